"""A gap question's cells by a ladder (`design: ladder`, the default): which recipe is lowest at `at`, decided from
two sizes of each recipe, a top as large as the budget reaches and a rung RATIO times smaller, the forecast the power
law through the two (a secant in log-log).

A question (design.choose calls `next_cells` once the common stops, the budget and the decided rule, have been read):

1. The plan: a top for every recipe, raised a size at a time, the recipe whose top costs least first, while the
   whole ladder fits in the budget: for each recipe its top, its rung (the largest size at most top / RATIO) and its
   foot (the same below the rung). The tops are where the budget goes; they are not measured yet. Where the sizes
   below a step span less than RATIO (the Delphi grid's nine sizes span 7.6 times), the step's lower size is the one
   nearest the middle of their span in log, so that a narrow grid still has a foot, a rung and a top, and a band.
2. The rungs: every recipe's foot and rung, cheapest first. From them, each recipe's forecast at `at` (the secant
   through foot and rung); a recipe whose forecast is more than MARGIN (in log L) above the lowest is out: no top
   for it. One recipe left: decided by elimination.
3. The tops: the budget the rungs left, planned again over the recipes still in (their rungs measured, so the tops
   of fewer recipes reach further), and measured, cheapest first.
4. The stop: every top measured (or none affordable); the decision is the lowest forecast, each recipe's the secant
   through its largest size and the size below it by the same rule (`below`: its top and rung; a recipe out, its
   rung and foot).

The band (`forecasts`): the secant through foot and rung, extrapolated to the top, errs by e (log L); the errors of
the decision's recipes, each per unit of the distance it reached (log top/rung), pooled (root mean square), grown
linearly with the distance to `at` and never below their own mean distance (nearer than the errors were measured,
the band stays at them: a point's own noise does not shrink with the distance; forms.growth's floor, the same
rule), read as Student-t with one degree of freedom per error. The decision's probability of being wrong
(design.decide) and the generic stop (design.MAX_REACH, `level`) read it. Without the floor, on the replays the
decisions that stopped as decided claimed 1.4% P(wrong) and 3.0% were wrong; with it, 1.6% and 1.2% (on 1,890
unseen, 1.7% and 2.6%; docs/steering.md, Measured).

Why two sizes far apart and not a window of consecutive sizes (`design: race`) or plans by their worth (`design:
value`): on the replayed fine-tuning curves (docs/steering.md, Measured) what decides a gap question at 30% of the
grid's GPU-hours is how close to `at` each recipe that can still win is measured; a curve bends late (its flat start,
then the fall), so a local power law through two large sizes forecasts it better than any of the global forms fitted
to a window of small ones, and a window spends on sizes the forecast does not read. Stepping through every size
costs about twice the largest size reached; a ladder, about 1 + 1/RATIO of it. RATIO 8 (three doublings) is the span
the local law was measured on there; MARGIN 0.2 is the largest of the margins tried on the development seeds (0.2,
0.1, 0.05, 0.03), the one that dropped the winner least (2 winners of 2,670 recipes dropped; 0.1 dropped 61).
Measured afterwards, the constants unchanged, over every decision the replays allow (every 3 of each dataset's 30
models: 12,180): right in 90.2% at 22.0% of the grid's GPU-hours (the full grid 93.2%); RATIO 4 89.8-89.9% at
MARGIN 0.1-0.3, RATIO 16 with MARGIN 0.3 89.9%, and a margin of 0.1 costly where the rungs are far apart (RATIO 8
86.2%, RATIO 16 82.3%: a recipe whose secant over three doublings errs by more is dropped before its top).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sft_grid.adaptive.candidates import Candidate, Cells, Forecast, by_size, cheapest, sizes_of

if TYPE_CHECKING:
    from sft_grid.adaptive.spec import AdaptiveSpec

# a rung's size below its top (and a foot's below its rung): at most top / RATIO
RATIO = 8.0
# a recipe whose forecast from its rungs is this far above the lowest (log L) gets no top
MARGIN = 0.2
# the name the forecasts give their form (Forecast.form)
FORM = "secant"


def below(sizes: Sequence[float], x: float) -> float | None:
    """The largest of `sizes` at most x / RATIO; where the sizes below x span less, the one nearest (in log) the
    middle of their span and x, so that a narrow grid still has three sizes apart; None: none below x."""
    under = [s for s in sizes if s < x]
    far = [s for s in under if s <= x / RATIO * (1 + 1e-9)]
    if far or not under:
        return max(far, default=None)
    middle = math.sqrt(min(under) * x)
    return min(under, key=lambda s: (abs(math.log(s / middle)), s))


def secant(lo: tuple[float, float], hi: tuple[float, float], at: float) -> float:
    """log L at `at` on the power law through the two (size, loss) points."""
    (x0, y0), (x1, y1) = lo, hi
    slope = math.log(y1 / y0) / math.log(x1 / x0)
    return math.log(y1) + slope * math.log(at / x1)


def _points(pool: Sequence[Candidate], observed: Mapping[str, float], recipe: str) -> dict[float, float]:
    """The recipe's observed losses by size (several cells at one size: their geometric mean); holdouts never."""
    logs: dict[float, list[float]] = {}
    for c in pool:
        v = observed.get(c.name)
        if c.recipe == recipe and not c.holdout and v is not None and math.isfinite(v) and v > 0 and c.n > 0:
            logs.setdefault(c.n, []).append(math.log(v))
    return {n: math.exp(sum(vs) / len(vs)) for n, vs in logs.items()}


