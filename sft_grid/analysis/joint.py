"""The joint form over size and data, where a grid has both: L(N, D) = E + A N^-alpha + B D^-beta (Hoffmann et al.'s
form, one data exponent shared by the sizes), fitted (`fit_joint`) and weighed against each size's own curve over D
(analysis/forms.py's `select`) on the held-out largest data sizes (`select_joint`; the report's joint_fits,
analysis/report_data.py).

Pure numpy and scipy; the same input gives the same result.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sft_grid.analysis.forms import Selection, positive, select


@dataclass(frozen=True)
class JointFit:
    """L(N, D) = E + A N^-alpha + B D^-beta as `fit_joint` fitted it (ok False, its parameters nan, where it could
    not: too few sizes, data sizes or points); `residual` the root-mean-square in-sample log residual."""

    ok: bool
    E: float = math.nan
    A: float = math.nan
    alpha: float = math.nan
    B: float = math.nan
    beta: float = math.nan
    residual: float = math.nan

    def predict(self, n: float, d: float) -> float:
        return float(self.E + self.A * n**-self.alpha + self.B * d**-self.beta)

    def formula(self, n: str = "N", d: str = "D") -> str:
        """The surface with its fitted parameters ("1.5 + 300 N^-0.3 + 50 D^-0.25"), or its shape where the fit
        failed."""
        if not self.ok:
            return f"E + A {n}^-alpha + B {d}^-beta"
        return f"{self.E:.4g} + {self.A:.4g} {n}^-{self.alpha:.4g} + {self.B:.4g} {d}^-{self.beta:.4g}"


def fit_joint(points: Sequence[tuple[float, float, float]]) -> JointFit:
    """L(N, D) = E + A N^-alpha + B D^-beta on (N, D, L) points (Hoffmann et al.'s form, least squares in log L, E,
    A, B >= 0, exponents in 0.01..2; N and D scaled by their geometric means; the best of a grid of starts)."""
    import numpy as np
    from scipy.optimize import least_squares

    good = [(float(n), float(d), float(v)) for n, d, v in points if positive(n) and positive(d) and positive(v)]
    if len({n for n, _, _ in good}) < 2 or len({d for _, d, _ in good}) < 3 or len(good) < 6:
        return JointFit(False)
    arr = np.array(good)
    n0, d0 = np.exp(np.log(arr[:, 0]).mean()), np.exp(np.log(arr[:, 1]).mean())
    xn, xd, y = arr[:, 0] / n0, arr[:, 1] / d0, np.log(arr[:, 2])

    def resid(th: Any) -> Any:
        return np.log(np.maximum(th[0] + th[1] * xn ** -th[2] + th[3] * xd ** -th[4], 1e-300)) - y

    lower, upper = [0, 0, 0.01, 0, 0.01], [np.inf, np.inf, 2.0, np.inf, 2.0]
    best = None
    low = float(arr[:, 2].min())
    for e in (0.0, 0.5 * low, 0.9 * low):
        for a in (0.1, 0.5):
            for b in (0.1, 0.5):
                res = least_squares(resid, [e, 0.3 * low, a, 0.3 * low, b], bounds=(lower, upper), max_nfev=2000)
                if best is None or res.cost < best.cost:
                    best = res
    assert best is not None
    e, a_n, alpha, b_n, beta = (float(v) for v in best.x)
    rms = float(np.sqrt(np.mean(resid(best.x) ** 2)))
    return JointFit(True, e, a_n * n0**alpha, alpha, b_n * d0**beta, beta, rms)


@dataclass(frozen=True)
class JointSelection:
    """The joint surface against each size's own curve, chosen on the held-out largest data sizes (`select_joint`):
    `chosen` "joint" or "per_size" ("" with `reason` where neither could be scored), each candidate's root-mean-
    square held-out log error, the held-out data sizes, the joint surface refitted on every point."""

    chosen: str
    scores: dict[str, float]
    heldout: int
    heldout_d: tuple[float, ...]
    joint: JointFit
    points: tuple[tuple[float, float, float], ...]
    reason: str = ""
    level: float = 0.9  # the per-size selections' band level (`select`'s)

    @property
    def ok(self) -> bool:
        return bool(self.chosen)

    def predict(self, n: float, d: float) -> float:
        """The chosen candidate's forecast at size n and data d (per_size: n's own curve, its form chosen by
        `select`; nan for a size not among the points, and where nothing was chosen)."""
        if not self.ok:
            return math.nan
        if self.chosen == "joint":
            return self.joint.predict(n, d)
        own = self._per_size.get(n)
        return own.average(d) if own is not None else math.nan

    @functools.cached_property
    def _per_size(self) -> dict[float, Selection]:
        """Each size's own curve, its form chosen by `select` (once, however many forecasts are asked)."""
        sizes = sorted({n for n, _, _ in self.points})
        return {n: select([(d, v) for nn, d, v in self.points if nn == n], level=self.level) for n in sizes}

    def as_dict(self) -> dict[str, Any]:
        """What the report shows (report.json's joint_fits[]): the candidate chosen (None, with `reason`, where
        none was), each candidate's held-out error (None: not scorable on the folds), the held-out points and data
        sizes, the joint surface's parameters and formula (refitted on every point, whichever was chosen), and how
        many sizes and data sizes the points hold."""
        j = self.joint
        return {
            "ok": self.ok,
            "chosen": self.chosen or None,
            "reason": self.reason,
            "scores": {k: v if math.isfinite(v) else None for k, v in self.scores.items()},
            "heldout": self.heldout,
            "heldout_d": list(self.heldout_d),
            "joint": {"E": j.E, "A": j.A, "alpha": j.alpha, "B": j.B, "beta": j.beta} if j.ok else None,
            "formula": j.formula(),
            "sizes": len({n for n, _, _ in self.points}),
            "data_sizes": len({d for _, d, _ in self.points}),
        }


