"""Time limits on the local Slurm cluster, for real: Slurm ends each leg (TIMEOUT), submitit's USR2 comes first and
requeues the job while the cell's budget lasts, each leg resumes from the last checkpoint, and the cell then stops
with the right reason and the exact change to make.

Two grids are queued at once by one module fixture and run side by side (about six minutes, most of it Slurm's
two- and three-minute limits; the tests only read what they left):
- `one`: a budget of one: the second leg resumes from the first leg's checkpoint (the trainer says so, and logs the
  next step), then the budget is spent: the time limit, at which step, what to change;
- `futile`: two-minute legs that can never reach a checkpoint: the second such leg is not requeued again, whatever
  the budget ("no progress").
A cell's estimates before launch would refuse the first (it runs far longer than its wall time): they are turned off
for it, since these tests are about the limit that follows. A cell with no requeue budget at all ends as the first
leg here did, stopped instead of requeued: the policy and the summary of that case are checked in tests/test_triage.py
(its leg on this cluster cost CI three minutes of a core and showed nothing this grid does not).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sft_grid.core import events
from sft_grid.core.failures import FailureClass, RemedyKind
from sft_grid.core.layout import checkpoints, iter_cell_dirs
from sft_grid.core.state import CellState, State

from .conftest import holding_cluster, run_sft
from .helpers import LONG_TRAINING, cancel_jobs_of, ledger, triaged_states, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.backend, pytest.mark.xdist_group("cluster_alone")]

# on the local cluster (its env: one thread a process)
LONG = [*LONG_TRAINING, "cluster=slurm_local"]
# a leg must reach its first checkpoint (step 10) and, resumed, log a step: the start-up alone took 72 s on this
# machine at load 14 (a two-node cell, tests/test_triage_faults.py), so 3 minutes a leg (2 failed there once; 4 cost CI
# two more minutes of the cluster held alone)
LEG = "00:03:00"
# 6000 steps: more than two legs train here (3000 steps finished within two 3-minute legs on this machine on
# 2026-12-04, the second leg in 1:51, so the budget of one requeue was never spent)
GRIDS = {
    "one": ([*LONG, "max_steps=6000", f"time={LEG}", "cluster.max_requeues=1"], {"SFT_GRID_ESTIMATES": "0"}),
    # a checkpoint only at the end: no leg can save one. The budget of 200 is what the estimates ask for; the second
    # leg that ends with nothing saved stops it anyway
    # (two-minute legs: no length reaches step 5000 here, and a one-minute leg of a busy machine ended before its
    # runner started, once)
    "futile": ([*LONG, "max_steps=5000", "save_steps=5000", "time=00:02:00", "cluster.max_requeues=200"], {}),
}
WAIT_S = 1800  # CI's shared 2-core machine can be several times slower than a workstation


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> Iterator[dict[str, Path]]:
    """Each grid's runs root, all queued at once; the cluster is held (shared) until the module's tests end, so
    that no test that takes it alone (preemption, a node set down) disturbs the legs."""
    roots: dict[str, Path] = {}
    with holding_cluster(alone=False):
        try:
            for name, (args, env) in GRIDS.items():
                roots[name] = tmp_path_factory.mktemp(f"limit_{name}") / "runs"
                run_sft(*args, f"runs_root={roots[name]}", env=env, check=True)
            yield roots
        finally:
            for root in roots.values():
                cancel_jobs_of(root)


def the_cell(root: Path) -> Path:
    (cell,) = iter_cell_dirs(root / "default")
    return cell


def final(root: Path) -> CellState:
    """The cell's state once it ended, as `status` shows it (the scheduler's ends triaged)."""
    cell = the_cell(root)

    def ended() -> CellState | None:
        st = triaged_states([cell])[cell]
        done = st.state in (State.COMPLETED, State.FAILED, State.CANCELLED) and st.action is not RemedyKind.REQUEUE
        return st if done else None

    return wait_for(ended, f"{cell.name} to end", WAIT_S, interval=2)


def status_text(root: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def training_events(cell: Path) -> list[dict]:
    return [e for e in ledger(cell) if e["event"] not in ("stage", "post_job")]


def test_a_time_limit_with_its_budget_spent_says_where_it_stopped_and_what_to_change(limited):
    root = limited["one"]
    st = final(root)
    cell = the_cell(root)
    assert st.state is State.FAILED and st.failure_class is FailureClass.TIME_LIMIT, st
    assert st.action is RemedyKind.STOP, st
    assert "time limit reached after 1 requeue (budget 1), at step" in st.reason, st
    assert re.search(r"TIMEOUT|DUE TO TIME LIMIT|timed-out", st.evidence), st.evidence
    # what to change: more legs, more time or more nodes, and the exact rerun command
    assert re.search(r"at step \d+ of 6000", st.reason), st.reason
    assert "cluster.max_requeues=" in st.advice and "time=00:06:00" in st.advice, st.advice  # twice a leg
    assert "Rerun: python -m sft_grid" in st.advice and "rerun_failed=true" in st.advice, st.advice
    assert "BeginTime" not in st.reason
    assert events.read(cell), "the ledger must stay readable"
    assert checkpoints(cell / "output"), "the checkpoints must stay"
    text = status_text(root)
    assert "time_limit" in text and "failed or cancelled, by class:" in text


def test_a_timed_out_cell_is_requeued_and_its_next_leg_resumes_from_the_checkpoint(limited):
    root = limited["one"]
    final(root)
    cell = the_cell(root)
    kinds = [e["event"] for e in training_events(cell)]
    assert "requeued" in kinds and kinds.count("running") == 2, kinds
    assert kinds.count("submitted") == 1, kinds  # requeued by the job itself, not submitted again
    resumed = [e for e in training_events(cell) if e["event"] == "resumed"]
    assert resumed, kinds
    step = int(resumed[-1]["checkpoint"].split("-")[1])
    # the trainer itself says where it picked up: the checkpoint's step, not step 0
    train_log = (cell / "logs" / "train.log").read_text()
    assert re.search(rf"Resuming training from checkpoint with epoch \d+ and global step {step}\b", train_log), (
        train_log[-2000:]
    )
    logged = [
        r["current_steps"]
        for r in map(json.loads, (cell / "output" / "trainer_log.jsonl").read_text().splitlines())
        if "loss" in r
    ]
    assert step + 1 in logged and logged[-1] > step, logged


def test_legs_that_never_reach_a_checkpoint_stop_as_a_time_limit_with_no_progress(limited):
    st = final(limited["futile"])
    kinds = [e["event"] for e in training_events(the_cell(limited["futile"]))]
    assert st.state is State.FAILED and st.failure_class is FailureClass.TIME_LIMIT, (st, kinds)
    assert "no progress" in st.reason and "save_steps=1250" in st.advice and "time=00:04:00" in st.advice, st
    assert kinds.count("running") == 2 and kinds.count("requeued") == 1, kinds
