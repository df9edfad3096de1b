"""The hang watch (sft_grid/job/hang.py), on real processes and files: what counts as progress (and what does not:
a log that only grows), the bound it keeps, the process tree it ends, the bounded wait for it (a process SIGKILL
cannot end) and the evidence it records. A real LLaMA-Factory training that stalls while its log keeps growing, and
one that is only slow, are in test_hang_training.py; a real two-node training that hangs on one rank in
test_triage_faults.py."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sft_grid.core.failures import Failure, FailureClass, RemedyKind, remedy_for
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


# tqdm's bar of a training's steps, as the HF Trainer draws it (a carriage return before each redraw)
def _bar(done: int, total: int = 120) -> str:
    return f"\r {done * 100 // total:3d}%|#         | {done}/{total} [00:{done:02d}<01:40,  1.20it/s]"


def test_every_kind_of_training_progress_restarts_the_clock(tmp_path, clock):
    cell = _cell(tmp_path)
    (cell / "logs" / "train.log").write_text("=== sft_grid: bash launch.sh\n")
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, startup_s=60.0))
    clock[0] += 59
    assert not watch.poll()
    clock[0] += 2
    assert watch.poll(), "61 s without progress is past a 60 s bound"
    progress_of = [
        lambda: _append(cell / "logs" / "train.log", _bar(1)),  # the training's bar moved
        lambda: _append(cell / "logs" / "train.log", _bar(2)),
        lambda: (cell / "logs" / "train.node1.log").write_text(_bar(3)),  # rank 0's bar, on another node
        lambda: _append(  # the data being tokenized (the data step), the weights being loaded
            cell / "logs" / "train.log",
            "Running tokenizer on dataset (num_proc=16):  45%|####5     | 4500/10000 [00:31<00:38, 143.21 examples/s]",
        ),
        lambda: _append(cell / "logs" / "train.log", "\nLoading checkpoint shards:  50%| 2/4 [1:02:03<?, ?it/s]"),
        lambda: _record(cell, 10),  # the trainer's step record
        lambda: (cell / "output" / "checkpoint-10").mkdir(),  # a checkpoint being saved
        lambda: (cell / "output" / "checkpoint-10" / "model.safetensors").write_bytes(b"0" * 10),
        lambda: (cell / "output" / "checkpoint-10" / "model.safetensors").write_bytes(b"0" * 20),
        lambda: (cell / "output" / "trainer_state.json").write_text("{}"),  # the final save
        lambda: (cell / "data_step.jsonl").write_text('{"event": "start"}\n'),  # the data step's record
    ]
    for i, change in enumerate(progress_of):
        change()
        assert not watch.poll(), f"change {i} is progress"
        clock[0] += 61
        assert watch.poll(), f"after change {i}, 61 s without another is past the bound"


# what a hung training's log keeps printing: none of it is progress
NOISE = [
    # NCCL's watchdog while a collective waits, with its counters and timestamps changing
    "[rank0]:[W1204 05:26:{i:02d}.{i:06d} ProcessGroupNCCL.cpp:1669] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog"
    " still waiting: WorkNCCL(SeqNum={i}, OpType=ALLREDUCE, NumelIn=202048, Timeout(ms)=1800000) ran for {i}000 ms\n",
    "n1:1234:1250 [0] NCCL INFO NET/Socket: retrying connection to 10.0.0.2<45678> (attempt {i})\n",
    # a retry loop counting its attempts the way a bar counts its steps, without a bar's timing
    "WARNING storage: read of /lustre/scratch/shard-00017.arrow timed out; retry {i}/1000 [backoff 0.5 s]\n",
    "Retrying (Retry(total={i}, connect=None, read=None, redirect=None, status=None)) after connection broken\n",
    # the training's bar drawn again where it stopped (a redraw moves nothing)
    _bar(17),
    # the runner's own start-up heartbeat
    "--- sft_grid: 2026-12-04T05:26:12 no output from the backend yet, 2.5 s after launch.sh started\n",
]


def test_a_log_that_grows_without_training_progress_is_still_hung(tmp_path, clock):
    """Log bytes alone never reset the clock: a rank hung in a collective while a watchdog, a retry loop or a warning
    keeps printing is ended at its bound, the same as a silent one."""
    cell = _cell(tmp_path)
    log = cell / "logs" / "train.log"
    log.write_text(f"[INFO] ***** Running training *****\n{_bar(16)}{_bar(17)}")
    (cell / "logs" / "train.node1.log").write_text(log.read_text())  # global rank 0's bar may be on either node
    _record(cell, 17)
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, startup_s=60.0))
    began = clock[0]
    for i in itertools.count():
        for line in NOISE:
            _append(log, line.format(i=i))
            _append(cell / "logs" / "train.node1.log", line.format(i=i))
        clock[0] += 5
        if watch.poll():
            break
    assert watch.silent() == clock[0] - began == 65, "no line of noise ever reset the clock"
    assert log.stat().st_size > 4000, "the log grew all along"
    # a flood larger than one read (the last READ_BYTES of it are read) hides neither noise nor a move
    _append(log, "NCCL WARN flooded\n" * (hang.READ_BYTES // 10))
    assert watch.poll(), "a flood of warnings is no progress"
    _append(log, "NCCL WARN flooded\n" * (hang.READ_BYTES // 10) + _bar(18))
    assert not watch.poll(), "the bar's move after the flood is progress"


def test_a_bar_cut_between_two_reads_counts_once(tmp_path, clock):
    cell = _cell(tmp_path)
    log = cell / "logs" / "train.log"
    log.write_text("")
    watch = hang.Watch(cell, hang.Bound(floor_s=60.0, startup_s=60.0))
    bar = _bar(5)
    _append(log, bar[:14])  # the file as the writer left it mid-bar
    clock[0] += 30
    assert not watch.poll() and watch.silent() == 30, "half a bar is not yet its move"
    _append(log, bar[14:])
    assert not watch.poll() and watch.silent() == 0, "the whole bar is"
    clock[0] += 30
    _append(log, "NCCL WARN a warning after the bar\n")
    assert not watch.poll() and watch.silent() == 30, "the bar read again with the new bytes is no second move"
    log.write_text(_bar(1))  # the log written anew (smaller than before): its bar is read from the start
    assert not watch.poll() and watch.silent() == 0


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
    assert text.startswith(
        "no training step, checkpoint file, data step record or progress bar move for 125 s (bound 120 s); "
        "last logged step 10"
    ), text
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
    first = remedy_for(failure, attempts_so_far=0)
    assert first.kind is RemedyKind.REQUEUE and "Requeued from the last checkpoint" in first.message
    spent = remedy_for(failure, attempts_so_far=2)
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
    """While the backend imports, the job's log gets a line at least every 2.5 s saying so and for how long;
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


