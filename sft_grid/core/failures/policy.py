"""What to do after a classified failure: requeue from the last checkpoint, or stop and say how to fix it.

Design:
- A Policy maps each FailureClass to a Rule (remedy kind + budget). The defaults: transient faults of the
  machine (preemption, node failure, GPU hardware, a failed collective, a rendezvous that never formed: the
  network or a node between ranks; a rank that hung, which the job's runner ended) are requeued from the last
  checkpoint, excluding the nodes the evidence names, within a bounded budget; a time limit is requeued within
  the grid's own max_requeues; everything else stops, keeping checkpoints, because running it again unchanged
  fails the same way.
- Stopping says what helps, and whose move it is: only `backend_error` (positive evidence that the backend
  refused its config or data, or that the user's code or config failed before the first step) asks the user to
  fix what the evidence names; `unknown` asks them to read the log it
  names, at the line the evidence quotes, and blames no one.
- A grid changes the defaults with a plain mapping: {"preempted": {"action": "requeue", "budget": 8},
  "gpu_oom": "stop", "node_failure": "requeue:1"}.
- remedy_for() is pure. Its Remedy carries a message for the user, the overrides it suggests, the nodes to
  exclude and, when the cell's rerun command is known, that command with the overrides applied.
Invariants: a requeue never exceeds its budget; a stop never suggests a change it cannot compute (an
override appears only when the current value is known).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sft_grid.core import human
from sft_grid.core.failures.classes import Failure, FailureClass

F = FailureClass


class RemedyKind(StrEnum):
    REQUEUE = "requeue"
    STOP = "stop"

    @classmethod
    def parse(cls, value: object) -> RemedyKind | None:
        """The remedy a ledger names, or None (none, or one this version does not know)."""
        try:
            return cls(str(value)) if value not in (None, "") else None
        except ValueError:
            return None


@dataclass(frozen=True)
class Rule:
    kind: RemedyKind
    # most requeues for this class; None: the grid's max_requeues (Failure.requeue_budget)
    budget: int | None = 0


@dataclass(frozen=True)
class OverrideKeys:
    """The config keys suggestions are written in (Hydra override spelling)."""

    time: str = "time"
    max_requeues: str = "cluster.max_requeues"
    nodes: str = "nodes"
    micro_batch_size: str = "micro_batch_size"
    lr: str = "lr"
    mem_gb: str = "cluster.mem_gb"


TRANSIENT = (F.PREEMPTED, F.NODE_FAILURE, F.COLLECTIVE_TIMEOUT, F.GPU_HARDWARE, F.RENDEZVOUS, F.HANG)
DEFAULT_RULES: Mapping[FailureClass, Rule] = {
    **{c: Rule(RemedyKind.STOP) for c in FailureClass},
    F.PREEMPTED: Rule(RemedyKind.REQUEUE, 5),
    F.NODE_FAILURE: Rule(RemedyKind.REQUEUE, 2),
    F.GPU_HARDWARE: Rule(RemedyKind.REQUEUE, 2),
    F.COLLECTIVE_TIMEOUT: Rule(RemedyKind.REQUEUE, 2),
    F.RENDEZVOUS: Rule(RemedyKind.REQUEUE, 2),
    F.HANG: Rule(RemedyKind.REQUEUE, 2),
    F.TIME_LIMIT: Rule(RemedyKind.REQUEUE, None),
}

FIX = {
    F.NAN_LOSS: "the loss became NaN/inf: lower the learning rate or add warmup; checkpoints are kept, but "
    "the newest may already hold bad weights",
    F.DIVERGED: "the loss diverged: lower the learning rate or add warmup, check the data; checkpoints are kept",
    F.BACKEND_ERROR: "the backend refused its config or data, or the run's own code or config failed before "
    "training: fix what the evidence names, then rerun",
    F.DISK_FULL: "free space or raise the quota where the cell's output and caches live; the rerun resumes "
    "from the last complete checkpoint",
    F.OFFLINE_HUB: "the Hub was out of reach and the files were not in the cache (compute nodes often have no "
    "internet): stage the model and data on a node that has it (sft-grid stage, or point "
    "the model at a local copy) and keep HF_HUB_OFFLINE=1 for training",
    F.CANCELLED: "cancelled by a user: nothing to fix; a rerun resumes from the last checkpoint",
    F.MISSING_INPUT: "the cell started before the job that builds its input had built it (the grid's order of jobs, "
    "not the config or the data): run the grid command again with rerun_failed=true; it queues that job again "
    "where the cell runs, unless the input is built by then, and the cell after it",
    F.HOST_OOM: "the node ran out of host memory: ask for more memory per node or use fewer data workers",
    # not retried unchanged: the same workers fill the same /dev/shm again; the worker count is a backend key
    F.SHM_FULL: "the data loader's workers ran out of shared memory (/dev/shm, sized by the node or container apart "
    "from the job's memory): use fewer of them (+extra.dataloader_num_workers=0 loads in the training process) or "
    "ask for a larger /dev/shm (a container's --shm-size; where /dev/shm counts against the job's memory, more "
    "memory per node); the rerun resumes from the last checkpoint",
}
# unknown: nothing says whose fault it is, so nothing is blamed; the log and its telling line are named
UNKNOWN_FIX = (
    "no rule recognises this failure as the machine's, the scheduler's or the config's or data's: read "
    "{log} around the line quoted above, and rerun once the cause is known"
)


@dataclass(frozen=True)
class Policy:
    rules: Mapping[FailureClass, Rule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    keys: OverrideKeys = OverrideKeys()

    @classmethod
    def from_mapping(cls, changes: Mapping[str, Any] | None, keys: OverrideKeys = OverrideKeys()) -> Policy:
        """The defaults with a grid's changes: class -> {"action": requeue|stop, "budget": N} or "requeue:N"."""
        rules = dict(DEFAULT_RULES)
        for name, given in (changes or {}).items():
            try:
                klass = FailureClass(name)
            except ValueError:
                raise ValueError(f"unknown failure class {name!r}; known: {[c.value for c in FailureClass]}") from None
            spec = given
            if isinstance(given, str):
                action, _, budget = given.partition(":")
                spec = {"action": action, **({"budget": budget} if budget else {})}
            if not isinstance(spec, Mapping):
                # a ValueError like every other bad value: planning/validate.py reports each one as a problem
                raise ValueError(f"{name}: {spec!r} is neither stop, requeue:N nor a mapping")
            try:
                action = RemedyKind(spec.get("action", rules[klass].kind.value))
            except ValueError:
                raise ValueError(f"{name}: action {spec.get('action')!r} is neither requeue nor stop") from None
            budget = spec.get("budget", rules[klass].budget if action is RemedyKind.REQUEUE else 0)
            if budget is not None and not str(budget).strip().isdigit():
                raise ValueError(f"budget of {name} must be a whole number >= 0, got {budget!r}")
            rules[klass] = Rule(action, None if budget is None else int(budget))
        return cls(rules, keys)

    def rule(self, klass: FailureClass) -> Rule:
        return self.rules.get(klass, Rule(RemedyKind.STOP))


