"""The tiny assets are real: tokenizers and models load with transformers in the backend env, datasets have the
shapes the configs will declare, and rebuilding is skipped, redone or refused exactly when it should be.

Builds go into a tmp dir through ``build(dest=...)``: the backend env lives under SFT_GRID_CACHE too, so
moving the cache would rebuild the env (minutes) instead of the assets (seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid.core.paths import REPO_ROOT, assets_dir
from sft_grid.planning.environments import VenvSpec
from sft_grid.stages import tiny_assets

LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|finetune_right_pad_id|>",
    "<|start_think|>",
    "<|end_think|>",
    "<|tool_call|>",
    "<|tool_result|>",
]
QWEN3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 8 plus 36?"},
    {"role": "assistant", "content": "<|start_think|>I add.<|end_think|>The answer is 44."},
]
EXPECTED_CHAT = {
    "tiny-llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 8 plus 36?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<|start_think|>I add.<|end_think|>The answer is 44.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "tiny-qwen3": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 8 plus 36?<|im_end|>\n"
        "<|im_start|>assistant\n<|start_think|>I add.<|end_think|>The answer is 44.<|im_end|>\n<|im_start|>assistant\n"
    ),
}

# Runs in the backend env: loads what build() wrote the way a backend would, and reports facts as JSON.
INSPECT = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
root, specials, chat = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
report = {}
for name, tokens in specials.items():
    tok = AutoTokenizer.from_pretrained(f"{root}/models/{name}")
    model = AutoModelForCausalLM.from_pretrained(f"{root}/models/{name}")
    report[name] = {
        "ids": {t: tok.encode(t, add_special_tokens=False) for t in tokens},
        "chat": tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
        "len_tok": len(tok),
        "vocab_size": model.config.vocab_size,
        "embedding_rows": model.get_input_embeddings().weight.shape[0],
        "architecture": type(model).__name__,
        "eos": tok.eos_token, "pad": tok.pad_token, "bos": tok.bos_token,
    }
print(json.dumps(report))
"""

pytestmark = pytest.mark.backend


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_assets.build(dest=tmp_path_factory.mktemp("assets"))


