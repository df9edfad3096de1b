"""A hung cell noticed while it hangs: the job's runner watches its training's progress and ends it.

A rank stuck in a collective (or in a read that never returns) leaves its peers waiting in theirs, and a
backend's own collective timeout is often hours or never fires: the job would burn its whole wall time. The
runner (the process that starts launch.sh and waits for it) needs no channel into the training: it reads what
the training writes, the same for both backends and every launcher:

- every node's training log (logs/train.log, logs/train.node<N>.log): a line, or a progress bar's update;
- the trainer's step records (output/trainer_log.jsonl), the files of a checkpoint being saved (output/ and its
  newest checkpoint-N), the data step's record (data_step.jsonl).

When none of them changed for longer than the bound, the training's whole process tree is killed (torchrun
starts its ranks in sessions of their own, so one process group is not enough). The bound is the site's
`cluster.hang_after_s` (900 s by default: longer than the longest silence of a healthy run between its steps,
saving a ZeRO-3 checkpoint), or `cluster.hang_multiple` (10) times the cell's own time between two logged steps
as this watch saw them, when that is longer (a slow cell logging rarely is not hung). Before the leg's first
step, `cluster.hang_startup_s` (1800 s): imports from a cold shared file system, loading a large model and the
rendezvous print little (measured on the local cluster, busy: 72 s of silence while LLaMA-Factory imports). Node 0
then records the failure `hang` with its evidence (how long it was silent, the last step, each node's last
line and the step its progress bar last showed) and the policy's next step (a requeue from the last checkpoint
by default). The other nodes watch too, with twice the bound, as a backstop: when node 0's task fails, srun
ends theirs (--kill-on-bad-exit).
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
from dataclasses import dataclass
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

log = logging.getLogger(__name__)

# a progress bar's position, as tqdm draws it: " 12/120 [00:31<04:50, ..."
_BAR = re.compile(r"(\d+)/(\d+) \[")
LINE_CHARS = 160  # of each node's last line in the evidence (the ledger keeps 500 characters of it)
BEAT_S = 2.5  # the job's log hears at least this often while the backend starts (issue 28: at most 3 s silent)


@dataclass(frozen=True)
class Bound:
    """How long a training may be silent: the site's floor, or a multiple of its own time between logged steps."""

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
    """What changes whenever the training makes progress (see the module's docstring)."""
    output = cell_dir / OUTPUT_DIR
    try:
        names = tuple(sorted(os.listdir(output)))
    except OSError:
        names = ()
    ckpts = checkpoints(output)
    saving: tuple[tuple[str, int], ...] = ()
    if ckpts:
        saving = tuple(sorted((str(p.relative_to(ckpts[-1])), _size(p)) for p in ckpts[-1].rglob("*")))
    logs = tuple((p.name, _size(p)) for p in node_logs(cell_dir))
    return logs, _size(output / TRAINER_LOG), _size(cell_dir / DATA_STEP_FILE), names, saving


@dataclass
class Watch:
    """The silence of one training, polled: when it last changed, and its time between logged steps."""

    cell_dir: Path
    bound: Bound
    factor: float = 1.0  # the other nodes' backstop: twice node 0's bound

    def __post_init__(self) -> None:
        self.last = signature(self.cell_dir)
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
        return (time.monotonic() if now is None else now) - self.changed

    def absorb(self, log_file: Path) -> None:
        """The runner itself wrote to `log_file` (a start-up heartbeat): that growth is no progress of the training.
        Anything else that changed meanwhile is left for the next poll to see."""

        def others(sig: tuple[object, ...]) -> tuple[object, ...]:
            logs, *rest = sig
            return (tuple(entry for entry in logs if entry[0] != log_file.name), *rest)  # type: ignore[attr-defined]

        current = signature(self.cell_dir)
        if others(current) == others(self.last):
            self.last = current

    def poll(self) -> bool:
        """Look again; whether the training is silent past its bound."""
        now = time.monotonic()
        current = signature(self.cell_dir)
        if current != self.last:
            self.last, self.changed = current, now
            step = progress(self.cell_dir / OUTPUT_DIR).step
            if step is not None and (not self.steps or step != self.steps[-1][1]):
                self.steps.append((now, step))
        limit = self.limit()
        return limit is not None and now - self.changed > limit


@dataclass(frozen=True)
class Hung:
    """A training ended for its silence."""

    silent_s: float
    bound_s: float


def poll_every(bound: Bound) -> float:
    """A twentieth of the floor, between 1 s and 30 s: the watch ends a hung training within 5% of its bound."""
    return max(1.0, min(30.0, (bound.floor_s or 600.0) / 20))


class StartBeat:
    """The job's log hears at least every BEAT_S seconds while the backend starts: until the backend writes its
    first byte to the log (its imports take seconds, a cold shared file system a minute), the runner appends a line
    saying so and for how long ("--- sft_grid:", not "=== sft_grid:", which starts an attempt for the triage). The
    watch above is not fooled by these lines: the log's growth they cause is taken as the watch's own (`absorb`), so
    a backend that hangs in its imports is still ended at its bound."""

    def __init__(self, log_file: Path, started: float) -> None:
        self.log_file, self.started = log_file, started
        self.expected = _size(log_file)  # the log as the runner left it: more means the backend spoke
        self.last = started
        self.done = False
        self.lines = 0

    def tick(self, watch: Watch) -> None:
        now = time.monotonic()
        if _size(self.log_file) != self.expected:
            self.done = True
            return
        if now - self.last < BEAT_S:
            return
        line = (
            f"--- sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} no output from the backend yet,"
            f" {now - self.started:.1f} s after launch.sh started (it imports its libraries first)\n"
        )
        with self.log_file.open("ab") as fh:
            fh.write(line.encode())
        self.expected, self.last = _size(self.log_file), now
        self.lines += 1
        watch.absorb(self.log_file)


def wait(
    proc: subprocess.Popen[bytes], cell_dir: Path, bound: Bound, factor: float = 1.0, log_file: Path | None = None
) -> Hung | None:
    """Wait for the training to end; end it when it hangs. None: it ended by itself (proc.returncode says how).
    `log_file`: the training's log, which hears a line at least every BEAT_S seconds until the backend's first."""
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
            beat.tick(watch)
            if time.monotonic() < next_poll:
                continue
        next_poll = time.monotonic() + every
        if watch.poll():
            silent, limit = watch.silent(), watch.limit() or 0.0
            log.error("%s: no training progress for %.0f s (bound %.0f s): ending it", cell_dir.name, silent, limit)
            kill_tree(proc.pid)
            proc.wait()
            return Hung(silent, limit)


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc (Linux, where Slurm runs)."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _tree(pid: int) -> list[int]:
    children, found, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL the process and all its descendants, whatever their session. Stopped first, then listed again, so
    that none forks a child the listing misses, nor leaves one to be adopted by init."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in _tree(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)


def _last_line(text: str) -> str:
    last = next((line.strip() for line in reversed(re.split(r"[\r\n]", text)) if line.strip()), "")
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
    parts = [f"no training step, log line or checkpoint file for {hung.silent_s:.0f} s (bound {hung.bound_s:.0f} s)"]
    parts.append(step)
    for n in nodes:
        at = f", bar at step {n['step']}" if n["step"] is not None else ""
        parts.append(f"node {n['node']} ({n['log']}{at}): {n['last_line']!r}")
    details = {"silent_s": round(hung.silent_s), "bound_s": round(hung.bound_s), "ranks": nodes}
    return "; ".join(parts), details
