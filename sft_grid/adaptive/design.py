"""The next cells of an adaptive grid: what each is worth to the question asked, per GPU-hour, and when to stop.

A round: (1) each recipe's completed cells (never a holdout) are fitted with the form chosen on held-out points
(analysis/forms.py: E + A N^-alpha, A N^-alpha, a log-linear, the rectified E + B / (D_l + N^beta) or the local
power law through the largest three sizes, weighed by how well each extrapolated from the smaller sizes to the
larger: the forecast is their weighted average, Selection.average), and the errors the best of them made there give
its band at the size `at`: the forecast times exp(+-t s), s the log error scale the
form makes extrapolating as far as `at` lies beyond the largest size (forms.growth: the level of its held-out
one-step errors, grown with the distance as its nested extrapolations show, a flat prior on growth between linear
and quadratic in the log distance where they cannot tell; so a forecast ten doublings out of four small sizes gets a
band about five times the linear stretch of a one-doubling error) and the forms' disagreement at `at`
(Selection.spread: forms that held out about as well but part ways there), t Student's (none through three sizes);
(2) the decision: which recipe wins (has the lowest loss) at `at`, and the probability that it is wrong, under each
recipe's band read as a Student-t predictive distribution in log L (the recipes independent; `DRAWS` seeded draws);
(3) the loop stops when the budget is spent, the band's half width is below `stop_halfwidth`, or (question `gap`)
the probability of a wrong decision is below 1 - `level` and every recipe's sizes span at least as far (in log size)
as `at` lies beyond the largest of them (MAX_REACH); (4) otherwise it chooses what to run next.

`gap` (which recipe wins at `at`) chooses its cells by the block's `design`: `ladder` (the default; ladder.py, whose
secants are its forecasts too, in place of (1)), `race` (race.py) or `value`, here: a plan (a set of affordable
cells) is worth the expected fall in the probability
of a wrong decision once its cells are observed, per GPU-hour it costs. The expectation is a preposterior analysis:
the band the decision will read after the plan is predicted from the band's own model (forms.growth: s(d)^2 =
sum_p w_p (c_p max(d, step)^p)^2 at d = log(at / largest), step the held-out extrapolations' mean distance, which a
plan changes through the largest sizes and the held-out steps it makes, the levels c_p and the growth's posterior
w_p held); the part of each recipe's predictive variance that the plan resolves moves its forecast, the rest stays
as noise, and the expected chance that the forecast winner afterwards is the true winner is counted over the same
seeded draws for every plan (common random numbers, so that plans are compared without the draws' noise between
them; a gain under `GAIN_SE` standard errors of the draws counts as none). No fit is run per candidate: a round
costs the fits of the recipes (the nested fits of the band remembered from round to round) and a few milliseconds
per thousand plans. Plans rather than single cells, and their value per GPU-hour over the plan (the
knowledge-gradient of Frazier and Powell, KG(*)): the value of information is not concave, one cheap cell alone
rarely moves a decision, and a one-cell-at-a-time greedy rule would keep buying the cheap small sizes. The predicted
band depends on a recipe's three largest sizes only, so each recipe's plans are its subsets of at most three new
sizes, kept on their cost/band frontier, and the recipes' frontiers are combined. The best plan's cells are run
cheapest first, `batch` at a time, and the plan is chosen again from what they show. A recipe without a band yet
gets its cheapest sizes first (the seed design, four sizes, QUESTION_SIZES: two held-out sizes each extrapolated
from two below it). Two or more recipes: the decision is which is lowest.

`loss` (each recipe's loss at `at`): the affordable completion of the design that minimises the forecast's variance
at `at` on the form E + A N^-alpha (the delta method: Var f(at) ~ g' (J'J)^-1 g, J the model's Jacobian of log L at
the design's sizes, g its gradient at `at`, both at the current fit; the V-optimal criterion of experimental design,
one of the baselines of Li et al. 2026, "Spend Less, Fit Better"), its largest cells first, after a seed design of
three sizes; it runs to the budget unless the band's half width falls below `stop_halfwidth`. Its round reports the
decision and its probability too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, product
from typing import TYPE_CHECKING

from sft_grid.adaptive import ladder, race
from sft_grid.adaptive.candidates import Candidate, Forecast
from sft_grid.adaptive.spec import AdaptiveSpec
from sft_grid.analysis import forms, scaling

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

MIN_SIZES = scaling.N_PARAMS
# the sizes a band needs (analysis/forms.py): two held-out sizes, each extrapolated from two sizes below it
BAND_SIZES = MIN_SIZES + 1
# the distinct sizes (besides holdouts) each recipe needs for the question: `loss` a fit (the law's three
# parameters), `gap` a band for every recipe; the seed design buys them, and a grid with fewer is refused (steer.py)
QUESTION_SIZES = {"loss": MIN_SIZES, "gap": BAND_SIZES}
# a ladder's (ladder.py) band needs three sizes of each recipe: its foot, rung and top (the secant through the first
# two, checked at the third)
LADDER_SIZES = 3
# the seeded draws the decision's probabilities are counted over (the same draws for every plan of a round)
DRAWS = 4000
# a plan's expected gain must stand this many standard errors of the draws above zero to count
GAIN_SE = 2.0
# the plans compared in a round at most (each recipe's cost/band frontier thinned evenly beyond)
MAX_PLANS = 20000
# new sizes per recipe in a plan: the band reads a recipe's three largest sizes only
PLAN_SIZES = 3
# a decision is called only where every recipe's forecast reaches beyond its largest size by at most this many times
# the span of its sizes (log at/largest <= MAX_REACH log largest/smallest): the band's growth with distance is measured
# by nested extrapolations inside the span and only assumed beyond it, and a curve's first sizes can all sit on its
# flat start (a model that has not begun to learn the data), whose small one-step errors say nothing of the fall
# that follows; on the replayed curves (docs/steering.md, Measured), the stops from a recipe's few smallest sizes,
# three or four doublings wide and eight to ten short of the target, claimed 1-5% and were wrong in 3 of 13 (the
# later stops in 1 of 26); with the rule, 1 wrong in 49 stops claiming 3.3%
MAX_REACH = 1.0


@dataclass(frozen=True)
class Round:
    """One round's fit and choice: the forecasts, the question's half width, what was spent, what to run next
    and why (one line per chosen cell), why the loop stops (empty while it goes on), and the decision: the recipe
    with the lowest forecast at `at` and the probability that it is not the lowest (None: not every recipe has a
    band yet)."""

    forecasts: tuple[Forecast, ...]
    halfwidth: float
    spent: float
    chosen: tuple[str, ...]
    why: tuple[str, ...]
    stop: str = ""
    decision: str = ""
    p_wrong: float | None = None


@dataclass(frozen=True)
class _Fit:
    forecast: Forecast
    growth: forms.Growth | None  # the band's log error scale by the distance beyond the largest size (None: no band)
    # the band's scale over growth's alone (the forms' disagreement: Selection.spread), held by a plan's prediction
    widen: float = 1.0


def _fits(spec: AdaptiveSpec, pool: Sequence[Candidate], observed: Mapping[str, float]) -> dict[str, _Fit]:
    out = {}
    for recipe in sorted({c.recipe for c in pool}):
        pts = [(c.n, observed[c.name]) for c in pool if c.recipe == recipe and not c.holdout and c.name in observed]
        if len({n for n, _ in pts}) < MIN_SIZES:
            out[recipe] = _Fit(Forecast(recipe, None, None, None, len(pts)), None)
            continue
        # the form chosen on held-out points (analysis/forms.py), its band from the errors it made extrapolating
        chosen = forms.select(pts, forms=spec.forms or forms.FORMS, level=spec.level)
        value, lo, hi = chosen.forecast(spec.at)
        if not chosen.ok or not math.isfinite(value) or value <= 0:
            out[recipe] = _Fit(Forecast(recipe, None, None, None, len(pts)), None)
            continue
        # the band's scale at `at`: the form's error at that distance beyond the largest size (forms.growth) and
        # the forms' disagreement there (Selection.spread)
        band = chosen.growth if lo is not None and hi is not None else None  # a zero band is a band
        reach = math.log(spec.at / chosen.x_max) if spec.at > chosen.x_max else 0.0
        own = None if band is None else band.scale(reach)
        scale = None if own is None else math.hypot(own, chosen.spread(spec.at))  # Selection.scale, its parts kept
        widen = scale / own if scale is not None and own else 1.0
        found = Forecast(recipe, value, lo, hi, len(pts), chosen.form, scale, 0 if band is None else band.df)
        out[recipe] = _Fit(found, band, widen)
    return out


def forecasts(
    spec: AdaptiveSpec, pool: Sequence[Candidate], observed: Mapping[str, float], resamples: int = 200
) -> tuple[Forecast, ...]:
    """Each recipe's forecast at `at` with its band, from the observed cells that are not holdouts (a ladder's: its
    secants, ladder.forecasts)."""
    if _laddered(spec):
        return ladder.forecasts(spec, pool, observed)
    return tuple(f.forecast for f in _fits(spec, pool, observed).values())


def _laddered(spec: AdaptiveSpec) -> bool:
    return spec.question == "gap" and spec.design == "ladder"


def sizes_needed(spec: AdaptiveSpec) -> tuple[int, str]:
    """The distinct sizes (besides holdouts) each recipe of the question needs, and why."""
    if _laddered(spec):
        return (
            LADDER_SIZES,
            "a ladder's band needs a foot, a rung and a top: the secant through two, checked at the third",
        )
    if spec.question == "loss":
        return QUESTION_SIZES["loss"], "the law has three parameters"
    return QUESTION_SIZES[
        "gap"
    ], "a decision needs every recipe's band: two held-out sizes, each extrapolated from two below it"


def _recipes(spec: AdaptiveSpec, pool: Sequence[Candidate]) -> list[str]:
    return sorted(set(spec.recipes) or {c.recipe for c in pool})


def question_halfwidth(spec: AdaptiveSpec, found: Sequence[Forecast]) -> float:
    """loss: the widest recipe's half width; gap: the half widths of the forecast winner and its nearest rival
    added in quadrature (the two recipes' for a gap of two)."""
    by = {f.recipe: f for f in found}
    if spec.question == "gap":
        mine = [by.get(r) for r in spec.recipes]
        if len(mine) < 2 or any(f is None or f.value is None for f in mine):
            return math.inf
        a, b = sorted((f for f in mine if f is not None), key=lambda f: (f.value, f.recipe))[:2]
        return math.hypot(a.halfwidth, b.halfwidth)
    relevant = [by[r] for r in spec.recipes if r in by] if spec.recipes else list(found)
    return max((f.halfwidth for f in relevant), default=math.inf)


def _draws(seed: int, dfs: Sequence[int]) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The draws every plan of a round is counted over: two standard normals and a Student-t's scale factor
    sqrt(df / chi2_df) per recipe (a t draw is the normal times the factor)."""
    import numpy as np

    rng = np.random.default_rng([seed, len(dfs), *dfs])
    z1 = rng.standard_normal((DRAWS, len(dfs)))
    z2 = rng.standard_normal((DRAWS, len(dfs)))
    df = np.array(dfs, dtype=float)
    return z1, z2, np.sqrt(df / rng.chisquare(df, size=(DRAWS, len(dfs))))


def _right(
    mu: NDArray[np.float64],
    now: NDArray[np.float64],
    after: NDArray[np.float64],
    draws: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]],
) -> NDArray[np.bool_]:
    """(plans, DRAWS): whether the forecast winner after each plan is the true winner. `mu`, `now`: each recipe's
    forecast (log L) and band scale; `after` (plans, recipes): the scales each plan leaves. The resolved part of the
    predictive variance, now^2 - after^2, moves the forecast; the rest separates it from the truth."""
    import numpy as np

    z1, z2, w = draws
    after = np.minimum(after, now)
    moved = np.sqrt(np.maximum(now**2 - after**2, 0.0))
    forecast = mu + w * moved[:, None, :] * z1
    truth = forecast + w * after[:, None, :] * z2
    return np.asarray(forecast.argmin(axis=2) == truth.argmin(axis=2))


def decide(spec: AdaptiveSpec, found: Sequence[Forecast], recipes: Sequence[str] = ()) -> tuple[str, float | None]:
    """The recipe with the lowest forecast at `at` among `recipes` (the spec's, else all), and the probability that
    another is truly lower under the bands (None while a recipe has no band; 0 for one recipe)."""
    import numpy as np

    by = {f.recipe: f for f in found}
    names = sorted(recipes or spec.recipes or by)
    fitted = [by[r] for r in names if r in by and by[r].value is not None]
    if not fitted:
        return "", None
    winner = min(fitted, key=lambda f: (f.value, f.recipe)).recipe
    if len(names) == 1:
        return winner, 0.0
    if len(fitted) < len(names) or any(f.scale is None for f in fitted):
        return winner, None
    mu = np.log(np.array([f.value for f in fitted], dtype=float))
    now = np.array([f.scale for f in fitted], dtype=float)
    right = _right(mu, now, now[None, :], _draws(spec.seed, [f.df for f in fitted]))
    return winner, float(1.0 - right.mean())


def _scale_after(fit: _Fit, at: float, sizes: Sequence[float]) -> float:
    """The band's scale the fit would have on `sizes`, its levels and growth with distance held (forms.growth: s(d)
    at d = log(at / largest), no nearer than the mean step of the held-out extrapolations on `sizes`, band_step),
    the forms' disagreement in the same proportion to it as now (it shrinks as the distance does)."""
    assert fit.growth is not None and fit.forecast.scale is not None
    floor = forms.band_step(sizes)
    return min(fit.forecast.scale, fit.widen * fit.growth.scale(math.log(at / max(sizes)), floor))


_Option = tuple[float, float, tuple[Candidate, ...]]


def _thin(options: list[_Option], keep: int) -> list[_Option]:
    """At most `keep` of a frontier's options, evenly spread (the first and last kept)."""
    if len(options) <= keep:
        return options
    idx = sorted({round(i * (len(options) - 1) / (keep - 1)) for i in range(keep)})
    return [options[i] for i in idx]


def _decision_plan(
    spec: AdaptiveSpec,
    fits: Mapping[str, _Fit],
    recipes: Sequence[str],
    design: Mapping[str, list[float]],
    left: Sequence[Candidate],
    room_h: float,
    room_n: int,
) -> tuple[tuple[Candidate, ...], float, float, int]:
    """The affordable plan with the largest expected fall in the probability of a wrong decision per GPU-hour
    (see the module's docstring): (its cells, the probability before it, after it, the plans compared); no cells
    when no plan gains."""
    import numpy as np

    order = list(recipes)
    found = [fits[r].forecast for r in order]
    mu = np.log(np.array([f.value for f in found], dtype=float))
    now = np.array([f.scale for f in found], dtype=float)
    draws = _draws(spec.seed, [f.df for f in found])
    base = np.array([_scale_after(fits[r], spec.at, design[r]) for r in order])
    frontiers = []
    for i, r in enumerate(order):
        cheapest: dict[float, Candidate] = {}
        for c in sorted(left, key=lambda c: (c.gpu_hours, c.name)):
            if c.recipe == r and c.n not in design[r]:
                cheapest.setdefault(c.n, c)
        options: list[tuple[float, float, tuple[Candidate, ...]]] = [(0.0, float(base[i]), ())]
        for k in range(1, min(PLAN_SIZES, room_n) + 1):
            for cells in combinations(sorted(cheapest.values(), key=lambda c: c.name), k):
                cost = sum(c.gpu_hours for c in cells)
                if cost <= room_h + 1e-9:
                    options.append((cost, _scale_after(fits[r], spec.at, [*design[r], *(c.n for c in cells)]), cells))
        frontiers.append(_frontier(options))
    keep = max(2, int(MAX_PLANS ** (1 / len(frontiers))))
    frontiers = [_thin(f, keep) for f in frontiers]
    plans = []
    for combo in product(*frontiers):
        cells = tuple(c for _, _, cs in combo for c in cs)
        cost = sum(cost for cost, _, _ in combo)
        if cells and cost <= room_h + 1e-9 and len(cells) <= room_n:
            plans.append((cost, [s for _, s, _ in combo], cells))
    right_base = _right(mu, now, base[None, :], draws)[0]
    p_base = float(1.0 - right_base.mean())
    if not plans:
        return (), p_base, p_base, 0
    best: tuple[float, float, tuple[str, ...]] | None = None
    pick = None
    for start in range(0, len(plans), 200):
        chunk = plans[start : start + 200]
        right = _right(mu, now, np.array([s for _, s, _ in chunk]), draws)
        diff = right.astype(float) - right_base
        gains = diff.mean(axis=1)
        errs = diff.std(axis=1) / math.sqrt(DRAWS)
        for (cost, _, cells), gain, err in zip(chunk, gains, errs, strict=True):
            if gain <= 0 or gain <= GAIN_SE * err or cost <= 0:
                continue
            key = (-gain / cost, cost, tuple(sorted(c.name for c in cells)))
            if best is None or key < best:
                best, pick = key, (cells, p_base - float(gain))
    if pick is None:
        return (), p_base, p_base, len(plans)
    return pick[0], p_base, pick[1], len(plans)


def choose(
    spec: AdaptiveSpec,
    pool: Sequence[Candidate],
    observed: Mapping[str, float],
    in_flight: Sequence[str] = (),
    resamples: int = 200,
) -> Round:
    """One round: fit, decide, stop or choose the next batch (pure: the same inputs give the same round)."""
    laddered = _laddered(spec)
    fits = {} if laddered else _fits(spec, pool, observed)
    found = ladder.forecasts(spec, pool, observed) if laddered else tuple(f.forecast for f in fits.values())
    width = question_halfwidth(spec, found)
    recipes = _recipes(spec, pool)
    decision, p_wrong = decide(spec, found, recipes)
    taken = set(observed) | set(in_flight)
    spent = sum(c.gpu_hours for c in pool if c.name in taken)
    budget_h = spec.budget_gpu_hours if spec.budget_gpu_hours is not None else math.inf
    budget_n = spec.budget_cells if spec.budget_cells is not None else len(pool)

    def done(stop: str) -> Round:
        return Round(found, width, spent, (), (), stop, decision, p_wrong)

    if spec.stop_halfwidth is not None and width < spec.stop_halfwidth:
        return done(f"the band's half width {width:.4g} < {spec.stop_halfwidth:g}")
    far = _beyond_reach(spec, pool, observed, recipes)
    under = spec.question == "gap" and p_wrong is not None and p_wrong < 1 - spec.level
    # under the level, but held back by the span rule (MAX_REACH): said in the record, not silently
    held = f"{', '.join(far)} forecast further beyond their largest size than their sizes span" if far and under else ""
    if under and not far:
        assert p_wrong is not None  # as `under` says
        return done(
            f"decided: {decision} is the lowest at {spec.at:.4g} with probability {1 - p_wrong:.3f} >="
            f" {spec.level:g} (wrong with probability {p_wrong:.3f} < {1 - spec.level:.3g})"
        )
    design = {r: [c.n for c in pool if c.recipe == r and c.name in taken and not c.holdout] for r in recipes}
    waiting = {c.recipe for c in pool if c.name in in_flight}
    left = [c for c in pool if c.name not in taken and not c.holdout and c.recipe in recipes]
    room_h = budget_h - spent
    room_n = budget_n - len(taken)
    gap = spec.question == "gap"
    need_sizes = QUESTION_SIZES[spec.question]

    def seeding(r: str) -> bool:
        if len(set(design[r])) < need_sizes:
            return True
        # a decision needs every band: a recipe whose cells are all in and still has none gets its next size
        return gap and fits[r].growth is None and r not in waiting

    chosen: list[str] = []
    why: list[str] = []
    if laddered:  # two sizes of each recipe that can still win (ladder.py): its rungs, its tops, its stop
        chosen, why, stop = ladder.next_cells(spec, pool, observed, recipes, set(taken), (room_h, room_n))
        if stop and held:
            stop += f"; not called decided: {held}"
        return _end(spec, pool, found, width, spent, taken, chosen, why, stop, decision, p_wrong, waiting)
    if gap and spec.design == "race":  # successive elimination (race.py): its seed, its race, its stop
        ready = all(f.scale is not None for f in found)
        draws = _draws(spec.seed, [fits[r].forecast.df for r in recipes]) if ready else None
        by = {r: fits[r].forecast for r in recipes}
        chosen, why, stop = race.next_cells(spec, pool, by, recipes, set(taken), waiting, far, (room_h, room_n), draws)
        if stop and held:
            stop += f"; not called decided: {held}"
        return _end(spec, pool, found, width, spent, taken, chosen, why, stop, decision, p_wrong, waiting)
    for c in sorted(left, key=lambda c: (c.gpu_hours, c.name)):  # the seed design: the cheapest sizes first
        if len(chosen) >= spec.batch or not seeding(c.recipe) or c.n in design[c.recipe]:
            continue
        if c.gpu_hours > room_h + 1e-9 or len(chosen) >= room_n:
            break
        have = len(set(design[c.recipe]))
        need = f"{have} of {need_sizes} sizes of {c.recipe} for a band" if gap else f"{have} of {need_sizes}"
        chosen.append(c.name)
        why.append(f"{c.name}: seed design ({need}{'' if gap else f' sizes of {c.recipe} to fit'})")
        design[c.recipe].append(c.n)
        room_h -= c.gpu_hours
    stop = ""
    if not chosen and gap:
        bandless = [r for r in recipes if fits[r].growth is None]
        if bandless and not waiting & set(bandless):  # nothing left to seed with, nothing to wait for
            stop = (
                f"no band for {', '.join(bandless)} (a band needs {need_sizes} sizes fitted; none affordable is left):"
                f" {decision or 'no recipe'} lowest, with no probability"
            )
        elif bandless:
            pass  # a band still to come from cells in flight: wait for them
        else:
            plan, before, after, compared = _decision_plan(spec, fits, recipes, design, left, room_h, room_n)
            cost = sum(c.gpu_hours for c in plan)
            for c in sorted(plan, key=lambda c: (c.gpu_hours, c.name))[: spec.batch]:
                chosen.append(c.name)
                why.append(
                    f"{c.name}: of the plan {', '.join(sorted(p.name for p in plan))} ({cost:.4g} GPU-h), which"
                    f" lowers the expected probability of a wrong decision at {spec.at:.4g} from {before:.3f} to"
                    f" {after:.3f}: {(before - after) / cost:.3g} per GPU-h, the most of {compared} affordable"
                    " plans; its cheapest cells first" + (f" (not yet called decided: {held})" if held else "")
                )
            if not plan and any(c.gpu_hours <= room_h + 1e-9 for c in left) and room_n > 0:
                stop = (
                    f"no affordable cell lowers the probability of a wrong decision ({before:.3f}, {decision}"
                    f" lowest; {room_h:.4g} GPU-h left)"
                )
                if held:
                    stop += f"; not called decided: {held}"
    elif not chosen:
        fitted = {f.recipe: f for f in found}
        thetas: dict[str, tuple[float, float, float]] = {}
        for r in recipes:
            pts = [
                (c.n, observed[c.name], c.name) for c in pool if c.recipe == r and c.name in observed and not c.holdout
            ]
            fit = scaling.fit(pts, resamples=0) if fitted.get(r) and fitted[r].value is not None else None
            if fit is not None and fit.ok:
                thetas[r] = (fit.E, fit.A, fit.alpha)
        if all(r in thetas for r in recipes):
            planned, before_v, after_v = _best_completion(spec.at, set(recipes), design, thetas, left, room_h, room_n)
            ranked = sorted(planned, key=lambda c: (-c.gpu_hours, c.name))[: spec.batch]
            total = sum(p.gpu_hours for p in planned)
            for c in ranked:
                chosen.append(c.name)
                why.append(
                    f"{c.name}: part of the affordable completion of the design that minimises the forecast's variance"
                    f" at {spec.at:.3g} ({before_v:.3g} -> {after_v:.3g} x residual variance, summed over"
                    f" {', '.join(sorted(recipes))}; {total:.3g} GPU-h for {len(planned)} cell(s):"
                    f" {(before_v - after_v) / max(total, 1e-12):.3g} per GPU-h); its largest cells first"
                )
    if not chosen and not stop and held and not (gap and waiting):
        stop = f"the budget is spent ({spent:.4g} GPU-h, {len(taken)} cells); not called decided: {held}"
    return _end(spec, pool, found, width, spent, taken, chosen, why, stop, decision, p_wrong, waiting)


def _end(
    spec: AdaptiveSpec,
    pool: Sequence[Candidate],
    found: tuple[Forecast, ...],
    width: float,
    spent: float,
    taken: set[str],
    chosen: Sequence[str],
    why: Sequence[str],
    stop: str,
    decision: str,
    p_wrong: float | None,
    waiting: set[str],
) -> Round:
    """The round: what the chosen cells add to what is spent; with none chosen, no stop said and nothing in flight
    to wait for (a gap's), the budget is spent."""
    if chosen:
        spent += sum(c.gpu_hours for c in pool if c.name in chosen)
    elif not stop and not (spec.question == "gap" and waiting):
        stop = f"the budget is spent ({spent:.4g} GPU-h, {len(taken)} cells)"
    return Round(found, width, spent, tuple(chosen), tuple(why), stop, decision, p_wrong)


def _beyond_reach(
    spec: AdaptiveSpec, pool: Sequence[Candidate], observed: Mapping[str, float], recipes: Sequence[str]
) -> list[str]:
    """The recipes whose forecast at `at` lies further beyond their largest observed size than MAX_REACH times
    their sizes' span (log at/largest > MAX_REACH log largest/smallest)."""
    far = []
    for r in recipes:
        ns = [c.n for c in pool if c.recipe == r and c.name in observed and not c.holdout]
        if ns and spec.at > max(ns) and math.log(spec.at / max(ns)) > MAX_REACH * math.log(max(ns) / min(ns)):
            far.append(r)
    return far


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
