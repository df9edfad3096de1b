"""Why a cell failed: one class, the one line of evidence that decided it, and the nodes to avoid.

Inputs are what the orchestrator can read after a job ends: every record `sacct --duplicates` keeps of the
job (a requeued job has one per run, "leg"), the tail of the cell's logs, the loss watchdog's verdict
(<output_dir>/watchdog.json) and the progress the trainer logged. Pure: no I/O, stdlib only.

Rules, in order (the first that yields a class decides):
1. The loss watchdog's verdict (nan_loss, diverged): the run stopped itself on purpose.
2. Attempts are weighed from the last backwards; the last attempt showing any sign decides. An attempt is
   one sacct leg (with its steps) and the matching stretch of each log, aligned from the end (logs are split
   at restart and requeue markers, and where a line comes well after the scheduler ended the job: lines.py).
   A requeued job's last record often shows only a pending reason, so an earlier leg still decides.
3. Within an attempt the lowest tier wins (signs.py: watchdog line < root causes < scheduler end <
   communication < the loss < the run's own failure); within a tier sacct's state comes first, then a message
   before quoted source code, then a sign's rank, then the earliest line (the first failure observed is the
   cause, later ones its echo). One exception to the tiers: a communication failure that follows a failure
   the run itself named (the backend refusing its data, a CUDA fault) is that failure's echo on the other ranks.
4. Exceptions (lines.py finds them behind launchers' labels and in spliced output, and C++'s terminate ...
   what()): the run's failure is its last exception, or the first of its chain (raise ... from ...). It is
   `backend_error` only on positive evidence that the backend refused its config or data: a sign of that
   (signs.py), or a value error raised from the backend's argument parsing, config validation or data
   loading (a frame of those in its traceback); or that the user's own code or config failed before the
   first step: a plain exception (signs.PLAIN_ERRORS) outside the training loop, before any loss was
   logged, with no sign of anything else in the attempt. Any other exception is `unknown`, with itself as
   evidence.
5. The loss: the last logged loss not finite, a loss scaler pushed to its floor (nan_loss); a loss that jumped
   and never came back decides only when nothing else in the log does (diverged).
6. Nothing at all: `unknown`, with the most telling line left (a crash, a kill, an exit status) as evidence.
submitit's account of a signal's timing weighs as a launcher's reading of the scheduler (below its record).
Ignored on purpose: pending reasons (BeginTime, Dependency, ...: a wait, not an end), step records CANCELLED
by a time limit or preemption, wrapper exceptions (ChildFailedError, CalledProcessError, ...), which only
re-raise a child's error, and another tool's label the scheduler's record does not back (signs.py).
Nodes are named only for a node's own fault (classes.NODE_CLASSES).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sft_grid.core.failures import signs
from sft_grid.core.failures.classes import DESCRIPTION, NODE_CLASSES, Failure, FailureClass
from sft_grid.core.failures.lines import Line, read_lines, split_attempts
from sft_grid.core.failures.sacct import SacctLeg

F = FailureClass
# a loss that jumped and stayed up: below every named failure and every exception
SPIKE = signs.EXCEPTION + 1
SPIKE_UP, SPIKE_STAYS = 1.5, 1.1  # the jump over the lowest loss before it, and where the loss stays after it

# allocation state -> (class, tier); the other states (REQUEUED, FAILED, COMPLETED, PENDING, ...) say nothing
_STATES = {
    "TIMEOUT": (F.TIME_LIMIT, signs.SCHEDULER),
    "DEADLINE": (F.TIME_LIMIT, signs.SCHEDULER),
    "PREEMPTED": (F.PREEMPTED, signs.SCHEDULER),
    "NODE_FAIL": (F.NODE_FAILURE, signs.SCHEDULER),
    "BOOT_FAIL": (F.NODE_FAILURE, signs.SCHEDULER),
    "OUT_OF_MEMORY": (F.HOST_OOM, signs.ROOT),
}
# the few sacct reasons that describe an end rather than a wait
_REASONS = {"NodeDown": F.NODE_FAILURE, "launch failed requeued held": F.NODE_FAILURE}


@dataclass(frozen=True)
class _Finding:
    klass: FailureClass
    tier: int
    order: int  # sacct findings < 0 (before any line), then line index
    evidence: str
    nodes: tuple[str, ...] = ()
    code: bool = False  # found on source code a traceback quotes: weaker than a message
    rank: int = 0
    named: bool = False  # a failure of the run's own that a sign or positive evidence names (rule 3's echo)

    @property
    def key(self) -> tuple[int, bool, int, int]:
        return self.tier, self.code, self.rank, self.order


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
            found.append(_Finding(F.CANCELLED, signs.SCHEDULER, i - 2000, leg.describe()))
        elif leg.reason in _REASONS:
            found.append(
                _Finding(
                    _REASONS[leg.reason],
                    signs.SCHEDULER,
                    i - 2000,
                    f"{leg.job_id} Reason={leg.reason}",
                    tuple(leg.node_names()),
                )
            )
    return found


def _best_sign(line: Line, earlier: Sequence[Line]) -> tuple[signs.Sign, str] | None:
    """The strongest sign on a line, and the text to quote (Line.quote; the physical line where the sign shows only
    with the next line a terminal cut this one from)."""
    best: tuple[signs.Sign, str] | None = None
    for sign in signs.SIGNS:
        where = ""
        if sign.pattern.search(line.raw) or (line.joined and sign.pattern.search(line.text)):
            where = line.quote
        elif line.wrapped and (m := sign.pattern.search(line.wrapped)) and m.start() < len(line.raw) < m.end():
            where = line.raw
        if not where or (best is not None and (sign.tier, sign.rank) >= (best[0].tier, best[0].rank)):
            continue
        if sign.unless_after is not None and any(sign.unless_after.search(x.raw) for x in earlier):
            continue  # the consequence of an earlier line, which is what to explain
        best = (sign, where)
    return best


def _sign_findings(lines: Sequence[Line]) -> list[_Finding]:
    found = []
    running = False  # the process group is up: a lost connection is a failed collective from here on
    for line in lines:
        running = running or bool(signs.GROUP_RUNNING.search(line.raw))
        hit = _best_sign(line, lines[: line.index])
        if hit is not None:
            sign, text = hit
            klass = sign.running if sign.running is not None and running else sign.klass
            named = sign.tier == signs.EXCEPTION
            found.append(
                _Finding(klass, sign.tier, line.index, text[:500], _nodes_in(line.raw), line.code, sign.rank, named)
            )
        running = running or bool(signs.GROUP_RUNNING.search(line.raw) or _loss_in(line.raw) is not None)
    return found


@dataclass(frozen=True)
class _Exception:
    line: Line
    kind: str  # the exception's type ("" for C++'s what())
    frames: tuple[str, ...]  # the traceback's frames since the exception before it
    functions: tuple[str, ...] = ()  # the functions of those frames


def _exceptions(lines: Sequence[Line]) -> list[list[_Exception]]:
    """The exceptions of the log in chains (raise ... from, or raised while handling another), oldest first."""
    chains: list[list[_Exception]] = []
    frames: list[str] = []
    functions: list[str] = []
    linked = False  # a chain marker since the last exception
    for line in lines:
        if line.frame:
            frames.append(line.frame)
            if m := signs.FRAME_FUNCTION.search(line.text):
                functions.append(m.group("func"))
        if signs.CHAINED.search(line.text):
            linked = True
        if line.code:
            continue
        what = signs.WHAT.match(line.text)
        exc = signs.EXCEPTION_LINE.match(line.text)
        if what is None and (exc is None or signs.WRAPPERS.search(line.text) or signs.NCCL_RESULT.match(line.text)):
            continue
        found = _Exception(line, exc.group("type") if exc and not what else "", tuple(frames), tuple(functions))
        if linked and chains:
            chains[-1].append(found)
        else:
            chains.append([found])
        frames, functions, linked = [], [], False
    return chains


def _positive(chain: Sequence[_Exception], named: set[int]) -> bool:
    """Whether a chain is the backend refusing its config or data: a sign of that on one of its exceptions, or a
    value error raised through the backend's argument parsing, config validation or data loading."""
    for exc in chain:
        if exc.line.index in named:
            return True
        if signs.VALUE_ERRORS.search(exc.kind) and any(signs.CONFIG_DATA_FRAME.search(f) for f in exc.frames):
            return True
    return False


