"""A commit after submission changes no queued cell, on the real local Slurm cluster.

The user's checkout is a temporary git clone of this project's deciding paths; the grid is launched from it as a
user launches it (`python -m sft_grid` with that checkout's package imported), its cell held in the queue; then a
commit in the checkout replaces the job's entry with one that fails the cell and leaves a mark; the cell is released
and trains with the launch's commit, from the snapshot, and the later commit's code never runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.state import State, state_of
from sft_grid.sites.snapshot import MARKER, SHIP_ENV

from .helpers import ledger
from .test_snapshot import commit_all, git, make_checkout

pytestmark = [pytest.mark.slurm, pytest.mark.backend, pytest.mark.sites]

EDIT = """

def train(cell_dir: str) -> str:  # the later commit: it must never run for a cell queued before it
    Path(cell_dir, "NEW_CODE_RAN").write_text("yes")
    raise SystemExit("the later commit ran")
"""


def test_a_commit_after_submission_changes_no_queued_cell(tmp_path: Path, runs_root: Path):
    checkout = make_checkout(tmp_path / "checkout")
    launched = git(checkout, "rev-parse", "HEAD").strip()
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop(SHIP_ENV, None)  # a clean checkout: nothing to ship
    argv = [
        sys.executable,
        "-m",
        "sft_grid",
        "model=tiny_llama",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "cluster=slurm_local",
        "+cluster.sbatch_extra.hold=true",  # queued, not started, until released below
        f"runs_root={runs_root}",
    ]
    proc = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cell,) = iter_cell_dirs(runs_root / "default")
    submitted = next(e for e in ledger(cell) if e["event"] == "submitted")
    assert submitted["code"]["commit"] == launched
    snap = Path(submitted["code"]["snapshot"])
    assert snap == runs_root / ".code" / launched and (snap / MARKER).is_file()
    job_id = next(e for e in ledger(cell) if e["event"] == "job")["job_id"]
    assert state_of(cell).state is State.SUBMITTED

    # the checkout moves on while the cell waits: a commit that would change what it runs
    entries = checkout / "sft_grid" / "job" / "entries.py"
    entries.write_text(entries.read_text() + EDIT)
    later = commit_all(checkout, "a later commit")
    assert later != launched
    # every job of the grid was held (its tokenization's and post-training's too): each runs from the snapshot
    queue = subprocess.run(["squeue", "-h", "-o", "%A|%Z"], capture_output=True, text=True, timeout=60).stdout
    held = [row.split("|")[0] for row in queue.splitlines() if row.endswith("|" + str(snap))]
    assert job_id in held
    subprocess.run(["scontrol", "release", ",".join(held)], check=True, capture_output=True, timeout=60)

    def queued() -> bool:
        out = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, timeout=60).stdout
        return bool(out.strip())

    deadline = time.monotonic() + 900
    while state_of(cell).state.in_flight and queued():  # the cell's own files, or its job gone from the queue
        assert time.monotonic() < deadline, f"cell not done after 900 s: {state_of(cell)}"
        time.sleep(1)
    final = state_of(cell)
    assert final.state is State.COMPLETED, final
    assert not (cell / "NEW_CODE_RAN").exists()
    # the job ran from the snapshot: the launch's entries.py, untouched; the live checkout's is the later one
    assert "the later commit ran" not in (snap / "sft_grid" / "job" / "entries.py").read_text()
    assert not list((runs_root / ".code").glob(later + "*"))