@dataclass(frozen=True, kw_only=True)
class CellContext:
    """What remedy_for() may use to make suggestions concrete; unknown fields stay None."""

    rerun: tuple[str, ...] = ()  # argv that reruns the cell, e.g. python -m sft_grid model=... rerun_failed=true
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    lr: float | None = None
    time: str | None = None  # the job's time limit, [D-]HH:MM:SS
    nodes: int | None = None
    max_requeues: int | None = None
    mem_gb: int | None = None
    log: str = ""  # the log that holds the evidence (the cell's own, or its job's), as the user finds it


@dataclass(frozen=True)
class Remedy:
    kind: RemedyKind
    message: str
    overrides: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    rerun: tuple[str, ...] = ()  # the rerun argv with the overrides applied (empty when unknown or requeued)


def with_overrides(argv: Sequence[str], overrides: Sequence[str]) -> tuple[str, ...]:
    """argv with each key=value replacing an existing one for the same key, or appended."""
    keys = {o.split("=", 1)[0].lstrip("+") for o in overrides}
    kept = [a for a in argv if a.split("=", 1)[0].lstrip("+") not in keys or "=" not in a]
    return (*kept, *overrides)


def parse_time(text: str) -> int:
    """Slurm's [D-]HH:MM:SS (or MM:SS, or minutes) -> seconds."""
    days, _, rest = text.rpartition("-") if "-" in text else ("", "", text)
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        parts = [0, parts[0], 0]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def _stop(failure: Failure, ctx: CellContext, keys: OverrideKeys, why: str) -> Remedy:
    overrides: tuple[str, ...] = ()
    text = FIX.get(failure.klass, "")
    if failure.klass is F.GPU_OOM:
        mbs = ctx.micro_batch_size
        if mbs and mbs > 1:
            overrides = (f"{keys.micro_batch_size}={mbs // 2}",)
            gbs = f" ({ctx.global_batch_size})" if ctx.global_batch_size else ""
            text = (
                f"out of GPU memory: halve {keys.micro_batch_size} ({mbs} -> {mbs // 2}); the global batch"
                f"{gbs} stays, gradient accumulation doubles to make it up"
            )
        else:
            text = (
                f"out of GPU memory with {keys.micro_batch_size}=1: shorten cutoff_len, shard the model "
                "(ZeRO-3) or use more GPUs"
            )
    elif failure.klass in (F.NAN_LOSS, F.DIVERGED) and ctx.lr:
        overrides = (f"{keys.lr}={ctx.lr / 10:g}",)
    elif failure.klass is F.HOST_OOM and ctx.mem_gb:
        overrides = (f"{keys.mem_gb}={ctx.mem_gb * 2}",)
    elif failure.klass is F.TIME_LIMIT:
        overrides, text = _time_limit_advice(failure, ctx, keys)
    elif failure.klass is F.UNKNOWN:
        text = UNKNOWN_FIX.format(log=ctx.log or "the cell's log (logs/train.log) and its job's log")
    elif failure.klass in TRANSIENT:
        text = f"{failure.klass.value} again with no requeue left: check the cluster's health before a rerun"
    rerun = with_overrides(ctx.rerun, overrides) if ctx.rerun else ()
    message = f"{failure.summary}. Not retried ({why}): {text}."
    if rerun:
        message += f" Rerun: {shlex.join(rerun)}"
    return Remedy(RemedyKind.STOP, message, overrides, (), rerun)


