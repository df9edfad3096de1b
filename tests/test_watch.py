"""`sft-grid status GRID --watch`: the table read again as the grid's jobs move (fake sbatch/sacct/squeue on PATH,
tests/fakeslurm.py), one sacct and one squeue per read, printed only when something changed when not on a
terminal, redrawn in place on one, ended by itself once nothing is under way; and left cleanly by Ctrl-C. A local
grid is watched from its ledgers and its jobs' processes."""

from __future__ import annotations

import io
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from sft_grid.cli.cmd_status import ALT_OFF, ALT_ON, HOME, Watch
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.paths import REPO_ROOT

from . import fakeslurm
from .helpers import wait_for
from .test_grid_decisions import cells, complete, fake, grid, job_of  # noqa: F401 (fixtures)

TITLE = "sft-grid status default"


@pytest.fixture
def fake_grid(request: pytest.FixtureRequest) -> tuple[Path, Any]:
    """tests/test_grid_decisions.py's fake Slurm directory and grid (by name: the imports stay unshadowed)."""
    return request.getfixturevalue("fake"), request.getfixturevalue("grid")


def start(sweep_dir: Path, tty: bool = False) -> tuple[Watch, io.StringIO, threading.Thread]:
    out = io.StringIO()
    watch = Watch(sweep_dir, interval=0.05, out=out, tty=tty, title=TITLE)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    return watch, out, thread


def tables(text: str) -> list[str]:
    """The tables a watch printed off a terminal, each after its `== <time>` line."""
    return [t.split("\n", 1)[1] for t in text.split("== ")[1:]]


def queries(fake_dir: Path) -> tuple[int, int]:
    return len(fakeslurm.calls(fake_dir, "sacct")), len(fakeslurm.calls(fake_dir, "squeue"))


def test_watch_reads_the_grid_once_per_refresh_prints_changes_and_ends_by_itself(fake_grid):
    slurm_dir, run_grid = fake_grid
    run_grid()
    sweep = run_grid.runs / "default"
    first, second, third = cells(run_grid.runs)
    before = queries(slurm_dir)
    watch, out, thread = start(sweep)
    wait_for(lambda: "3 cell(s): 3 submitted" in out.getvalue(), "the first table", 30, 0.02)
    fakeslurm.set_state(slurm_dir, job_of(first), "RUNNING")
    wait_for(lambda: "3 cell(s): 1 running, 2 submitted" in out.getvalue(), "the running cell", 30, 0.02)
    for cell in (first, second, third):
        complete(cell)  # the output first: a job that ended COMPLETED without it would be a failure
    fakeslurm.set_state(slurm_dir, "100", "COMPLETED")
    fakeslurm.set_state(slurm_dir, "101", "COMPLETED")  # the post array: nothing is under way any more
    thread.join(30)
    assert not thread.is_alive(), out.getvalue()[-2000:]
    text = out.getvalue()
    assert f"{TITLE}: the grid has ended" in text and "3 cell(s): 3 completed" in text
    # exactly one scheduler query (an sacct and an squeue) per read of the grid
    sacct, squeue = queries(slurm_dir)
    assert watch.refreshes >= 3 and (sacct - before[0], squeue - before[1]) == (watch.refreshes, watch.refreshes)
    # off a terminal, a table each time something changed, never the same one twice in a row
    printed = tables(text.split(f"\n{TITLE}:")[0])
    assert 3 <= len(printed) <= watch.refreshes
    assert all(a != b for a, b in itertools.pairwise(printed))
    assert ALT_ON not in text and HOME not in text


def test_watch_on_a_terminal_redraws_in_place_and_leaves_the_final_table(fake_grid):
    slurm_dir, run_grid = fake_grid
    run_grid(seeds=(1,))
    (cell,) = cells(run_grid.runs)
    complete(cell)
    fakeslurm.set_state(slurm_dir, "100", "COMPLETED")
    fakeslurm.set_state(slurm_dir, "101", "COMPLETED")
    watch, out, thread = start(run_grid.runs / "default", tty=True)
    thread.join(30)
    text = out.getvalue()
    assert watch.refreshes == 1 and text.startswith(ALT_ON + HOME) and f"{TITLE} --watch: every 0.05 s" in text
    screen, after = text.split(ALT_OFF)
    assert "1 cell(s): 1 completed" in screen and "1 cell(s): 1 completed" in after
    assert after.rstrip().endswith("the grid has ended (nothing queued, running, in post stages or evaluating)")


