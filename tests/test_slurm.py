"""sft_grid on a real Slurm cluster (scripts/slurm_up.sh: two virtual nodes on this machine): grids as job
arrays, skip on rerun, status from one sacct call, cancel, a preempted cell that is requeued and resumes from its
checkpoint, and sbatch's refusal. (Two-node training: tests/test_delphi.py; time limits: tests/test_time_limits.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sft_grid.cli.cmd_status import rows
from sft_grid.core.layout import checkpoints, iter_cell_dirs
from sft_grid.core.state import CellState, State
from sft_grid.schedulers import slurm

from .conftest import run_sft
from .helpers import cancel_jobs_of, states_of, wait_for
from .helpers import ledger as ledger_of

pytestmark = [pytest.mark.slurm, pytest.mark.backend]

TINY = ["model=tiny_llama", "global_batch_size=4", "micro_batch_size=2", "cluster=slurm_local"]
# long enough to be caught mid-training (~20 s of steps on this machine), checkpointing every 20 steps
SLOW = [
    "model=tiny_llama",
    "max_steps=300",
    "save_steps=20",
    "global_batch_size=16",
    "micro_batch_size=1",
    "cluster=slurm_local",
]


def cell_dirs(root: Path, sweep: str = "default") -> list[Path]:
    return list(iter_cell_dirs(root / sweep))


def states(root: Path, sweep: str = "default") -> dict[str, CellState]:
    dirs = cell_dirs(root, sweep)
    return {d.name: s for d, s in states_of(dirs).items()}


def wait_until(root: Path, done: set[str], sweep: str = "default", deadline_s: float = 1200) -> dict[str, CellState]:
    deadline = time.time() + deadline_s
    while True:
        found = states(root, sweep)
        if found and all(s.state.value in done for s in found.values()):
            return found
        if time.time() > deadline:
            raise AssertionError(f"cells not {done} after {deadline_s} s: {found}")
        time.sleep(1)


@pytest.fixture
def cleanup_jobs():
    roots: list[Path] = []
    yield roots
    for root in roots:  # every job of the test's cells, its post-training and preps too, out of the queue
        cancel_jobs_of(root)


def events(cell: Path) -> list[dict]:
    """The cell's training events (the post-training chain's own are tested in test_post.py)."""
    return [e for e in ledger_of(cell) if e["event"] not in ("stage", "post_job")]


def test_grid_is_one_throttled_array_then_skipped_and_status_asks_sacct_once(
    tmp_path, tiny_assets, cleanup_jobs, monkeypatch
):
    cleanup_jobs.append(tmp_path)
    queued = run_sft("-m", *TINY, "max_steps=2", "seed=1,2,3", "concurrency=2", f"runs_root={tmp_path}", check=True)
    assert "queued 3 cell(s) as sft_grid-" in queued.stdout and "at most 2 at once" in queued.stdout
    final = wait_until(tmp_path, {"completed", "failed"})
    assert {s.state.value for s in final.values()} == {"completed"}, final
    arrays = {s.job_id.split("_")[0] for s in final.values()}
    assert len(arrays) == 1  # one sbatch for the grid
    # the training array's script: it waits for the grid's tokenize-once job (afterany), and the post-training
    # array waits for it task by task (aftercorr)
    (script,) = [
        t
        for t in (p.read_text() for p in (tmp_path / "default" / ".submitit").rglob("*_submission.sh"))
        if "aftercorr" not in t
    ]
    assert "#SBATCH --array=0-2%2" in script and "#SBATCH --requeue" in script
    assert "--dependency=afterany:" in script
    for cell in cell_dirs(tmp_path):
        assert json.loads((cell / "output" / "trainer_state.json").read_text())["global_step"] == 2
    again = run_sft("-m", *TINY, "max_steps=2", "seed=1,2,3", "concurrency=2", f"runs_root={tmp_path}", check=True)
    assert "3 cell(s): 0 to run, 3 completed - nothing to run." in again.stdout
    assert all([e["event"] for e in events(c)].count("submitted") == 1 for c in cell_dirs(tmp_path))
    # status: one accounting query and one queue query for the whole grid
    calls: list[list[str]] = []
    real = slurm._run

    def counting(argv, timeout=60, env=None):
        calls.append(list(argv))
        return real(argv, timeout, env)

    monkeypatch.setattr(slurm, "_run", counting)
    table = rows(cell_dirs(tmp_path))
    assert [c[0] for c in calls] == ["sacct", "squeue"]
    assert len(table) == 3 and all(r[1] == "completed" and r[2] for r in table)
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert "3 cell(s): 3 completed" in proc.stdout


def test_cancel_stops_a_running_cell(tmp_path, tiny_assets, cleanup_jobs):
    cleanup_jobs.append(tmp_path)
    run_sft(*SLOW, "max_steps=3000", f"runs_root={tmp_path}", check=True)
    wait_until(tmp_path, {"running"}, deadline_s=600)
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "cancel", "default", "--runs-root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "1 cell(s) cancelled" in proc.stdout
    (cell,) = cell_dirs(tmp_path)
    job_id = states(tmp_path)[cell.name].job_id
    wait_for(
        lambda: any(j.job_id == job_id and j.state == "CANCELLED" for j in slurm.query([job_id])),
        f"job {job_id} to be CANCELLED",
        120,
    )
    st = states(tmp_path)[cell.name]
    assert st.state is State.CANCELLED
    skipped = run_sft(*SLOW, "max_steps=3000", f"runs_root={tmp_path}", check=True)
    assert "0 to run" in skipped.stdout and "rerun_failed=true reruns them" in skipped.stdout


def _logged_steps(log: Path) -> list[int]:
    # the per-step lines (they carry a loss; the trainer's closing line repeats the last step without one)
    return [r["current_steps"] for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]


def _assert_resumed(cell: Path, total: int = 300) -> None:
    kinds = [e["event"] for e in events(cell)]
    assert "requeued" in kinds and kinds[-1] == "completed", kinds
    resumed = [e for e in events(cell) if e["event"] == "resumed"]
    assert resumed, kinds
    step = int(resumed[-1]["checkpoint"].split("-")[1])
    # the trainer itself says where it picked up: the checkpoint's step, not step 0
    train_log = (cell / "logs" / "train.log").read_text()
    assert re.search(rf"Resuming training from checkpoint with epoch \d+ and global step {step}\b", train_log), (
        train_log[-2000:]
    )
    steps = _logged_steps(cell / "output" / "trainer_log.jsonl")
    assert steps[-1] == total and step + 1 in steps, steps
    assert json.loads((cell / "output" / "trainer_state.json").read_text())["global_step"] == total
    assert [e["event"] for e in events(cell)].count("submitted") == 1  # requeued, not resubmitted


@pytest.mark.whole_cluster  # its `high` job preempts every debug job of the cluster
def test_preempted_cell_is_requeued_and_resumes_from_its_checkpoint(tmp_path, tiny_assets, cleanup_jobs):
    cleanup_jobs.append(tmp_path)
    run_sft(*SLOW, f"runs_root={tmp_path}", check=True)
    (cell,) = cell_dirs(tmp_path)
    wait_for(lambda: checkpoints(cell / "output"), "a first checkpoint", 600)
    job_id = states(tmp_path)[cell.name].job_id
    # a job in the `high` partition that needs every CPU of both nodes preempts the cell's job
    high = subprocess.run(
        ["sbatch", "--parsable", "-p", "high", "-N", "2", "--exclusive", "-o", "/dev/null", "--wrap", "sleep 1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        (st,) = wait_until(tmp_path, {"completed", "failed"}, deadline_s=1200).values()
    finally:
        subprocess.run(["scancel", high], check=False)
    assert st.state is State.COMPLETED, st
    history = subprocess.run(
        ["sacct", "--duplicates", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True, text=True
    ).stdout.split()
    assert "PREEMPTED" in history or "REQUEUED" in history, history
    _assert_resumed(cell)


def test_sbatch_refusal_is_reported_and_leaves_the_cells_planned(tmp_path, tiny_assets, cleanup_jobs):
    cleanup_jobs.append(tmp_path)
    proc = run_sft(*TINY, "max_steps=2", "cluster.partition=nope", f"runs_root={tmp_path}")
    assert proc.returncode == 1
    assert "sbatch refused array sft_grid-" in proc.stderr and "Invalid partition name" in proc.stderr
    assert "1 cell(s) were not queued and read as planned" in proc.stderr
    assert [s.state for s in states(tmp_path).values()] == [State.PLANNED]
    # the partition is where the cell runs, not what it trains: fixed, the same cell is queued
    fixed = run_sft(*TINY, "max_steps=2", f"runs_root={tmp_path}", check=True)
    assert "queued 1 cell(s)" in fixed.stdout
    (st,) = wait_until(tmp_path, {"completed", "failed"}).values()
    assert st.state is State.COMPLETED
