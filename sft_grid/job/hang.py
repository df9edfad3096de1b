"""A hung cell noticed while it hangs: the job's runner watches its training's progress and ends it.

A rank stuck in a collective (or in a read that never returns) leaves its peers waiting in theirs, and a
backend's own collective timeout is often hours or never fires: the job would burn its whole wall time. The
runner (the process that starts launch.sh and waits for it) needs no channel into the training: it reads what
the training writes, the same for both backends and every launcher. Only the training's own progress counts:

- a new record in the trainer's per-step log (output/trainer_log.jsonl: LLaMA-Factory writes it, sft_grid's
  axolotl plugin the same lines), one every `logging_steps` steps;
- a checkpoint: a new file in output/, or the newest checkpoint-N's files appearing or growing while it is saved;
- the data step (the backend's tokenize or load of the training data): its record in data_step.jsonl as each
  process starts and ends it;
- a progress bar that moved, in any node's log: tqdm's bar of the training's steps (drawn each step, by global
  rank 0), of the data being tokenized, of the weights being loaded, of an evaluation. A bar is a position with
  tqdm's timing (" 12/120 [00:31<04:50"); the same position drawn again, or a count in a line of text
  ("attempt 3/10 [...]"), is no move.

A log's growth alone is not progress: a rank hung in a collective while NCCL's watchdog, a retry loop or a warning
keeps printing is still hung. When nothing above happened for longer than the bound, the training's whole process
tree is killed (torchrun starts its ranks in sessions of their own, so one process group is not enough). The bound
is the site's `cluster.hang_after_s` (900 s by default: longer than the longest wait of a healthy run between two
steps, saving a ZeRO-3 checkpoint), or `cluster.hang_multiple` (10) times the cell's own time between two logged
steps as this watch saw them, when that is longer (a slow cell is not hung). Before the leg's first logged step,
`cluster.hang_startup_s` (1800 s): imports from a cold shared file system, loading a large model and the rendezvous
move no bar for minutes (measured on the local cluster, busy: 72 s of imports).

The killed processes are waited for, within REAP_S: a rank in uninterruptible sleep (D state: a read from a dead
NFS or Lustre server, a driver call that never returns) is not ended by SIGKILL until the call returns, and a wait
without a bound would keep the job to its wall time. Past REAP_S the runner goes on without it, naming each such
process (its pid, /proc's state and the kernel function it sleeps in) in the cell's log and in the hang's
evidence, and exits: Slurm then ends the step (and drains a node whose processes it cannot kill), and the
policy's requeue goes on. Node 0 records the failure `hang` with its evidence (how long nothing progressed, the
last step, each node's last line and the step its progress bar last showed) and the policy's next step (a requeue
from the last checkpoint by default). The other nodes watch too, with twice the bound, as a backstop: when node
0's task fails, srun ends theirs (--kill-on-bad-exit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sft_grid.core.layout import (
    DATA_STEP_FILE,
    LOGS_DIR,
    OUTPUT_DIR,
    TRAIN_LOG,
    TRAINER_LOG,
    checkpoints,
    progress,
    tail_lines,
)
from sft_grid.core.state import proc_stat

log = logging.getLogger(__name__)

# a progress bar's position, as tqdm draws it: " 12/120 [00:31<04:50, ..."
_BAR = re.compile(r"(\d+)/(\d+) \[")
# ... with tqdm's elapsed<remaining after it ("[00:31<04:50", "[1:02:03<?"): what makes a count a bar's move
_MOVE = re.compile(rb"(\d+)/(\d+) \[(?:\d+:)?\d+:\d+<")
OWN = "--- sft_grid:"  # starts the runner's own lines in the training's log ("=== sft_grid:" starts an attempt)
LINE_CHARS = 160  # of each node's last line in the evidence (the ledger keeps 500 characters of it)
BEAT_S = 2.5  # the job's log hears at least this often while the backend starts (at most 3 s silent)
READ_BYTES = 1 << 20  # of a log's new bytes at one poll, the last ones: a log flooded with warnings is not read whole
OVERLAP = 256  # bytes read again before a log's new ones: a bar cut by the previous read is seen whole
REAP_S = 60.0  # how long the killed training's processes are waited for (a large process frees its memory in seconds)


@dataclass(frozen=True)
class Bound:
    """How long a training may go without progress: the site's floor, or a multiple of its own time between logged
    steps."""

    floor_s: float | None  # None: no watch
    multiple: float = 10.0
    startup_s: float = 1800.0  # before the training's first step of this leg

    @classmethod
    def of(cls, cell_config: dict[str, Any]) -> Bound:
        """From cell.yaml's cluster section (cluster.hang_after_s, hang_multiple, hang_startup_s); a cell rendered
        by an earlier version has none of them and gets the schema's defaults."""
        cluster = cell_config.get("cluster") or {}
        floor = cluster.get("hang_after_s", 900)
        return cls(
            None if floor is None else float(floor),
            float(cluster.get("hang_multiple") or 10.0),
            float(cluster.get("hang_startup_s") or 1800.0),
        )

    def seconds(self, step_interval: float | None, started: bool = True) -> float | None:
        """The bound once the leg logged a step (a multiple of its time between logged steps, at least the floor),
        or before it (imports from a cold shared file system, loading the model, the rendezvous: at least
        startup_s)."""
        if self.floor_s is None:
            return None
        if not started:
            return max(self.floor_s, self.startup_s)
        return max(self.floor_s, self.multiple * step_interval) if step_interval else self.floor_s