def _early_user_error(chain: Sequence[_Exception], lines: Sequence[Line], sign_found: Sequence[_Finding]) -> bool:
    """Whether a chain is the user's own code or config failing before the first training step: a plain exception
    (signs.PLAIN_ERRORS, its message naming nothing of the machine's) raised outside the training loop, before any
    loss or step was logged, in an attempt with no sign of anything else (an infrastructure fault, a crash)."""
    cause = chain[0]
    if not signs.PLAIN_ERRORS.search(cause.kind) or signs.MACHINE_WORDS.search(cause.line.text):
        return False
    if any(signs.TRAINING_LOOP_FUNCTION.fullmatch(f.rsplit(".", 1)[-1]) for e in chain for f in e.functions):
        return False
    if any(f.klass is not F.BACKEND_ERROR for f in sign_found):
        return False
    if any(signs.UNKNOWN_HINTS[0].search(x.raw) for x in lines):
        return False  # a crash (a segfault, an abort, NCCL's warning) besides it
    before = [x for x in lines[: cause.line.index] if not x.code]
    return not any(_loss_in(x.raw) is not None or signs.TRAINING_STEP.search(x.raw) for x in before)


def _exception_findings(lines: Sequence[Line], sign_found: Sequence[_Finding]) -> list[_Finding]:
    refused = {f.order for f in sign_found if f.klass is F.BACKEND_ERROR}
    chains = _exceptions(lines)
    found = []
    for i, chain in enumerate(chains):
        cause = chain[0].line
        evidence = cause.quote[:500]
        if _positive(chain, refused):
            found.append(_Finding(F.BACKEND_ERROR, signs.EXCEPTION, cause.index, evidence, named=True))
        elif i == len(chains) - 1:
            # the run's last exception: the user's if it is their code or config failing before training started
            # (rule), else nothing says whose fault it is: not the user's
            if _early_user_error(chain, lines, sign_found):
                found.append(_Finding(F.BACKEND_ERROR, signs.EXCEPTION, cause.index, evidence, named=True))
            else:
                found.append(_Finding(F.UNKNOWN, signs.EXCEPTION, cause.index, evidence))
    return found


