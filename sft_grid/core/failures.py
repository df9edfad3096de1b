"""Why a cell failed: one class, the one line of evidence that decided it, and the nodes it names.

Inputs are what the orchestrator can read after a job ends: every record `sacct --duplicates` keeps of the
job (a requeued job has one per run, "leg"), the tail of the cell's logs, the loss watchdog's verdict
(<output_dir>/watchdog.json) and the progress the trainer logged. Pure: no I/O, stdlib only.

Rules, in order (the first that yields a class decides):
1. The loss watchdog's verdict (nan_loss, diverged): the run stopped itself on purpose.
2. Attempts are weighed from the last backwards; the last attempt showing any sign decides. An attempt is
   one sacct leg (with its steps) and the matching stretch of each log, aligned from the end (logs are
   split at restart/requeue markers, failure_signs.ATTEMPT_*). A requeued job's last record often shows
   only a pending reason, so an earlier leg (TIMEOUT, then a requeue held on BeginTime) still decides.
3. Within an attempt the lowest tier wins (failure_signs: watchdog line < root causes < scheduler end <
   communication < NaN loss < other exception); within a tier sacct's state comes first, then the
   earliest log line (the first failure observed is the cause, later ones its echo).
Ignored on purpose: pending reasons (BeginTime, Dependency, None, Priority, ...: they describe a wait, not
an end), step records CANCELLED by a time limit or preemption, and wrapper exceptions (ChildFailedError,
CalledProcessError, ...), which only re-raise a child's error.
sacct's records are parsed in sft_grid/core/sacct_legs.py; what to do next is decided in
sft_grid/core/failure_policy.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from sft_grid.core import failure_signs as signs
from sft_grid.core.sacct_legs import SacctLeg, parse_sacct, sacct_argv

# sacct's records are read through sacct_legs; its reader is re-exported for callers of classify()
__all__ = ["DESCRIPTION", "Failure", "FailureClass", "NODE_CLASSES", "SacctLeg", "classify", "parse_sacct",
           "sacct_argv", "split_attempts", "summarize"]


class FailureClass(str, Enum):
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node_failure"
    HOST_OOM = "host_oom"
    GPU_OOM = "gpu_oom"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    RENDEZVOUS = "rendezvous"
    GPU_HARDWARE = "gpu_hardware"
    DISK_FULL = "disk_full"
    OFFLINE_HUB = "offline_hub"
    NAN_LOSS = "nan_loss"
    DIVERGED = "diverged"
    BACKEND_ERROR = "backend_error"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


_unknown_signs = {s.klass for s in signs.SIGNS} - {c.value for c in FailureClass}
assert not _unknown_signs, f"failure_signs names classes that do not exist: {_unknown_signs}"

DESCRIPTION = {
    FailureClass.TIME_LIMIT: "time limit reached",
    FailureClass.PREEMPTED: "preempted by the scheduler",
    FailureClass.NODE_FAILURE: "node failure",
    FailureClass.HOST_OOM: "host memory exhausted (OOM killer)",
    FailureClass.GPU_OOM: "GPU out of memory",
    FailureClass.COLLECTIVE_TIMEOUT: "a collective operation timed out",
    FailureClass.RENDEZVOUS: "distributed rendezvous failed",
    FailureClass.GPU_HARDWARE: "GPU hardware error",
    FailureClass.DISK_FULL: "disk full or quota exceeded",
    FailureClass.OFFLINE_HUB: "Hugging Face Hub access on an offline node",
    FailureClass.NAN_LOSS: "loss became NaN or infinite",
    FailureClass.DIVERGED: "loss diverged",
    FailureClass.BACKEND_ERROR: "the backend failed on its config or data",
    FailureClass.CANCELLED: "cancelled by the user",
    FailureClass.UNKNOWN: "failed for an unknown reason",
}
# classes whose evidence names a node worth excluding from the next attempt
NODE_CLASSES = frozenset({FailureClass.NODE_FAILURE, FailureClass.GPU_HARDWARE})

# allocation state -> (class, tier); the other states (REQUEUED, FAILED, COMPLETED, PENDING, ...) say nothing
_STATES = {
    "TIMEOUT": (FailureClass.TIME_LIMIT, signs.SCHEDULER),
    "DEADLINE": (FailureClass.TIME_LIMIT, signs.SCHEDULER),
    "PREEMPTED": (FailureClass.PREEMPTED, signs.SCHEDULER),
    "NODE_FAIL": (FailureClass.NODE_FAILURE, signs.SCHEDULER),
    "BOOT_FAIL": (FailureClass.NODE_FAILURE, signs.SCHEDULER),
    "OUT_OF_MEMORY": (FailureClass.HOST_OOM, signs.ROOT),
}
# the few sacct reasons that describe an end rather than a wait
_REASONS = {"NodeDown": FailureClass.NODE_FAILURE, "launch failed requeued held": FailureClass.NODE_FAILURE}


@dataclass(frozen=True)
class Failure:
    klass: FailureClass
    evidence: str  # the log line or sacct record that decided it, one line
    nodes: tuple[str, ...]  # nodes to avoid next time (--exclude): named only for node_failure, gpu_hardware
    summary: str  # one line for the user
    step: int | None = None
    total: int | None = None
    requeues: int = 0
    requeue_budget: int = 0


@dataclass(frozen=True)
class _Finding:
    klass: FailureClass
    tier: int
    order: int  # sacct findings < 0 (before any line), then line index
    evidence: str
    nodes: tuple[str, ...] = ()


def split_attempts(text: str) -> list[list[str]]:
    """A log's lines split into the attempts of a requeued cell, oldest first (never empty)."""
    attempts: list[list[str]] = [[]]
    for line in text.splitlines():
        if signs.ATTEMPT_START.search(line) and any(x.strip() for x in attempts[-1]):
            attempts.append([])
        attempts[-1].append(line)
        if signs.ATTEMPT_END.search(line):
            attempts.append([])
    return [a for a in attempts if any(x.strip() for x in a)] or [[]]