def node_logs(cell_dir: Path) -> list[Path]:
    """Every node's training log, node 0's first."""
    logs = cell_dir / LOGS_DIR
    others = sorted(logs.glob("train.node*.log"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    return [p for p in [logs / TRAIN_LOG, *others] if p.is_file()]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def signature(cell_dir: Path) -> tuple[object, ...]:
    """The files that change only when the training progresses: the trainer's step records, the data step's
    record, output/'s names and the newest checkpoint's files with their sizes (a checkpoint being saved). No log:
    a log grows with warnings too (the logs' progress bars are read by `Bars`)."""
    output = cell_dir / OUTPUT_DIR
    try:
        names = tuple(sorted(os.listdir(output)))
    except OSError:
        names = ()
    ckpts = checkpoints(output)
    saving: tuple[tuple[str, int], ...] = ()
    if ckpts:
        saving = tuple(sorted((str(p.relative_to(ckpts[-1])), _size(p)) for p in ckpts[-1].rglob("*")))
    return _size(output / TRAINER_LOG), _size(cell_dir / DATA_STEP_FILE), names, saving


@dataclass
class Bars:
    """The progress bars of every node's log, read as the logs grow: whether one moved since the last look.

    Each log is read from where the last look ended (its last READ_BYTES at most); a bar counts when the position
    it shows differs from the last one seen in that log: tqdm draws a bar again only when it moved, and a line of
    text repeated (a warning, a retry) has no bar's position, or always the same."""

    cell_dir: Path
    offsets: dict[str, int] = field(default_factory=dict)  # each log's size at the last look
    shown: dict[str, tuple[int, int]] = field(default_factory=dict)  # each log's last bar position

    def __post_init__(self) -> None:
        # what the logs held before this watch (an earlier attempt's lines) is no progress of this one, and the
        # position their bars last showed is the one a move starts from
        for path in node_logs(self.cell_dir):
            size = self.offsets[path.name] = _size(path)
            positions = _moves(_read(path, max(0, size - 65536), size))  # its last 64 KiB
            if positions:
                self.shown[path.name] = positions[-1][1]

    def moved(self) -> bool:
        moved = False
        for path in node_logs(self.cell_dir):
            size, seen = _size(path), self.offsets.get(path.name, 0)
            if size < seen:  # a log written anew
                seen = 0
            if size <= seen:
                continue
            start = max(0, seen - OVERLAP, size - READ_BYTES)
            text = _read(path, start, size)
            self.offsets[path.name] = start + len(text)
            for end, position in _moves(text):
                if start + end <= seen:
                    continue  # read again from the previous look: already counted
                if position != self.shown.get(path.name):
                    self.shown[path.name] = position
                    moved = True
        return moved


def _read(path: Path, start: int, end: int) -> bytes:
    """The file's bytes from `start` to `end` (fewer where it is shorter; none where it cannot be read)."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            return fh.read(max(0, end - start))
    except OSError:
        return b""


def _moves(text: bytes) -> list[tuple[int, tuple[int, int]]]:
    """Each bar's position in `text` (done, total), with where it ends."""
    return [(m.end(), (int(m.group(1)), int(m.group(2)))) for m in _MOVE.finditer(text)]


@dataclass
class Watch:
    """The training's progress, polled: when it last progressed, and its time between logged steps."""

    cell_dir: Path
    bound: Bound
    factor: float = 1.0  # the other nodes' backstop: twice node 0's bound

    def __post_init__(self) -> None:
        self.last = signature(self.cell_dir)
        self.bars = Bars(self.cell_dir)
        self.changed = time.monotonic()
        self.steps: list[tuple[float, int]] = []  # (when this watch first saw it, the trainer's logged step)
        # a resumed leg's trainer log already holds the earlier legs' steps: this leg starts at its first new one
        self.resumed_at = progress(self.cell_dir / OUTPUT_DIR).step

    def step_interval(self) -> float | None:
        """The median time between two logged steps this watch saw (the first one seen is left out: it includes
        the start, and a resumed leg's first record is its checkpoint's)."""
        gaps = [b[0] - a[0] for a, b in zip(self.steps[1:], self.steps[2:], strict=False)]
        return statistics.median(gaps) if gaps else None

    def started(self) -> bool:
        return any(step != self.resumed_at for _, step in self.steps)

    def limit(self) -> float | None:
        seconds = self.bound.seconds(self.step_interval(), self.started())
        return None if seconds is None else seconds * self.factor

    def silent(self, now: float | None = None) -> float:
        """Seconds since the training last progressed."""
        return (time.monotonic() if now is None else now) - self.changed

    def poll(self) -> bool:
        """Look again; whether the training went without progress past its bound."""
        now = time.monotonic()
        current = signature(self.cell_dir)
        files_moved = current != self.last
        bars_moved = self.bars.moved()  # read every time: its offsets follow the logs
        if files_moved or bars_moved:
            self.changed = now
        if files_moved:
            self.last = current
            step = progress(self.cell_dir / OUTPUT_DIR).step
            if step is not None and (not self.steps or step != self.steps[-1][1]):
                self.steps.append((now, step))
        limit = self.limit()
        return limit is not None and now - self.changed > limit


@dataclass(frozen=True)
class Stuck:
    """A process of the training still there REAP_S after its SIGKILL, as /proc shows it: its state (D, disk
    sleep: a call into a file system or a driver that does not return; Z: dead, its exit held by a debugger attached
    to it) and the kernel function it sleeps in."""

    pid: int
    name: str
    state: str  # "D (disk sleep)"
    wchan: str  # "" where the kernel does not say

    def text(self) -> str:
        where = f" in {self.wchan}" if self.wchan else ""
        return f"pid {self.pid} ({self.name}) {self.state}{where}"


@dataclass(frozen=True)
class Hung:
    """A training ended for its lack of progress; `unreaped`: its processes still there `reap_s` after SIGKILL."""

    silent_s: float
    bound_s: float
    unreaped: tuple[Stuck, ...] = ()
    reap_s: float = REAP_S

    def message(self) -> str:
        """The one line the job fails with."""
        text = f"hang: no training progress for {self.silent_s:.0f} s (bound {self.bound_s:.0f} s)"
        return text + (f"; {self.unreaped_text()}" if self.unreaped else "")

    def unreaped_text(self) -> str:
        """Which processes the runner left behind, and in what state."""
        stuck = ", ".join(s.text() for s in self.unreaped)
        return f"not reaped {self.reap_s:.0f} s after SIGKILL, left behind: {stuck}"


def poll_every(bound: Bound) -> float:
    """A twentieth of the floor, between 1 s and 30 s: the watch ends a hung training within 5% of its bound."""
    return max(1.0, min(30.0, (bound.floor_s or 600.0) / 20))


class StartBeat:
    """The job's log hears at least every BEAT_S seconds while the backend starts: until the backend writes its
    first byte to the log (its imports take seconds, a cold shared file system a minute), the runner appends a line
    saying so and for how long ("--- sft_grid:", not "=== sft_grid:", which starts an attempt for the triage). The
    watch above is not fooled by these lines: a log's growth is no progress, and they draw no bar, so a backend that
    hangs in its imports is still ended at its bound."""

    def __init__(self, log_file: Path, started: float) -> None:
        self.log_file, self.started = log_file, started
        self.expected = _size(log_file)  # the log as the runner left it: more means the backend spoke
        self.last = started
        self.done = False
        self.lines = 0

    def tick(self) -> None:
        now = time.monotonic()
        if _size(self.log_file) != self.expected:
            self.done = True
            return
        if now - self.last < BEAT_S:
            return
        _say(
            self.log_file,
            f"no output from the backend yet, {now - self.started:.1f} s after launch.sh started"
            " (it imports its libraries first)",
        )
        self.expected, self.last = _size(self.log_file), now
        self.lines += 1


def _say(log_file: Path, text: str) -> None:
    """A line of the runner's own in the training's log (no node's last line in the evidence)."""
    with log_file.open("ab") as fh:
        fh.write(f"{OWN} {time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n".encode())


def wait(
    proc: subprocess.Popen[bytes], cell_dir: Path, bound: Bound, factor: float = 1.0, log_file: Path | None = None
) -> Hung | None:
    """Wait for the training to end; end it when it hangs. None: it ended by itself (proc.returncode says how).
    `log_file`: the training's log, which hears a line at least every BEAT_S seconds until the backend's first,
    and, when the training is ended, why (and which of its processes could not be reaped)."""
    watch = Watch(cell_dir, bound, factor)
    every = poll_every(bound)
    beat = StartBeat(log_file, time.monotonic()) if log_file is not None else None
    next_poll = time.monotonic() + every
    while True:
        beating = beat is not None and not beat.done
        try:
            proc.wait(timeout=min(every, BEAT_S / 5) if beating else max(0.0, next_poll - time.monotonic()))
            return None
        except subprocess.TimeoutExpired:
            pass
        if beat is not None and beating:
            beat.tick()
            if time.monotonic() < next_poll:
                continue
        next_poll = time.monotonic() + every
        if watch.poll():
            silent, limit = watch.silent(), watch.limit() or 0.0
            log.error("%s: no training progress for %.0f s (bound %.0f s): ending it", cell_dir.name, silent, limit)
            hung = Hung(silent, limit, end(proc), REAP_S)  # killed first: a log on a dead file system blocks its writer
            if log_file is not None:
                _say(log_file, f"no training progress for {silent:.0f} s (bound {limit:.0f} s): ended the training")
            if hung.unreaped:
                log.error("%s: %s", cell_dir.name, hung.unreaped_text())
                if log_file is not None:
                    _say(log_file, hung.unreaped_text())
            return hung


def end(proc: subprocess.Popen[bytes], within_s: float | None = None) -> tuple[Stuck, ...]:
    """Kill the training's whole process tree and wait, at most `within_s` (REAP_S), for `proc` to be reaped and
    every other killed process to be gone; the ones still there, as /proc shows them. A process in uninterruptible
    sleep dies from its SIGKILL only when its call returns, which on a dead file system is never."""
    killed = kill_tree(proc.pid)
    deadline = time.monotonic() + (REAP_S if within_s is None else within_s)
    while True:
        left = deadline - time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(0.1, left)))
        alive = [pid for pid, started in killed.items() if pid != proc.pid and _running(pid, started)]
        if proc.returncode is not None and not alive:
            return ()
        if left <= 0:
            if proc.returncode is None:
                alive.insert(0, proc.pid)
            return tuple(_stuck(pid) for pid in alive)
        if proc.returncode is not None:
            time.sleep(min(0.1, left))


