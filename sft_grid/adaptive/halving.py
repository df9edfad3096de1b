"""Successive halving across Slurm, decided from files alone (no live channel to the jobs).

The cells of a bracket (cells alike in the `by:` keys; typically one size and seed, several learning rates) train
in legs that end at the rungs. At each rung, once every surviving cell of the bracket has its evidence on the shared
filesystem, the rung is decided: the cells are ranked on that evidence and the best `ceil(keep x n)` continue; the
rest are pruned (they keep their checkpoint, and can be resumed by hand). Synchronous halving (a rung waits for its
whole bracket) rather than ASHA's asynchronous promotion: a decision then depends on the files only, never on the
order in which jobs happened to end, which is what makes it deterministic and replayable (ASHA's own authors note
its early promotions rest on fewer cells; Li et al. 2018).

The decay's flip (rankings of learning rates invert while the learning rate decays; Wen et al. 2025, "never prune
on pre-annealing loss"): with `guard: cooldown` each cell is compared on a short cooldown probe from the rung's
checkpoint (the learning rate decayed to 0 over `probe` x the rung's steps, then evaluated and discarded), as the
end of a schedule would see it; with `guard: position` on its logged loss at the rung's step, smoothed over the last
three logging points (every cell of a bracket at the same steps, so at the same schedule position); with
`guard: extrapolate` on its logged curve extrapolated to the schedule's end (`extrapolate`: the curve's own shape
under its own learning-rate schedule, fitted to its logged points, evaluated at the last step with the schedule's
last factor), which needs no probe, so it serves every backend that logs its loss and learning rate.

Every decision is appended to the grid's record (`<sweep dir>/.sft_grid_prune.jsonl`) before anything acts on it.
A record's decision is never recomputed: an orchestrator killed anywhere and started again reads the same record
and the same files and takes the same decisions (a decision it had computed but not recorded is recomputed from
the same files, so it is the same). A line cut by a kill is ignored (its decision is taken again).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sft_grid.analysis.along import logged_losses
from sft_grid.core.layout import OUTPUT_DIR, TRAINER_LOG

RECORD_FILE = ".sft_grid_prune.jsonl"
PROBE_FILE = "probe-{step}.json"  # in the cell's output/: a cooldown probe's result


@dataclass(frozen=True)
class RungDecision:
    """One rung of one bracket: the evidence each cell had, and who continues."""

    bracket: str
    rung: int  # index into the rungs
    step: int
    metric: str
    evidence: Mapping[str, float]
    kept: tuple[str, ...]
    pruned: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "bracket": self.bracket,
            "rung": self.rung,
            "step": self.step,
            "metric": self.metric,
            "evidence": dict(sorted(self.evidence.items())),
            "kept": list(self.kept),
            "pruned": list(self.pruned),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RungDecision:
        return cls(
            str(d["bracket"]),
            int(d["rung"]),
            int(d["step"]),
            str(d["metric"]),
            {str(k): float(v) for k, v in d["evidence"].items()},
            tuple(d["kept"]),
            tuple(d["pruned"]),
        )

    def why(self, cell: str) -> str:
        """The rung's evidence for one cell, in words (what `status` shows beside `pruned`)."""
        best = min(self.evidence.values())
        kept_worst = max(self.evidence[c] for c in self.kept)
        return (
            f"pruned at rung {self.rung + 1} (step {self.step}): {self.metric} {self.evidence[cell]:.4f}, the"
            f" {len(self.kept)} kept of {len(self.evidence)} were at most {kept_worst:.4f} (best {best:.4f})"
        )


def decide_rung(
    bracket: str, rung: int, step: int, evidence: Mapping[str, float], keep: float, metric: str = "loss"
) -> RungDecision:
    """Rank one rung (lower is better; ties broken by the cell's name, so the order never depends on time)."""
    n = len(evidence)
    k = max(1, math.ceil(n * keep - 1e-9))
    order = sorted(evidence, key=lambda c: (evidence[c], c))
    return RungDecision(bracket, rung, step, metric, dict(evidence), tuple(sorted(order[:k])), tuple(sorted(order[k:])))