def _files(root: Path) -> dict[str, tuple[int, int, str]]:
    """path -> (inode, mtime_ns, sha256): a rewrite shows in the inode or mtime even when the bytes are equal."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock")):
        st = path.stat()
        out[str(path.relative_to(root))] = (st.st_ino, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_layout(built: Path) -> None:
    assert sorted(p.name for p in built.iterdir()) == ["data", "models", "sizes"]  # no staging dirs left behind
    assert sorted(p.name for p in (built / "sizes").iterdir()) == sorted([".complete", *tiny_assets.SIZES])
    data_files = sorted(p.name for p in (built / "data").iterdir())
    assert data_files == [".complete", "tiny_messages.jsonl", "tiny_sharegpt.jsonl"]
    assert sorted(p.name for p in (built / "models").iterdir()) == [
        ".complete",
        "tiny-delphi",
        "tiny-llama3",
        "tiny-qwen3",
    ]
    for name in tiny_assets.MODELS:
        model_dir = built / "models" / name
        # tiny-delphi's weights are sharded, with their index, as a real Delphi checkpoint's above 447M are
        weights = "model.safetensors.index.json" if name == "tiny-delphi" else "model.safetensors"
        for file in ("config.json", weights, "tokenizer.json", "tokenizer_config.json"):
            assert (model_dir / file).is_file(), model_dir / file
        # transformers 5 keeps the chat template in its own file, not in tokenizer_config.json; a Delphi base
        # checkpoint (tiny-delphi) has none: the cell's delphi template gives it one
        assert (model_dir / "chat_template.jinja").is_file() == (name != "tiny-delphi")


def test_tokenizers_and_models_load_in_backend_env(built: Path) -> None:
    python = VenvSpec.load(tiny_assets.BACKEND).path / "bin" / "python"
    specials = {"tiny-llama3": LLAMA3_SPECIALS, "tiny-qwen3": QWEN3_SPECIALS}
    proc = subprocess.run(
        [str(python), "-c", INSPECT, str(built), json.dumps(specials), json.dumps(CHAT)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    for name, tokens in specials.items():
        facts = report[name]
        ids = facts["ids"]
        assert all(len(ids[t]) == 1 for t in tokens), {t: i for t, i in ids.items() if len(i) != 1}
        assert len({i[0] for i in ids.values()}) == len(tokens), "two special tokens share an id"
        assert facts["chat"] == EXPECTED_CHAT[name]
        assert facts["len_tok"] == facts["vocab_size"] == facts["embedding_rows"] == 1000
    assert report["tiny-llama3"]["architecture"] == "LlamaForCausalLM"
    assert report["tiny-qwen3"]["architecture"] == "Qwen3ForCausalLM"
    assert (report["tiny-llama3"]["bos"], report["tiny-llama3"]["eos"], report["tiny-llama3"]["pad"]) == (
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|finetune_right_pad_id|>",
    )
    assert (report["tiny-qwen3"]["bos"], report["tiny-qwen3"]["eos"], report["tiny-qwen3"]["pad"]) == (
        None,
        "<|im_end|>",
        "<|endoftext|>",
    )


def test_messages_dataset(built: Path) -> None:
    rows = _read_jsonl(built / "data" / "tiny_messages.jsonl")
    assert len(rows) == 60
    for i, row in enumerate(rows):
        assert list(row) == ["messages"]
        turns = row["messages"]
        assert all(set(t) == {"role", "content"} and t["content"] for t in turns)
        has_system = turns[0]["role"] == "system"
        assert has_system == (i % 2 == 0)
        dialog = turns[1:] if has_system else turns
        assert [t["role"] for t in dialog] == ["user", "assistant"] * (2 if i % 3 == 0 else 1)
    answers = [t["content"] for row in rows for t in row["messages"] if t["role"] == "assistant"]
    thinking = [a for a in answers if a.startswith("<|start_think|>")]
    assert 0 < len(thinking) < len(answers)
    assert all("<|end_think|>" in a for a in thinking)
    # The answers are right: a model trained on them learns arithmetic, not noise.
    first_user = rows[1]["messages"][0]["content"]
    a, b = (int(w) for w in first_user.rstrip("?").split() if w.isdigit())
    assert rows[1]["messages"][1]["content"].endswith(f"The answer is {a + b}.")


def test_sharegpt_dataset(built: Path) -> None:
    rows = _read_jsonl(built / "data" / "tiny_sharegpt.jsonl")
    assert len(rows) == 40
    senders: set[str] = set()
    for row in rows:
        assert list(row) == ["conversations"]
        turns = row["conversations"]
        assert all(set(t) == {"from", "value"} and t["value"] for t in turns)
        dialog = turns[1:] if turns[0]["from"] == "system" else turns
        assert [t["from"] for t in dialog][::2] == ["human"] * (len(dialog) // 2)
        assert [t["from"] for t in dialog][1::2] == ["gpt"] * (len(dialog) // 2)
        senders.update(t["from"] for t in turns)
    assert senders == {"system", "human", "gpt"}


def test_datasets_are_deterministic() -> None:
    assert tiny_assets.messages_rows() == tiny_assets.messages_rows()
    assert tiny_assets.sharegpt_rows() == tiny_assets.sharegpt_rows()


def test_second_build_is_a_noop(built: Path) -> None:
    before = _files(built)
    assert tiny_assets.build(dest=built) == built
    assert _files(built) == before


def test_dir_without_marker_is_rebuilt_identically(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "assets"
    shutil.copytree(built, copy)
    (copy / "models" / tiny_assets.MARKER).unlink()
    before = _files(copy)
    tiny_assets.build(dest=copy)
    after = _files(copy)
    assert after.keys() == before.keys() | {f"models/{tiny_assets.MARKER}"}
    for path in before:
        if path.startswith(("data/", "sizes/")):  # each part has its own marker: only models/ lost its
            assert after[path] == before[path], f"{path} was rewritten though its part was complete"
        else:
            assert after[path][:2] != before[path][:2], f"{path} was not rebuilt"
            # Seeded build: a rebuild reproduces the same bytes, so runs stay comparable across machines.
            assert after[path][2] == before[path][2], f"{path} differs after a rebuild"


def test_stale_version_is_rebuilt(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "assets"
    shutil.copytree(built, copy)
    marker = copy / "data" / tiny_assets.MARKER
    marker.write_text(json.dumps({"version": "0"}))
    before = _files(copy)
    tiny_assets.build(dest=copy)
    after = _files(copy)
    assert json.loads(marker.read_text()) == {"version": tiny_assets.ASSETS_VERSION}
    assert after["data/tiny_messages.jsonl"][:2] != before["data/tiny_messages.jsonl"][:2]
    assert after["models/tiny-llama3/model.safetensors"] == before["models/tiny-llama3/model.safetensors"]


def test_failed_model_build_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken_probe.py"
    broken.write_text(
        "import pathlib, sys\n"
        "d = pathlib.Path(sys.argv[1], 'models', 'tiny-llama3'); d.mkdir(parents=True)\n"
        "(d / 'config.json').write_text('{}')\n"
        "sys.exit('boom: half-written')\n"
    )
    monkeypatch.setattr(tiny_assets, "SCRIPT", broken)
    dest = tmp_path / "assets"
    with pytest.raises(tiny_assets.AssetBuildError, match="boom: half-written"):
        tiny_assets.build(dest=dest)
    assert sorted(p.name for p in dest.iterdir()) == ["data"]  # data finished first; no models/, no staging


def test_cli_path() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "assets", "path"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == str(assets_dir())