def _leg_findings(records: Sequence[SacctLeg]) -> list[_Finding]:
    found = []
    for i, leg in enumerate(records):
        if leg.is_step:
            # a time limit or preemption cancels the steps; only their OOM and node states add anything
            if leg.base_state in ("OUT_OF_MEMORY", "NODE_FAIL"):
                klass, tier = _STATES[leg.base_state]
                found.append(_Finding(klass, tier, i - 1000, leg.describe(), tuple(leg.node_names())))
            continue
        if leg.base_state in _STATES:
            klass, tier = _STATES[leg.base_state]
            found.append(_Finding(klass, tier, i - 2000, leg.describe(), tuple(leg.node_names())))
        elif leg.base_state == "CANCELLED":
            found.append(_Finding(FailureClass.CANCELLED, signs.SCHEDULER, i - 2000, leg.describe()))
        elif leg.reason in _REASONS:
            found.append(_Finding(_REASONS[leg.reason], signs.SCHEDULER, i - 2000,
                                  f"{leg.job_id} Reason={leg.reason}", tuple(leg.node_names())))
    return found


def _line_findings(lines: Sequence[str]) -> list[_Finding]:
    found = []
    exceptions: list[int] = []
    chains: list[int] = []
    last_loss: tuple[int, str] | None = None
    for i, line in enumerate(lines):
        text = line.strip()
        for sign in signs.SIGNS:
            if sign.pattern.search(text):
                found.append(_Finding(FailureClass(sign.klass), sign.tier, i, text[:500], _nodes_in(text)))
                break
        else:
            if signs.EXCEPTION_LINE.match(text) and not signs.WRAPPERS.search(text):
                exceptions.append(i)
            elif signs.CHAINED.search(text):
                chains.append(i)
        if signs.LOSS_VALUE.search(text):
            last_loss = (i, text)
    if exceptions:
        # the exception that ended the run is the last one, unless it was raised from an earlier one: then
        # the first of that chain (a KeyError under datasets' DatasetGenerationError); early exceptions a
        # library logged and survived do not count
        j = len(exceptions) - 1
        while j > 0 and any(exceptions[j - 1] < c < exceptions[j] for c in chains):
            j -= 1
        i = exceptions[j]
        found.append(_Finding(FailureClass.BACKEND_ERROR, signs.EXCEPTION, i, lines[i].strip()[:500]))
    if last_loss and not _finite(signs.LOSS_VALUE.search(last_loss[1]).group("value")):
        # only the last logged loss: an early NaN on an all-masked batch that training got past is no failure
        found.append(_Finding(FailureClass.NAN_LOSS, signs.LOSS, last_loss[0], last_loss[1][:500]))
    return found


