"""What the adaptive designs read and say: a candidate cell of the pool (its recipe, size, price, whether it is a
holdout) and a recipe's forecast at the question's size with its band. design.py fits and decides, race.py races;
both read these.
"""

from __future__ import annotations

import math
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
