"""The hang watch (sft_grid/job/hang.py), on real processes and files: the silence it measures, the bound it keeps,
the process tree it ends and the evidence it records. The whole path on a real two-node training that hangs on
one rank is in test_triage_faults.py."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sft_grid.core.failures import Failure, FailureClass, RemedyKind, decide
from sft_grid.job import hang

from .helpers import wait_for


def _cell(tmp_path: Path) -> Path:
    cell = tmp_path / "cell"
    (cell / "logs").mkdir(parents=True)
    (cell / "output").mkdir()
    return cell


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped


# a training's shape: a launcher that starts its rank in a session of its own (as torchrun does), then both
# are silent forever
SILENT_TREE = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(rank.pid))
time.sleep(3600)
"""


def test_a_silent_training_is_ended_whole_past_its_bound(tmp_path):
    cell = _cell(tmp_path)
    pid_file = tmp_path / "rank.pid"
    proc = subprocess.Popen([sys.executable, "-c", SILENT_TREE, str(pid_file)])
    try:
        rank = int(wait_for(lambda: pid_file.is_file() and pid_file.read_text(), "the rank to start", 120))
        hung = hang.wait(proc, cell, hang.Bound(floor_s=1.0, startup_s=1.0))
    finally:
        hang.kill_tree(proc.pid)
    assert hung is not None and hung.silent_s > hung.bound_s == 1.0, hung
    assert proc.returncode == -9
    # the rank in its own session is ended too, not left to its peers' collectives
    wait_for(lambda: not _alive(rank), "the rank to be gone", 60)


def test_a_training_that_ends_by_itself_is_not_touched(tmp_path):
    cell = _cell(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert hang.wait(proc, cell, hang.Bound(floor_s=600.0)) is None
    assert proc.returncode == 3


@pytest.fixture
def clock(monkeypatch):
    """The watch's clock, moved by the test: what counts is how long the files stayed the same, not how fast the
    machine is."""
    now = [1000.0]
    monkeypatch.setattr(hang.time, "monotonic", lambda: now[0])
    return now


def _record(cell: Path, step: int) -> None:
    with (cell / "output" / "trainer_log.jsonl").open("a") as fh:
        fh.write(json.dumps({"current_steps": step, "total_steps": 100, "loss": 1.0}) + "\n")


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def test_every_kind_of_progress_restarts_the_silence(tmp_path, clock):
    cell = _cell(tmp_path)
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, startup_s=60.0))
    clock[0] += 59
    assert not watch.poll()
    clock[0] += 2
    assert watch.poll(), "61 s without a change is past a 60 s bound"
    progress_of = [
        lambda: (cell / "logs" / "train.log").write_text("a line\n"),
        lambda: (cell / "logs" / "train.node1.log").write_text("another node's line\n"),
        lambda: _append(cell / "logs" / "train.log", "\r 2/120 ["),  # a progress bar's update
        lambda: _record(cell, 10),
        lambda: (cell / "output" / "checkpoint-10").mkdir(),
        lambda: (cell / "output" / "checkpoint-10" / "model.safetensors").write_bytes(b"0" * 10),
        lambda: (cell / "output" / "checkpoint-10" / "model.safetensors").write_bytes(b"0" * 20),
        lambda: (cell / "data_step.jsonl").write_text('{"event": "start"}\n'),
    ]
    for i, change in enumerate(progress_of):
        change()
        assert not watch.poll(), f"change {i} is progress"
        clock[0] += 61
        assert watch.poll(), f"after change {i}, 61 s without another is past the bound"


def test_the_bound_grows_with_the_cells_own_time_between_logged_steps(tmp_path, clock):
    cell = _cell(tmp_path)
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, multiple=10.0, startup_s=120.0))
    assert watch.limit() == 120.0  # no step yet: the start-up bound
    for step in (10, 20, 30, 40):  # the first record is left out (it includes the start): gaps of 100 s after it
        _record(cell, step)
        watch.poll()
        clock[0] += 100 if step > 10 else 500
    assert watch.step_interval() == 100.0
    assert watch.limit() == 1000.0  # 10 x 100 s, above the floor
    clock[0] += 900
    assert not watch.poll(), "silent for 1000 s, within 10 x its own 100 s between logged steps"
    assert hang.Watch(cell, hang.Bound(floor_s=60.0), factor=2.0).limit() == 3600.0  # the other nodes' backstop


