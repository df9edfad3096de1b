"""The next cells of an adaptive grid: the fit's uncertainty on the question, reduced most per GPU-hour.

A round: (1) each recipe's completed cells (never a holdout) are fitted with the form chosen on held-out points
(analysis/forms.py: E + A N^-alpha, A N^-alpha or a log-linear, whichever extrapolated best from the smaller sizes
to the larger), and the errors it made there give the question's band at the size `at` (none through three sizes);
(2) the loop stops when the budget is spent or the band's half width is below `stop_halfwidth`; (3) otherwise each
candidate of the pool (not run, not a holdout, affordable) is scored by how much it would shrink the variance of the
forecast at `at`, per GPU-hour, and the best `batch` are chosen greedily (each choice joins the design before the
next is scored).

The choice of the next cells stays on the form E + A N^-alpha: the variance is the fit's linearisation (the delta
method; the classic V-optimal criterion of experimental design, one of the baselines of Li et al. 2026, "Spend Less,
Fit Better"): Var f(at) ~ g' (J'J)^-1 g, with J the model's Jacobian (of log L, as the fit works in log space) at
the design's sizes and g its gradient at `at`, both at the current fit. Adding a candidate adds its row to J, which
needs no value for it: the score is exact for the linearised model and costs microseconds, where refitting every
bootstrap resample per candidate (the other choice) would cost a fit per candidate and resample. A recipe with fewer
than three sizes has no fit yet: its cheapest sizes are chosen first (the seed design).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sft_grid.adaptive.spec import AdaptiveSpec
from sft_grid.analysis import forms, scaling

MIN_SIZES = scaling.N_PARAMS


@dataclass(frozen=True)
class Candidate:
    name: str
    recipe: str
    n: float  # parameters
    gpu_hours: float
    holdout: bool = False


@dataclass(frozen=True)
class Forecast:
    recipe: str
    value: float | None  # the fit's forecast at `at` (None: no fit yet)
    lo: float | None
    hi: float | None
    points: int
    form: str = "power_e"  # the form the forecast comes from (analysis/forms.py)

    @property
    def halfwidth(self) -> float:
        return math.inf if self.lo is None or self.hi is None else (self.hi - self.lo) / 2


@dataclass(frozen=True)
class Round:
    """One round's fit and choice: the forecasts, the question's half width, what was spent, what to run next
    and why (one line per chosen cell), and why the loop stops (empty while it goes on)."""

    forecasts: tuple[Forecast, ...]
    halfwidth: float
    spent: float
    chosen: tuple[str, ...]
    why: tuple[str, ...]
    stop: str = ""


def forecasts(
    spec: AdaptiveSpec, pool: Sequence[Candidate], observed: Mapping[str, float], resamples: int = 200
) -> tuple[Forecast, ...]:
    """Each recipe's forecast at `at` with its bootstrap band, from the observed cells that are not holdouts."""
    out = []
    for recipe in sorted({c.recipe for c in pool}):
        pts = [
            (c.n, observed[c.name], c.name) for c in pool if c.recipe == recipe and not c.holdout and c.name in observed
        ]
        if len({n for n, _, _ in pts}) < MIN_SIZES:
            out.append(Forecast(recipe, None, None, None, len(pts)))
            continue
        # the form chosen on held-out points (analysis/forms.py), its band from the errors it made extrapolating
        chosen = forms.select([(n, v) for n, v, _ in pts], level=spec.level)
        value, lo, hi = chosen.forecast(spec.at)
        if not chosen.ok or not math.isfinite(value):
            out.append(Forecast(recipe, None, None, None, len(pts)))
            continue
        out.append(Forecast(recipe, value, lo, hi, len(pts), chosen.form))
    return tuple(out)


def question_halfwidth(spec: AdaptiveSpec, found: Sequence[Forecast]) -> float:
    """loss: the widest recipe's half width; gap: the two recipes' half widths added in quadrature."""
    by = {f.recipe: f for f in found}
    if spec.question == "gap":
        a, b = (by[r].halfwidth if r in by else math.inf for r in spec.recipes)
        return math.hypot(a, b)
    relevant = [by[r] for r in spec.recipes if r in by] if spec.recipes else list(found)
    return max((f.halfwidth for f in relevant), default=math.inf)


