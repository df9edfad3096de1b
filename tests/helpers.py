"""Small helpers the tests share: a cell's ledger as plain JSON lines, its kinds of event, the grid's states."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from sft_grid.analysis.view import read_view
from sft_grid.core import events
from sft_grid.core.layout import LEDGER_FILE, iter_cell_dirs
from sft_grid.core.state import CellState

T = TypeVar("T")

# a tiny Llama that trains far longer than any test waits or any time-limit leg lasts (a checkpoint every 10 steps)
LONG_TRAINING = [
    "model=tiny_llama",
    "max_steps=3000",
    "save_steps=10",
    "global_batch_size=16",
    "micro_batch_size=1",
    "scheduler=constant",
    # LLaMA-Factory's recompute, as CPU cells had before the layout chose no checkpointing for them: the pace these
    # tests' time limits were set for (without it the 3000 steps finish within two 3-minute legs)
    "layout.checkpointing=true",
]
# the keys of a score file (the score's contract with the report, results and the next evaluation)
SCORE_KEYS = {
    "score_id",
    "task",
    "suite",
    "settings",
    "harness",
    "model",
    "model_path",
    "template_digest",
    "metrics",
    "time",
    "seconds",
}


def ledger(cell_dir: Path) -> list[dict[str, Any]]:
    """The cell's events as the file holds them (one dict a line)."""
    return [e.to_json() for e in events.read(cell_dir)]


def kinds(cell_dir: Path) -> list[str]:
    return [e.kind.value for e in events.read(cell_dir)]


def states_of(dirs: Iterable[Path]) -> dict[Path, CellState]:
    """Each cell's state, with one scheduler query for all of them (as `status` reads them)."""
    dirs = list(dirs)
    view = read_view(dirs)
    return {d: view.state(d) for d in dirs}


def triaged_states(dirs: Iterable[Path]) -> dict[Path, CellState]:
    """Each cell's state as `status` shows it: failures the scheduler ended are triaged (and recorded) first."""
    from sft_grid.grid.triage import settle

    dirs = list(dirs)
    view = settle(read_view(dirs), dirs)
    return {d: view.state(d) for d in dirs}


def grid_states(root: Path, sweep: str = "default") -> dict[str, CellState]:
    return {d.name: s for d, s in states_of(iter_cell_dirs(root / sweep)).items()}


def array_names(root: Path) -> set[str]:
    """The name of every Slurm array any invocation submitted (or tried to) for the cells under root."""
    return {
        e["name"]
        for c in root.rglob(LEDGER_FILE)
        for e in ledger(c.parent)
        if e.get("event") == "submitted" and e.get("name")
    }


def cancel_jobs_of(root: Path) -> None:
    """scancel every job of the cells under root: the training arrays by name (unique to a test; job ids are not,
    across a cluster restart), and the preps and post arrays by their batch script, which lies under root; then
    wait until the queue has none of them left (a bounded wait: cancelling is quick)."""

    def ours() -> list[str]:
        names = array_names(root)
        queue = subprocess.run(["squeue", "-h", "-o", "%A|%j|%o"], capture_output=True, text=True, timeout=30).stdout
        return sorted(
            {
                row.split("|")[0]
                for row in queue.splitlines()
                if row.count("|") >= 2 and (row.split("|")[1] in names or str(root) in row.split("|", 2)[2])
            }
        )

    jobs = ours()
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True, timeout=30)
    end = time.monotonic() + 15
    while jobs and time.monotonic() < end:
        jobs = ours()
        if not jobs:
            break
        time.sleep(0.5)


def wait_for(probe: Callable[[], T | None], what: str, deadline_s: float = 60, interval: float = 0.5) -> T:
    """Poll `probe` until it returns something true; fail naming `what` after `deadline_s` (generous: CI is slow)."""
    end = time.monotonic() + deadline_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(interval)
