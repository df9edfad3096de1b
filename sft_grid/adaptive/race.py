"""A gap question's next cells by successive elimination (`design: race`; the default is ladder.py): which recipe
is lowest at `at`, decided by measuring every recipe that can still win one size further each round, and none that
cannot.

A round (design.choose calls `next_cells` once the common stops, the budget and the decided rule, have been read):

1. The seed: each recipe's window of WINDOW consecutive sizes (the fewest its forms need for a band: the form's
   fewest sizes, two held out, one more origin for the band's growth; analysis/forms.py), the same rank of size for
   every recipe, the largest rank whose windows cost at most SEED_SHARE of the budget (the smallest windows where
   the budget is in cells). Why not the cheapest windows: a fine-tuning curve can sit on its flat start over its
   first sizes (the model has not begun to learn the data) and fall later, so a recipe dropped there is dropped on
   the part of its curve that says least about the target.
2. The race: each recipe's probability of being the lowest at `at` under the bands (the forecasts read as
   Student-t in log L, the same seeded draws as the decision's). A recipe whose probability is below 1 - level is
   out of the race: no more cells for it. Every recipe still in gets its next size up, fewest sizes measured first
   and then cheapest (a round robin over the doublings), each while it fits in what is left of the budget. While a
   forecast reaches further beyond its sizes than they span (design.MAX_REACH), no recipe is dropped.
3. The stop: one recipe left in the race (decided by elimination), or no recipe in it whose next size is
   affordable (the budget), or every one at its largest size; the decision is the lowest forecast, as always.

Why elimination and not the value of each plan per GPU-hour (`design: value`): on the replayed curves (docs/steering.md,
Measured) the plans worth most per GPU-hour buy the cheap recipes' largest cells and leave the dear recipe's band
wide, and when its next size is the plan that matters it no longer fits; the loop stopped undecided with budget
left in most of its misses. A race spends on the recipes that can still win, level by level, and nothing on the
rest: successive elimination, the racing algorithms of Maron and Moore (1994) and the best-arm identification of
Even-Dar, Mannor and Mansour (2006), with the forecast's band in place of a confidence bound on a mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sft_grid.adaptive.candidates import Cells, by_size, cheapest, sizes_of
from sft_grid.analysis import forms

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from sft_grid.adaptive.candidates import Candidate, Forecast
    from sft_grid.adaptive.spec import AdaptiveSpec

# the held-out sizes forms.select scores the forms on
HOLDOUT = 2
# the share of the budget the seed windows may cost at most (the rest is the race's)
SEED_SHARE = 0.5


def window(spec_forms: Sequence[str]) -> int:
    """The sizes a recipe's seed window holds: the fewest of its forms' (forms.MIN_X), the held-out sizes, and one
    more origin for the band's growth (forms.growth)."""
    return min(forms.MIN_X[f] for f in (spec_forms or forms.FORMS)) + HOLDOUT + 1


def chances(
    found: Sequence[Forecast], draws: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
) -> dict[str, float]:
    """Each recipe's probability of being the lowest at `at` under the bands (every forecast has a band)."""
    import numpy as np

    z1, _, w = draws
    mu = np.log(np.array([f.value for f in found], dtype=float))
    scale = np.array([f.scale for f in found], dtype=float)
    lowest = (mu + scale * w * z1).argmin(axis=1)
    return {f.recipe: float(np.mean(lowest == i)) for i, f in enumerate(found)}


def seed_rank(spec: AdaptiveSpec, cells: Cells, sizes: Mapping[str, Sequence[float]]) -> int:
    """The rank (from the smallest, 0-based) of the largest size of every recipe's seed window (see the module);
    `cells`: the pool's by (recipe, size); `sizes`: each recipe's distinct sizes, smallest first."""
    w = window(spec.forms)
    top = max(len(s) for s in sizes.values()) - 1
    if spec.budget_gpu_hours is None:
        return min(w - 1, top)

    def cost(j: int) -> float:
        total = 0.0
        for r, s in sizes.items():
            hi = min(j, len(s) - 1)
            for n in s[max(0, hi - w + 1) : hi + 1]:
                total += min(c.gpu_hours for c in cells[(r, n)])
        return total

    best = min(w - 1, top)
    for j in range(best + 1, top + 1):
        if cost(j) <= SEED_SHARE * spec.budget_gpu_hours + 1e-9:
            best = j
    return best