def _running(pid: int, started: str) -> bool:
    """Whether the process that was `pid` when it was killed (its start time) still runs: not gone, not a zombie
    (dead, only not yet reaped by its parent), not a new process with its number."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == started


_STATES = {
    "R": "R (running)",
    "S": "S (sleeping)",
    "D": "D (disk sleep)",
    "T": "T (stopped)",
    "t": "t (tracing stop)",
    "Z": "Z (zombie)",
    "X": "X (dead)",
    "I": "I (idle)",
}


def _stuck(pid: int) -> Stuck:
    """The process as /proc shows it: stat and wchan only (its cmdline or maps could block on the stuck process's
    memory map)."""
    fields = proc_stat(pid)
    try:
        name = Path(f"/proc/{pid}/stat").read_text().split("(", 1)[1].rsplit(")", 1)[0]
    except (OSError, IndexError):
        name = "?"
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    state = "gone" if fields is None else _STATES.get(fields[0], fields[0])
    return Stuck(pid, name, state, "" if wchan == "0" else wchan)


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc (Linux, where Slurm runs)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(int(entry))
        if fields is not None:
            out.setdefault(int(fields[1]), []).append(int(entry))
    return out


def _tree(pid: int) -> list[int]:
    children, found, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill_tree(pid: int) -> dict[int, str]:
    """SIGKILL the process and all its descendants, whatever their session. Stopped first, then listed again, so
    that none forks a child the listing misses, nor leaves one to be adopted by init. Returns each process killed
    with its start time (/proc's, to tell it from a later process given its number)."""
    killed: dict[int, str] = {}
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in _tree(pid):
            fields = proc_stat(p)
            if fields is not None and sig == signal.SIGKILL:
                killed[p] = fields[19]
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
    return killed


def _last_line(text: str) -> str:
    """The training's last line: not one of the runner's own ("--- sft_grid: ...")."""
    lines = (line.strip() for line in reversed(re.split(r"[\r\n]", text)))
    last = next((line for line in lines if line and not line.startswith(OWN)), "")
    return last if len(last) <= LINE_CHARS else last[: LINE_CHARS - 3] + "..."


def ranks(cell_dir: Path, total: int | None) -> list[dict[str, Any]]:
    """Each node's last line and the step its training's progress bar last showed: a bar of `total` steps, not one
    of the data's, a checkpoint's shards or the weights loading (node 0's; the Trainer draws none on other ranks)."""
    out = []
    for path in node_logs(cell_dir):
        text = "\n".join(tail_lines(path, 65536))
        steps = [int(done) for done, of in _BAR.findall(text) if total and int(of) == total]
        node = int(re.sub(r"\D", "", path.name) or 0)
        out.append(
            {
                "node": node,
                "log": str(path.relative_to(cell_dir)),
                "last_line": _last_line(text),
                "step": steps[-1] if steps else None,
            }
        )
    return out


def evidence(cell_dir: Path, hung: Hung) -> tuple[str, dict[str, Any]]:
    """One line (what the ledger and `sft-grid status` show) and the whole record (the failed event's details)."""
    done = progress(cell_dir / OUTPUT_DIR)
    nodes = ranks(cell_dir, done.total)
    step = (
        "no step logged"
        if done.step is None
        else f"last logged step {done.step}" + (f" of {done.total}" if done.total else "")
    )
    parts = [
        f"no training step, checkpoint file, data step record or progress bar move for {hung.silent_s:.0f} s"
        f" (bound {hung.bound_s:.0f} s)"
    ]
    if hung.unreaped:  # before the nodes' lines: the ledger keeps the evidence's first 500 characters
        parts.append(hung.unreaped_text())
    parts.append(step)
    for n in nodes:
        at = f", bar at step {n['step']}" if n["step"] is not None else ""
        parts.append(f"node {n['node']} ({n['log']}{at}): {n['last_line']!r}")
    details: dict[str, Any] = {"silent_s": round(hung.silent_s), "bound_s": round(hung.bound_s), "ranks": nodes}
    if hung.unreaped:
        details["unreaped"] = [
            {"pid": s.pid, "name": s.name, "state": s.state, "wchan": s.wchan} for s in hung.unreaped
        ]
    return "; ".join(parts), details