def _loss_in(text: str) -> float | None:
    """The loss a line logs, in any of the formats signs.py names (perplexity as its logarithm), or None. A step
    whose gradient norm is NaN while its loss shows 0.0 (fp16 overflow as the HF Trainer logs it), or that ESPnet
    skipped for a NaN norm, logs a loss that is not finite."""
    m = signs.LOSS_VALUE.search(text) or signs.OTHER_LOSS_VALUE.search(text)
    value = _number(m.group("value")) if m else None
    if value is None and (p := signs.PERPLEXITY_VALUE.search(text)):
        ppl = _number(p.group("value"))
        value = math.log(ppl) if math.isfinite(ppl) and ppl > 0 else math.nan
    if (value is None or value == 0.0) and signs.GRAD_NORM_NAN.search(text):
        value = math.nan
    return value


def _loss_findings(lines: Sequence[Line]) -> list[_Finding]:
    losses: list[tuple[Line, float]] = []
    scales: list[tuple[Line, float]] = []
    for line in lines:
        if line.code:
            continue  # a traceback's quoted source ("assert not np.isnan(loss), 'diverged with loss = NaN'")
        if (value := _loss_in(line.raw)) is not None:
            if value == 0.0 and losses and math.isnan(losses[-1][1]):
                value = math.nan  # the same overflowed step logged again without its gradient norm (a callback's)
            losses.append((line, value))
        scales.extend((line, _number(s.group("to"))) for s in signs.SCALE_DOWN.finditer(line.raw))
    found = []
    # the last logged loss decides: an early NaN on an all-masked batch that training got past is no failure.
    # The evidence is where the loss became NaN and stayed so (a scaler: where it reached its floor and stayed)
    # (the scaler's own word that it gave up, a sign, is stronger than its halvings: rank 1)
    rules = ((0, losses, lambda v: not math.isfinite(v)), (1, scales, lambda v: v <= signs.SCALE_FLOOR))
    for rank, series, bad in rules:
        if series and bad(series[-1][1]):
            start = len(series) - 1
            while start and bad(series[start - 1][1]):
                start -= 1
            found.append(
                _Finding(F.NAN_LOSS, signs.LOSS, series[start][0].index, series[start][0].raw[:500], rank=rank)
            )
    spike = _spike(losses)
    if spike is not None:
        found.append(_Finding(F.DIVERGED, SPIKE, spike.index, spike.raw[:500]))
    return found


