"""A failed cell's triage: its class, the evidence that decided it and the next step, from what its directory
and the scheduler keep.

Read: the tail of the cell's training log and of its job's own log (submitit's, where slurmstepd writes
"CANCELLED ... DUE TO TIME LIMIT" and the OOM killer's notices), the loss watchdog's verdict
(output/watchdog.json), the progress the trainer logged, the requeues the ledger counts, and, when the caller
has them, the job's sacct records (every leg of a requeued job). The class comes from classify.py, the next
step from policy.py with the policy and values in cell.yaml (so a suggested override is the cell's own value
halved or doubled, the rerun command is the cell's own, and an unknown failure names the log to read).

Two callers: the job's runner, the moment training exits with an error (the log alone decides; no sacct yet),
and the grid (status, the next invocation) for a job the scheduler ended (time limit, out of memory, node
failure, scancel), where nothing in the job could write a word.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sft_grid.core import events, human
from sft_grid.core.cellfiles import CellYaml
from sft_grid.core.events import Event, Kind, submitted_site
from sft_grid.core.failures.classes import DESCRIPTION, Failure, FailureClass
from sft_grid.core.failures.classify import classify
from sft_grid.core.failures.policy import (
    CellContext,
    Policy,
    Remedy,
    RemedyKind,
    parse_time,
    remedy_for,
    with_overrides,
)
from sft_grid.core.failures.sacct import SacctLeg
from sft_grid.core.layout import (
    CELL_FILE,
    DATA_STEP_FILE,
    LOGS_DIR,
    OUTPUT_DIR,
    SUBMITIT_DIR,
    TRAIN_LOG,
    checkpoints,
    progress,
    tail_lines,
)
from sft_grid.core.overrides import rerun_words

WATCHDOG_FILE = "watchdog.json"  # written by the loss watchdog into the trainer's output directory
TAIL_BYTES = 65536
REQUEUE_NOTE = "requeue: "  # the note of a submission the failure policy made (not a new run of the cell)


def log_tails(cell_dir: Path, history: Sequence[Event]) -> dict[Path, str]:
    """The training log's tail (node 0's, then the other nodes'), then the job's own log (submitit's, where
    slurmstepd writes) of the latest submission, by path, in that order."""
    texts = {}
    logs = cell_dir / LOGS_DIR
    for train in [logs / TRAIN_LOG, *sorted(logs.glob("train.node*.log"))]:
        if train.is_file():
            texts[train] = "\n".join(tail_lines(train, TAIL_BYTES))
    submitted = next((e for e in reversed(history) if e.kind is Kind.SUBMITTED), None)
    job_id = next((e.job_id for e in reversed(history) if e.kind is Kind.JOB and e.job_id), "")
    if submitted is not None and submitted.array and job_id:
        folder = cell_dir.parent / SUBMITIT_DIR / submitted.array
        for suffix in ("out", "err"):
            path = folder / f"{job_id}_0_log.{suffix}"
            if path.is_file():
                texts[path] = "\n".join(tail_lines(path, TAIL_BYTES))
    return texts


def evidence_log(cell_dir: Path, tails: dict[Path, str], evidence: str) -> str:
    """The log that holds the evidence line (relative to the cell where it lies inside it), else the training
    log: what an unknown failure tells the user to read."""
    line = evidence.strip()[:120]
    path = next((p for p, text in tails.items() if line and line in text), cell_dir / LOGS_DIR / TRAIN_LOG)
    try:
        return str(path.relative_to(cell_dir))
    except ValueError:
        return str(path)


def disk_note(cell_dir: Path) -> str:
    """A line saying the cell's file system is full, when it is (nearly): a full disk often leaves no log
    line of its own, since the log cannot grow either."""
    try:
        st = os.statvfs(cell_dir)
    except OSError:
        return ""
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if total and free < max(1 << 20, total // 1000):
        return (
            f"sft_grid: No space left on device: {free} bytes free of {human.size(total)} on the file system"
            f" of {cell_dir}"
        )
    return ""


def watchdog_verdict(cell_dir: Path) -> dict[str, Any] | None:
    path = cell_dir / OUTPUT_DIR / WATCHDOG_FILE
    try:
        data = yaml.safe_load(path.read_text())  # JSON is YAML; a torn file is no verdict
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _since_submitted(history: Sequence[Event]) -> Sequence[Event]:
    start = max((i for i, e in enumerate(history) if e.kind is Kind.SUBMITTED), default=-1)
    return history[start + 1 :]


def cell_config(cell_dir: Path) -> dict[str, Any]:
    return CellYaml.config_of(cell_dir)


def rerun_argv(cell_dir: Path) -> tuple[str, ...]:
    """The cell's own rerun command (cell.yaml's header says it), asking for the rerun of a failed cell."""
    try:
        with (cell_dir / CELL_FILE).open() as fh:
            head = "".join(line for _, line in zip(range(6), fh, strict=False))
    except (OSError, UnicodeDecodeError):
        return ()
    words = rerun_words(head)
    return (*words, "rerun_failed=true") if words else ()


def policy_of(config: dict[str, Any]) -> Policy:
    return Policy.from_mapping(config.get("failure_policy") or {})


def context_of(cell_dir: Path, config: dict[str, Any], log: str = "") -> CellContext:
    cluster = config.get("cluster") or {}
    return CellContext(
        rerun=rerun_argv(cell_dir),
        micro_batch_size=config.get("micro_batch_size"),
        global_batch_size=config.get("global_batch_size"),
        lr=config.get("lr"),
        time=config.get("time"),
        nodes=config.get("nodes"),
        max_requeues=cluster.get("max_requeues"),
        mem_gb=cluster.get("mem_gb"),
        log=log,
    )


def triage(cell_dir: Path, history: Sequence[Event], legs: Sequence[SacctLeg] = ()) -> tuple[Failure, Remedy]:
    """The class of the cell's latest failure and what its policy does next. Requeues are counted by the legs
    that started (a `running` each), not by `requeued`: submitit asks the entry to checkpoint also when the
    budget is spent and it will not requeue."""
    config = cell_config(cell_dir)
    latest = _since_submitted(history)
    done = progress(cell_dir / OUTPUT_DIR)
    budget = int((config.get("cluster") or {}).get("max_requeues") or 0)
    verdict = watchdog_verdict(cell_dir)
    tails = log_tails(cell_dir, history)
    note = disk_note(cell_dir)
    texts = list(tails.values())
    failure = classify(
        legs,
        [*texts, note] if note else texts,
        verdict,
        requeues_used=max(0, sum(e.kind is Kind.RUNNING for e in latest) - 1),
        requeue_budget=budget,
        step=None if verdict else done.step,
        total=done.total,
    )
    failure = in_data_step(failure, cell_dir, latest)
    return failure, next_step(cell_dir, history, failure, tails)


def requeues_spent(history: Sequence[Event], klass: FailureClass) -> int:
    """The failure policy's own requeues of this class, over the cell's life."""
    return sum(e.kind is Kind.FAILED and e.failure_class is klass and e.action is RemedyKind.REQUEUE for e in history)


def next_step(
    cell_dir: Path, history: Sequence[Event], failure: Failure, tails: dict[Path, str] | None = None
) -> Remedy:
    """What the cell's policy does next about this failure (also one its job decided itself: a hang)."""
    config = cell_config(cell_dir)
    if failure.klass is FailureClass.TIME_LIMIT:
        spent = failure.requeues  # submitit requeued the job itself until its budget was spent
    else:
        spent = requeues_spent(history, failure.klass)
    log = evidence_log(cell_dir, log_tails(cell_dir, history) if tails is None else tails, failure.evidence)
    return remedy_for(failure, policy_of(config), spent, context_of(cell_dir, config, log))