# -- the record ------------------------------------------------------------------------------------------------


def read_record(sweep_dir: Path) -> dict[tuple[str, int], RungDecision]:
    """(bracket, rung) -> its decision; the first line of a (bracket, rung) wins, a cut or damaged line (not JSON,
    not UTF-8) is skipped: that rung is decided again."""
    path = sweep_dir / RECORD_FILE
    out: dict[tuple[str, int], RungDecision] = {}
    if not path.is_file():
        return out
    for line in path.read_bytes().splitlines():
        try:
            d = RungDecision.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue
        out.setdefault((d.bracket, d.rung), d)
    return out


def write_decision(sweep_dir: Path, decision: RungDecision) -> None:
    """Append one decision, flushed to disk before the caller acts on it."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    line = json.dumps(decision.to_json(), sort_keys=True) + "\n"
    with (sweep_dir / RECORD_FILE).open("a") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


# -- the evidence, from a cell's files -------------------------------------------------------------------------


def logged_loss(cell_dir: Path, step: int, points: int = 3) -> float | None:
    """The training loss at `step`, smoothed: the mean of the last `points` losses the trainer's per-step log holds
    at steps up to `step` (every cell of a bracket logs at the same steps, so all are read at the same schedule
    position); None while the cell has logged no loss at `step` itself."""
    output = cell_dir / OUTPUT_DIR
    if not (output / TRAINER_LOG).is_file():
        return None
    losses = {at: loss for at, loss in logged_losses(output) if at <= step}
    if step not in losses:
        return None
    last = [losses[s] for s in sorted(losses)[-points:]]
    return sum(last) / len(last)


def probe_loss(cell_dir: Path, step: int) -> float | None:
    """A cooldown probe's loss from the checkpoint at `step`, or None while it has none."""
    path = cell_dir / OUTPUT_DIR / PROBE_FILE.format(step=step)
    try:
        return float(json.loads(path.read_text())["loss"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# the fewest logged points before a rung that `guard: extrapolate` fits (its form has four parameters)
MIN_POINTS = 5
_BETAS = tuple(0.02 * 1.12**i for i in range(40))  # 0.02 .. ~1.7, the data exponents tried


def schedule_end(kind: str) -> float:
    """The learning rate's factor at a schedule's last step: 1 for the constant ones, 0 for those that decay."""
    return 1.0 if kind in {"constant", "constant_with_warmup"} else 0.0


def extrapolate(points: Sequence[tuple[float, float, float]], total: float, end: float) -> float | None:
    """A training curve's loss at step `total` from its logged (step, loss, lr factor) points: the form
    L(s) = c + b s^-beta + k f(s), the data term (a power law in the steps seen, Kaplan et al.) plus a noise floor
    proportional to the learning rate's factor f (which the decay removes: the flip a pruner must not be fooled
    by; Tissue et al. 2024, "Scaling law with learning rate annealing", use the same split), fitted by least
    squares with c, b, k >= 0 (a loss, a falling data term, a floor that only adds), linear in (c, b, k) for each
    beta of a grid, the best beta refined between its neighbours; evaluated at (total, end). Without
    variation in f (a constant schedule) k is dropped. None with fewer than MIN_POINTS points."""
    import numpy as np
    from scipy.optimize import minimize_scalar, nnls

    pts = [(s, v, f) for s, v, f in points if s > 0 and math.isfinite(v) and math.isfinite(f)]
    if len(pts) < MIN_POINTS:
        return None
    steps = np.array([p[0] for p in pts], dtype=float)
    loss = np.array([p[1] for p in pts])
    factor = np.array([p[2] for p in pts])
    varies = float(np.ptp(factor)) > 1e-6

    def solve(beta: float) -> tuple[float, float]:
        cols = [np.ones_like(steps), steps**-beta] + ([factor] if varies else [])
        design = np.stack(cols, axis=1)
        coef, _ = nnls(design, loss)
        value = float(coef[0] + coef[1] * total**-beta + (coef[2] * end if varies else 0.0))
        return float(np.sum((design @ coef - loss) ** 2)), value

    sse = [solve(beta)[0] for beta in _BETAS]
    i = int(np.argmin(sse))
    # the grid's best beta, refined between its neighbours
    lo, hi = _BETAS[max(0, i - 1)], _BETAS[min(len(_BETAS) - 1, i + 1)]
    found = minimize_scalar(lambda b: solve(b)[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-5})
    beta = float(found.x) if found.success and found.fun <= sse[i] else _BETAS[i]
    return solve(beta)[1]


def logged_curve(cell_dir: Path, step: int) -> list[tuple[float, float, float]]:
    """The (step, loss, learning-rate factor) points the trainer's per-step log holds up to `step`, the factor
    being the logged learning rate over the largest logged so far (the peak, once warmup is over)."""
    path = cell_dir / OUTPUT_DIR / TRAINER_LOG
    rows: dict[int, tuple[float, float]] = {}
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            rec = json.loads(line)
            at, loss, lr = int(rec["current_steps"]), rec.get("loss"), rec.get("learning_rate")
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(loss, (int, float)) and isinstance(lr, (int, float)) and at <= step:
            rows[at] = (float(loss), float(lr))
    peak = max((lr for _, lr in rows.values()), default=0.0)
    return [(float(s), v, lr / peak if peak > 0 else 1.0) for s, (v, lr) in sorted(rows.items())]


def extrapolated_loss(cell_dir: Path, step: int, total: int, end: float) -> float | None:
    """`guard: extrapolate`'s evidence: the cell's logged curve up to `step` extrapolated to `total`; None while it
    has logged no loss at `step` itself."""
    curve = logged_curve(cell_dir, step)
    if not curve or curve[-1][0] != step:
        return None
    return extrapolate(curve, total, end)


# -- the plan: what each cell does next --------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """run: train (or resume) the cell up to `step` (None: to its end); probe: measure its cooldown probe at
    `step`; prune: stop it, with the rung's evidence in `why`."""

    kind: str
    cell: str
    step: int | None = None
    why: str = ""


@dataclass(frozen=True)
class Plan:
    new: tuple[RungDecision, ...]  # decisions taken now: record them before acting
    actions: tuple[Action, ...]
    decisions: Mapping[tuple[str, int], RungDecision] = field(default_factory=dict)  # every decision, recorded or new


def plan(
    brackets: Mapping[str, Sequence[str]],
    rungs: Sequence[int],
    evidence: Callable[[str, int], float | None],
    recorded: Mapping[tuple[str, int], RungDecision],
    keep: float,
    reached: Callable[[str, int], bool],
    guard: str = "cooldown",
    metric: str = "loss",
) -> Plan:
    """Pure: given the brackets' cells, the rungs (steps), each cell's evidence at a rung (None: not there yet),
    whether a cell has reached a rung (its checkpoint exists), and the recorded decisions, the decisions to take
    now and the next action of every cell."""
    new: list[RungDecision] = []
    actions: list[Action] = []
    every = dict(recorded)
    for bracket in sorted(brackets):
        alive = sorted(brackets[bracket])
        for i, step in enumerate(rungs):
            d = every.get((bracket, i))
            if d is None:
                values = {c: evidence(c, step) for c in alive}
                missing = [c for c in alive if values[c] is None]
                if missing:
                    for c in missing:
                        probe = guard == "cooldown" and reached(c, step)
                        actions.append(Action("probe" if probe else "run", c, step))
                    break
                d = decide_rung(bracket, i, step, {c: v for c, v in values.items() if v is not None}, keep, metric)
                new.append(d)
                every[(bracket, i)] = d
            actions += [Action("prune", c, step, d.why(c)) for c in d.pruned]
            alive = [c for c in alive if c in d.kept]
        else:
            actions += [Action("run", c, None) for c in alive]
    return Plan(tuple(new), tuple(actions), every)