def forecasts(spec: AdaptiveSpec, pool: Sequence[Candidate], observed: Mapping[str, float]) -> tuple[Forecast, ...]:
    """Each recipe's forecast at `at`: the secant through its largest observed size and the one `below` it, with the
    pooled band of the module's docstring (no band while no recipe has a third size below those two)."""
    from scipy.stats import t as student

    lines: dict[str, tuple[float, float] | None] = {}  # recipe: (log L at `at`, largest size)
    counts: dict[str, int] = {}  # recipe: the sizes it has
    units: list[float] = []  # each recipe's held-out error per unit of distance
    reached: list[float] = []  # the distance each held-out error was made at
    for r in sorted({c.recipe for c in pool}):
        pts = _points(pool, observed, r)
        xs = sorted(pts)
        counts[r] = len(xs)
        x0 = below(xs, xs[-1]) if xs else None
        if x0 is None:
            lines[r] = None
            continue
        x1 = xs[-1]
        lines[r] = (secant((x0, pts[x0]), (x1, pts[x1]), spec.at), x1)
        x00 = below(xs, x0)
        if x00 is not None and (not spec.recipes or r in spec.recipes):  # the question's recipes' errors only
            err = math.log(pts[x1]) - secant((x00, pts[x00]), (x0, pts[x0]), x1)
            units.append(abs(err) / math.log(x1 / x0))
            reached.append(math.log(x1 / x0))
    unit = math.sqrt(sum(u * u for u in units) / len(units)) if units else None
    out = []
    for r, line in lines.items():
        if line is None:
            out.append(Forecast(r, None, None, None, counts[r], FORM))
            continue
        log_value, x1 = line
        n = counts[r]
        value = math.exp(log_value)
        if unit is None:
            out.append(Forecast(r, value, None, None, n, FORM))
            continue
        scale = unit * max(math.log(spec.at / x1), sum(reached) / len(reached))
        half = float(student.ppf(0.5 + spec.level / 2, len(units))) * scale
        out.append(Forecast(r, value, value * math.exp(-half), value * math.exp(half), n, FORM, scale, len(units)))
    return tuple(out)


def _price(cells: Cells, recipe: str, n: float) -> float:
    return min(c.gpu_hours for c in cells[(recipe, n)])


def _rungs(sizes: Sequence[float], top: float) -> list[float]:
    """The ladder below `top`: its foot and rung (those the sizes have), smallest first."""
    rung = below(sizes, top)
    foot = below(sizes, rung) if rung is not None else None
    return [x for x in (foot, rung) if x is not None]


def plan(
    cells: Cells, sizes: Mapping[str, Sequence[float]], recipes: Sequence[str], room: float, rungs: Mapping[str, float]
) -> dict[str, float]:
    """Each recipe's top: raised a size at a time, the recipe whose top costs least first, while the ladders (a
    recipe in `rungs` has its rung measured: its top only, above the rung) cost at most `room`; each at its least
    where even that does not fit."""

    def cost(tops: Mapping[str, float]) -> float:
        total = 0.0
        for r, top in tops.items():
            total += _price(cells, r, top)
            if r not in rungs:
                total += sum(_price(cells, r, x) for x in _rungs(sizes[r], top))
        return total

    tops = {r: next((n for n in sizes[r] if n > rungs[r]), rungs[r]) if r in rungs else sizes[r][0] for r in recipes}
    moved = cost(tops) <= room + 1e-9
    while moved:
        moved = False
        for r in sorted(recipes, key=lambda r: (_price(cells, r, tops[r]), r)):
            i = sizes[r].index(tops[r])
            if i + 1 < len(sizes[r]):
                raised = {**tops, r: sizes[r][i + 1]}
                if cost(raised) <= room + 1e-9:
                    tops, moved = raised, True
    return tops


