"""A scaling fit that chooses its form on held-out points, with a band calibrated by the same held-out errors.

Why: one form, E + A x^-alpha, is misspecified on many real fine-tuning curves: on the 90 public curves of Lin et
al. 2024 (sft_grid/conf/replay/) the fitted E ends on its bound (0) in a third of them, the curve not yet bending
within the observed range, and the bootstrap band of a misspecified form is narrow around the wrong curve. So:

* candidate forms (x is the fit's axis: parameters, or fine-tuning examples):
  `power_e`  L = E + A x^-alpha   (the report's fit, analysis/scaling.py: Huber in log space, E >= 0)
  `power`    L = A x^-alpha       (no irreducible term: a line in log-log, least squares in log L)
  `loglinear` L = a - b log x     (least squares in L)
  and, where a grid has both size and data, `joint`: L = E + A N^-alpha + B D^-beta (fit_joint);
* the choice: rolling-origin validation, the extrapolation the forecast makes: for each of the `holdout`
  largest distinct x, each form is fitted on the points below it and scored on the points at it (log error,
  log(predicted / observed)); the form with the smallest root-mean-square held-out error wins (ties: the order
  above), and is refitted on every point;
* the band: the chosen form's forecast times exp(+-t s), s the root-mean-square of its held-out log errors and its
  in-sample residuals combined, scaled up with the distance of the forecast beyond the largest point (in log x,
  relative to the held-out steps' distance), t Student's quantile with as many degrees of freedom as held-out points.
  A band from the errors the form actually made when extrapolating, not from resampling a form assumed right;
  its coverage on the replays is measured by benchmarks/bench_adaptive.py.

Pure numpy (scipy for power_e's fit and t's quantile); the same input gives the same result.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sft_grid.analysis import scaling

FORMS = ("power_e", "power", "loglinear")
# the fewest distinct x each form is fitted on (its parameters)
MIN_X = {"power_e": 3, "power": 2, "loglinear": 2}


@dataclass(frozen=True)
class FormFit:
    """One form fitted to (x, L) points: its parameters by name, or ok=False and why."""

    form: str
    ok: bool
    params: dict[str, float] = field(default_factory=dict)
    residual: float = math.nan  # root-mean-square in-sample log residual
    at_bounds: tuple[str, ...] = ()

    def predict(self, x: float) -> float:
        p = self.params
        if not self.ok:
            return math.nan
        if self.form == "power_e":
            return float(p["E"] + p["A"] * x ** -p["alpha"])
        if self.form == "power":
            return float(p["A"] * x ** -p["alpha"])
        return p["a"] - p["b"] * math.log(x)


def fit_form(form: str, points: Sequence[tuple[float, float]]) -> FormFit:
    """Fit one form to (x, L) points with x, L > 0 (others are left out). Pure, so remembered: an adaptive loop
    refits the same folds round after round."""
    if form not in MIN_X:
        raise ValueError(f"unknown form {form!r}: one of {', '.join(FORMS)}")
    good = tuple(sorted((float(x), float(y)) for x, y in points if _positive(x) and _positive(y)))
    return _fit_form(form, good)


@functools.lru_cache(maxsize=4096)
def _fit_form(form: str, good: tuple[tuple[float, float], ...]) -> FormFit:
    import numpy as np

    if len({x for x, _ in good}) < MIN_X[form]:
        return FormFit(form, False)
    xs = np.array([x for x, _ in good])
    ys = np.array([y for _, y in good])
    if form == "power_e":
        f = scaling.fit([(x, y, str(i)) for i, (x, y) in enumerate(good)], resamples=0)
        if not f.ok:
            return FormFit(form, False)
        params = {"E": f.E, "A": f.A, "alpha": f.alpha}
        at_bounds = f.at_bounds
    elif form == "power":
        slope, icpt = np.polyfit(np.log(xs), np.log(ys), 1)
        params, at_bounds = {"A": float(math.exp(icpt)), "alpha": float(-slope)}, ()
    else:
        slope, icpt = np.polyfit(np.log(xs), ys, 1)
        params, at_bounds = {"a": float(icpt), "b": float(-slope)}, ()
    fitted = FormFit(form, True, params, at_bounds=at_bounds)
    pred = np.array([fitted.predict(x) for x in xs])
    if not np.all(pred > 0):
        return FormFit(form, False, params)
    res = float(np.sqrt(np.mean(np.log(pred / ys) ** 2)))
    return FormFit(form, True, params, res, at_bounds)


@dataclass(frozen=True)
class Selection:
    """The chosen form refitted on every point, each form's held-out score, and what the band is made of."""

    form: str
    fit: FormFit
    scores: dict[str, float]  # form -> root-mean-square held-out log error (inf: not fittable on the folds)
    heldout: int  # held-out points the scores are over
    sigma: float  # the chosen form's log error scale (held out and in sample combined)
    step: float  # the mean distance in log x of the held-out extrapolations
    x_max: float
    level: float
    folds: tuple[float, ...] = ()  # the held-out x: each scored on a fit of the points below it

    @property
    def ok(self) -> bool:
        return self.fit.ok

    @property
    def error(self) -> float:
        """The chosen form's root-mean-square held-out log error: what chose it (inf: nothing was held out)."""
        return self.scores.get(self.form, math.inf)

    def formula(self, x: str = "x") -> str:
        """The chosen form with its fitted parameters, in words: "1.69 + 406.4 N^-0.34"."""
        return formula(self.form, self.fit.params, x)

    def forecast(self, x: float) -> tuple[float, float | None, float | None]:
        """(value, lo, hi) at x; no band (None) where nothing was held out."""
        from scipy.stats import t as student

        value = self.fit.predict(x)
        if not self.heldout or not math.isfinite(self.sigma) or not math.isfinite(value) or value <= 0:
            return value, None, None
        reach = max(1.0, math.log(x / self.x_max) / self.step) if x > self.x_max and self.step > 0 else 1.0
        half = float(student.ppf((1 + self.level) / 2, self.heldout)) * self.sigma * reach
        return value, value * math.exp(-half), value * math.exp(half)

    def as_dict(self) -> dict[str, Any]:
        """What the report shows (report.json's fits[].selection): the chosen form, its parameters, the held-out
        error that chose it (`error`) beside the other forms' (`alternatives`; `scores` holds all of them; None:
        not fittable on the folds), the held-out points and x, the band's log scale."""

        def finite(v: float) -> float | None:
            return v if math.isfinite(v) else None

        return {
            "form": self.form,
            "formula": self.formula(),
            "params": dict(self.fit.params),
            "error": finite(self.error),
            "alternatives": {k: finite(v) for k, v in self.scores.items() if k != self.form},
            "scores": {k: finite(v) for k, v in self.scores.items()},
            "heldout": self.heldout,
            "heldout_x": list(self.folds),
            "sigma": finite(self.sigma),
            "at_bounds": list(self.fit.at_bounds),
        }