def select_joint(
    points: Sequence[tuple[float, float, float]], *, holdout: int = 2, level: float = 0.9
) -> JointSelection:
    """Where a grid has both size N and data D ((N, D, L) points): the joint surface (fit_joint) or each size's own
    curve over D (`select`), whichever forecast the `holdout` largest distinct D better from the points below each
    (rolling origin, log error; ties: per_size, the fewer assumptions). A size with fewer than two smaller D makes
    per_size unscorable on that fold, a failed joint fit the joint; fewer than 2 sizes or 3 data sizes: not ok.

    Why: the joint form shares one data exponent across sizes, which helps where each size has few data points and
    the sizes' curves are alike; real fine-tuning curves of one family differ in shape (on the replays its held-out
    error is several times each curve's own; benchmarks/bench_adaptive.py), so it is chosen only where it holds out
    better, not assumed."""
    good = [(float(n), float(d), float(v)) for n, d, v in points if positive(n) and positive(d) and positive(v)]
    ns, ds = sorted({n for n, _, _ in good}), sorted({d for _, d, _ in good})
    if len(ns) < 2 or len(ds) < 3:
        why = f"{len(ns)} size(s) and {len(ds)} data size(s): the joint form needs 2 sizes and 3 data sizes"
        return JointSelection("", {}, 0, (), JointFit(False), tuple(good), why, level)
    folds = ds[-holdout:] if holdout > 0 else []
    errors: dict[str, list[float]] = {"joint": [], "per_size": []}
    usable = dict.fromkeys(errors, True)
    for cut in folds:
        train = [p for p in good if p[1] < cut]
        test = [p for p in good if p[1] == cut]
        joint = fit_joint(train)
        for n, d, v in test:
            value = joint.predict(n, d) if joint.ok else math.nan
            own = [(dd, vv) for nn, dd, vv in train if nn == n]
            mine = select(own, level=level).forecast(d)[0] if len({dd for dd, _ in own}) >= 2 else math.nan
            for name, f in (("joint", value), ("per_size", mine)):
                if math.isfinite(f) and f > 0:
                    errors[name].append(math.log(f / v))
                else:
                    usable[name] = False
    scores = {
        k: math.sqrt(sum(e * e for e in es) / len(es)) if usable[k] and es else math.inf for k, es in errors.items()
    }
    heldout = max((len(e) for e in errors.values()), default=0)
    if not any(math.isfinite(s) for s in scores.values()):
        why = "neither the joint form nor each size's own curve could be scored on the held-out data sizes"
        return JointSelection("", scores, 0, tuple(folds), fit_joint(good), tuple(good), why, level)
    chosen = "joint" if scores["joint"] < scores["per_size"] else "per_size"
    return JointSelection(chosen, scores, heldout, tuple(folds), fit_joint(good), tuple(good), "", level)