def open_data_step(cell_dir: Path, history: Sequence[Event]) -> dict[str, Any] | None:
    """The data step (in_venv/data_step.py's record) that a process of the latest leg started and never ended: it
    was killed there (a time limit, the OOM killer, a lost node), e.g. by a tokenization that hung."""
    legs = [e.time for e in history if e.kind is Kind.RUNNING and e.time]
    try:
        since = dt.datetime.strptime(legs[-1], "%Y-%m-%dT%H:%M:%S%z").timestamp() - 1 if legs else 0.0
        lines = (cell_dir / DATA_STEP_FILE).read_text().splitlines()
    except (OSError, ValueError):
        return None
    started: dict[Any, dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or float(record.get("time") or 0) < since:
            continue
        if record.get("event") == "start":
            started[record.get("pid")] = record
        elif record.get("event") == "end":
            started.pop(record.get("pid"), None)
    return max(started.values(), key=lambda r: float(r.get("time") or 0)) if started else None


def describe_data_step(step: dict[str, Any]) -> str:
    """e.g. "get_dataset on rank 0, started 2026-12-01 05:03:12"."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(step.get("time") or 0)))
    return f"{step.get('what', '?')} on rank {step.get('rank', 0)}, started {since}"


def in_data_step(failure: Failure, cell_dir: Path, history: Sequence[Event]) -> Failure:
    """The failure, its summary saying so when the job ended inside its data step."""
    step = open_data_step(cell_dir, history)
    if step is None:
        return failure
    return dataclasses.replace(
        failure, summary=f"{failure.summary}, in its data step ({describe_data_step(step)}, never finished)"
    )


# the deferred checks of an input the grid builds before the cell (checks/preflight.py), and the job that builds it
_BUILDERS = {"tokenized": "tokenize job", "prepared": "model prep job", "staged": "staging"}


def missing_input(cell_dir: Path, kind: str, target: str, message: str) -> tuple[Failure, Remedy] | None:
    """A cell whose deferred check failed as its job started (job/runner.py), when that check found an input the
    grid builds before the cell not there yet (its model's prepared copy, its shared tokenized dataset, a staged Hub
    repository: the check's own words, signs.py): class `missing_input`, the grid's order of jobs and no fault of
    the config or the data, with a summary that names the input and the job that should have built it, and the
    policy's next step. None for any other failed check (the cell's config or data refused: `backend_error`).
    `kind`, `target`: the check's; `message`: its verdict's."""
    found = classify([], message)
    if found.klass is not FailureClass.MISSING_INPUT:
        return None
    cell_site = submitted_site(events.read(cell_dir))[0]
    where = f" (the cell ran on site {cell_site})" if cell_site else ""
    evidence = message.strip().splitlines()[0][:500] if message.strip() else found.evidence
    summary = f"{DESCRIPTION[FailureClass.MISSING_INPUT]}: {evidence}; {_builder(kind, target)}{where}"
    failure = dataclasses.replace(found, evidence=evidence, summary=summary)
    return failure, next_step(cell_dir, events.read(cell_dir), failure)


def _builder(kind: str, target: str) -> str:
    """Which job should have built the input of a check, as the ledger in the input's directory records it (a
    tokenized dataset's, a model prep's); a staged repository's staging is named only (its job's directory is the
    grid's, not the check's)."""
    what = _BUILDERS.get(kind, "job before the cell")
    if kind not in ("tokenized", "prepared"):
        return f"the grid's {what} should have built it first"
    history = events.read(Path(target))
    at = next((i for i in range(len(history) - 1, -1, -1) if history[i].kind is Kind.SUBMITTED), None)
    if at is None:
        return f"no {what} was queued for it ({target})"
    submitted = history[at]
    if submitted.executor != "slurm":
        return f"the {what} on the grid's machine should have built it first ({target})"
    ids = [e.job_id for e in history[at + 1 :] if e.kind is Kind.JOB and e.job_id]
    ran = [str(e.details.get("site")) for e in history[at + 1 :] if e.kind is Kind.RUNNING and e.details.get("site")]
    job = f"{what} {ids[-1] if ids else '(no job id recorded)'} ({submitted.array}"
    job += f", on site {ran[-1]})" if ran else ")"
    return f"{job} should have built it first"


def failed_event(failure: Failure, remedy: Remedy, **fields: Any) -> Event:
    """The ledger's record of a triaged failure: its one-line summary as the reason, the policy's message (what
    was done, what to change, the rerun command) as the note."""
    return Event(
        Kind.FAILED,
        reason=failure.summary,
        note=remedy.message,
        failure_class=failure.klass,
        evidence=failure.evidence[:500],
        nodes=",".join(remedy.exclude_nodes or failure.nodes),
        action=remedy.kind,
        step=failure.step,
        **fields,
    )


def triaged(history: Sequence[Event]) -> bool:
    """Whether the latest submission's failure already has its class in the ledger."""
    return any(e.kind is Kind.FAILED and e.failure_class for e in _since_submitted(history))