def next_cells(
    spec: AdaptiveSpec,
    pool: Sequence[Candidate],
    found: Mapping[str, Forecast],
    recipes: Sequence[str],
    taken: set[str],
    waiting: set[str],
    far: Sequence[str],
    room: tuple[float, int],
    draws: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None,
) -> tuple[list[str], list[str], str]:
    """This round's cells of the race (at most spec.batch), a line on why each, and why the race stops (empty while
    it goes on or waits for cells in flight). `found`: each recipe's forecast; `taken`: the cells observed or in
    flight; `waiting`: the recipes with cells in flight; `far`: the recipes the span rule holds (design.MAX_REACH);
    `room`: the GPU-hours and cells left; `draws`: the decision's draws (None while a recipe has no band)."""
    room_h, room_n = room
    chosen: list[str] = []
    why: list[str] = []
    cells = by_size(pool)
    sizes = {r: sizes_of(cells, r) for r in recipes}
    have = {r: [i for i, n in enumerate(sizes[r]) if any(c.name in taken for c in cells[(r, n)])] for r in recipes}
    level = {r: max(have[r], default=-1) for r in recipes}  # the rank of its largest size measured or in flight

    def take(c: Candidate, line: str) -> bool:
        nonlocal room_h, room_n
        if len(chosen) >= spec.batch or room_n < 1 or c.gpu_hours > room_h + 1e-9:
            return False
        chosen.append(c.name)
        why.append(line)
        taken.add(c.name)
        room_h -= c.gpu_hours
        room_n -= 1
        return True

    # the seed: every recipe's window measured whole (and a recipe whose whole window gave no band one size more)
    j = seed_rank(spec, cells, sizes)
    w = window(spec.forms)
    want: list[tuple[Candidate, str]] = []
    for r in (r for r in recipes if sizes[r]):
        hi = min(j, len(sizes[r]) - 1)
        lo = max(0, hi - w + 1)
        missing = [i for i in range(lo, hi + 1) if i not in have[r]]
        if not missing and found[r].scale is None and r not in waiting:  # the next size below it, else above it
            missing = [i for i in [*range(lo - 1, -1, -1), *range(hi + 1, len(sizes[r]))] if i not in have[r]][:1]
        line = f"seed window of {r} ({hi - lo + 1} sizes up to {sizes[r][hi]:.4g}: a band, then the race)"
        want += [(c, line) for c in (cheapest(cells, r, sizes[r][i], taken) for i in missing) if c is not None]
    for c, line in sorted(want, key=lambda cl: (cl[0].gpu_hours, cl[0].name)):
        if not take(c, f"{c.name}: {line}"):
            break
    bandless = [r for r in recipes if found[r].scale is None]
    if chosen or (bandless and waiting):
        return chosen, why, ""
    if bandless:
        return chosen, why, f"no band for {', '.join(bandless)}: no affordable size is left to seed it with"
    assert draws is not None  # every recipe has a band
    p = chances([found[r] for r in recipes], draws)
    floor = 1 - spec.level
    racing = list(recipes) if far else [r for r in recipes if p[r] >= floor]
    out = [r for r in recipes if r not in racing]
    said = ", ".join(f"{r} {p[r]:.3f}" for r in recipes)
    if len(racing) == 1:
        return (
            [],
            [],
            (
                f"decided by elimination: {racing[0]} is the only recipe that can still be the lowest at {spec.at:.4g}"
                f" (probability of being the lowest: {said}; out below {floor:.3g})"
            ),
        )
    nexts = {
        r: cheapest(cells, r, sizes[r][level[r] + 1], taken) if level[r] + 1 < len(sizes[r]) else None for r in racing
    }
    for r in sorted(racing, key=lambda r: (level[r], _cost(nexts[r]), r)):
        cell = nexts[r]
        if r in waiting or cell is None:
            continue  # waiting: its next size waits for the cells in flight, read first
        take(
            cell,
            f"{cell.name}: the next size of {r}, in the race for the lowest at {spec.at:.4g} (probability of being"
            f" the lowest: {said}; "
            + (
                "no recipe dropped while a forecast reaches beyond its span"
                if far
                else f"out: {', '.join(out) or 'none'}"
            )
            + ")",
        )
    if chosen or waiting:
        return chosen, why, ""
    at_top = all(level[r] + 1 >= len(sizes[r]) for r in racing)
    if at_top:
        return [], [], f"every recipe in the race ({', '.join(racing)}) is measured at its largest size"
    return (
        [],
        [],
        (f"no recipe in the race ({', '.join(racing)}) has an affordable next size ({room_h:.4g} GPU-h left)"),
    )


def _cost(cell: Candidate | None) -> float:
    return math.inf if cell is None else cell.gpu_hours
