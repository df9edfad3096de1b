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
last factor), which needs no probe, so it serves every backend that logs its loss and learning rate. Its evidence
carries a band (`extrapolate_band`: the error the same fit made extrapolating the curve's own first half to the
rung, scaled to the reach from the rung to the end), and the rung keeps by confidence rather than a fixed fraction:
every cell whose band overlaps the best's, at least the best and at most BAND_EXTRA more than `ceil(keep x n)` (so
the steps spent stay bounded); a cell clear of the best's band is pruned even within the fixed fraction.

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
from statistics import NormalDist
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
    # cell -> (lo, hi): the evidence's band where the rung kept by confidence (guard: extrapolate); empty otherwise
    bands: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bracket": self.bracket,
            "rung": self.rung,
            "step": self.step,
            "metric": self.metric,
            "evidence": dict(sorted(self.evidence.items())),
            "kept": list(self.kept),
            "pruned": list(self.pruned),
        }
        if self.bands:
            out["bands"] = {c: [lo, hi] for c, (lo, hi) in sorted(self.bands.items())}
        return out

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
            {str(k): (float(v[0]), float(v[1])) for k, v in (d.get("bands") or {}).items()},
        )

    def why(self, cell: str) -> str:
        """The rung's evidence for one cell, in words (what `status` shows beside `pruned`)."""
        best = min(self.evidence, key=lambda c: (self.evidence[c], c))
        kept_worst = max(self.evidence[c] for c in self.kept)
        head = f"pruned at rung {self.rung + 1} (step {self.step}): {self.metric} {self.evidence[cell]:.4f}"
        if cell in self.bands and best in self.bands:
            (lo, hi), (best_lo, best_hi) = self.bands[cell], self.bands[best]
            where = "clear of" if lo > best_hi else "overlapping, past the most kept of"
            return (
                f"{head} (band [{lo:.4f}, {hi:.4f}], {where} the best's: {self.evidence[best]:.4f}"
                f" [{best_lo:.4f}, {best_hi:.4f}]); {len(self.kept)} kept of {len(self.evidence)}"
            )
        return (
            f"{head}, the {len(self.kept)} kept of {len(self.evidence)} were at most {kept_worst:.4f}"
            f" (best {self.evidence[best]:.4f})"
        )


# the cells beyond the fixed fraction, ceil(keep x n), that a rung deciding by confidence may keep when their bands
# overlap the best's: what bounds the steps spent (brackets of 9, keep 0.4, rungs at 1/9 and 1/3: at most 5 then 3
# cells go on, 45.6% of the full sweep's steps, against 4 then 2, 35.7%, for the fixed fraction)
BAND_EXTRA = 1


def decide_rung(
    bracket: str,
    rung: int,
    step: int,
    evidence: Mapping[str, float],
    keep: float,
    metric: str = "loss",
    bands: Mapping[str, tuple[float, float]] | None = None,
) -> RungDecision:
    """Rank one rung (lower is better; ties broken by the cell's name, so the order never depends on time).

    Without `bands` the best `ceil(keep x n)` are kept. With a band (lo, hi) for every cell the rung keeps by
    confidence: the cells whose band overlaps the best's (lo <= the best's hi), in the order of their evidence, at
    most `ceil(keep x n) + BAND_EXTRA`, at least the best: fewer than the fixed fraction where the bands tell the
    cells apart, more where they cannot."""
    evidence = {c: float(v) for c, v in evidence.items()}  # plain floats (an Estimate's band goes to `bands`)
    n = len(evidence)
    k = max(1, math.ceil(n * keep - 1e-9))
    order = sorted(evidence, key=lambda c: (evidence[c], c))
    if bands is None or not order or any(c not in bands for c in order):
        return RungDecision(
            bracket, rung, step, metric, dict(evidence), tuple(sorted(order[:k])), tuple(sorted(order[k:]))
        )
    best_hi = bands[order[0]][1]
    near = [c for c in order if c == order[0] or bands[c][0] <= best_hi]
    kept = set(near[: k + BAND_EXTRA])
    return RungDecision(
        bracket,
        rung,
        step,
        metric,
        dict(evidence),
        tuple(sorted(kept)),
        tuple(sorted(c for c in order if c not in kept)),
        {c: (float(bands[c][0]), float(bands[c][1])) for c in order},
    )


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
    L(s) = c + b s^-beta + k f(s), the data term (a power law in the steps seen, Kaplan et al.; saturating in
    log-step) plus a noise floor proportional to the learning rate's factor f (which the decay removes: the flip a
    pruner must not be fooled by; Tissue et al. 2024, "Scaling law with learning rate annealing", use the same
    split), fitted by least squares with c, b, k >= 0 (a loss, a falling data term, a floor that only adds), linear
    in (c, b, k) for each beta of a grid, the best beta refined between its neighbours; evaluated at (total, end).
    Without variation in f (a constant schedule) k is dropped. None with fewer than MIN_POINTS points."""
    pts = _clean(points)
    if len(pts) < MIN_POINTS:
        return None
    return _curve_model(pts)(total, end)


class Estimate(float):
    """An extrapolated final loss (the float itself) with its band: `lo`, `hi` (None where the curve is too short to
    hold a part of it out). A float, so that whatever passes evidence on (adaptive/prune.py) passes the band with it;
    `plan` decides a rung by confidence when every cell's evidence carries one."""

    lo: float | None
    hi: float | None

    def __new__(cls, value: float, lo: float | None = None, hi: float | None = None) -> Estimate:
        obj = super().__new__(cls, value)
        obj.lo, obj.hi = lo, hi
        return obj

    @property
    def band(self) -> tuple[float, float] | None:
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)