def test_before_the_legs_first_step_the_startup_bound_holds(tmp_path, clock):
    cell = _cell(tmp_path)
    _record(cell, 30)  # an earlier leg's last record: this leg resumes from its checkpoint
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, startup_s=600.0))
    (cell / "logs" / "train.log").write_text("loading the model\n")
    clock[0] += 1
    assert not watch.poll() and watch.limit() == 600.0  # the earlier leg's step is no step of this one
    clock[0] += 599
    assert not watch.poll(), "600 s of silence at start-up is within its bound"
    clock[0] += 2
    assert watch.poll(), "past the start-up bound"
    _record(cell, 31)  # this leg's first step: from now on the floor
    assert not watch.poll() and watch.started() and watch.limit() == 60.0
    clock[0] += 61
    assert watch.poll()


def test_the_bound_from_a_cells_config():
    given = {"cluster": {"hang_after_s": 120, "hang_multiple": 4, "hang_startup_s": 300}}
    assert hang.Bound.of(given) == hang.Bound(120.0, 4.0, 300.0)
    assert hang.Bound.of({}) == hang.Bound(900.0, 10.0, 1800.0)  # a cell rendered before the keys existed
    off = hang.Bound.of({"cluster": {"hang_after_s": None}})
    assert off.seconds(100.0) is None  # null: no watch


def test_the_evidence_names_the_last_step_and_each_nodes_last_line(tmp_path):
    cell = _cell(tmp_path)
    bar = "\r".join(f" {i}/100 [00:{i:02d}<01:40,  1.2it/s]" for i in range(1, 18))
    shards = "Writing model shards: 100%|##########| 1/1 [00:00<00:00, 83.74it/s]"  # a bar, but not the training's
    (cell / "logs" / "train.log").write_text(f"[INFO] loading\n{{'loss': 2.31, 'epoch': 0.1}}\n{bar}\n{shards}\n")
    (cell / "logs" / "train.node1.log").write_text("[INFO|trainer.py] ***** Running training *****\n\n")
    _record(cell, 10)
    text, details = hang.evidence(cell, hang.Hung(silent_s=125.4, bound_s=120.0))
    assert text.startswith("no training step, log line or checkpoint file for 125 s (bound 120 s)"), text
    assert "last logged step 10 of 100" in text
    assert f"node 0 (logs/train.log, bar at step 17): {shards!r}" in text, text
    assert "node 1 (logs/train.node1.log): '[INFO|trainer.py] ***** Running training *****'" in text, text
    assert details["ranks"] == [
        {"node": 0, "log": "logs/train.log", "last_line": shards, "step": 17},
        {
            "node": 1,
            "log": "logs/train.node1.log",
            "last_line": "[INFO|trainer.py] ***** Running training *****",
            "step": None,
        },
    ]
    assert (details["silent_s"], details["bound_s"]) == (125, 120)


def test_a_hang_is_requeued_from_its_checkpoint_by_default_within_its_budget():
    failure = Failure(
        klass=FailureClass.HANG, evidence="no training step ...", nodes=(), summary="hung", step=12, total=120
    )
    first = decide(failure, attempts_so_far=0)
    assert first.kind is RemedyKind.REQUEUE and "Requeued from the last checkpoint" in first.message
    spent = decide(failure, attempts_so_far=2)
    assert spent.kind is RemedyKind.STOP and "check the cluster's health" in spent.message