# A FUSE file system whose server answers the kernel's greeting, then reads every request and answers none: a dead
# NFS or Lustre server as the client sees it. A process that touches it sleeps in the kernel; once it gets a signal,
# the request already read by the server, it waits uninterruptibly (D state) and SIGKILL cannot end it. The server
# dies with the test (PR_SET_PDEATHSIG); its death aborts the connection and frees every process stuck in it.
DEAD_FS = """
import ctypes, os, signal, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
fd = os.open("/dev/fuse", os.O_RDWR)
options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"sft_grid_dead_fs", sys.argv[1].encode(), b"fuse", 0, options) != 0:
    print("mount:", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
while True:
    request = os.read(fd, (1 << 20) + 4096)
    length, opcode, unique = struct.unpack_from("<IIQ", request)
    if opcode == 26:  # FUSE_INIT: protocol 7.31, and nothing else is ever answered
        readahead = struct.unpack_from("<I", request, 48)[0]
        init = struct.pack("<IIIIHHIIHHI", 7, 31, readahead, 0, 16, 12, 1 << 20, 1, 0, 0, 0) + bytes(28)
        os.write(fd, struct.pack("<IiQ", 16 + len(init), 0, unique) + init)
        print("mounted", flush=True)
"""


@pytest.fixture
def dead_fs(tmp_path):
    """A mounted file system that never answers (DEAD_FS); needs /dev/fuse and the right to mount (root)."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        pytest.skip("no /dev/fuse: a process in uninterruptible sleep needs a file system that never answers")
    mount = tmp_path / "dead"
    mount.mkdir()
    server = subprocess.Popen([sys.executable, "-c", DEAD_FS, str(mount)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    said = server.stdout.readline().strip()  # the server's word once the kernel greeted it: an event, no sleep
    if said != "mounted":
        server.kill()
        server.wait()
        pytest.skip(f"cannot mount a FUSE file system here ({said or 'the server ended'})")
    try:
        yield mount
    finally:
        server.kill()  # frees the processes stuck in it, before the mount is taken away
        server.wait()
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


# a training whose launcher (exec'd by launch.sh, as the real launch.sh execs the backend) and its rank (in a session
# of its own, as torchrun starts it) each read the dead file system: they are silent, then past the bound are killed
STUCK_TREE = """
import os, subprocess, sys
mount, pids = sys.argv[1], sys.argv[2]
rank = subprocess.Popen([sys.executable, "-c", f"import os; os.stat({mount + '/shard-1'!r})"], start_new_session=True)
with open(pids, "w") as fh:
    fh.write(f"{os.getpid()} {rank.pid}")
