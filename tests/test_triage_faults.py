"""Real faults, each ending with the right class, evidence and next step, and nothing lost (the checkpoints and
the ledger stay readable).

On the local Slurm cluster (scripts/slurm_up.sh: memory is a consumable resource, a step over its --mem is
killed as cgroups would on a real site): a host out of memory under a memory limit, one rank of a two-node job
killed (a transient fault: requeued at once, from its checkpoint, and completed), one rank of a two-node job that
stops making progress (a hang: ended by the job's runner at its bound, requeued and completed), a full disk (a
small tmpfs as the runs root) and a user's scancel. The node set down mid-job is in test_slurm_faults.py, the time
limits in test_time_limits.py. Locally, on both backends: a loss blown up by a huge learning rate on a tiny model,
stopped by the loss watchdog.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from sft_grid.core import events
from sft_grid.core.layout import checkpoints, iter_cell_dirs
from sft_grid.core.state import CellState, State

from .conftest import run_sft
from .helpers import LONG_TRAINING, cancel_jobs_of, ledger, triaged_states

pytestmark = [pytest.mark.backend]
slurm = pytest.mark.slurm

T = TypeVar("T")
LONG = LONG_TRAINING  # long enough to be caught
WAIT_S = 1800  # CI's shared 2-core machine can be several times slower than a workstation
# the hang test's bound once the leg trains (its steps take well under a second; a checkpoint's files count as
# progress); before its first step the start-up bound (cluster.hang_startup_s, 1800 s) covers the imports (72 s
# of silence measured here, busy). A minute: far above a step's gap even on a machine several times slower, and a
# minute of CI's time instead of two
HANG_AFTER_S = 60
# a failure its policy requeues is submitted again by its job's batch script (job/after.py) within seconds of the
# step's end: ten minutes without it is a lost requeue, not a slow machine
REQUEUE_WAIT_S = 600


def wait_for(probe: Callable[[], T | None], what: str, deadline_s: float = WAIT_S) -> T:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")


def the_cell(root: Path) -> Path:
    (cell,) = iter_cell_dirs(root / "default")
    return cell


def final(root: Path, deadline_s: float = WAIT_S) -> CellState:
    """The cell's state once it ended, as `status` shows it (the scheduler's ends triaged). A failure its policy
    requeues is not an end; one left unrequeued for REQUEUE_WAIT_S (its job ended and nothing submitted it again)
    fails at once, instead of at the deadline."""
    cell = the_cell(root)
    waiting: list[float] = []  # since when the cell has waited for its requeue

    def ended() -> CellState | None:
        st = triaged_states([cell])[cell]
        if st.state is State.FAILED and st.action == "requeue":
            waiting[:] = waiting or [time.monotonic()]
            assert time.monotonic() - waiting[0] < REQUEUE_WAIT_S, f"never requeued: {st}"
            return None
        waiting.clear()
        return st if st.state in (State.COMPLETED, State.FAILED, State.CANCELLED) else None

    return wait_for(ended, f"{cell.name} to end", deadline_s)


def status_text(root: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def assert_nothing_lost(cell: Path, expect_checkpoints: bool = True) -> None:
    assert events.read(cell), "the ledger must stay readable"
    if expect_checkpoints:
        assert checkpoints(cell / "output"), "the checkpoints must stay"


def training(root: Path) -> CellState:
    """Wait until the cell's training runs and has written a checkpoint."""

    def probe() -> CellState | None:
        cells = list(iter_cell_dirs(root / "default"))
        if not cells:
            return None
        st = triaged_states(cells)[cells[0]]
        return st if st.state is State.RUNNING and checkpoints(cells[0] / "output") else None

    return wait_for(probe, "the cell training with a first checkpoint", 600)


@pytest.fixture
def roots(tmp_path: Path, tiny_assets: Path) -> Iterator[Callable[[str], Path]]:
    made: list[Path] = []

    def make(name: str) -> Path:
        root = tmp_path / name
        root.mkdir()
        made.append(root)
        return root

    yield make
    for root in made:
        cancel_jobs_of(root)


@slurm
def test_host_out_of_memory_under_a_memory_limit(roots):
    root = roots("oom")
    # 200 MB: less than a python with torch imported holds, so the cell's job goes over it at once. sbatch_extra is
    # every job's (a tokenize-once job would be killed first, and the cell never start): the cell tokenizes itself
    run_sft(
        *LONG,
        "cluster=slurm_local",
        "+cluster.sbatch_extra.mem=200M",
        "tokenize_once=false",
        f"runs_root={root}",
        check=True,
    )
    st = final(root, 600)
    assert st.state is State.FAILED and st.failure_class == "host_oom", st
    assert "memory limit" in st.evidence, st.evidence
    assert st.action == "stop" and "host memory" in st.advice, st
    assert_nothing_lost(the_cell(root), expect_checkpoints=False)