# each form in words, its parameters by name
FORMULAS = {"power_e": "{E} + {A} {x}^-{alpha}", "power": "{A} {x}^-{alpha}", "loglinear": "{a} - {b} log {x}"}


def formula(form: str, params: dict[str, float], x: str = "x") -> str:
    """A form with its parameters ("1.69 + 406.4 N^-0.34"), or its shape where they are missing ("E + A N^-alpha")."""
    names = {"E", "A", "alpha", "a", "b"}
    values = {k: (f"{params[k]:.4g}" if isinstance(params.get(k), (int, float)) else k) for k in names}
    return FORMULAS.get(form, form).format(x=x, **values)


def select(
    points: Sequence[tuple[float, float]],
    *,
    forms: Sequence[str] = FORMS,
    holdout: int = 2,
    level: float = 0.9,
) -> Selection:
    """Choose among `forms` on the `holdout` largest distinct x (rolling origin; see the module docstring)."""
    good = [(float(x), float(y)) for x, y in points if _positive(x) and _positive(y)]
    distinct = sorted({x for x, _ in good})
    folds = distinct[-holdout:] if holdout > 0 else []
    errors: dict[str, list[float]] = {f: [] for f in forms}
    steps: list[float] = []
    usable = dict.fromkeys(forms, True)
    for cut in folds:
        train = [p for p in good if p[0] < cut]
        test = [p for p in good if p[0] == cut]
        if not train:
            continue
        steps.append(math.log(cut / max(x for x, _ in train)))
        for f in forms:
            fitted = fit_form(f, train)
            preds = [fitted.predict(x) for x, _ in test]
            if not fitted.ok or not all(math.isfinite(p) and p > 0 for p in preds):
                usable[f] = False
                continue
            errors[f] += [math.log(p / y) for p, (_, y) in zip(preds, test, strict=True)]
    n_test = max((len(e) for e in errors.values()), default=0)
    scores = {
        f: math.sqrt(sum(e * e for e in errors[f]) / len(errors[f])) if usable[f] and errors[f] else math.inf
        for f in forms
    }
    ranked = sorted(forms, key=lambda f: (scores[f], forms.index(f)))
    full = {f: fit_form(f, good) for f in ranked}
    chosen = next((f for f in ranked if full[f].ok and math.isfinite(scores[f])), None)
    if chosen is None:  # nothing could be validated: the first form that fits, with no band
        chosen = next((f for f in forms if full[f].ok), forms[0])
        return Selection(
            chosen, full[chosen], scores, 0, math.nan, math.nan, max(distinct, default=math.nan), level, tuple(folds)
        )
    fit = full[chosen]
    errs = errors[chosen]
    sigma = math.sqrt((sum(e * e for e in errs) + fit.residual**2) / (len(errs) + 1))
    return Selection(chosen, fit, scores, n_test, sigma, sum(steps) / len(steps), distinct[-1], level, tuple(folds))


# -- the joint form, where a grid has both size and data ---------------------------------------------------------


@dataclass(frozen=True)
class JointFit:
    ok: bool
    E: float = math.nan
    A: float = math.nan
    alpha: float = math.nan
    B: float = math.nan
    beta: float = math.nan
    residual: float = math.nan

    def predict(self, n: float, d: float) -> float:
        return float(self.E + self.A * n**-self.alpha + self.B * d**-self.beta)


def fit_joint(points: Sequence[tuple[float, float, float]]) -> JointFit:
    """L(N, D) = E + A N^-alpha + B D^-beta on (N, D, L) points (Hoffmann et al.'s form, least squares in log L, E,
    A, B >= 0, exponents in 0.01..2; N and D scaled by their geometric means; the best of a grid of starts)."""
    import numpy as np
    from scipy.optimize import least_squares

    good = [(float(n), float(d), float(v)) for n, d, v in points if _positive(n) and _positive(d) and _positive(v)]
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


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