def _time_limit_advice(failure: Failure, ctx: CellContext, keys: OverrideKeys) -> tuple[tuple[str, ...], str]:
    """How many more legs the remaining steps need at the pace so far, and the alternatives."""
    legs = failure.requeues + 1
    used = ctx.max_requeues if ctx.max_requeues is not None else failure.requeue_budget
    if failure.step and failure.total and failure.total > failure.step:
        more = math.ceil((failure.total - failure.step) / (failure.step / legs))
        where = f"stopped at step {failure.step} of {failure.total} after {legs} leg{'s' if legs > 1 else ''}"
    else:
        more, where = max(used, 1), "stopped before finishing"
    overrides = (f"{keys.max_requeues}={used + more}",)
    options = [f"{keys.max_requeues}={used + more} (about {more} more leg{'s' if more > 1 else ''} at this pace)"]
    if ctx.time:
        options.append(f"{keys.time}={human.duration(parse_time(ctx.time) * 2)} (twice the time per leg)")
    if ctx.nodes:
        options.append(f"{keys.nodes}={ctx.nodes * 2} (twice the nodes)")
    return overrides, f"{where}; checkpoints are kept and a rerun resumes; change " + " or ".join(options)


def remedy_for(
    failure: Failure, policy: Policy | None = None, attempts_so_far: int = 0, cell: CellContext | None = None
) -> Remedy:
    """The next step for a failed cell. attempts_so_far: requeues already spent on this class (for a time
    limit, the job's requeues)."""
    policy, ctx = policy or Policy(), cell or CellContext()
    rule = policy.rule(failure.klass)
    budget = failure.requeue_budget if rule.budget is None else rule.budget
    if rule.kind is RemedyKind.REQUEUE and attempts_so_far < budget:
        exclude = failure.nodes  # only node failures and GPU faults name nodes (failures.NODE_CLASSES)
        where = f", excluding {','.join(exclude)}" if exclude else ""
        message = (
            f"{failure.summary}. Requeued from the last checkpoint{where} "
            f"(requeue {attempts_so_far + 1} of {budget} for {failure.klass.value})."
        )
        return Remedy(RemedyKind.REQUEUE, message, (), tuple(exclude))
    if rule.kind is RemedyKind.REQUEUE:
        why = f"requeue budget {budget} spent"
    else:
        why = f"policy: {failure.klass.value} stops"
    return _stop(failure, ctx, policy.keys, why)