def test_the_runner_ends_a_hung_training_and_records_a_hang_to_requeue(tmp_path):
    """run_cell (python -m sft_grid.job) on a cell whose launch.sh starts a process that prints a line, then hangs:
    the job ends it at the bound, and the ledger says `hang`, with its evidence and the requeue."""
    import yaml

    from sft_grid.job.runner import CellFailed, run_cell

    from .helpers import ledger

    cell = tmp_path / "cell"
    cell.mkdir()
    # a bound below the schema's floor (10 s), which only a cell written by hand can hold: the test stays short
    config = {"backend": {"name": "llamafactory"}, "cluster": {"hang_after_s": 1, "hang_startup_s": 1}}
    (cell / "cell.yaml").write_text(yaml.safe_dump(config))
    pid_file = tmp_path / "sleeper.pid"
    (cell / "launch.sh").write_text(f"echo 'loading the model'\nsleep 3600 &\necho $! > {pid_file}\nwait\n")
    with pytest.raises(CellFailed, match=r"^hang: no training progress"):
        run_cell(cell)
    (failed,) = [e for e in ledger(cell) if e["event"] == "failed"]
    assert failed["class"] == "hang" and failed["action"] == "requeue", failed
    assert "node 0 (logs/train.log): 'loading the model'" in failed["evidence"], failed["evidence"]
    assert "no step logged" in failed["evidence"] and failed["bound_s"] == 1, failed
    assert "Requeued from the last checkpoint (requeue 1 of 2 for hang)" in failed["note"], failed
    wait_for(lambda: not _alive(int(pid_file.read_text())), "the hung process to be gone", 60)


# a backend that is silent until it is told to speak (its imports), then writes a line and ends
QUIET_THEN_SPEAK = "import sys; sys.stdin.readline(); print('backend: first line', flush=True)"


def _beats(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "no output from the backend yet" in line]


def test_the_jobs_log_hears_the_backend_start_until_its_first_line(tmp_path, monkeypatch):
    """Issue 28: while the backend imports, the job's log gets a line at least every 2.5 s saying so and for how long;
    the backend's own first line ends them. (Every 0.5 s here: the test waits for two of them.)"""
    monkeypatch.setattr(hang, "BEAT_S", 0.5)
    cell = _cell(tmp_path)
    log = cell / "logs" / "train.log"
    log.write_text("=== sft_grid: bash launch.sh\n")
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", QUIET_THEN_SPEAK], stdin=subprocess.PIPE, stdout=fh)
    ended: list[hang.Hung | None] = []
    waiter = threading.Thread(target=lambda: ended.append(hang.wait(proc, cell, hang.Bound(900.0), log_file=log)))
    waiter.start()
    try:
        wait_for(lambda: len(_beats(log)) >= 2, "two heartbeat lines in the job's log", 120, interval=0.1)
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        waiter.join(120)
    finally:
        hang.kill_tree(proc.pid)
    assert ended == [None] and proc.returncode == 0
    lines = log.read_text().splitlines()
    beats = _beats(log)
    # what the mechanism said: its own times, each at most BEAT_S (+ a poll) after the one before
    said = [float(line.split(", ")[1].split(" s ")[0]) for line in beats]
    assert said[0] <= hang.BEAT_S + 1.0 and all(0 < b - a <= hang.BEAT_S + 1.0 for a, b in itertools.pairwise(said))
    first = lines.index("backend: first line")
    assert all(lines.index(b) < first for b in beats)  # none after the backend spoke
    assert len(_beats(log)) == len(beats)
    # the triage reads one attempt: the heartbeats do not start attempts as the runner's own header does
    from sft_grid.core.failures.lines import split_attempts

    assert len(split_attempts(log.read_text())) == 1


def test_the_start_heartbeat_does_not_hide_a_backend_hung_in_its_imports(tmp_path, monkeypatch):
    """The heartbeat's own lines are not progress: a backend silent past its start-up bound is still ended."""
    monkeypatch.setattr(hang, "BEAT_S", 0.5)
    cell = _cell(tmp_path)
    log = cell / "logs" / "train.log"
    log.write_text("=== sft_grid: bash launch.sh\n")
    with log.open("ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", QUIET_THEN_SPEAK], stdin=subprocess.PIPE, stdout=fh)
    try:
        hung = hang.wait(proc, cell, hang.Bound(floor_s=2.0, startup_s=2.0), log_file=log)
    finally:
        hang.kill_tree(proc.pid)
    assert hung is not None and hung.bound_s == 2.0, hung
    assert len(_beats(log)) >= 2  # it wrote its lines meanwhile, each a change of the log