def _rank_pid(cell: Path, rank: str) -> int | None:
    """The training process of this global rank for this cell (both nodes are processes on this machine)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (
            f"RANK={rank}".encode() in env
            and str(cell).encode() in cmdline
            and b"sft_grid_lf.py" in cmdline
            and b"LOCAL_RANK=0" in env
        ):
            return int(pid)
    return None


def _two_node_cell_training(root: Path, *overrides: str) -> tuple[Path, int]:
    """A tiny two-node cell (120 steps, a checkpoint every 10) queued on the local cluster and training: its
    directory, and the pid of rank 1's training process (on the second node) to fault."""
    run_sft(
        "model=tiny_llama",
        "max_steps=120",
        "save_steps=10",
        "global_batch_size=8",
        "micro_batch_size=1",
        "scheduler=constant",
        "nodes=2",
        "cluster=slurm_local",
        f"runs_root={root}",
        *overrides,
        check=True,
    )
    training(root)
    cell = the_cell(root)
    return cell, wait_for(lambda: _rank_pid(cell, "1"), "rank 1's training process", 600)


@slurm
def test_one_rank_of_a_two_node_job_killed_is_requeued_from_its_checkpoint_and_completes(roots):
    root = roots("rank")
    # the peers' collective timeout bounded (the Trainer's ddp_timeout, 1800 s by default): whether the surviving
    # rank learns of the loss from srun ending the step or from its own collective timing out, the cell ends soon
    cell, pid = _two_node_cell_training(root, "+extra.ddp_timeout=120")
    os.kill(pid, 9)
    st = final(root)
    history = ledger(cell)
    failed = [e for e in history if e["event"] == "failed"]
    assert failed and failed[0]["action"] == "requeue", history
    assert failed[0]["class"] in ("collective_timeout", "rendezvous"), failed[0]
    requeued = [e for e in history if e["event"] == "submitted" and e.get("note", "").startswith("requeue: ")]
    assert requeued, history  # submitted again by the policy, not by a person
    # ... by the job's batch script once srun had ended the step (the step, being killed, only recorded it)
    said = (cell / "logs" / "after_step.log").read_text()
    assert re.search(rf"job {failed[0]['job_id']}: \S+: requeued after \w+: queued as job \d+", said), said
    assert st.state is State.COMPLETED, (st, [e["event"] for e in history])
    assert any(e["event"] == "resumed" for e in history[history.index(requeued[0]) :]), history


@slurm
def test_a_rank_that_hangs_is_ended_as_a_hang_and_requeued_from_its_checkpoint_and_completes(roots):
    root = roots("hang")
    # a small bound for the test (the site's default is 900 s); the Trainer's own collective timeout (LLaMA-Factory:
    # 180000000 s) never fires
    cell, pid = _two_node_cell_training(root, f"cluster.hang_after_s={HANG_AFTER_S}")
    # rank 1 stops making progress (frozen, as a rank stuck in a read or a kernel is): rank 0 waits in its next
    # collective, and neither writes a line or a step again
    os.kill(pid, signal.SIGSTOP)
    try:
        hung = wait_for(lambda: [e for e in ledger(cell) if e["event"] == "failed"], "the hang to be recorded")
        st = final(root)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    history = ledger(cell)
    first = hung[0]
    assert first["class"] == "hang" and first["action"] == "requeue", first
    assert first["silent_s"] >= first["bound_s"] >= HANG_AFTER_S, first
    # the evidence: how long it was silent, the last step the trainer logged, each node's last line
    assert first["evidence"].startswith(
        "no training step, checkpoint file, data step record or progress bar move for "
    ), first["evidence"]
    assert first["step"] >= 10 and f"last logged step {first['step']} of 120" in first["evidence"], first
    # the training's bar: drawn by global rank 0 only, on whichever node the rendezvous made it (torchrun's c10d
    # assigns node ranks by arrival, so it is node 1 about as often as node 0: a CI flake while this said node 0).
    # It shows the last step the trainer logged, give or take one: one ahead when the rank froze after the step
    # and before its log line (the Trainer gathers the loss to log it: a collective), one behind when that line's
    # redraw of the bar had not reached the file (srun passes a task's output on by lines, the bar is redrawn with a
    # carriage return only) and tqdm's rate limit skipped the bar's own update of the step
    bars = [r for r in first["ranks"] if r["step"] is not None]
    assert len(bars) == 1, first["evidence"]
    (bar,) = bars
    assert f"node {bar['node']} ({bar['log']}, bar at step {bar['step']})" in first["evidence"], first["evidence"]
    assert abs(bar["step"] - first["step"]) <= 1, first["evidence"]
    assert "node 1 (logs/train.node1.log" in first["evidence"], first["evidence"]
    assert [r["node"] for r in first["ranks"]] == [0, 1] and all(r["last_line"] for r in first["ranks"]), first
    assert "Requeued from the last checkpoint" in first["note"], first
    # the job ended by the watch, not by its time limit (4 h): submitted again by the policy, resumed, completed
    requeued = [e for e in history if e["event"] == "submitted" and e.get("note", "").startswith("requeue: ")]
    assert requeued, history
    assert st.state is State.COMPLETED, (st, [e["event"] for e in history])
    assert any(e["event"] == "resumed" for e in history[history.index(requeued[0]) :]), history
    assert not any(e["event"] == "failed" and e.get("class") == "time_limit" for e in history), history