def next_cells(
    spec: AdaptiveSpec,
    pool: Sequence[Candidate],
    observed: Mapping[str, float],
    recipes: Sequence[str],
    taken: set[str],
    room: tuple[float, int],
) -> tuple[list[str], list[str], str]:
    """This round's cells of the ladder (at most spec.batch), a line on why each, and why it stops (empty while it
    goes on or waits for cells in flight). `taken`: the cells observed or in flight; `room`: the GPU-hours and cells
    left. Pure: the plans are made from the budget and the pool, not from what is spent, so every round makes the
    same ones."""
    room_h, room_n = room
    cells = by_size(pool)
    sizes = {r: found for r in recipes if (found := sizes_of(cells, r))}
    recipes = [r for r in recipes if r in sizes]
    seen = set(observed)
    budget = spec.budget_gpu_hours if spec.budget_gpu_hours is not None else math.inf
    chosen: list[str] = []
    why: list[str] = []

    def state(r: str, n: float) -> str:
        names = {c.name for c in cells[(r, n)]}
        return "observed" if names & seen else "in flight" if names & taken else ""

    def take(wanted: list[tuple[str, float, str]]) -> bool:
        """The wanted sizes not yet taken, cheapest first, while they fit; whether all of them are observed."""
        nonlocal room_h, room_n
        free = [(c, line) for r, n, line in wanted if not state(r, n) for c in [cheapest(cells, r, n, taken)] if c]
        for c, line in sorted(free, key=lambda cl: (cl[0].gpu_hours, cl[0].name)):
            if len(chosen) >= spec.batch or room_n < 1 or c.gpu_hours > room_h + 1e-9:
                break
            chosen.append(c.name)
            why.append(f"{c.name}: {line}")
            taken.add(c.name)
            room_h -= c.gpu_hours
            room_n -= 1
        return all(state(r, n) == "observed" for r, n, _ in wanted)

    tops = plan(cells, sizes, recipes, budget, {})
    ladders = {r: _rungs(sizes[r], tops[r]) for r in recipes}
    said = ", ".join(f"{r} {tops[r]:.4g}" for r in recipes)
    first = [
        (r, n, f"{'rung' if n == ladders[r][-1] else 'foot'} of {r}'s ladder (tops the budget reaches: {said})")
        for r in recipes
        for n in ladders[r]
    ]
    if not take(first):
        return chosen, why, ""  # the rungs to measure, or in flight
    # the rungs are in: each recipe's forecast from its foot and rung; those MARGIN behind the lowest are out
    early = {}
    for r in recipes:
        pts = _points(pool, observed, r)
        if len(ladders[r]) == 2:
            early[r] = secant((ladders[r][0], pts[ladders[r][0]]), (ladders[r][1], pts[ladders[r][1]]), spec.at)
    lowest = min(early.values(), default=math.inf)
    out = sorted(r for r, v in early.items() if v > lowest + MARGIN)
    alive = [r for r in recipes if r not in out]
    from_rungs = ", ".join(f"{r} {math.exp(v):.4g}" for r, v in sorted(early.items())) or (
        f"none: no recipe has a foot, a size RATIO ({RATIO:g}) times below its rung"
    )
    if len(alive) == 1:
        return (
            [],
            [],
            (
                f"decided by elimination: {alive[0]} is the only recipe within {MARGIN:g} (log L) of the lowest"
                f" forecast at {spec.at:.4g} from the rungs ({from_rungs})"
            ),
        )
    spent = sum(_price(cells, r, n) for r in recipes for n in ladders[r])
    measured = {r: ladders[r][-1] for r in alive if ladders[r]}
    tops = plan(cells, sizes, alive, budget - spent, measured)
    said = ", ".join(f"{r} {tops[r]:.4g}" for r in alive)
    dropped = f"; out after the rungs: {', '.join(out)}" if out else ""
    line = f"forecasts from the rungs: {from_rungs}{dropped}; tops for the rest: {said}"
    if not take([(r, tops[r], f"top of {r}'s ladder ({line})") for r in alive if tops[r] != measured.get(r)]):
        if chosen or any(state(r, tops[r]) == "in flight" for r in alive):
            return chosen, why, ""
        return [], [], f"no affordable top for {', '.join(r for r in alive if not state(r, tops[r]))} ({line})"
    return [], [], f"the ladder is measured ({line})"