def _spike(losses: Sequence[tuple[Line, float]]) -> Line | None:
    """The line where the loss rose well above its lowest value so far and never came back near it: a jump that
    later losses stay above, or a climb the log ends on (two rises in a row up to it, so one noisy value at the
    end is not enough)."""
    values = [v for _, v in losses]
    if len(values) < 3 or not all(math.isfinite(v) and v > 0 for v in values):
        return None
    for j in range(1, len(values)):
        low = min(values[:j])
        if values[j] < SPIKE_UP * low:
            continue
        if min(values[j:]) < SPIKE_STAYS * low:
            return None  # it came back: a spike training got past
        climbing = j >= 2 and values[j - 2] < values[j - 1] < values[j]
        return losses[j][0] if j < len(values) - 1 or climbing else None
    return None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _choose(found: Sequence[_Finding]) -> _Finding:
    best = min(found, key=lambda f: f.key)
    if best.tier == signs.COMM:
        # rule 3's exception: ranks losing their peer after a failure the run named are its echo
        causes = [f for f in found if f.named and f.order < best.order]
        if causes:
            return min(causes, key=lambda f: f.order)
    return best


def _timing_findings(lines: Sequence[Line]) -> list[_Finding]:
    """submitit's account of when a signal came (signs.SUBMITIT_TIMING): far from the time limit (submitit's "has
    not timed out": before 80% of it and more than 10 minutes from it), a preemption; else the limit's warning. A
    launcher's reading of the scheduler's signal: below the scheduler's record and submitit's own verdicts."""
    found = []
    for line in lines:
        if m := signs.SUBMITIT_TIMING.search(line.raw):
            early = int(m.group("asked")) - int(m.group("ran")) > signs.WARNING_MARGIN_MIN
            klass = F.PREEMPTED if early and " not " in m.group(0) else F.TIME_LIMIT
            found.append(_Finding(klass, signs.SCHEDULER, line.index, line.raw[:500], rank=2))
    return found


def _findings(records: Sequence[SacctLeg], text_lines: Sequence[str]) -> list[_Finding]:
    lines = read_lines(text_lines)
    signed = _sign_findings(lines) + _timing_findings(lines)
    return _leg_findings(records) + signed + _exception_findings(lines, signed) + _loss_findings(lines)


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


