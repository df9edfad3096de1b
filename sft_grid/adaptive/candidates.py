"""What the adaptive designs read and say: a candidate cell of the pool (its recipe, size, price, whether it is a
holdout), the pool indexed by (recipe, size), and a recipe's forecast at the question's size with its band.
design.py fits and decides, race.py races, ladder.py climbs; all read these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
    scale: float | None = None  # the band's scale in log L (Student-t with `df` degrees of freedom); None: no band
    df: int = 0

    @property
    def halfwidth(self) -> float:
        return math.inf if self.lo is None or self.hi is None else (self.hi - self.lo) / 2


# the pool's cells that can be fitted, by (recipe, size): read once a round, so a round is linear in the pool
Cells = Mapping[tuple[str, float], Sequence[Candidate]]


def by_size(pool: Sequence[Candidate]) -> dict[tuple[str, float], list[Candidate]]:
    cells: dict[tuple[str, float], list[Candidate]] = {}
    for c in pool:
        if not c.holdout:
            cells.setdefault((c.recipe, c.n), []).append(c)
    return cells


def sizes_of(cells: Cells, recipe: str) -> list[float]:
    """The recipe's distinct sizes in the pool, smallest first."""
    return sorted(n for r, n in cells if r == recipe)


def cheapest(cells: Cells, recipe: str, n: float, taken: set[str]) -> Candidate | None:
    """The cheapest cell of `recipe` at size `n` not yet taken (None: all taken)."""
    free = [c for c in cells.get((recipe, n), ()) if c.name not in taken]
    return min(free, key=lambda c: (c.gpu_hours, c.name), default=None)
