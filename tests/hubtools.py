"""Helpers for the Hub staging tests: small synthetic repos, stagers in child processes, assets and envs.

The fixtures (a loopback hub, a clean client environment) are in ``hub_fixtures``, which test modules load with
``pytest_plugins``, so nothing is added to the shared conftest.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for  # noqa: F401 (re-exported for the hub tests)

REPO_ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


# -- synthetic repos ------------------------------------------------------------------------------------------
def safetensors_bytes(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """A valid safetensors file of F32 tensors (header length, JSON header, data), as the format defines it."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def tokenizer_json() -> bytes:
    """A real (tiny) tokenizer.json built with the tokenizers library, with the Llama-3 template's special tokens
    (so the grid's template check passes on a staged copy)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_start|>", "<|im_end|>", "hello", "world", "user"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(
        [
            AddedToken(t, special=True)
            for t in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
        ]
    )
    return tok.to_str().encode()


def model_files(weights_mib: float = 0.25, seed: int = 0) -> dict[str, bytes]:
    """A model repo as they come: what training needs, plus duplicate weights and training state it does not."""
    n = int(weights_mib * MiB) // 4
    data = (seed.to_bytes(4, "little") + os.urandom(4 * n))[: 4 * n]
    chat = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 8, "seed": seed}).encode(),
        "generation_config.json": b'{"eos_token_id": 2}',
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": json.dumps({"chat_template": chat, "eos_token": "<|im_end|>"}).encode(),
        "chat_template.jinja": chat.encode(),
        "model.safetensors": safetensors_bytes({"w": ([n], data)}),
        "README.md": b"---\nlicense: mit\n---\n# tiny\n",
        "pytorch_model.bin": b"duplicate weights" * 64,
        "optimizer.pt": b"optimizer state" * 64,
        "scheduler.pt": b"scheduler state",
        "rng_state_0.pth": b"rng",
        "training_args.bin": b"args",
        "checkpoint-10/model.safetensors": b"old checkpoint" * 64,
        "global_step10/mp_rank_00_model_states.pt": b"deepspeed state",
    }


MODEL_NEEDED = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors",
    "README.md",
}


def dataset_files(rows: int = 20) -> dict[str, bytes]:
    lines = [
        json.dumps({"messages": [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": "world"}]})
        for i in range(rows)
    ]
    return {
        "README.md": b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        b"    path: data/train.jsonl\n---\n# tiny chat\n",
        "data/train.jsonl": ("\n".join(lines) + "\n").encode(),
        "data/extra.csv": b"prompt,answer\nhello,world\n",
        "tiny_chat.py": b"# a loading script: datasets 4 no longer runs these\n",
        "images/banner.png": b"\x89PNG....",
    }


DATASET_NEEDED = {"README.md", "data/train.jsonl", "data/extra.csv"}


# -- a stager in its own process ------------------------------------------------------------------------------
STAGE_CHILD = """
import json, sys
from dataclasses import asdict
from sft_grid.stages.staging import download
args = json.loads(sys.argv[1])
staged = download(args.pop("repo_id"), **args)
out = asdict(staged)
out["path"] = str(out["path"])
print(json.dumps(out))
"""


def stage_in_child(hub_url: str, cache: Path, repo_id: str, **kwargs: Any) -> subprocess.Popen[str]:
    """``download`` in a new process (a stager that can be killed, or run beside another)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_ENDPOINT": hub_url}
    args = {"repo_id": repo_id, "cache": str(cache), "endpoint": hub_url, **kwargs}
    return subprocess.Popen(
        [sys.executable, "-c", STAGE_CHILD, json.dumps(args)],
        env=env,
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def child_result(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"stager exited {proc.returncode}:\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


# -- project assets and backend environments ------------------------------------------------------------------
def sft_grid_cache() -> Path:
    return Path(os.environ.get("SFT_GRID_CACHE") or Path.home() / ".cache" / "sft_grid")


def tiny_asset(rel: str) -> Path:
    """A tiny asset built by ``sft-grid assets build``; skips the test when it is not there."""
    path = sft_grid_cache() / "assets" / rel
    if not path.exists():
        pytest.skip(f"tiny asset {path} not built (sft-grid assets build)")
    return path


def venv_python(backend: str) -> Path:
    """The python of a built backend environment (``envs/<backend>-<pins>``); skips when none is ready."""
    ready = sorted((sft_grid_cache() / "envs").glob(f"{backend}-*/.sft_grid_ready"), key=lambda p: p.stat().st_mtime)
    if not ready:
        pytest.skip(f"no ready {backend} environment under {sft_grid_cache() / 'envs'} (sft-grid venv build {backend})")
    return ready[-1].parent / "bin" / "python"


# -- a cell on the synthetic repos, and `sft-grid stage` as a user runs it -----------------------


def cell_args(cache: Path, runs: Path, model: str = "org/tiny", data: str = "org/chat") -> list[str]:
    """A cell on the synthetic repos of tests/hubtools.py, training in the managed environment: the tests that use
    it empty sft_grid's cache (`no_backend_here`), so it is not on this machine and the checks that run in it wait
    for the job (the fast set starts no backend)."""
    return [
        "model=tiny_llama",
        "model.path=null",
        f"model.hub_id={model}",
        "dataset=tiny_messages",
        f"dataset.tiny_messages.source={data}",
        f"cluster.hf_cache={cache}",
        f"runs_root={runs}",
        "max_steps=2",
    ]


def stage_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "sft_grid", "stage", *args]


def run_stage(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(stage_cmd(*args), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def popen_stage(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        stage_cmd(*args), cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