def _variance(ns: Sequence[float], at: float, theta: tuple[float, float, float]) -> float:
    """g'(J'J)^-1 g for log(E + A N^-alpha) at the design `ns` (N scaled by their geometric mean), in units of the
    residual variance; inf when the design cannot determine the three parameters."""
    import numpy as np

    if len(set(ns)) < MIN_SIZES:
        return math.inf
    e, a, alpha = theta
    n0 = math.exp(sum(math.log(n) for n in ns) / len(ns))

    def row(n: float) -> list[float]:
        x = n / n0
        xa = x**-alpha
        f = e + a * n0**-alpha * xa
        # d/dE, d/dA' (A' = A n0^-alpha), d/dalpha of log f
        return [1 / f, xa / f, -(a * n0**-alpha) * xa * math.log(x) / f]

    jac = np.array([row(n) for n in ns])
    g = np.array(row(at))
    info = jac.T @ jac
    if np.linalg.cond(info) > 1e14:
        return math.inf
    return float(g @ np.linalg.solve(info, g))


def choose(
    spec: AdaptiveSpec,
    pool: Sequence[Candidate],
    observed: Mapping[str, float],
    in_flight: Sequence[str] = (),
    resamples: int = 200,
) -> Round:
    """One round: fit, stop or choose the next batch (pure: the same inputs give the same round)."""
    found = forecasts(spec, pool, observed, resamples)
    width = question_halfwidth(spec, found)
    taken = set(observed) | set(in_flight)
    spent = sum(c.gpu_hours for c in pool if c.name in taken)
    budget_h = spec.budget_gpu_hours if spec.budget_gpu_hours is not None else math.inf
    budget_n = spec.budget_cells if spec.budget_cells is not None else len(pool)
    if spec.stop_halfwidth is not None and width < spec.stop_halfwidth:
        return Round(found, width, spent, (), (), f"the band's half width {width:.4g} < {spec.stop_halfwidth:g}")
    recipes = set(spec.recipes) or {c.recipe for c in pool}
    design = {r: [c.n for c in pool if c.recipe == r and c.name in taken and not c.holdout] for r in recipes}
    fits = {f.recipe: f for f in found}
    thetas: dict[str, tuple[float, float, float]] = {}
    for r in recipes:
        pts = [(c.n, observed[c.name], c.name) for c in pool if c.recipe == r and c.name in observed and not c.holdout]
        fit = scaling.fit(pts, resamples=0) if fits.get(r) and fits[r].value is not None else None
        if fit is not None and fit.ok:
            thetas[r] = (fit.E, fit.A, fit.alpha)
    left = [c for c in pool if c.name not in taken and not c.holdout and c.recipe in recipes]
    room_h = budget_h - spent
    room_n = budget_n - len(taken)
    seeding = sorted(
        (c for c in left if len({*design[c.recipe]}) < MIN_SIZES),
        key=lambda c: (c.gpu_hours, c.name),
    )
    chosen: list[str] = []
    why: list[str] = []
    for c in seeding:  # the seed design: the cheapest sizes of a recipe that cannot be fitted yet
        have = len(set(design[c.recipe]))
        if len(chosen) >= spec.batch or have >= MIN_SIZES or c.n in design[c.recipe]:
            continue
        if c.gpu_hours > room_h + 1e-9 or len(chosen) >= room_n:
            break
        chosen.append(c.name)
        why.append(f"{c.name}: seed design ({have} of {MIN_SIZES} sizes of {c.recipe} to fit)")
        design[c.recipe].append(c.n)
        room_h -= c.gpu_hours
    if not chosen and all(r in thetas for r in recipes):
        planned, before, after = _best_completion(spec.at, recipes, design, thetas, left, room_h, room_n)
        ranked = sorted(planned, key=lambda c: (-c.gpu_hours, c.name))[: spec.batch]
        for c in ranked:
            chosen.append(c.name)
            why.append(
                f"{c.name}: part of the affordable completion of the design that minimises the forecast's variance"
                f" at {spec.at:.3g} ({before:.3g} -> {after:.3g} x residual variance, summed over"
                f" {', '.join(sorted(recipes))}; {sum(p.gpu_hours for p in planned):.3g} GPU-h for"
                f" {len(planned)} cell(s): {(before - after) / max(sum(p.gpu_hours for p in planned), 1e-12):.3g}"
                " per GPU-h); its largest cells first"
            )
    if chosen:
        spent += sum(c.gpu_hours for c in pool if c.name in chosen)
    stop = "" if chosen else f"the budget is spent ({spent:.4g} GPU-h, {len(taken)} cells)"
    return Round(found, width, spent, tuple(chosen), tuple(why), stop)