os.stat(mount + "/shard-0")
"""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_a_process_that_survives_its_sigkill_does_not_hold_the_runner(tmp_path, dead_fs, monkeypatch):
    """run_cell on a training whose processes sleep uninterruptibly in a dead file system's read (D state: SIGKILL
    ends them only when the read returns, here never): the runner ends the hang, waits REAP_S for them and no longer
    (the unbounded wait held the job to its wall time), then records the hang naming each process left behind, its
    pid and /proc's state, in the ledger and the training's log."""
    import yaml

    from sft_grid.job.runner import CellFailed, run_cell

    from .helpers import ledger

    monkeypatch.setattr(hang, "REAP_S", 2.0)
    cell = tmp_path / "cell"
    cell.mkdir()
    # the start-up bound leaves the stuck tree time to start and write its pids on a loaded machine (at 1 s the hang
    # was called before it had: the python of a shared CI core can take longer than that to start)
    config = {"backend": {"name": "llamafactory"}, "cluster": {"hang_after_s": 1, "hang_startup_s": 15}}
    (cell / "cell.yaml").write_text(yaml.safe_dump(config))
    pids = tmp_path / "pids"
    (tmp_path / "stuck.py").write_text(STUCK_TREE)
    (cell / "launch.sh").write_text(f"exec {sys.executable} {tmp_path / 'stuck.py'} {dead_fs} {pids}\n")
    raised: list[BaseException] = []

    def run() -> None:
        try:
            run_cell(cell)
        except BaseException as exc:
            raised.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    written = wait_for(lambda: (pids.is_file() and pids.read_text().split()) or raised, "the training's pids", 120)
    assert not raised, raised
    launcher, rank = (int(p) for p in written)
    # the bounds (15 s to start, a poll every 1 s) and REAP_S (2 s), with room for a slow machine; the old wait never
    # returned
    runner.join(120)
    assert not runner.is_alive(), "the runner still waits for a process it killed"
    assert [type(e) for e in raised] == [CellFailed], raised
    message = str(raised[0])
    assert message.startswith("hang: no training progress") and "not reaped 2 s after SIGKILL" in message, message
    # both were still there, in uninterruptible sleep, when the runner went on
    assert (_state(launcher), _state(rank)) == ("D", "D")
    (failed,) = [e for e in ledger(cell) if e["event"] == "failed"]
    assert failed["class"] == "hang" and failed["action"] == "requeue", failed
    assert "rc" not in failed, failed  # the launcher was never reaped: no exit status to record
    for pid in (launcher, rank):
        assert f"pid {pid} (python" in failed["evidence"] and f"pid {pid} (python" in failed["reason"], failed
    assert failed["evidence"].count(") D (disk sleep)") == 2, failed["evidence"]
    assert {(s["pid"], s["state"]) for s in failed["unreaped"]} == {
        (launcher, "D (disk sleep)"),
        (rank, "D (disk sleep)"),
    }
    log = (cell / "logs" / "train.log").read_text()
    assert "no training progress for" in log and f"not reaped 2 s after SIGKILL, left behind: pid {launcher}" in log


# a tracer that attaches to a process (as gdb does to a hung rank) and never waits for it: the process's exit is
# reported to its tracer first, so its parent cannot reap it until the tracer waits, detaches or dies
TRACER = """
import ctypes, sys, time
if ctypes.CDLL(None, use_errno=True).ptrace(16, int(sys.argv[1]), None, None) != 0:  # PTRACE_ATTACH
    print("ptrace:", ctypes.get_errno(), flush=True)
    sys.exit(1)
print("attached", flush=True)
time.sleep(3600)
"""


def test_the_wait_for_a_killed_training_that_cannot_be_reaped_ends_at_its_bound(tmp_path):
    """end(): a killed training process that a debugger holds (attached and not waiting: its exit goes to the
    debugger, and the parent's wait never sees it) is waited for `within_s`, then named with /proc's state."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    tracer = subprocess.Popen([sys.executable, "-c", TRACER, str(proc.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert tracer.stdout is not None
        said = tracer.stdout.readline().strip()
        if said != "attached":
            pytest.skip(f"cannot attach a tracer here ({said or 'it ended'})")
        began = time.monotonic()
        stuck = hang.end(proc, within_s=1.0)
        took = time.monotonic() - began
        assert 1.0 <= took < 30, took
        assert proc.returncode is None
        assert [(s.pid, s.state) for s in stuck] == [(proc.pid, "Z (zombie)")], stuck
        assert stuck[0].text().startswith(f"pid {proc.pid} (python")
    finally:
        tracer.kill()
        tracer.wait()
        hang.kill_tree(proc.pid)
    assert proc.wait(60) == -9  # once the tracer is gone, its parent reaps it