def _finite(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return True  # not a number at all: no verdict on it


def _nodes_in(line: str) -> tuple[str, ...]:
    for pattern in signs.NODE_IN_LINE:
        m = pattern.search(line)
        if m:
            return (m.group("node"),)
    return ()


def _node_hints(lines: Sequence[str], records: Sequence[SacctLeg]) -> tuple[str, ...]:
    """Nodes an attempt names when its deciding evidence names none (or a whole allocation): srun's
    "Node failure on X", else the host of torchrun's first failed rank, else the allocation's only node."""
    for pattern in (signs.NODE_FAILED, signs.ROOT_CAUSE_HOST):
        for line in lines:
            m = pattern.search(line)
            if m:
                return (m.group("node"),)
    allocs = [r for r in records if not r.is_step]
    single = allocs[-1].node_names() if allocs else []
    return tuple(single) if len(single) == 1 else ()


def _attempt_pools(legs: Sequence[SacctLeg], texts: Sequence[str]) -> list[tuple[list[SacctLeg], list[str]]]:
    """(records, lines) of each attempt, the last attempt first."""
    leg_groups: list[list[SacctLeg]] = []
    for leg in legs:
        if not leg.is_step or not leg_groups:
            leg_groups.append([])
        leg_groups[-1].append(leg)
    log_attempts = [split_attempts(t) for t in texts]
    depth = max([len(leg_groups), *(len(a) for a in log_attempts)])
    pools = []
    for k in range(1, depth + 1):
        records = leg_groups[-k] if k <= len(leg_groups) else []
        lines = [line for a in log_attempts if k <= len(a) for line in a[-k]]
        pools.append((records, lines))
    return pools


def _progress(lines: Iterable[str]) -> tuple[int | None, int | None]:
    step = total = None
    for line in lines:
        m = re.search(r"""['"]current_steps['"]\s*:\s*(\d+).*['"]total_steps['"]\s*:\s*(\d+)""", line)
        if m:
            step, total = int(m.group(1)), int(m.group(2))
    return step, total


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def summarize(klass: FailureClass, evidence: str, nodes: Sequence[str], requeues: int, budget: int,
              step: int | None, total: int | None) -> str:
    """One line, e.g. "time limit reached after 3 requeues (budget 3), at step 297 of 300"."""
    text = DESCRIPTION[klass]
    if requeues or (budget and klass in (FailureClass.TIME_LIMIT, FailureClass.PREEMPTED)):
        text += f" after {requeues} requeue{'s' if requeues != 1 else ''}" + (f" (budget {budget})" if budget else "")
    if step is not None:
        text += f", at step {step}" + (f" of {total}" if total else "")
    if nodes:
        text += f", on {','.join(nodes)}"
    if klass not in (FailureClass.TIME_LIMIT, FailureClass.PREEMPTED, FailureClass.CANCELLED) and evidence:
        text += f": {_short(evidence)}"
    return text


def classify(legs: Sequence[SacctLeg], log_tail: str | Sequence[str], watchdog: Mapping[str, Any] | None = None,
             requeues_used: int | None = None, requeue_budget: int = 0, step: int | None = None,
             total: int | None = None) -> Failure:
    """The failure of one cell (legs: its allocation's records in sacct's order; log_tail: one log or
    several, each in time order), with the summary a user reads."""
    texts = [log_tail] if isinstance(log_tail, str) else list(log_tail)
    all_lines = [line for t in texts for line in t.splitlines()]
    log_step, log_total = _progress(all_lines)
    allocs = [leg for leg in legs if not leg.is_step]
    # the caller's count where it keeps one (a ledger); else the legs sacct kept, or the attempts the logs show
    requeues = requeues_used if requeues_used is not None else max(
        [len(allocs) - 1, *(len(split_attempts(t)) - 1 for t in texts), 0])

    chosen: _Finding | None = None
    verdict = dict(watchdog or {})
    if verdict.get("class") in (FailureClass.NAN_LOSS.value, FailureClass.DIVERGED.value):
        evidence = (f"watchdog.json: rule={verdict.get('rule')} step={verdict.get('step')} "
                    f"loss={verdict.get('loss')}: {verdict.get('detail', '')}").strip()
        chosen = _Finding(FailureClass(verdict["class"]), signs.WATCHDOG, -3000, evidence)
        step = step if step is not None else verdict.get("step")
        pool_lines, pool_records = all_lines, list(legs)
    else:
        for records, lines in _attempt_pools(legs, texts):
            found = _leg_findings(records) + _line_findings(lines)
            if found:
                chosen = min(found, key=lambda f: (f.tier, f.order))
                pool_lines, pool_records = lines, records
                break
    if chosen is None:
        pools = _attempt_pools(legs, texts)
        last_lines = pools[0][1] if pools else []
        hint = next((x.strip() for x in last_lines if signs.UNKNOWN_HINT.search(x)), "")
        last = next((x.strip() for x in reversed(all_lines) if x.strip()), "")
        evidence = hint or (allocs[-1].describe() if allocs else last) or "no sacct record and no log"
        chosen, pool_lines, pool_records = _Finding(FailureClass.UNKNOWN, 99, 0, evidence[:500]), [], []

    nodes: tuple[str, ...] = ()
    if chosen.klass in NODE_CLASSES:  # a time limit, preemption or OOM is no node's fault: nothing to avoid
        nodes = chosen.nodes
        if len(nodes) != 1:
            nodes = _node_hints(pool_lines, pool_records) or nodes
    step = step if step is not None else log_step
    total = total if total is not None else log_total
    summary = summarize(chosen.klass, chosen.evidence, nodes, requeues, requeue_budget, step, total)
    return Failure(chosen.klass, chosen.evidence, tuple(nodes), summary, step, total, requeues, requeue_budget)