# a recipe's candidates are enumerated whole up to this many (2^12 subsets); beyond, greedily
_EXHAUSTIVE = 12


def _frontier(
    options: list[tuple[float, float, tuple[Candidate, ...]]],
) -> list[tuple[float, float, tuple[Candidate, ...]]]:
    """The (cost, variance) Pareto frontier: cheaper or lower-variance designs only."""
    out: list[tuple[float, float, tuple[Candidate, ...]]] = []
    for cost, var, cells in sorted(options, key=lambda o: (o[0], o[1], [c.name for c in o[2]])):
        if not out or var < out[-1][1] - 1e-15:
            out.append((cost, var, cells))
    return out


def _best_completion(
    at: float,
    recipes: set[str],
    design: Mapping[str, list[float]],
    thetas: Mapping[str, tuple[float, float, float]],
    left: Sequence[Candidate],
    room_h: float,
    room_n: int,
) -> tuple[tuple[Candidate, ...], float, float]:
    """The affordable set of candidates that minimises the summed variance at `at` (each recipe's designs on its
    cost/variance frontier, the recipes combined under the budget), with the variance before and after. A
    one-step-greedy choice per GPU-hour keeps buying the cheap small sizes, which barely constrain an
    extrapolation; the whole completion is what finds the large anchor worth its price."""
    from itertools import combinations

    combined: list[tuple[float, float, tuple[Candidate, ...]]] = [(0.0, 0.0, ())]
    before = 0.0
    for r in sorted(recipes):
        mine = sorted((c for c in left if c.recipe == r), key=lambda c: c.name)
        base = _variance(design[r], at, thetas[r])
        before += base
        options = []
        if len(mine) <= _EXHAUSTIVE:
            for k in range(len(mine) + 1):
                for cells in combinations(mine, k):
                    cost = sum(c.gpu_hours for c in cells)
                    if cost <= room_h + 1e-9 and k <= room_n:
                        options.append((cost, _variance([*design[r], *(c.n for c in cells)], at, thetas[r]), cells))
        else:
            chosen: tuple[Candidate, ...] = ()
            options.append((0.0, base, ()))
            while True:
                cost0 = sum(c.gpu_hours for c in chosen)
                var0 = _variance([*design[r], *(c.n for c in chosen)], at, thetas[r])
                best = None
                for c in mine:
                    if c in chosen or cost0 + c.gpu_hours > room_h + 1e-9:
                        continue
                    var = _variance([*design[r], *(x.n for x in chosen), c.n], at, thetas[r])
                    gain = (var0 - var) / c.gpu_hours
                    if best is None or gain > best[0]:
                        best = (gain, c, var)
                if best is None:
                    break
                chosen = (*chosen, best[1])
                options.append((cost0 + best[1].gpu_hours, best[2], chosen))
        merged = [
            (c1 + c2, v1 + v2, cells1 + cells2)
            for c1, v1, cells1 in combined
            for c2, v2, cells2 in _frontier(options)
            if c1 + c2 <= room_h + 1e-9 and len(cells1) + len(cells2) <= room_n
        ]
        combined = _frontier(merged)
    cost, after, cells = min(combined, key=lambda o: (o[1], o[0]))
    return cells, before, after
