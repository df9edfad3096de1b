"""Scaling-law fit L(N) = E + A * N^(-alpha), with a bootstrap confidence band.

Design: the objective, bounds and multi-start of the fit scaling-law papers use (Hoffmann et al. 2022,
"Chinchilla", approach 3, which minimises it with L-BFGS from a grid of starts); the minimiser here is a
vectorised Levenberg-Marquardt (analysis/solver.py), which reaches the same optimum and lets the bootstrap
refit hundreds of resamples at once.

* Objective: the Huber loss of the residuals of log L, r_i = log(E + A N_i^-alpha) - log L_i, with
  delta = 1e-3 (Chinchilla's value). A residual of 1e-3 in log space is a 0.1% relative error: inside it
  the fit is least squares, beyond it every point pulls with the same force, so the fit is close to a
  median regression and one diverged or mislabelled cell cannot drag the curve. Log space makes the fit
  care about relative error, so small and large losses weigh alike.
* `loss="least_squares"` instead minimises sum (E + A N^-alpha - L)^2 on L itself: the textbook fit, the
  one `scipy.optimize.curve_fit` does. It exists to cross-check and for data without outliers.
* Bounds: E >= 0, A >= 0, alpha in `alpha_bounds` (default 0.01..2.0; exponents reported for language
  models lie well inside, and alpha near 0 makes E and A interchangeable).
* Conditioning: N spans decades (1e8..1e10 parameters, 1e18..1e22 FLOPs), so the optimiser works on
  x = N / N0 with N0 the geometric mean of the points' N, and A' = A * N0^-alpha. Reported A is in the
  caller's units of N.
* Starts: a grid (E as a fraction of min L x alpha values; A' from the linear least squares given E and
  alpha) is improved all at once by a vectorised, bound-projected Levenberg-Marquardt (with iteratively
  reweighted least squares for Huber); the best is then carried on by the same solver to a relative gain
  of 1e-15. `converged` says it stopped because no step gained any more. (numpy only: scipy's
  least_squares reaches the same optimum, tests/test_report_scaling.py checks against curve_fit, but
  importing scipy.optimize alone costs each report about a second.)
* Band: case bootstrap (resample the points with replacement, `resamples` times, seeded numpy Generator),
  each resample refitted by the same vectorised solver started from the full-data optimum; the band is
  the pointwise (1-level)/2 and (1+level)/2 quantiles of the refitted curves over a grid of N. Same
  input and seed give the same band, bit for bit, on one machine.
* Too few points (fewer distinct N than the 3 parameters) is not an error: the Fit says ok=False and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from sft_grid.analysis.solver import N_PARAMS, Loss, Problem

HUBER_DELTA = 1e-3
ALPHA_BOUNDS = (0.01, 2.0)


@dataclass(frozen=True)
class Band:
    """Pointwise bootstrap band of the fitted curve: lo[i] <= L(n[i]) <= hi[i] at `level`."""

    n: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    level: float
    resamples: int  # resamples that were fitted (degenerate ones, with < 3 distinct N, are skipped)


@dataclass(frozen=True)
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
        return self.E + self.A * n ** (-self.alpha)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (nan becomes None), the shape the report renderer reads."""

        def num(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else v

        band = None
        if self.band is not None:
            b = self.band
            band = {"n": list(b.n), "lo": list(b.lo), "hi": list(b.hi), "level": b.level, "resamples": b.resamples}
        return {"ok": self.ok, "reason": self.reason, "E": num(self.E), "A": num(self.A), "alpha": num(self.alpha),
                "loss": self.loss, "delta": self.delta, "objective": num(self.objective), "keys": list(self.keys),
                "converged": self.converged, "at_bounds": list(self.at_bounds), "band": band}


def _no_fit(reason: str, loss: Loss, delta: float | None, keys: Sequence[str]) -> Fit:
    nan = float("nan")
    return Fit(False, reason, nan, nan, nan, loss, delta, nan, tuple(keys), False, (), None)


def fit(points: Sequence[tuple[float, float, str]], *, loss: Loss = "huber", delta: float = HUBER_DELTA,
        alpha_bounds: tuple[float, float] = ALPHA_BOUNDS, band_n: Sequence[float] | None = None,
        band_points: int = 64, resamples: int = 300, level: float = 0.9, seed: int = 0) -> Fit:
    """Fit L(N) = E + A N^-alpha to (N, L, cell_key) points; see the module docstring for the method.

    Points with a non-finite or non-positive N or L are left out (their keys are not in Fit.keys).
    `band_n` is the grid of N for the band (default: `band_points` log-spaced over the points' range);
    `resamples=0` skips the band.
    """
    import numpy as np

    if loss not in ("huber", "least_squares"):
        raise ValueError(f"loss must be 'huber' or 'least_squares', not {loss!r}")
    d = delta if loss == "huber" else None
    good = [(float(n), float(l), str(k)) for n, l, k in points
            if _finite_positive(n) and _finite_positive(l)]
    keys = [k for _, _, k in good]
    if len({n for n, _, _ in good}) < N_PARAMS:
        return _no_fit(f"{len(good)} usable points at {len({n for n, _, _ in good})} distinct N: "
                       f"fitting {N_PARAMS} parameters needs at least {N_PARAMS} distinct N", loss, d, keys)
    n_arr = np.array([p[0] for p in good])
    l_arr = np.array([p[1] for p in good])
    n0 = float(np.exp(np.mean(np.log(n_arr))))
    prob = Problem(n_arr / n0, l_arr, loss, delta, alpha_bounds)

    starts = prob.grid_starts()
    # enough steps to rank the starts' basins; the polish below finishes the best one
    theta, obj, _ = prob.solve(starts, np.ones((len(starts), len(good))), iters=60)
    best = theta[int(np.argmin(obj))]
    polished, converged = prob.polish(best)
    if prob.objective(polished[None], np.ones((1, len(good))))[0] <= obj.min():
        best = polished
    e, a_norm, alpha = (float(v) for v in best)
    objective = float(prob.objective(best[None], np.ones((1, len(good))))[0])
    lo, hi = prob.lower, prob.upper
    at_bounds = tuple(name for name, v, l, h in zip(("E", "A", "alpha"), best, lo, hi)
                      if abs(v - l) <= 1e-9 * max(1.0, abs(l)) or (math.isfinite(h) and abs(v - h) <= 1e-9 * h))

    band = None
    if resamples > 0:
        grid = (np.asarray(band_n, dtype=float) if band_n is not None
                else np.geomspace(n_arr.min(), n_arr.max(), band_points))
        band = _bootstrap_band(prob, best, grid, n0, resamples, level, seed)
    return Fit(True, "", e, a_norm * n0 ** alpha, alpha, loss, d, objective, tuple(keys), converged,
               at_bounds, band)


def report_fits(data: dict[str, Any], metrics: Sequence[str] | None = None,
                xs: Sequence[str] = ("params", "compute_budget"), **kw: Any) -> list[dict[str, Any]]:
    """The report's "fits": one fit per (metric, x, recipe) from the completed cells of `data`.

    metric "final_loss" reads cell["final_loss"]; any other name reads cell["scores"][name]["value"] (default:
    final_loss and every score). A score whose values all lie in [0, 1] and whose name is not a loss, an error
    or a perplexity is taken to rise with scale towards 1: its error 1 - score is fitted (`flip`: True; the
    plot draws 1 - the curve), since the form E + A N^-alpha falls towards a floor.
    x is a cell field: "params" or "compute_budget". Running, failed and planned cells never enter a fit.
    A (metric, x, recipe) with no completed cell that has both values is left out; one with too few is
    kept, with ok=False and its reason, so the report can say why a curve is missing. `kw` goes to `fit`.
    """
    out: list[dict[str, Any]] = []
    cells = [c for c in data.get("cells", []) if c.get("state") == "completed"]
    if metrics is None:
        metrics = ["final_loss", *sorted({k for c in cells for k in (c.get("scores") or {})})]
    recipes = sorted({c.get("recipe") or "" for c in cells})
    for metric in metrics:
        values = [v for c in cells if isinstance(v := _metric(c, metric), (int, float))]
        flip = metric != "final_loss" and bool(values) and all(0 <= v <= 1 for v in values) and \
            not any(w in metric.lower() for w in _FALLING)
        for x in xs:
            for recipe in recipes:
                pts = [(c.get(x), _metric(c, metric), str(c.get("key") or c.get("name")))
                       for c in cells if (c.get("recipe") or "") == recipe]
                pts = [(n, 1.0 - v if flip else v, k) for n, v, k in pts if _finite_positive(n)
                       and isinstance(v, (int, float)) and not isinstance(v, bool)]
                pts = [p for p in pts if _finite_positive(p[1])]
                if pts:
                    out.append({"metric": metric, "x": x, "recipe": recipe, "flip": flip, **fit(pts, **kw).as_dict()})
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


def _bootstrap_band(prob: Problem, best: Any, grid: Any, n0: float, resamples: int, level: float,
                    seed: int) -> Band | None:
    """None when no resample has 3 distinct N (only likely with 3 points and a handful of resamples)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = prob.x.size
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)
    _, which = np.unique(prob.x, return_inverse=True)
    distinct = (weights @ np.eye(which.max() + 1)[which] > 0).sum(axis=1)  # distinct N drawn by each resample
    weights = weights[distinct >= N_PARAMS]
    if not len(weights):
        return None
    # From the full-data optimum a resample needs few steps: 40 give the band of 100 to 5 digits (measured on the
    # Delphi grid's fits); 1e-8 moves it by far less than its width.
    theta, _, _ = prob.solve(np.repeat(best[None], len(weights), axis=0), weights, iters=40, rtol=1e-8)
    x = grid / n0
    curves = theta[:, :1] + theta[:, 1:2] * x[None, :] ** (-theta[:, 2:3])
    q = (1.0 - level) / 2.0
    lo, hi = np.quantile(curves, [q, 1.0 - q], axis=0)
    return Band(tuple(float(v) for v in grid), tuple(float(v) for v in lo), tuple(float(v) for v in hi),
                level, len(weights))