def requeue_nodes(history: Sequence[Event]) -> tuple[str, ...]:
    """Nodes the latest triaged failure asks the requeue to avoid, when its policy requeues it."""
    for e in reversed(history):
        if e.kind is Kind.FAILED and e.failure_class:
            return tuple(n for n in e.nodes.split(",") if n) if e.action is RemedyKind.REQUEUE else ()
        if e.kind is Kind.SUBMITTED:
            break
    return ()


def stalled(cell_dir: Path, history: Sequence[Event], job_id: str = "") -> Event | None:
    """The failure to record instead of another requeue when the job is about to be requeued and that cannot
    help: its last two legs each started from the checkpoint that is still the newest (or from none, and none
    was saved), so each leg ends before it saves the next one and a third would end the same way, until the
    requeue budget is spent. None while the cell progresses (a leg that saved a checkpoint)."""
    latest = list(_since_submitted(history))
    starts: list[str] = []  # each leg's starting checkpoint ("" for none)
    for e in latest:
        if e.kind is Kind.RUNNING:
            starts.append("")
        elif e.kind is Kind.RESUMED and starts:
            starts[-1] = e.checkpoint
    ckpts = checkpoints(cell_dir / OUTPUT_DIR)
    newest = ckpts[-1].name if ckpts else ""
    if len(starts) < 2 or not starts[-1] == starts[-2] == newest:
        return None
    config = cell_config(cell_dir)
    ctx = context_of(cell_dir, config)
    save_steps = config.get("save_steps")
    done = progress(cell_dir / OUTPUT_DIR)
    overrides = [f"save_steps={max(1, save_steps // 4)}"] if isinstance(save_steps, int) and save_steps > 1 else []
    if ctx.time:
        overrides.append(f"time={human.duration(parse_time(str(ctx.time)) * 2)}")
    since = f"from {newest}" if newest else "with no checkpoint"
    evidence = f"the last {len(starts[-2:])} legs each started {since} and ended before saving the next one"
    rerun = with_overrides(ctx.rerun, overrides) if ctx.rerun else ()
    note = (
        f"time limit reached with no progress: {evidence}. Not requeued (every further leg would end the same"
        f" way): save checkpoints more often or give each leg more time"
        + (f" ({', '.join(overrides)})" if overrides else "")
        + "."
        + (f" Rerun: {shlex.join(rerun)}" if rerun else "")
    )
    return Event(
        Kind.FAILED,
        reason=f"time limit reached with no progress since {newest or 'the start'}",
        note=note,
        failure_class=FailureClass.TIME_LIMIT,
        evidence=evidence,
        action=RemedyKind.STOP,
        step=done.step,
        job_id=job_id,
    )
