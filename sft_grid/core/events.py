"""The ledger: one event type, one writer, typed readers.

Each cell (and each model prep) keeps an append-only ledger, `events.jsonl`: one JSON object a line. Every
module that records something builds an `Event` and calls `append`; every reader gets `Event`s back from
`read`. A line is appended with O_APPEND in one write, so concurrent writers (the orchestrator, the job, a
post job) never interleave within a line, and a torn last line from a killed writer is not an event.

The file stays plain JSON lines a person can read, with the keys earlier versions wrote (`event`, `time`,
`job_id`, `name`, `index`, ...), so ledgers written before the events were typed still load: a key this
version does not model is kept in `details`, and so is a kind it does not know.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from sft_grid.core.cellfiles import Damage, DamagedFile, not_utf8
from sft_grid.core.failures.classes import FailureClass
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import LEDGER_FILE


class Kind(str, Enum):
    # the cell's state changes (the last of these decides it, see core/state.py)
    PLANNED = "planned"  # to be submitted again (an orphaned job of a killed orchestrator was cancelled)
    SUBMITTED = "submitted"  # handed to the executor; on Slurm before sbatch runs, with the array's name
    RUNNING = "running"  # the job started the cell
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped at a rung by successive halving (its reason: the rung's evidence)
    # annotations
    JOB = "job"  # the scheduler's id of the latest submission
    INTERRUPTED = "interrupted"  # training was killed by a signal (time limit, preemption, OOM killer)
    REQUEUED = "requeued"  # the job asked Slurm to requeue it (time limit near, or preempted)
    RESUMED = "resumed"  # training continues from a checkpoint
    ARCHIVED = "archived"  # an output was moved aside, never deleted
    PREP = "prep"  # the model prep this cell waits for
    STAGE = "stage"  # a post-training stage changed state
    POST_JOB = "post_job"  # the Slurm job that runs the cell's post-training stages
    NOTIFIED = "notified"  # a notification went out (its key: sent once, across requeues and reruns)
    EVAL = "eval"  # the evaluation stage (of a cell, or of a base model) changed state, or one score did
    EVAL_JOB = "eval_job"  # the Slurm job that evaluates the cell (or the base model)
    OTHER = "other"  # a kind this version does not know (kept, never decides anything)


STATE_KINDS = frozenset(
    {Kind.PLANNED, Kind.SUBMITTED, Kind.RUNNING, Kind.COMPLETED, Kind.FAILED, Kind.CANCELLED, Kind.PRUNED}
)


@dataclass(frozen=True)
class Event:
    kind: Kind
    time: str = ""
    # the process that wrote it, when it stands for the cell (its death without an outcome is a failure)
    pid: int | None = None
    host: str = ""
    # submitted: local or slurm; on Slurm the array's job name and this cell's task index in it
    executor: str = ""
    array: str = ""
    index: int | None = None
    job_id: str = ""
    # outcome and annotations
    reason: str = ""
    note: str = ""
    rc: int | None = None
    signal: int | None = None
    step: int | None = None
    loss: float | None = None
    checkpoint: str = ""  # resumed: from which checkpoint-N
    path: str = ""  # archived: where the output went, relative to the cell
    why: str = ""  # archived: why
    stage: str = ""  # stage: which post-training stage
    state: str = ""  # stage: pending, running, waiting, completed, failed; eval: running, completed, failed
    post_job_id: str = ""  # post_job: the post job's Slurm id (`job_id` always names the training job)
    after: str = ""  # post_job, eval_job: the job it waits for
    eval_job_id: str = ""  # eval_job: the evaluation job's Slurm id
    score_id: str = ""  # eval: the score (eval/<score_id>.json) an outcome is about; none: the whole stage
    task: str = ""  # eval: that score's task
    model: str = ""  # prep: the model
    prepared: str = ""  # prep: the prepared model directory
    prep_job_id: str = ""  # prep: the prep's Slurm job
    # failed: the failure's class (core/failures), the log line or sacct record that decided it, the nodes it
    # names, and what the policy did about it (requeue | stop); typed here, their values in the file
    failure_class: FailureClass | None = None
    evidence: str = ""
    nodes: str = ""
    action: RemedyKind | None = None
    key: str = ""  # notified: the notification's key
    # what else the event knows (a stage's results: files, url, commit, ...), and keys of unknown events
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def here(cls, kind: Kind, **fields: Any) -> Event:
        """An event written by this process, standing for the cell (its pid and host)."""
        return cls(kind, **{"pid": os.getpid(), "host": socket.gethostname(), **fields})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time": self.time, "event": self.kind.value}
        for f in dataclasses.fields(self)[2:]:
            value = getattr(self, f.name)
            if f.name == "details":
                out.update(value)
            elif value not in ("", None):
                out[_JSON_KEY.get(f.name, f.name)] = value.value if isinstance(value, Enum) else value
        if self.kind is Kind.OTHER:
            out["event"] = self.details.get("event", "other")
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Event:
        raw = dict(data)
        name = str(raw.pop("event", ""))
        try:
            kind = Kind(name)
        except ValueError:
            kind, raw["event"] = Kind.OTHER, name
        fields: dict[str, Any] = {"time": str(raw.pop("time", ""))}
        for f in dataclasses.fields(cls)[2:-1]:
            key = _JSON_KEY.get(f.name, f.name)
            if key not in raw:
                continue
            if f.name in _ENUMS:
                # a value this version does not know stays in details, so the event is written back unchanged
                parsed = _ENUMS[f.name](raw[key])
                if parsed is not None:
                    fields[f.name] = parsed
                    del raw[key]
            else:
                fields[f.name] = _coerce(f.type, raw.pop(key))
        return cls(kind, details=raw, **fields)


# field -> its key in the file, where they differ (the keys earlier versions wrote)
_JSON_KEY = {"array": "name", "prepared": "dir", "prep_job_id": "job_id_prep", "failure_class": "class"}
# typed fields -> their parser at the ledger's boundary (None: empty, or a value this version does not know)
_ENUMS: dict[str, Callable[[Any], Enum | None]] = {"failure_class": FailureClass.parse, "action": RemedyKind.parse}


def _coerce(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    if "int" in str(hint) and not isinstance(value, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            return None
    if "float" in str(hint):
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return str(value)


def append(directory: Path, event: Event) -> Event:
    """Append one event to a ledger (one write, O_APPEND); the time is set here. Returns what was written."""
    if not event.time:
        event = dataclasses.replace(event, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    line = (json.dumps(event.to_json(), default=str) + "\n").encode()
    fd = os.open(directory / LEDGER_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return event


@dataclass(frozen=True)
class Ledger:
    """A ledger as read: the events of its lines, and its first damage (None: every line is an event). `unread`: what
    could not be read at all (the file, or a line that is not UTF-8): `read` raises it."""

    events: list[Event]
    damage: Damage | None = None
    unread: Damage | None = None


def scan(directory: Path) -> Ledger:
    """Every event of a ledger, and what is damaged in it: the file is a directory or cannot be read, or a line is not
    UTF-8, not JSON, not an object or not an event (that line is left out, the others are read). A last line without
    its newline that is not JSON is a write a kill cut short: not an event, and no damage."""
    try:
        data = (directory / LEDGER_FILE).read_bytes()
    except FileNotFoundError:
        return Ledger([])
    except IsADirectoryError:
        return Ledger([], Damage(LEDGER_FILE, "a directory, not a file"))
    except OSError as exc:
        unreadable = Damage(LEDGER_FILE, f"cannot be read ({exc.strerror or exc})")
        return Ledger([], unreadable, unreadable)
    return _parse(data)


def _parse(data: bytes) -> Ledger:
    out: list[Event] = []
    damage = unread = None
    lines = data.split(b"\n")
    offset = 0
    for i, raw in enumerate(lines, 1):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        problem = ""
        try:
            record = json.loads(raw.decode())
        except UnicodeDecodeError as exc:
            problem = not_utf8(raw, exc, i, start)
            unread = unread or Damage(LEDGER_FILE, problem)
        except ValueError:
            if i == len(lines):
                continue  # a torn last line from a killed writer is not an event
            problem = f"line {i} is not JSON"
        else:
            try:
                out.append(Event.from_json(record))
            except (AttributeError, TypeError, ValueError):
                problem = f"line {i} is not an event" + ("" if isinstance(record, dict) else " (not a JSON object)")
        if problem and damage is None:
            damage = Damage(LEDGER_FILE, problem)
    return Ledger(out, damage, unread)


def read(directory: Path) -> list[Event]:
    """A ledger's events. A line that is not JSON, or no event, is left out (a torn last line from a killed writer is
    not an event), and so is a ledger that is no file; one that cannot be read raises OSError, and a line of it that
    is not UTF-8 DamagedFile (a ValueError), naming it: those who act on a ledger do not act on part of one. `scan`
    reads every event it can, and says what is damaged."""
    path = directory / LEDGER_FILE
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return []
    found = _parse(data)
    if found.unread is not None:
        raise DamagedFile(found.unread, path, f"{path}: {found.unread.what}")
    return found.events


def last(history: Sequence[Event], *kinds: Kind) -> Event | None:
    """The latest event of these kinds."""
    return next((e for e in reversed(history) if e.kind in kinds), None)


def submitted_site(history: Sequence[Event]) -> tuple[str, dict[str, str]]:
    """The site of a cell's latest submission and its Slurm client environment, as its `submitted` event records
    them (a grid across sites); ("", {}) for a cell of a one-site grid."""
    for e in reversed(history):
        if e.kind is Kind.SUBMITTED:
            env = e.details.get("slurm_env") or {}
            env = env if isinstance(env, Mapping) else {}  # a damaged line's: no environment
            return str(e.details.get("site") or ""), {str(k): str(v) for k, v in env.items()}
    return "", {}
