"""Scaling-law fit L(N) = E + A * N^(-alpha), with a bootstrap confidence band.

Design: the objective, bounds and multi-start of the fit scaling-law papers use (Hoffmann et al. 2022,
"Chinchilla", approach 3), minimised by `scipy.optimize.least_squares` (trust-region reflective, with bounds and
its Huber loss); the bootstrap resamples with numpy and refits every resample at once.

* Objective: the Huber loss of the residuals of log L, r_i = log(E + A N_i^-alpha) - log L_i, with
  delta = 1e-3 (Chinchilla's value; least_squares' `f_scale`). A residual of 1e-3 in log space is a 0.1%
  relative error: inside it the fit is least squares, beyond it every point pulls with the same force, so the
  fit is close to a median regression and one diverged or mislabelled cell cannot drag the curve. Log space makes
  the fit care about relative error, so small and large losses weigh alike.
* `loss="least_squares"` instead minimises sum (E + A N^-alpha - L)^2 on L itself: the textbook fit, the one
  `scipy.optimize.curve_fit` does. It exists to cross-check and for data without outliers.
* Bounds: E >= 0, A >= 0, alpha in `alpha_bounds` (default 0.01..2.0; exponents reported for language models lie
  well inside, and alpha near 0 makes E and A interchangeable).
* Conditioning: N spans decades (1e8..1e10 parameters, 1e18..1e22 FLOPs), so the fit works on x = N / N0 with N0
  the geometric mean of the points' N, and A' = A * N0^-alpha. Reported A is in the caller's units of N.
* Starts: a grid (E as a fraction of min L x alpha values; A' from the linear least squares given E and alpha),
  ranked by the objective; least_squares runs from the best few, and the lowest optimum wins. `converged` says
  least_squares stopped on its tolerances (1e-12), not on its evaluation budget.
* Band: case bootstrap (resample the points with replacement, `resamples` times, seeded numpy Generator); the
  band is the pointwise (1-level)/2 and (1+level)/2 quantiles of the refitted curves over a grid of N. Refitting
  each resample with least_squares costs ~1 ms of its set-up per call, 3600 calls (4 s) for the 72-cell grid's 12
  fits, over the report's time; so the resamples are refitted all at once on numpy by the same method (damped
  Gauss-Newton with the Huber loss's own curvature, bounds held by projection), from the full-data optimum; a
  resample it leaves unconverged is finished by least_squares. tests/test_report_scaling.py checks the band
  against one refitted resample by resample with least_squares. Same input and seed give the same band.
* Too few points (fewer distinct N than the 3 parameters) is not an error: the Fit says ok=False and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # numpy is imported where a fit runs
    import numpy as np
    from numpy.typing import NDArray

    Floats = NDArray[np.float64]
    Indices = NDArray[np.intp]
    Bools = NDArray[np.bool_]

HUBER_DELTA = 1e-3
ALPHA_BOUNDS = (0.01, 2.0)
N_PARAMS = 3
_E_FRACTIONS = (0.0, 0.5, 0.8, 0.95)
_ALPHA_STARTS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)
_SOLVED_STARTS = 3  # the best-ranked grid starts least_squares is run from
_TOL = 1e-12
_BOOT_ITERS = 100  # batched steps; measured on the Delphi grid's fits, all but a few resamples stop within 60

Loss = Literal["huber", "least_squares"]


@dataclass(frozen=True)
class Band:
    """Pointwise bootstrap band of the fitted curve: lo[i] <= L(n[i]) <= hi[i] at `level`."""

    n: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    level: float
    resamples: int  # resamples that were fitted (degenerate ones, with < 3 distinct N, are skipped)


@dataclass(frozen=True, kw_only=True)
class Fit:
    """One fitted curve, or why there is none (ok=False, parameters nan)."""

    ok: bool
    reason: str
    E: float
    A: float
    alpha: float
    loss: Loss
    delta: float | None  # the Huber delta; None for least squares
    objective: float  # sum of Huber (or 0.5 * squared) residuals at the optimum
    keys: tuple[str, ...]  # the cell keys of the points used, in input order
    converged: bool
    at_bounds: tuple[str, ...]  # parameters that ended on a bound ("E", "A", "alpha"): read with care
    band: Band | None

    def predict(self, n: float) -> float:
        return self.E + self.A * float(n ** (-self.alpha))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (nan becomes None), the shape the report renderer reads."""

        def num(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else v

        band = None
        if self.band is not None:
            b = self.band
            band = {"n": list(b.n), "lo": list(b.lo), "hi": list(b.hi), "level": b.level, "resamples": b.resamples}
        return {
            "ok": self.ok,
            "reason": self.reason,
            "E": num(self.E),
            "A": num(self.A),
            "alpha": num(self.alpha),
            "loss": self.loss,
            "delta": self.delta,
            "objective": num(self.objective),
            "keys": list(self.keys),
            "converged": self.converged,
            "at_bounds": list(self.at_bounds),
            "band": band,
        }


@dataclass(frozen=True)
class _Problem:
    """One fit's data on the normalised scale (numpy arrays), and its objective: the one place the model and its
    derivatives are written, for least_squares and for the batched refits alike."""

    logx: Floats  # log(N / N0), (m,)
    y: Floats  # log L (huber) or L (least squares), (m,)
    loss: Loss
    delta: float
    lower: Floats
    upper: Floats

    def residuals(self, theta: Floats, logx: Floats, y: Floats) -> tuple[Floats, Floats]:
        """Residuals (B, m) of B parameter rows on B data rows (or one shared row), and their Jacobians (B, m, 3)."""
        import numpy as np

        xp = np.exp(-theta[:, 2:3] * logx)  # x^-alpha, cheaper than pow
        p = theta[:, :1] + theta[:, 1:2] * xp
        d_alpha = -theta[:, 1:2] * xp * logx
        if self.loss == "least_squares":
            return p - y, np.stack([np.ones_like(p), xp, d_alpha], axis=2)
        p = np.maximum(p, 1e-300)
        inv = 1.0 / p
        return np.log(p) - y, np.stack([inv, xp * inv, d_alpha * inv], axis=2)

    def rho(self, r: Floats) -> Floats:
        """The loss of each residual: least_squares' `cost` is their sum."""
        import numpy as np

        if self.loss == "least_squares":
            return 0.5 * r * r
        a = np.abs(r)
        return np.where(a <= self.delta, 0.5 * r * r, self.delta * (a - 0.5 * self.delta))

    def solve(self, start: Floats, logx: Floats | None = None, y: Floats | None = None) -> Any:
        """least_squares from `start` on these points (default: the problem's own)."""
        import numpy as np
        from scipy.optimize import least_squares

        lx = self.logx if logx is None else logx
        yy = self.y if y is None else y

        def fun(th: Floats) -> Floats:
            residuals: Floats = self.residuals(th[None], lx, yy)[0][0]
            return residuals

        def jac(th: Floats) -> Floats:
            jacobian: Floats = self.residuals(th[None], lx, yy)[1][0]
            return jacobian

        huber = self.loss == "huber"
        return least_squares(
            fun,
            np.clip(start, self.lower, self.upper),
            jac=jac,
            bounds=(self.lower, self.upper),
            loss="huber" if huber else "linear",
            f_scale=self.delta if huber else 1.0,
            x_scale="jac",
            xtol=_TOL,
            ftol=_TOL,
            gtol=_TOL,
            max_nfev=2000,
        )

    def starts(self, l_arr: Floats) -> Floats:
        """The grid of starts, best (lowest objective) first."""
        import numpy as np

        x = np.exp(self.logx)
        rows = []
        alphas = [a for a in _ALPHA_STARTS if self.lower[2] <= a <= self.upper[2]] or [float(self.lower[2])]
        for frac in _E_FRACTIONS:
            e = frac * float(l_arr.min())
            for alpha in alphas:
                basis = x**-alpha
                rows.append((e, max(float(np.dot(l_arr - e, basis) / np.dot(basis, basis)), 1e-6), alpha))
        grid = np.array(rows)
        r, _ = self.residuals(grid, self.logx[None], self.y[None])
        return grid[np.argsort(self.rho(r).sum(axis=1), kind="stable")]

    def refit(self, theta0: Floats, logx: Floats, y: Floats, iters: int = _BOOT_ITERS) -> tuple[Floats, Bools]:
        """Many resamples (rows of logx, y) refitted at once from theta0: Levenberg-Marquardt steps on the Huber
        loss's own curvature (a residual beyond delta adds slope, no curvature: least_squares' scaling too), bounds
        held by projection, a step kept only when it lowers the resample's objective. Returns (theta, done)."""
        import numpy as np

        eye = np.eye(N_PARAMS)
        theta = np.repeat(np.clip(theta0, self.lower, self.upper)[None], len(y), axis=0)
        f = self.rho(self.residuals(theta, logx, y)[0]).sum(axis=1)
        lam = np.full(len(y), 1e-2)
        done = np.zeros(len(y), dtype=bool)
        for _ in range(iters):
            i = np.flatnonzero(~done)
            if not i.size:
                break
            th, lx, yy = theta[i], logx[i], y[i]
            r, jac = self.residuals(th, lx, yy)
            inside = np.abs(r) <= self.delta if self.loss == "huber" else np.ones(r.shape, dtype=bool)
            psi = np.where(inside, r, self.delta * np.sign(r))
            jt = jac.transpose(0, 2, 1)
            g = np.matmul(jt, psi[:, :, None])[:, :, 0]
            h = np.matmul(jt * inside[:, None, :], jac)
            # a parameter on a bound that the descent would push past it stays there (projected Newton)
            held = ((th <= self.lower + 1e-12) & (g > 0)) | ((th >= self.upper - 1e-12) & (g < 0))
            g = np.where(held, 0.0, g)
            h = np.where(held[:, :, None] | held[:, None, :], 0.0, h) + held[:, :, None] * eye
            # damping scaled by J^T J's diagonal: with most residuals beyond delta, h alone is near singular
            scale = np.einsum("bmj,bmj->bj", jac, jac) + 1e-300
            step = np.linalg.solve(h + (lam[i, None] * scale)[:, :, None] * eye, -g[:, :, None])[:, :, 0]
            cand = np.clip(th + step, self.lower, self.upper)
            fc = self.rho(self.residuals(cand, lx, yy)[0]).sum(axis=1)
            better = fc < f[i]
            gain = np.where(better, (f[i] - fc) / np.maximum(f[i], 1e-300), 0.0)
            theta[i[better]], f[i[better]] = cand[better], fc[better]
            lam[i] = np.clip(np.where(better, lam[i] * 0.3, lam[i] * 10.0), 1e-12, 1e12)
            done[i] = (better & (gain < 1e-10)) | (lam[i] >= 1e12)
        return theta, done


def _no_fit(reason: str, loss: Loss, delta: float | None, keys: Sequence[str]) -> Fit:
    nan = float("nan")
    return Fit(
        ok=False,
        reason=reason,
        E=nan,
        A=nan,
        alpha=nan,
        loss=loss,
        delta=delta,
        objective=nan,
        keys=tuple(keys),
        converged=False,
        at_bounds=(),
        band=None,
    )


def resample_indices(m: int, resamples: int, seed: int) -> Indices:
    """The case bootstrap's draws: `resamples` rows of m point indices, with replacement (seeded)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, m, size=(resamples, m))


def fit(
    points: Sequence[tuple[float, float, str]],
    *,
    loss: Loss = "huber",
    delta: float = HUBER_DELTA,
    alpha_bounds: tuple[float, float] = ALPHA_BOUNDS,
    band_n: Sequence[float] | None = None,
    band_points: int = 64,
    resamples: int = 300,
    level: float = 0.9,
    seed: int = 0,
) -> Fit:
    """Fit L(N) = E + A N^-alpha to (N, L, cell_key) points; see the module docstring for the method.

    Points with a non-finite or non-positive N or L are left out (their keys are not in Fit.keys).
    `band_n` is the grid of N for the band (default: `band_points` log-spaced over the points' range);
    `resamples=0` skips the band.
    """
    import numpy as np

    if loss not in ("huber", "least_squares"):
        raise ValueError(f"loss must be 'huber' or 'least_squares', not {loss!r}")
    d = delta if loss == "huber" else None
    good = [(float(n), float(v), str(k)) for n, v, k in points if _finite_positive(n) and _finite_positive(v)]
    keys = [k for _, _, k in good]
    distinct = len({n for n, _, _ in good})
    if distinct < N_PARAMS:
        return _no_fit(
            f"{len(good)} usable points at {distinct} distinct N: fitting {N_PARAMS} parameters needs"
            f" at least {N_PARAMS} distinct N",
            loss,
            d,
            keys,
        )
    n_arr = np.array([p[0] for p in good])
    l_arr = np.array([p[1] for p in good])
    n0 = float(np.exp(np.mean(np.log(n_arr))))
    prob = _Problem(
        np.log(n_arr / n0),
        np.log(l_arr) if loss == "huber" else l_arr,
        loss,
        delta,
        np.array([0.0, 0.0, alpha_bounds[0]]),
        np.array([np.inf, np.inf, alpha_bounds[1]]),
    )
    best = None
    for start in prob.starts(l_arr)[:_SOLVED_STARTS]:
        res = prob.solve(start)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    if not np.all(np.isfinite(best.x)):
        return _no_fit("the fit did not reach a finite optimum", loss, d, keys)
    e, a_norm, alpha = (float(v) for v in best.x)
    at_bounds = tuple(name for name, active in zip(("E", "A", "alpha"), best.active_mask, strict=True) if active)
    band = None
    if resamples > 0:
        grid = (
            np.asarray(band_n, dtype=float)
            if band_n is not None
            else np.geomspace(n_arr.min(), n_arr.max(), band_points)
        )
        band = _bootstrap_band(prob, best.x, grid, n0, resample_indices(len(good), resamples, seed), level)
    return Fit(
        ok=True,
        reason="",
        E=e,
        A=a_norm * n0**alpha,
        alpha=alpha,
        loss=loss,
        delta=d,
        objective=float(best.cost),
        keys=tuple(keys),
        converged=best.status > 0,
        at_bounds=at_bounds,
        band=band,
    )


def _bootstrap_band(prob: _Problem, best: Floats, grid: Floats, n0: float, draws: Indices, level: float) -> Band | None:
    """None when no resample has 3 distinct N (only likely with 3 points and a handful of resamples)."""
    import numpy as np

    logx = prob.logx[draws]
    distinct = 1 + (np.diff(np.sort(logx, axis=1), axis=1) > 0).sum(axis=1)
    keep = distinct >= N_PARAMS
    logx, y = logx[keep], prob.y[draws[keep]]
    if not len(y):
        return None
    theta, done = prob.refit(best, logx, y)
    for i in np.flatnonzero(~done):  # the few the batch left unconverged, finished one by one
        res = prob.solve(theta[i], logx[i], y[i])
        if np.all(np.isfinite(res.x)):
            theta[i] = res.x
    x = grid / n0
    curves = theta[:, :1] + theta[:, 1:2] * x[None, :] ** (-theta[:, 2:3])
    q = (1.0 - level) / 2.0
    lo, hi = np.quantile(curves, [q, 1.0 - q], axis=0)
    return Band(tuple(float(v) for v in grid), tuple(float(v) for v in lo), tuple(float(v) for v in hi), level, len(y))


def report_fits(
    data: dict[str, Any],
    metrics: Sequence[str] | None = None,
    xs: Sequence[str] = ("params", "compute_budget"),
    select: Callable[[list[tuple[float, float]]], dict[str, Any]] | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """The report's "fits": one fit per (metric, x, recipe) from the completed cells of `data`.

    metric "final_loss" reads cell["final_loss"]; any other name reads cell["scores"][name]["value"] (default:
    final_loss and every score). A score whose values all lie in [0, 1] and whose name is not a loss, an error
    or a perplexity is taken to rise with scale towards 1: its error 1 - score is fitted (`flip`: True; the
    plot draws 1 - the curve), since the form E + A N^-alpha falls towards a floor.
    x is a cell field: "params" or "compute_budget". Running, failed and planned cells never enter a fit.
    A (metric, x, recipe) with no completed cell that has both values is left out; one with too few is
    kept, with ok=False and its reason, so the report can say why a curve is missing. `kw` goes to `fit`. With `select`
    (the report's: the form chosen on held-out points, analysis/forms.py, which builds on this module), each fitted
    entry also carries `selection`, for the reader to weigh the single form against.
    """
    out: list[dict[str, Any]] = []
    cells = [c for c in data.get("cells", []) if c.get("state") == "completed"]
    if metrics is None:
        metrics = ["final_loss", *sorted({k for c in cells for k in (c.get("scores") or {})})]
    recipes = sorted({c.get("recipe") or "" for c in cells})
    for metric in metrics:
        values = [v for c in cells if isinstance(v := _metric(c, metric), (int, float))]
        flip = (
            metric != "final_loss"
            and bool(values)
            and all(0 <= v <= 1 for v in values)
            and not any(w in metric.lower() for w in _FALLING)
        )
        for x in xs:
            for recipe in recipes:
                pts = [
                    (c.get(x), _metric(c, metric), str(c.get("key") or c.get("name")))
                    for c in cells
                    if (c.get("recipe") or "") == recipe
                ]
                pts = [
                    (n, 1.0 - v if flip else v, k)
                    for n, v, k in pts
                    if _finite_positive(n) and isinstance(v, (int, float)) and not isinstance(v, bool)
                ]
                pts = [p for p in pts if _finite_positive(p[1])]
                if pts:
                    found = fit(pts, **kw).as_dict()
                    # the form chosen on held-out points beside the report's own (analysis/forms.py): which form
                    # extrapolated best from the smaller sizes, each form's held-out error, and the band's scale
                    if select is not None:
                        found["selection"] = select([(n, v) for n, v, _ in pts]) if found["ok"] else None
                    out.append({"metric": metric, "x": x, "recipe": recipe, "flip": flip, **found})
    return out


# names of metrics that fall with scale (fitted as they are)
_FALLING = ("loss", "perplexity", "bits_per_byte", "error", "ter")


def _metric(cell: dict[str, Any], metric: str) -> Any:
    if metric == "final_loss":
        return cell.get("final_loss")
    score = (cell.get("scores") or {}).get(metric)
    return score.get("value") if isinstance(score, dict) else None


def _finite_positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
