"""What a cell directory holds, and what a trainer's output must hold to count as complete.

A cell directory (`<runs_root>/<sweep>/<slug>-<key>/`) is written whole by the grid and then read by the job
that runs it, the status command and the next invocation of the grid; these names are their contract.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CELL_FILE = "cell.yaml"
LAUNCH_FILE = "launch.sh"
PREFLIGHT_FILE = "preflight.json"
POST_FILE = "post.json"
LEDGER_FILE = "events.jsonl"
OUTPUT_DIR = "output"
LOGS_DIR = "logs"
TRAIN_LOG = "train.log"  # node 0's; node N's is train.node<N>.log (train_log)
# each backend process's data step (its call that tokenizes or loads the training data): one JSON line as it
# starts and one as it ends, written by in_venv/data_step.py in the directory of the job's script
DATA_STEP_FILE = "data_step.jsonl"
# what the grid estimated, when it queued the cell: tokens, FLOPs, GPU-hours, disk (planning/costs.py)
ESTIMATE_FILE = "estimate.json"
# the evaluation's score files, one a score: <cell>/eval/<score_id>.json; base models under <sweep>/_base/<model>/eval/
EVAL_DIR = "eval"
BASE_DIR = "_base"
ATTEMPTS_DIR = "attempts"
# beside the cells of a grid: the lock two invocations take turns through, and submitit's job folders
LOCK_FILE = ".sft_grid.lock"
SUBMITIT_DIR = ".submitit"
# a dry run's own files beside a grid's cells (the sbatch scripts a real run sends, a forced rerun's files)
PREVIEW_DIR = ".dry_run"
# the trainer's own per-step log (LLaMA-Factory writes it; the axolotl plugin writes the same lines)
TRAINER_LOG = "trainer_log.jsonl"
TRAINER_STATE = "trainer_state.json"
# the trainer's final metrics (train_runtime, ...), beside trainer_state.json
TRAIN_RESULTS = ("all_results.json", "train_results.json")
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def train_log(node: int) -> str:
    """The name of node `node`'s training log in the cell's logs/ (its SLURM_PROCID; node 0 keeps the ledger)."""
    return TRAIN_LOG if node == 0 else f"train.node{node}.log"


def output_complete(output_dir: Path) -> bool:
    """Final weights and trainer state. A ZeRO-3 run that does not gather at save (32B) writes its final
    weights as shards named by a `latest` file; its `consolidate` stage makes them safetensors, so training
    is complete either way."""
    if not (output_dir / TRAINER_STATE).is_file():
        return False
    return any((output_dir / w).is_file() for w in WEIGHT_FILES) or _zero_shards(output_dir)


def _zero_shards(output_dir: Path) -> bool:
    latest = output_dir / "latest"
    return latest.is_file() and (output_dir / latest.read_text().strip()).is_dir()


def checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N directories, oldest first."""
    found = []
    for p in output_dir.glob("checkpoint-*") if output_dir.is_dir() else ():
        suffix = p.name.rsplit("-", 1)[-1]
        if suffix.isdigit() and p.is_dir():
            found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def resumable(found: Sequence[Path]) -> list[Path]:
    """Of these checkpoint-N directories (`checkpoints`' list, oldest first), those a run can resume from: those
    whose trainer_state.json is written.
    Every backend here writes it last into a checkpoint (the HF Trainer after the weights, optimizer and RNG
    states; the in-venv trainers into a partial directory renamed whole), so one without it was cut mid-save: a
    job killed at its time limit while saving left checkpoint-790 without it, and the next leg, resumed from it,
    failed on the missing file."""
    return [p for p in found if (p / TRAINER_STATE).is_file()]


@dataclass(frozen=True)
class Progress:
    """Steps done, total steps and the last logged loss, from the trainer's own files."""

    step: int | None = None
    total: int | None = None
    loss: float | None = None


def progress(output_dir: Path) -> Progress:
    """From the trainer's log, read from its last lines; else from trainer_state.json."""
    log = output_dir / TRAINER_LOG
    if log.is_file():
        step = total = loss = None
        for line in reversed(tail_lines(log)):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # the first line of the tail may be cut, the last one still being written
            if step is None and "current_steps" in rec:
                step, total = rec["current_steps"], rec.get("total_steps")
            if loss is None and "loss" in rec:
                loss = rec["loss"]
            if step is not None and loss is not None:
                break
        if step is not None:
            return Progress(step, total, loss)
    state = output_dir / TRAINER_STATE
    if state.is_file():
        data = json.loads(state.read_text())
        losses = [h["loss"] for h in data.get("log_history", []) if "loss" in h]
        return Progress(data.get("global_step"), data.get("max_steps"), losses[-1] if losses else None)
    return Progress()


def tail_lines(path: Path, size: int = 8192) -> list[str]:
    """The last lines of a file (the first of them may be cut)."""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - size))
        return fh.read().decode(errors="replace").splitlines()


def not_a_cell_dir(path: Path) -> str | None:
    """Why `path` is not a cell's directory (for the commands that take one), or None."""
    if not path.is_dir():
        return f"{path} is not a directory"
    if not (path / CELL_FILE).is_file():
        return f"{path} is not a cell's directory (it has no {CELL_FILE}): give one under <runs_root>/<sweep_name>/"
    return None


def iter_cell_dirs(sweep_dir: Path) -> Iterator[Path]:
    """The cell directories of a grid, in name order (a `.`-name is a cell being written)."""
    if sweep_dir.is_dir():
        for p in sorted(sweep_dir.iterdir()):
            if not p.name.startswith(".") and (p / CELL_FILE).is_file():
                yield p