# the band's level: a cell is kept while its band overlaps the best's
BAND_LEVEL = 0.9


def extrapolate_band(
    points: Sequence[tuple[float, float, float]], total: float, end: float, level: float = BAND_LEVEL
) -> Estimate | None:
    """`extrapolate`'s value with a band from the errors the same fit makes extrapolating this very curve (rolling
    origin, as analysis/forms.py chooses a form): the fit of the points up to half the last step predicts the points
    after it; s, the root-mean-square of those log errors per unit of log-step reach (sqrt(sum e^2 / sum r^2), r the
    distance in log-step beyond the last fitted point: an error that grows with the reach, as a misjudged slope's
    does), times the reach from the last point to `total`, combined with the fit's in-sample log residual, times the
    normal quantile of `level`: value x exp(+-z sqrt((s log(total / last))^2 + residual^2)). No band (lo, hi None)
    where the first half holds fewer than MIN_POINTS points or the second fewer than 2. None as `extrapolate`."""
    import numpy as np

    pts = _clean(points)
    if len(pts) < MIN_POINTS:
        return None
    model = _curve_model(pts)
    value = model(total, end)
    last = pts[-1][0]
    train = [p for p in pts if p[0] <= last / 2]
    test = [p for p in pts if p[0] > last / 2]
    if len(train) < MIN_POINTS or len(test) < 2 or not value > 0:
        return Estimate(value)
    fold = _curve_model(train)
    reach_from = train[-1][0]
    errs = np.array([math.log(max(fold(s, f), 1e-12) / v) for s, v, f in test])
    reach = np.array([math.log(s / reach_from) for s, _, _ in test])
    per_reach = float(np.sqrt(np.sum(errs**2) / np.sum(reach**2)))
    resid = float(np.sqrt(np.mean([math.log(max(model(s, f), 1e-12) / v) ** 2 for s, v, f in pts])))
    z = NormalDist().inv_cdf((1 + level) / 2)
    half = z * math.hypot(per_reach * math.log(max(total, last) / last), resid)
    return Estimate(value, value * math.exp(-half), value * math.exp(half))


def _clean(points: Sequence[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    pts = [(float(s), float(v), float(f)) for s, v, f in points if s > 0 and math.isfinite(v) and math.isfinite(f)]
    return sorted(pts)


def _curve_model(pts: Sequence[tuple[float, float, float]]) -> Callable[[float, float], float]:
    """`extrapolate`'s fit of (step, loss, factor) points (at least one): the fitted L(s, f)."""
    import numpy as np
    from scipy.optimize import minimize_scalar, nnls

    steps = np.array([p[0] for p in pts], dtype=float)
    loss = np.array([p[1] for p in pts])
    factor = np.array([p[2] for p in pts])
    varies = float(np.ptp(factor)) > 1e-6

    def solve(beta: float) -> tuple[float, Any]:
        cols = [np.ones_like(steps), steps**-beta] + ([factor] if varies else [])
        design = np.stack(cols, axis=1)
        coef, _ = nnls(design, loss)
        return float(np.sum((design @ coef - loss) ** 2)), coef

    sse = [solve(beta)[0] for beta in _BETAS]
    i = int(np.argmin(sse))
    # the grid's best beta, refined between its neighbours
    lo, hi = _BETAS[max(0, i - 1)], _BETAS[min(len(_BETAS) - 1, i + 1)]
    found = minimize_scalar(lambda b: solve(b)[0], bounds=(lo, hi), method="bounded", options={"xatol": 1e-5})
    beta = float(found.x) if found.success and found.fun <= sse[i] else _BETAS[i]
    coef = solve(beta)[1]

    def at(s: float, f: float) -> float:
        return float(coef[0] + coef[1] * s**-beta + (coef[2] * f if varies else 0.0))

    return at


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


def extrapolated_loss(cell_dir: Path, step: int, total: int, end: float) -> Estimate | None:
    """`guard: extrapolate`'s evidence: the cell's logged curve up to `step` extrapolated to `total`, with its band
    (extrapolate_band); None while it has logged no loss at `step` itself."""
    curve = logged_curve(cell_dir, step)
    if not curve or curve[-1][0] != step:
        return None
    return extrapolate_band(curve, total, end)


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
                found = {c: v for c, v in values.items() if v is not None}
                # evidence that carries its band (guard: extrapolate's Estimate): the rung keeps by confidence
                bands = {c: b for c, v in found.items() if isinstance(v, Estimate) and (b := v.band) is not None}
                d = decide_rung(bracket, i, step, found, keep, metric, bands if len(bands) == len(found) else None)
                new.append(d)
                every[(bracket, i)] = d
            actions += [Action("prune", c, step, d.why(c)) for c in d.pruned]
            alive = [c for c in alive if c in d.kept]
        else:
            actions += [Action("run", c, None) for c in alive]
    return Plan(tuple(new), tuple(actions), every)
