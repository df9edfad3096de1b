"""A cell's state: derived, never stored, from its ledger, its own output, process liveness and the scheduler.

A cell is completed only when its output holds final weights and the trainer state, whatever the ledger or
the scheduler says. A cell whose latest submission went to Slurm takes its state from the scheduler's view
of that job (`SchedulerView`: one sacct + one squeue call for a whole grid); a local one from whether the
process that stands for it is still alive.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from pathlib import Path

from sft_grid.core import events, human
from sft_grid.core.events import STATE_KINDS, Event, Kind
from sft_grid.core.failures.classes import FailureClass
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import OUTPUT_DIR, Progress, output_complete, progress


class State(str, Enum):
    PLANNED = "planned"
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped at a rung by successive halving; its checkpoint kept, resumable by hand

    @property
    def in_flight(self) -> bool:
        return self in (State.SUBMITTED, State.RUNNING)


@dataclass(frozen=True)
class CellState:
    state: State
    reason: str = ""
    job_id: str = ""
    progress: Progress = field(default_factory=Progress)
    # the job was found by its array's name: the orchestrator died between sbatch and recording its id
    recovered: bool = False
    # wall time of the latest run: the scheduler's, or from the ledger's running event to its end
    elapsed: str = ""
    # a triaged failure (core/failures/cell.py): its class, the line that decided it, what the policy does; typed
    # (the ledger's values are parsed where it is read, core/events.py)
    failure_class: FailureClass | None = None
    evidence: str = ""
    action: RemedyKind | None = None
    advice: str = ""  # the policy's message: what it did, what to change, the rerun command


# -- the scheduler's view ------------------------------------------------------------------------------------

# sacct/squeue states in which a job may still run the cell
IN_FLIGHT = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "RESIZING",
        "SUSPENDED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SIGNALING",
        "STAGE_OUT",
        "PREEMPTED",
    }
)


@dataclass(frozen=True)
class JobState:
    """One job (or array task) as the scheduler reports it."""

    state: str
    elapsed: str = ""
    reason: str = ""
    # the job's name (an array's `sft_grid-<hash>`) and id (<array>_<index> for array tasks)
    name: str = ""
    job_id: str = ""

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT

    @property
    def task(self) -> tuple[str, int] | None:
        """(name, index) of an array task or a single job (index 0); None for an unexpanded array record."""
        if "[" in self.job_id:
            return None
        return self.name, int(self.job_id.rsplit("_", 1)[1]) if "_" in self.job_id else 0


@dataclass(frozen=True)
class SchedulerView:
    """The scheduler's jobs, found by id or by (array name, task index). `available` is False when the
    scheduler could not be asked: Slurm cells then keep their last recorded state."""

    by_id: Mapping[str, JobState] = field(default_factory=dict)
    by_task: Mapping[tuple[str, int], JobState] = field(default_factory=dict)
    available: bool = True

    @classmethod
    def of(cls, jobs: Sequence[JobState]) -> SchedulerView:
        by_id: dict[str, JobState] = {}
        by_task: dict[tuple[str, int], JobState] = {}
        for job in jobs:  # later records (the queue) win over earlier ones (accounting)
            by_id[job.job_id] = job
            if job.task is not None:
                by_task[job.task] = job
        return cls(by_id, by_task)

    def job(self, job_id: str) -> JobState | None:
        return self.by_id.get(job_id) if job_id else None

    def find(self, ref: SlurmRef) -> JobState | None:
        return self.job(ref.job_id) if ref.job_id else self.by_task.get((ref.array, ref.index))


UNAVAILABLE = SchedulerView(available=False)


@dataclass(frozen=True)
class SlurmRef:
    """How a cell's latest submission is known to Slurm: its job id, or its array's name and task index."""

    job_id: str
    array: str
    index: int


def slurm_ref(history: Sequence[Event]) -> SlurmRef | None:
    """The Slurm job of the latest submission, if it went to Slurm."""
    for i in range(len(history) - 1, -1, -1):
        e = history[i]
        if e.kind is Kind.SUBMITTED:
            if e.executor != "slurm":
                return None
            later = [x.job_id for x in history[i + 1 :] if x.kind is Kind.JOB and x.job_id]
            return SlurmRef(later[-1] if later else "", e.array, e.index or 0)
    return None


def post_job_id(history: Sequence[Event]) -> str:
    """The Slurm id of the cell's latest post job ("" when it has none)."""
    queued = events.last(list(history), Kind.POST_JOB)
    return queued.post_job_id if queued is not None else ""


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the name: state, ppid, ... (the name may hold spaces and parentheses); None
    where the process is gone or there is no /proc. Field 19 is its start time, in clock ticks since boot."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started_at(pid: int) -> float | None:
    """When process `pid` started, in seconds since the epoch (its start time and the boot time, /proc's), or None."""
    fields = proc_stat(pid)
    try:
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") if fields else None
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def alive(event: Event) -> bool | None:
    """Whether the process that wrote an event still runs; None when it is not on this machine."""
    if not event.pid or event.host != socket.gethostname():
        return None
    try:
        os.kill(event.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- deriving a cell's state ---------------------------------------------------------------------------------


def state_of(cell_dir: Path, view: SchedulerView | None = None, history: Sequence[Event] | None = None) -> CellState:
    """The cell's state. `view`: the scheduler's jobs of the grid (None: nothing of it went to Slurm)."""
    history = events.read(cell_dir) if history is None else history
    state = _state(cell_dir / OUTPUT_DIR, view, history)
    if not state.elapsed:
        state = replace(state, elapsed=_elapsed(history, state.state))
    if state.state is State.CANCELLED:
        why = _prep_failure(history)
        state = replace(state, reason=why) if why else state
    return state


def _cancelled_job(history: Sequence[Event]) -> Event | None:
    """A cancel of the latest submission's job: it wins over that job's own `running`, which can land after it
    (a cancel racing the job's start)."""
    start = max((i for i, e in enumerate(history) if e.kind is Kind.SUBMITTED), default=-1)
    cancels = [e for e in history[start + 1 :] if e.kind is Kind.CANCELLED and e.job_id]
    return cancels[-1] if cancels else None


def _state(output_dir: Path, view: SchedulerView | None, history: Sequence[Event]) -> CellState:
    if not history and not output_dir.is_dir():
        # nothing ran yet (a new cell of a large grid): one stat, not the trainer's three files looked for
        return CellState(state=State.PLANNED)
    last = events.last(history, *STATE_KINDS)
    job_id = next((e.job_id for e in reversed(history) if e.job_id), "")
    done = progress(output_dir)
    cancel = _cancelled_job(history)
    if cancel is not None and last is not None and last.kind is Kind.RUNNING and last.job_id == cancel.job_id:
        last = cancel
    if output_complete(output_dir) and (last is None or last.kind is not Kind.RUNNING):
        return CellState(state=State.COMPLETED, job_id=job_id, progress=done)
    kind = last.kind if last is not None else Kind.PLANNED
    if kind in (Kind.SUBMITTED, Kind.RUNNING):
        assert last is not None
        ref = slurm_ref(history)
        if ref is not None:
            return _slurm_state(ref, State(kind.value), last, view, done)
        if alive(last) is False:
            return CellState(
                state=State.FAILED,
                reason=(
                    f"its process {last.pid} on {last.host} ended without recording an outcome"
                    " (killed, or out of memory?)"
                ),
                job_id=job_id,
                progress=done,
            )
        return CellState(state=State(kind.value), job_id=job_id, progress=done)
    if kind is Kind.COMPLETED:
        return CellState(
            state=State.FAILED,
            reason=(
                "the ledger says completed but the output has no final weights and trainer_state.json"
                " (deleted or moved?)"
            ),
            job_id=job_id,
        )
    if kind is Kind.PRUNED:
        assert last is not None
        return CellState(State.PRUNED, last.reason, job_id, done)
    if kind in (Kind.FAILED, Kind.CANCELLED):
        assert last is not None
        return CellState(
            state=State(kind.value),
            reason=last.reason,
            job_id=job_id,
            progress=done,
            failure_class=last.failure_class,
            evidence=last.evidence,
            action=last.action,
            advice=last.note if last.failure_class else "",
        )
    return CellState(state=State.PLANNED)


def _slurm_state(ref: SlurmRef, state: State, last: Event, view: SchedulerView | None, done: Progress) -> CellState:
    job = view.find(ref) if view is not None else None
    if job is not None and ref.array and job.name and job.name != ref.array:
        # the id now names another job (the cluster's job ids were reset): this cell's job is gone
        return CellState(
            state=State.FAILED,
            reason=(
                f"Slurm job {ref.job_id} is no longer this cell's job ({ref.array}); the cluster's job ids were reset"
            ),
            job_id=ref.job_id,
            progress=done,
        )
    job_id = ref.job_id or (job.job_id if job is not None else "")
    if job is None:
        if ref.job_id or view is None or not view.available or alive(last) is not False:
            return CellState(state=state, job_id=ref.job_id, progress=done)
        # sbatch never ran (or failed): the submitting process is gone and no job carries the array's name
        return CellState(state=State.PLANNED)
    recovered = not ref.job_id
    if job.in_flight:
        running = job.state in ("RUNNING", "COMPLETING") or state is State.RUNNING
        return CellState(
            state=State.RUNNING if running else State.SUBMITTED,
            job_id=job_id,
            progress=done,
            recovered=recovered,
            elapsed=job.elapsed,
        )
    if job.state == "CANCELLED":
        return CellState(
            state=State.CANCELLED, reason="cancelled in Slurm", job_id=job_id, progress=done, recovered=recovered
        )
    why = f"Slurm job {job_id} ended {job.state}" + (f" ({job.reason})" if job.reason else "")
    if job.state == "COMPLETED":
        why += " but the output has no final weights and trainer_state.json"
    return CellState(state=State.FAILED, reason=why, job_id=job_id, progress=done, recovered=recovered)


def _prep_failure(history: Sequence[Event]) -> str:
    """Why the model prep this cell waited for failed (Slurm then cancels the cell's job), if it did."""
    prep = events.last(list(history), Kind.PREP)
    if prep is None or not prep.prepared:
        return ""
    outcome = events.last(events.read(Path(prep.prepared).parent), *STATE_KINDS)
    if outcome is not None and outcome.kind is Kind.FAILED:
        return f"its model prep failed: {outcome.reason or 'no reason recorded'}"
    return ""


def _elapsed(history: Sequence[Event], state: State) -> str:
    starts = [i for i, e in enumerate(history) if e.kind is Kind.RUNNING]
    if not starts:
        return ""
    begin = parse_time(history[starts[-1]].time)
    ends = [
        e
        for e in history[starts[-1] + 1 :]
        if e.kind in (Kind.COMPLETED, Kind.FAILED, Kind.CANCELLED, Kind.INTERRUPTED)
    ]
    end = parse_time(ends[0].time) if ends else (time.time() if state.in_flight else None)
    if begin is None or end is None:
        return ""
    return human.duration(int(max(0, end - begin)))


def parse_time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, TypeError):
        return None
