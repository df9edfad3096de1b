"""Tiny local models, tokenizers and datasets for tests and the demo, built here because no test machine can reach
the Hugging Face Hub.

The datasets are written by plain Python below. The models need torch and transformers, which the orchestrator
never imports, so they are built by ``sft_grid/in_venv/build_tiny.py`` running in the LLaMA-Factory backend's own
virtual environment. Everything lands under the cache root (``sft_grid.paths.assets_dir()``):

    data/tiny_messages.jsonl      60 conversations, ``messages`` column with role/content
    data/tiny_sharegpt.jsonl      40 conversations, ``conversations`` column with from/value
    models/tiny-llama3/           Llama-3-style tokenizer + 2-layer LlamaForCausalLM (vocab 1000)
    models/tiny-qwen3/            ChatML tokenizer + 2-layer Qwen3ForCausalLM (vocab 1000)
    models/tiny-delphi/           a Delphi checkpoint in miniature: Llama-3.1's tokenizer layout (128000 BPE ids,
                                  then its 256 specials with the reserved slots; bos 128000, eos 128001, no pad,
                                  no chat template) on an untied 2-layer Qwen3ForCausalLM (hidden 32), float32,
                                  in two safetensors shards with their index
    sizes/tiny-llama3-m/, -l/     tiny-llama3's tokenizer, 4-layer LlamaForCausalLM of hidden 128 and 256 (0.85M
                                  and 2.9M parameters; tiny-llama3 is 0.2M): a grid over model size

Each of ``data/``, ``models/`` and ``sizes/`` is staged in a temp dir, stamped with a ``.complete`` marker and only then
renamed into place, so a dir without a current marker is never trusted and a killed build is simply redone.

    sft-grid assets build [--force]     # no-op when everything is there and current
    sft-grid assets path                # print where the assets live
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sft_grid.core.lock import Lock
from sft_grid.core.paths import IN_VENV_DIR, assets_dir
from sft_grid.planning.environments import VenvSpec
from sft_grid.stages.venv_build import build as build_venv

log = logging.getLogger(__name__)

# Bump to rebuild every existing asset dir (e.g. after changing the datasets or build_tiny.py).
ASSETS_VERSION = "3"
MARKER = ".complete"
BACKEND = "llamafactory"
SCRIPT = IN_VENV_DIR / "build_tiny.py"

MODELS = ("tiny-llama3", "tiny-qwen3", "tiny-delphi")
SIZES = ("tiny-llama3-m", "tiny-llama3-l")
SIZES_SCRIPT = IN_VENV_DIR / "build_sizes.py"
DATASETS = {"tiny_messages": "tiny_messages.jsonl", "tiny_sharegpt": "tiny_sharegpt.jsonl"}
SYSTEM_PROMPT = "You are a tiny helpful assistant."


class AssetBuildError(RuntimeError):
    pass


def build(force: bool = False, dest: Path | None = None) -> Path:
    """Make sure the datasets and models exist under ``dest`` (default: the cache's assets dir); return ``dest``.

    Safe to call concurrently: a lock serialises builders, and the second one finds the work done.
    """
    dest = Path(dest) if dest is not None else assets_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with Lock(dest.parent / f".{dest.name}.lock"):
        _ensure(dest, "data", {"version": ASSETS_VERSION}, _write_datasets, force)
        # The models are written by the backend's transformers: a new environment may save another format.
        stamp = {"version": ASSETS_VERSION, "venv": VenvSpec.load(BACKEND).path.name}
        _ensure(dest, "models", stamp, _build_models, force)
        # a part of its own: adding it did not rebuild the models every test already uses
        _ensure(dest, "sizes", stamp, _build_sizes, force)
    return dest


def _is_complete(part_dir: Path, stamp: dict[str, Any]) -> bool:
    try:
        return bool(json.loads((part_dir / MARKER).read_text()) == stamp)
    except (OSError, ValueError):
        return False


def _ensure(dest: Path, part: str, stamp: dict[str, Any], builder: Callable[[Path], None], force: bool) -> None:
    """Build ``dest/part`` unless it carries the current stamp; stage, stamp, then swap it in."""
    target = dest / part
    if not force and _is_complete(target, stamp):
        log.info("%s is up to date", target)
        return
    log.info("building %s", target)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{part}.tmp-", dir=dest))
    try:
        builder(staging)
        # The marker goes last: its presence is the promise that everything before it was written.
        (staging / part / MARKER).write_text(json.dumps(stamp) + "\n")
        _replace(staging / part, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("built %s in %.1f s", target, time.monotonic() - started)


def _replace(new: Path, target: Path) -> None:
    # rename() cannot replace a non-empty dir: move the old one aside (same filesystem), then drop it.
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        target.rename(old / target.name)
        new.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        new.rename(target)


# ---- datasets ------------------------------------------------------------------------------------------------


def messages_rows(n: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    """Arithmetic chats in the ``messages`` role/content form, varied the way a template bug would show.

    Even rows carry a system turn, every third row has a second exchange, and half the rows wrap a reasoning
    trace in the Llama-3 tokenizer's think tokens, so masking and special-token handling all get exercised.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        answer = f"The answer is {a + b}."
        if i % 4 < 2:
            answer = f"<|start_think|>I add {a} and {b}.<|end_think|>{answer}"
        messages = [{"role": "system", "content": SYSTEM_PROMPT}] if i % 2 == 0 else []
        messages += [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": answer},
        ]
        if i % 3 == 0:
            messages += [
                {"role": "user", "content": "And times two?"},
                {"role": "assistant", "content": f"That is {2 * (a + b)}."},
            ]
        rows.append({"messages": messages})
    return rows


def sharegpt_rows(n: int = 40, seed: int = 1) -> list[dict[str, Any]]:
    """Subtraction chats in the classic ShareGPT ``conversations`` from/value form (human/gpt/system).

    A second schema on purpose: a mix of datasets must keep each dataset's own tags.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = sorted((rng.randint(1, 50), rng.randint(1, 50)), reverse=True)
        turns = [{"from": "system", "value": SYSTEM_PROMPT}] if i % 4 == 0 else []
        turns += [
            {"from": "human", "value": f"What is {a} minus {b}?"},
            {"from": "gpt", "value": f"The answer is {a - b}."},
        ]
        if i % 5 == 0:
            turns += [
                {"from": "human", "value": "And plus ten?"},
                {"from": "gpt", "value": f"That is {a - b + 10}."},
            ]
        rows.append({"conversations": turns})
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _write_datasets(staging: Path) -> None:
    data = staging / "data"
    data.mkdir()
    _write_jsonl(data / DATASETS["tiny_messages"], messages_rows())
    _write_jsonl(data / DATASETS["tiny_sharegpt"], sharegpt_rows())


# ---- models --------------------------------------------------------------------------------------------------


def _run_builder(script: Path, staging: Path, part: str, names: tuple[str, ...]) -> None:
    python = build_venv(BACKEND) / "bin" / "python"
    argv = [str(python), str(script), str(staging)]
    # Offline so that any accidental hub access fails at once instead of hanging on a compute node.
    proc_env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    log.info("$ %s", " ".join(argv))
    proc = subprocess.run(argv, env=proc_env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssetBuildError(f"{script.name} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
    missing = [name for name in names if not (staging / part / name / "config.json").is_file()]
    if missing:
        raise AssetBuildError(f"{script.name} exited 0 but did not write {missing} under {staging / part}")


def _build_models(staging: Path) -> None:
    _run_builder(SCRIPT, staging, "models", MODELS)


def _build_sizes(staging: Path) -> None:
    _run_builder(SIZES_SCRIPT, staging, "sizes", SIZES)