def _hint(lines: Sequence[str]) -> str:
    """The most telling line when nothing decided: the first line of the strongest kind (signs.UNKNOWN_HINTS)."""
    for pattern in signs.UNKNOWN_HINTS:
        for line in lines:
            if pattern.search(line):
                return line.strip()
    return ""


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
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize(
    klass: FailureClass,
    evidence: str,
    nodes: Sequence[str],
    requeues: int,
    budget: int,
    step: int | None,
    total: int | None,
) -> str:
    """One line, e.g. "time limit reached after 3 requeues (budget 3), at step 297 of 300"."""
    text = DESCRIPTION[klass]
    if requeues or (budget and klass in (F.TIME_LIMIT, F.PREEMPTED)):
        text += f" after {requeues} requeue{'s' if requeues != 1 else ''}" + (f" (budget {budget})" if budget else "")
    if step is not None:
        text += f", at step {step}" + (f" of {total}" if total else "")
    if nodes:
        text += f", on {','.join(nodes)}"
    if klass not in (F.TIME_LIMIT, F.PREEMPTED, F.CANCELLED) and evidence:
        text += f": {_short(evidence)}"
    return text


def classify(
    legs: Sequence[SacctLeg],
    log_tail: str | Sequence[str],
    watchdog: Mapping[str, Any] | None = None,
    requeues_used: int | None = None,
    requeue_budget: int = 0,
    step: int | None = None,
    total: int | None = None,
) -> Failure:
    """The failure of one cell (legs: its allocation's records in sacct's order; log_tail: one log or
    several, each in time order), with the summary a user reads."""
    texts = [log_tail] if isinstance(log_tail, str) else list(log_tail)
    all_lines = [line for t in texts for line in t.splitlines()]
    log_step, log_total = _progress(all_lines)
    allocs = [leg for leg in legs if not leg.is_step]
    # the caller's count where it keeps one (a ledger); else the legs sacct kept, or the attempts the logs show
    requeues = (
        requeues_used
        if requeues_used is not None
        else max([len(allocs) - 1, *(len(split_attempts(t)) - 1 for t in texts), 0])
    )

    chosen: _Finding | None = None
    pool_lines: list[str] = []
    pool_records: list[SacctLeg] = []
    verdict = dict(watchdog or {})
    if verdict.get("class") in (F.NAN_LOSS.value, F.DIVERGED.value):
        evidence = (
            f"watchdog.json: rule={verdict.get('rule')} step={verdict.get('step')} "
            f"loss={verdict.get('loss')}: {verdict.get('detail', '')}"
        ).strip()
        chosen = _Finding(F(verdict["class"]), signs.WATCHDOG, -3000, evidence)
        step = step if step is not None else verdict.get("step")
        pool_lines, pool_records = all_lines, list(legs)
    else:
        for records, lines in _attempt_pools(legs, texts):
            found = _findings(records, lines)
            if found:
                chosen = _choose(found)
                if chosen.tier == SPIKE and _hint(lines):
                    chosen = None  # a crash or a kill says more than a loss curve: unknown, below
                pool_lines, pool_records = lines, records
                break
    if chosen is None:
        pools = _attempt_pools(legs, texts)
        last_lines = pools[0][1] if pools else []
        last = next((x.strip() for x in reversed(all_lines) if x.strip()), "")
        evidence = _hint(last_lines) or (allocs[-1].describe() if allocs else last) or "no sacct record and no log"
        chosen, pool_lines, pool_records = _Finding(F.UNKNOWN, 99, 0, evidence[:500]), [], []

    nodes: tuple[str, ...] = ()
    if chosen.klass in NODE_CLASSES:  # no other class is a node's fault: nothing to avoid
        nodes = chosen.nodes
        if len(nodes) != 1:
            nodes = _node_hints(pool_lines, pool_records) or nodes
    step = step if step is not None else log_step
    total = total if total is not None else log_total
    summary = summarize(chosen.klass, chosen.evidence, nodes, requeues, requeue_budget, step, total)
    return Failure(
        klass=chosen.klass,
        evidence=chosen.evidence,
        nodes=tuple(nodes),
        summary=summary,
        step=step,
        total=total,
        requeues=requeues,
        requeue_budget=requeue_budget,
    )
