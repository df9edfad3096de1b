"""A scaling fit that chooses its form on held-out points, with a band calibrated by the same held-out errors.

Why: one form, E + A x^-alpha, is misspecified on many real fine-tuning curves: on the 90 public curves of Lin et
al. 2024 (sft_grid/conf/replay/) the fitted E ends on its bound (0) in a third of them, the curve not yet bending
within the observed range, and the bootstrap band of a misspecified form is narrow around the wrong curve. So:

* candidate forms (x is the fit's axis: parameters, or fine-tuning examples):
  `power_e`  L = E + A x^-alpha   (the report's fit, analysis/scaling.py: Huber in log space, E >= 0)
  `power`    L = A x^-alpha       (no irreducible term: a line in log-log, least squares in log L)
  `loglinear` L = a - b log x     (least squares in L)
  `rectified` L = E + B / (D_l + x^beta)   (Lin et al. 2024's "rectified" law for fine-tuning data, least squares
              in log L: a power law in x past a pre-learned size D_l, flat before it, where the curve has not yet
              begun to fall: the phase in which the other forms' fits are bent by the early, flat points)
  `tail`     L = A x^-alpha through the largest TAIL_X (3) x only (least squares in log L): the local power law,
              the curve's latest log-log slope carried on. Its forecast ignores how the curve began, so a flat start
              or an early bend the global forms must follow cannot tilt it; a curve made of power-law segments (a
              "broken" scaling law) is extrapolated by its last segment. On the 90 real curves it is the most often
              chosen and, used alone, errs least at every distance measured (benchmarks/README.md)
  (where a grid has both size and data, analysis/joint.py weighs a joint surface against each size's curve);
* the choice: rolling-origin validation, the extrapolation the forecast makes: for each of the `holdout`
  largest distinct x, each form is fitted on the points below it and scored on the points at it (log error,
  log(predicted / observed)); the form with the smallest root-mean-square held-out error is chosen (ties: the order
  above: what the report shows), every form is refitted on every point, and the forecast is their average in log L
  weighted by the likelihood of each form's held-out errors (`Selection.average`: a Bayesian model average's mean,
  with weights from held-out fit; a form that held out much worse weighs nothing);
* the band: the forecast times exp(+-t s(d)), d = log(x / largest x) the distance of the forecast
  beyond the largest point, s(d) the log error scale the form makes extrapolating that far, t Student's quantile
  with as many degrees of freedom as distinct held-out x. s(d) is learnt from nested held-out extrapolations
  (`growth`): the form is fitted on the j smallest distinct x for every j it can be fitted on, and predicts every
  larger observed x, so its errors are seen at every distance the data hold, not only at one step. Their scale is
  modelled as s(d) = c max(d, step)^p: c from the held-out extrapolations (and the in-sample residual), step their
  mean distance, the growth exponent p from how each nested fit's errors grow with the distance, averaged over
  [1, 2] under a flat prior, so that where the errors do not yet say how fast they grow the band is that of the
  faster growth (see `growth` for why these bounds). A band from the errors the form actually made when
  extrapolating, at the distances it made them, not from resampling a form assumed right; its coverage on the
  replays is measured by benchmarks/bench_adaptive.py.

Pure numpy (scipy for power_e's fit and t's quantile); the same input gives the same result.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sft_grid.analysis import scaling

FORMS = ("power_e", "power", "loglinear", "rectified", "tail")
# the local power law's distinct x: its largest three (the fewest through which a line in log-log has a residual)
TAIL_X = 3
# the fewest distinct x each form is fitted on (its parameters; the local power law's own x)
MIN_X = {"power_e": 3, "power": 2, "loglinear": 2, "rectified": 4, "tail": TAIL_X}


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
        if self.form in ("power", "tail"):
            return float(p["A"] * x ** -p["alpha"])
        if self.form == "rectified":
            return float(p["E"] + p["B"] / (p["Dl"] + x ** p["beta"]))
        return p["a"] - p["b"] * math.log(x)


def fit_form(form: str, points: Sequence[tuple[float, float]]) -> FormFit:
    """Fit one form to (x, L) points with x, L > 0 (others are left out). Pure, so remembered: an adaptive loop
    refits the same folds round after round."""
    if form not in MIN_X:
        raise ValueError(f"unknown form {form!r}: one of {', '.join(FORMS)}")
    good = tuple(sorted((float(x), float(y)) for x, y in points if positive(x) and positive(y)))
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
    elif form == "rectified":
        params, at_bounds = _fit_rectified(good)
    elif form in ("power", "tail"):
        x0 = 1.0
        if form == "tail":  # the largest TAIL_X distinct x only: the residual below is theirs too
            keep = xs >= sorted(set(xs.tolist()))[-TAIL_X]
            xs, ys = xs[keep], ys[keep]
            x0 = float(xs.max())  # log x about the largest: the three close x's line well conditioned
        slope, icpt = np.polyfit(np.log(xs / x0), np.log(ys), 1)
        params, at_bounds = {"A": float(math.exp(icpt) * x0**-slope), "alpha": float(-slope)}, ()
    else:
        slope, icpt = np.polyfit(np.log(xs), ys, 1)
        params, at_bounds = {"a": float(icpt), "b": float(-slope)}, ()
    fitted = FormFit(form, True, params, at_bounds=at_bounds)
    pred = np.array([fitted.predict(x) for x in xs])
    if not np.all(pred > 0):
        return FormFit(form, False, params)
    res = float(np.sqrt(np.mean(np.log(pred / ys) ** 2)))
    return FormFit(form, True, params, res, at_bounds)


# the rectified form's exponents and pre-learned sizes (log, in units of the points' geometric mean x) searched
# before the local fit: its E and B are linear given them (variable projection), so a grid of the two is cheap
RECTIFIED_BETAS = tuple(0.05 * k for k in range(1, 61))
RECTIFIED_LOG_DL = tuple(0.5 * k for k in range(-24, 25))


@functools.lru_cache(maxsize=256)
def _rectified_grid(good: tuple[tuple[float, float], ...]) -> tuple[float, Any, Any, Any, Any, Any]:
    """The rectified form on its (beta, D_l) grid (RECTIFIED_BETAS x RECTIFIED_LOG_DL, D_l in units of x0, the
    points' geometric mean x): at each, the linear (E, B) solved in closed form by least squares weighted by 1/L
    (log L's residual to first order), E clipped to [0, min L). Returns (x0, beta, D_l, E, B, the sum of squared
    log residuals), one entry per grid point, B in x0's units, the arrays read-only. Remembered by the sorted
    points: the fit (`_fit_rectified`) and its profile interval (`rectified_profile`) read the same grid."""
    import numpy as np

    xs = np.array([x for x, _ in good])
    ys = np.array([y for _, y in good])

    x0 = float(np.exp(np.log(xs).mean()))
    u_x, w = xs / x0, 1.0 / ys
    betas = np.repeat(np.array(RECTIFIED_BETAS), len(RECTIFIED_LOG_DL))
    dls = np.exp(np.tile(np.array(RECTIFIED_LOG_DL), len(RECTIFIED_BETAS)))
    u = 1.0 / (dls[:, None] + u_x[None, :] ** betas[:, None])  # (grid, points)
    sw, swu, swuu = (w**2).sum(), (w**2 * u).sum(1), (w**2 * u * u).sum(1)
    swy, swuy = (w**2 * ys).sum(), (w**2 * u * ys).sum(1)
    det = sw * swuu - swu**2
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(det > 0, (swuu * swy - swu * swuy) / det, 0.0)
    e = np.clip(e, 0.0, ys.min() * (1 - 1e-6))
    b = np.maximum((w**2 * u * (ys - e[:, None])).sum(1) / np.maximum(swuu, 1e-300), 1e-12)
    pred = e[:, None] + b[:, None] * u
    sse = ((np.log(np.maximum(pred, 1e-300)) - np.log(ys)) ** 2).sum(1)
    for a in (betas, dls, e, b, sse):
        a.flags.writeable = False
    return x0, betas, dls, e, b, sse


def _fit_rectified(good: tuple[tuple[float, float], ...]) -> tuple[dict[str, float], tuple[str, ...]]:
    """L = E + B / (D_l + x^beta), 0 <= E < min L, B, D_l > 0, beta in (0, 3], least squares in log L: the best
    point of its grid (`_rectified_grid`: E and B are linear given beta and D_l, so the search is over two
    parameters only), refined in log L (scipy's least_squares). Returns the parameters in the points' own x and the
    bounds hit."""
    import numpy as np
    from scipy.optimize import least_squares

    x0, betas, dls, e, b, sse = _rectified_grid(good)
    xs = np.array([x for x, _ in good])
    ys = np.array([y for _, y in good])
    u_x = xs / x0
    i = int(np.nanargmin(sse))
    lo_e, hi_e = 0.0, float(ys.min()) * (1 - 1e-6)
    log_y = np.log(ys)

    def resid(th: Any) -> Any:
        return np.log(np.maximum(th[0] + np.exp(th[1]) / (np.exp(th[2]) + u_x ** th[3]), 1e-300)) - log_y

    start = [min(max(float(e[i]), lo_e), hi_e), math.log(b[i]), math.log(dls[i]), float(betas[i])]
    res = least_squares(resid, start, bounds=([lo_e, -50, -30, 0.01], [hi_e, 50, 30, 3.0]), max_nfev=400)
    th = res.x if res.cost <= 0.5 * sse[i] + 1e-15 else start
    big_e, beta = float(th[0]), float(th[3])
    params = {
        "E": big_e,
        "B": float(math.exp(th[1])) * x0**beta,
        "Dl": float(math.exp(th[2])) * x0**beta,
        "beta": beta,
    }
    at_bounds = tuple(k for k, hit in (("E", big_e <= 1e-9 * hi_e), ("beta", beta >= 3.0 - 1e-6)) if hit)
    return params, at_bounds


# the rectified form's profile interval (`rectified_profile`): the grid points within chi2_1(0.9) of the best, their
# forecasts' half range read as a normal 90% interval's
PROFILE_CHI2 = 2.706
PROFILE_Z = 1.645


def rectified_profile(points: Sequence[tuple[float, float]], x: float, sigma: float) -> float:
    """The rectified form's parameter uncertainty at x (log L, a normal scale): the half range of the forecasts at x
    of every (beta, D_l) of its grid whose fit is within PROFILE_CHI2 sigma^2 of the best (a profile-likelihood
    interval at 90%, sigma the log error scale of the points), over PROFILE_Z; 0 where fewer than two are.

    Why: on a curve still flat over its sizes, the pre-learned size D_l is not identified: every D_l beyond the
    points fits the flat part about as well, and each forecasts a different fall at x. The one fitted D_l, and the
    errors its held-out fits made on the same flat part (`growth`), hide that."""
    import numpy as np

    good = sorted((float(a), float(b)) for a, b in points if positive(a) and positive(b))
    if len({a for a, _ in good}) < MIN_X["rectified"] or not (positive(x) and positive(sigma)):
        return 0.0
    x0, betas, dls, e, b, sse = _rectified_grid(tuple(good))
    at = e + b / (dls + (x / x0) ** betas)
    near = (sse - np.nanmin(sse) <= PROFILE_CHI2 * sigma**2) & (at > 0)
    if near.sum() < 2:
        return 0.0
    logs = np.log(at[near])
    return float((logs.max() - logs.min()) / 2 / PROFILE_Z)


# the exponents p of the band's growth s(d) = c max(d, step)^p, a flat prior over [1, 2] (see `growth`)
GROWTH_EXPONENTS = tuple(1.0 + k / 10 for k in range(11))
# the band's half width at most (log L): beyond, the band says nothing anyway, and exp() stays finite
MAX_HALF = 50.0


@dataclass(frozen=True)
class Growth:
    """The band's log error scale as a function of the distance d (log x) of a forecast beyond the largest x: s(d)^2 =
    sum over the exponents p of w_p (c_p max(d, floor)^p)^2 (the scale mixture of the exponents' posterior)."""

    components: tuple[tuple[float, float, float], ...]  # (posterior weight w_p, c_p, p)
    floor: float  # the held-out extrapolations' mean distance (log x; band_step): a forecast nearer gets the band at it
    df: int  # distinct x the level's errors are at: the band's degrees of freedom
    errors: int  # the errors the level is read from (the in-sample residual counted)

    def scale(self, distance: float, floor: float | None = None) -> float:
        """s at `distance` beyond the largest x (`floor`: another design's band_step, e.g. one to come)."""
        d = max(distance, self.floor if floor is None or not math.isfinite(floor) else floor)
        if d <= 0:
            return 0.0
        return math.sqrt(sum(w * c * c * math.exp(2 * p * math.log(d)) for w, c, p in self.components))

    @property
    def exponent(self) -> float:
        """The posterior mean of p."""
        return sum(w * p for w, _, p in self.components)


def band_step(xs: Sequence[float], holdout: int = 2) -> float:
    """The mean distance (log x) of the one-step extrapolations the band's level is read from on these x (`growth`):
    the last `holdout` steps between consecutive distinct x (nan: none). Nearer than it, an error is noise."""
    distinct = sorted({float(x) for x in xs if positive(x)})[-holdout - 1 :]
    gaps = [math.log(b / a) for a, b in itertools.pairwise(distinct)]
    return sum(gaps) / len(gaps) if gaps else math.nan


def growth(form: str, points: Sequence[tuple[float, float]], holdout: int = 2) -> Growth | None:
    """How the form's extrapolation error grows with the distance of the extrapolation, learnt from the points alone.

    Why: a band learnt from one-step extrapolations (the `holdout` largest x held out) and stretched linearly to a
    forecast ten steps out assumes the error grows as an error in the parameters does, linearly in the distance;
    where the form is misspecified (a curve that bends beyond the observed range, as real fine-tuning curves do) it
    grows faster, and only extrapolations over several distances can show it.

    Nested held-out extrapolations: for every j from the form's fewest x (MIN_X) up, the form is fitted on the j
    smallest distinct x (an origin) and predicts every point at a larger x: an error e = log(predicted / observed)
    at a distance d = log(x / the origin's largest x). The fits are remembered (fit_form), so a loop that adds sizes
    pays only for the new ones. The model: e ~ N(0, (c_j max(d, step)^p)^2), one growth exponent p for the curve
    and a level c_j per origin (a fit on the few smallest x errs more at every distance than one on many: its level
    is its own, so it cannot pass for growth), step the mean distance of the `holdout` one-step extrapolations
    (band_step: nearer than it, an error is counted as noise, not growth; the band's old unit of reach). p's
    posterior on GROWTH_EXPONENTS, a flat prior over [1, 2], from each origin's profile likelihood (its c_j at the
    maximum: an origin with one error says nothing of p), tempered to count each distinct x predicted once (the
    origins' errors share their points). The forecast's level c_p is that of the `holdout` largest origins (the
    held-out extrapolations select scores the forms on), the in-sample residual one more error at `step`; the
    band's scale at a distance d is the mixture over p, s(d)^2 = sum_p w_p (c_p max(d, step)^p)^2. With p = 1 this
    is the band as it was (the held-out error stretched linearly beyond `step`).

    The prior's bounds from first principles: an error in the form's parameters (a slope) grows linearly with the
    distance, a curvature the form misses with its square; growth slower than linear is not believed (where it is
    seen, the errors at short distances are mostly noise) and faster than quadratic not assumed. Where the errors
    cannot tell the exponents apart (few sizes, one or two distances), the mixture is dominated by the quadratic:
    a forecast ten steps out gets a band about five times that of linear growth, the conservative prior where there
    are too few points; as sizes come in, the growth the curve shows replaces it. None when nothing can be held out.
    """
    import numpy as np

    good = sorted((float(x), float(y)) for x, y in points if positive(x) and positive(y))
    distinct = sorted({x for x, _ in good})
    origins = distinct[MIN_X[form] - 1 : -1]
    found: list[list[tuple[float, float, float]]] = []  # per origin: (distance, error, x)
    for origin in origins:
        fitted = fit_form(form, [p for p in good if p[0] <= origin])
        errs = []
        for x, y in good:
            pred = fitted.predict(x) if fitted.ok and x > origin else math.nan
            if math.isfinite(pred) and pred > 0:
                errs.append((math.log(x / origin), math.log(pred / y), x))
        found.append(errs)
    level = [(d, e) for errs in found[-holdout:] for d, e, _ in errs]
    if not level:
        return None
    floor = band_step(distinct, holdout)
    full = fit_form(form, good)
    if full.ok and math.isfinite(full.residual):
        level.append((floor, full.residual))
    ps = np.array(GROWTH_EXPONENTS)
    d = np.maximum(np.array([x[0] for x in level]), floor)
    c2 = np.array([float(np.mean(np.array([x[1] for x in level]) ** 2 / d ** (2 * p))) for p in ps])
    # p's log likelihood: each origin with two or more errors, its level profiled out
    loglik = np.zeros(len(ps))
    ratios, predicted = 0, set()
    for errs in found:
        if len(errs) < 2:
            continue
        dj = np.maximum(np.array([x[0] for x in errs]), floor)
        e2 = np.array([x[1] for x in errs]) ** 2
        cj2 = np.array([float(np.mean(e2 / dj ** (2 * p))) for p in ps])
        if np.all(cj2 > 0):
            loglik += -len(errs) / 2 * np.log(cj2) - ps * float(np.log(dj).sum())
            ratios += len(errs) - 1
            predicted |= {x[2] for x in errs}
    if ratios:
        loglik *= min(1.0, (len(predicted) - 1) / ratios)
    w = np.exp(loglik - loglik.max())
    w /= w.sum()
    components = tuple((float(wi), math.sqrt(ci), float(p)) for wi, ci, p in zip(w, c2, ps, strict=True))
    return Growth(components, floor, len({x for errs in found[-holdout:] for _, _, x in errs}), len(level))


@dataclass(frozen=True)
class Selection:
    """The chosen form refitted on every point, each form's held-out score, and what the band is made of."""

    form: str
    fit: FormFit
    scores: dict[str, float]  # form -> root-mean-square held-out log error (inf: not fittable on the folds)
    heldout: int  # held-out points the scores are over
    sigma: float  # the one-step log error scale (held out and in sample combined; the report's: the band is growth's)
    step: float  # the mean distance in log x of the held-out extrapolations
    x_max: float
    level: float
    folds: tuple[float, ...] = ()  # the held-out x: each scored on a fit of the points below it
    points: tuple[tuple[float, float], ...] = ()  # what was fitted (for the band's growth)

    @property
    def ok(self) -> bool:
        return self.fit.ok

    @functools.cached_property
    def growth(self) -> Growth | None:
        """The band's growth with distance (`growth`; computed when a band is first asked for: the report's
        selection does not need it)."""
        return growth(self.form, self.points, len(self.folds)) if self.heldout and self.fit.ok else None

    @property
    def error(self) -> float:
        """The chosen form's root-mean-square held-out log error: what chose it (inf: nothing was held out)."""
        return self.scores.get(self.form, math.inf)

    def formula(self, x: str = "x") -> str:
        """The chosen form with its fitted parameters, in words: "1.69 + 406.4 N^-0.34"."""
        return formula(self.form, self.fit.params, x)

    @functools.cached_property
    def weights(self) -> tuple[tuple[str, float, FormFit], ...]:
        """Each form with a held-out score, its weight as a model of the held-out points and its fit on every point:
        exp(-n (score_f^2 - best^2) / (2 best^2)), normalised (n held-out points: the likelihood of its held-out errors
        under the chosen form's error scale: the chosen form's weight is the largest unless a form that held out
        better could not be refitted on every point). Empty where nothing was held out."""
        if not (self.heldout and math.isfinite(self.error)):
            return ()
        best = max(self.error, 1e-6)
        found = [
            (form, math.exp(-0.5 * self.heldout * (score**2 - best**2) / best**2), fit_form(form, self.points))
            for form, score in self.scores.items()
            if math.isfinite(score)
        ]
        total = sum(w for _, w, _ in found)
        return tuple((form, w / total, fitted) for form, w, fitted in found)

    def average(self, x: float) -> float:
        """The forecast at x: the forms' forecasts averaged in log L by their `weights` (a Bayesian model average's
        mean, with weights from held-out fit), over the forms that forecast a finite loss there; the chosen form's
        own where nothing was held out.

        Why not the chosen form's alone: with two held-out points the choice is noisy, and a forecast that follows
        whichever form happened to hold out best swings with it; the average moves with the forms' evidence instead.
        On the replayed curves (benchmarks/README.md) it errs less than the choice and decides more often right."""
        found = [(w, value) for _, w, value in self._each(x) if value is not None]
        total = sum(w for w, _ in found)
        return math.exp(sum(w * math.log(v) for w, v in found) / total) if total > 0 else self.fit.predict(x)

    def _each(self, x: float) -> list[tuple[str, float, float | None]]:
        """Each weighted form, its weight and its forecast at x (None where it forecasts no finite loss there)."""
        out: list[tuple[str, float, float | None]] = []
        for form, w, fitted in self.weights:
            value = fitted.predict(x) if fitted.ok else math.nan
            out.append((form, w, value if math.isfinite(value) and value > 0 else None))
        return out

    def spread(self, x: float) -> float:
        """The forms' disagreement at x (log L): the root of sum_f w_f log(F_f(x) / F(x))^2 over every form with a
        held-out score (`weights`), F_f refitted on every point, F the forecast (`average`), plus the rectified
        form's own parameter uncertainty in its term (`rectified_profile`). A form that held out as well but
        forecasts nothing finite at x counts as MAX_HALF apart.

        Why: the chosen form's own errors (`growth`) say how it errs while the curve keeps the shape it had; where
        forms that extrapolated the held-out points about as well part ways at x, which of them the curve follows
        is uncertain, and its own errors cannot show that (a curve still flat before its pre-learned size: every
        form fits the flat part, and they disagree where it falls). This is the model part of a Bayesian model
        average's predictive variance, with weights from held-out fit instead of a prior the data cannot check."""
        base = self.average(x)
        if not (self.weights and math.isfinite(base) and base > 0):
            return 0.0
        best = max(self.error, 1e-6)
        weighted = 0.0
        for form, w, value in self._each(x):
            apart = math.log(value / base) if value is not None else MAX_HALF
            own = rectified_profile(self.points, x, best) if form == "rectified" else 0.0
            weighted += w * (apart * apart + own * own)
        return math.sqrt(weighted)

    def scale(self, x: float) -> float | None:
        """The band's log scale at x: the chosen form's error at x's distance beyond the largest x (`growth`) and
        the forms' disagreement there (`spread`), added in quadrature; None where nothing was held out."""
        band = self.growth
        if band is None:
            return None
        reach = math.log(x / self.x_max) if x > self.x_max else 0.0
        return math.hypot(band.scale(reach), self.spread(x))

    def forecast(self, x: float) -> tuple[float, float | None, float | None]:
        """(value, lo, hi) at x: the forecast times exp(+-t `scale`); no band (None) where nothing was held out."""
        from scipy.stats import t as student

        value = self.average(x)
        scale = self.scale(x)
        band = self.growth
        if band is None or scale is None or not math.isfinite(value) or value <= 0:
            return value, None, None
        half = min(MAX_HALF, float(student.ppf((1 + self.level) / 2, band.df)) * scale)
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
FORMULAS = {
    "power_e": "{E} + {A} {x}^-{alpha}",
    "power": "{A} {x}^-{alpha}",
    "loglinear": "{a} - {b} log {x}",
    "rectified": "{E} + {B} / ({Dl} + {x}^{beta})",
    "tail": "{A} {x}^-{alpha} (through the largest 3)",
}


def formula(form: str, params: dict[str, float], x: str = "x") -> str:
    """A form with its parameters ("1.69 + 406.4 N^-0.34"), or its shape where they are missing ("E + A N^-alpha")."""
    names = {"E", "A", "alpha", "a", "b", "B", "Dl", "beta"}
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
    good = [(float(x), float(y)) for x, y in points if positive(x) and positive(y)]
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
    return Selection(
        chosen, fit, scores, n_test, sigma, sum(steps) / len(steps), distinct[-1], level, tuple(folds), tuple(good)
    )


def positive(v: object) -> bool:
    """A finite number above zero (not a bool): what a fit can take the log of."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