@slurm
def test_a_full_disk_stops_the_cell_and_keeps_what_it_wrote(roots, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], check=True)
    try:
        root = mount / "runs"
        root.mkdir()
        # a checkpoint every step: the tmpfs fills after a few
        run_sft(
            "model=tiny_llama",
            "max_steps=400",
            "save_steps=1",
            "global_batch_size=4",
            "micro_batch_size=2",
            "cluster=slurm_local",
            f"runs_root={root}",
            check=True,
        )
        st = final(root, 900)
        assert st.state is State.FAILED and st.failure_class == "disk_full", st
        # torch.save's own error (its stream failed) or, where the log could not grow either, the file system's
        assert re.search(r"No space left on device|Errno 28|iostream error", st.evidence), st.evidence
        assert st.action == "stop" and "free space" in st.advice, st
        assert_nothing_lost(the_cell(root))
    finally:
        cancel_jobs_of(mount / "runs")
        subprocess.run(["umount", "-l", str(mount)], check=False)


@slurm
def test_a_users_scancel_is_cancelled_not_failed(roots):
    root = roots("scancel")
    run_sft(*LONG, "cluster=slurm_local", f"runs_root={root}", check=True)
    st = training(root)
    subprocess.run(["scancel", st.job_id], check=True)
    st = final(root, 300)
    assert st.state is State.CANCELLED and st.failure_class == "cancelled", st
    assert "CANCELLED" in st.evidence, st
    assert_nothing_lost(the_cell(root))
    skipped = run_sft(*LONG, "cluster=slurm_local", f"runs_root={root}", check=True)
    assert "0 to run" in skipped.stdout and "cancelled (1)" in skipped.stdout, skipped.stdout


@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_a_diverging_loss_is_stopped_by_the_watchdog_in_both_backends(tmp_path, tiny_assets, backend, request):
    if backend == "axolotl":
        request.getfixturevalue("axolotl_env")
    root = tmp_path / "runs"
    proc = run_sft(
        "model=tiny_llama",
        f"backend={backend}",
        "lr=1",
        "max_steps=40",
        "save_steps=1",
        "global_batch_size=2",
        "micro_batch_size=2",
        "scheduler=constant",
        f"runs_root={root}",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cell = the_cell(root)
    st = triaged_states([cell])[cell]
    assert st.state is State.FAILED and st.failure_class in ("diverged", "nan_loss"), st
    assert st.evidence.startswith("watchdog.json: rule="), st.evidence
    assert st.action == "stop" and "lr=0.1" in st.advice, st.advice  # a tenth of the cell's own lr
    assert st.progress.step is not None and st.progress.step < 40  # stopped early, not trained on
    out = cell / "output"
    assert not (out / "model.safetensors").exists() and not (out / "trainer_state.json").exists()  # never completed
    verdict = json.loads((out / "watchdog.json").read_text())
    assert (out / "checkpoint-1" / "model.safetensors").is_file()  # what was saved before the trigger stays
    assert not (out / f"checkpoint-{verdict['step']}").exists()  # nothing saved after it
    log = (cell / "logs" / "train.log").read_text()
    assert f"sft_grid watchdog: {verdict['class']} at step {verdict['step']}" in log
    if backend == "axolotl":
        assert "Plugin loaded successfully: loss_watchdog.LossWatchdogPlugin" in log
    assert "failed, by class" in proc.stderr and st.failure_class in proc.stderr