def test_watch_waits_for_the_post_stages_then_a_stop_leaves_it(fake_grid):
    slurm_dir, run_grid = fake_grid
    run_grid(seeds=(1,))
    (cell,) = cells(run_grid.runs)
    complete(cell, stages_done=False)
    fakeslurm.set_state(slurm_dir, "100", "COMPLETED")  # trained; its post job (101) still queued
    watch, out, thread = start(run_grid.runs / "default")
    wait_for(lambda: watch.refreshes >= 3, "three reads", 30, 0.02)
    assert thread.is_alive() and "tokenizer in post job 101 (pending)" in out.getvalue()
    watch.stop.set()
    thread.join(30)
    assert not thread.is_alive() and out.getvalue().rstrip().endswith("left the watch; the grid goes on without it")


def test_ctrl_c_leaves_the_watch_cleanly(fake_grid):
    _, run_grid = fake_grid
    run_grid(seeds=(1,))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sft_grid",
            "status",
            "default",
            "--runs-root",
            str(run_grid.runs),
            "--watch",
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        seen = ""
        while "cell(s):" not in seen:  # the first table is out: the watch is waiting for the next read
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            seen += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "left the watch; the grid goes on without it" in out


def test_watch_of_a_local_grid_lasts_while_its_job_runs(tmp_path: Path) -> None:
    """A local cell's job records `completed`, then runs its post stages and evaluation: the watch ends when the
    job's process does, read from the ledger alone (no scheduler)."""
    sweep = tmp_path / "default"
    cell = sweep / "tiny_llama_lr1e-05-0123abcd"
    cell.mkdir(parents=True)
    (cell / "cell.yaml").write_text("{}\n")
    job = subprocess.Popen(["sleep", "60"])
    try:
        pid, host = job.pid, socket.gethostname()
        events.append(cell, Event(Kind.SUBMITTED, executor="local", pid=pid, host=host))
        events.append(cell, Event(Kind.RUNNING, pid=pid, host=host))
        _, out, thread = start(sweep)
        wait_for(lambda: "1 cell(s): 1 running" in out.getvalue(), "the running cell", 30, 0.02)
        complete(cell)
        events.append(cell, Event(Kind.COMPLETED, pid=pid, host=host))
        wait_for(lambda: "1 cell(s): 1 completed" in out.getvalue(), "the completed cell", 30, 0.02)
        assert thread.is_alive()  # its job still runs (the post stages, the evaluation)
    finally:
        job.kill()
        job.wait()
    thread.join(30)
    assert not thread.is_alive() and f"{TITLE}: the grid has ended" in out.getvalue()


@pytest.mark.slurm
@pytest.mark.backend
def test_a_real_slurm_cell_is_watched_and_its_log_followed_until_it_ends(tmp_path: Path, tiny_assets: Path) -> None:
    """On the local Slurm cluster (about 20 s): `logs -f` prints the training log as the job writes it and ends with
    the training; `status --watch` ends by itself once the cell and its post job have."""
    from .conftest import run_sft
    from .helpers import cancel_jobs_of

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        run_sft(
            "model=tiny_llama",
            "global_batch_size=4",
            "micro_batch_size=2",
            "cluster=slurm_local",
            "max_steps=2",
            f"runs_root={tmp_path}",
            check=True,
        )
        follow = subprocess.Popen(
            [sys.executable, "-m", "sft_grid", "logs", "default", "tiny_llama", "-f", "--runs-root", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        watch = subprocess.run(
            [
                sys.executable,
                "-m",
                "sft_grid",
                "status",
                "default",
                "--runs-root",
                str(tmp_path),
                "--watch",
                "--interval",
                "1",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
        )
        out, err = follow.communicate(timeout=120)
    finally:
        cancel_jobs_of(tmp_path)
    assert watch.returncode == 0 and watch.stdout.rstrip().endswith(
        "the grid has ended (nothing queued, running, in post stages or evaluating)"
    ), watch.stderr
    printed = tables(watch.stdout)
    assert "1 cell(s): 1 completed" in printed[-1] and len(printed) >= 2  # it saw the cell before it completed
    assert follow.returncode == 0 and "=== sft_grid: " in out and "train_loss" in out, err
    assert err.rstrip().endswith("is completed; train.log ends here")
