"""The scaling-law fit: recovers known curves from noisy data with outliers, reaches the optimum of its objective,
holds its bounds, says why a recipe is not fitted; its bootstrap band is the one refitting every resample with
least_squares gives, and covers the truth about as often as its level says."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from sft_grid.analysis.scaling import HUBER_DELTA, Loss, fit, report_fits, resample_indices

E, A, ALPHA = 1.6, 1.2e3, 0.35


def truth(n: Any) -> Any:
    """The law the data come from, at n (a number or an array)."""
    return E + A * np.asarray(n, dtype=float) ** -ALPHA


def points(n: np.ndarray, obs: np.ndarray) -> list[tuple[float, float, str]]:
    return [(float(a), float(b), f"cell{i:02d}") for i, (a, b) in enumerate(zip(n, obs, strict=True))]


def noisy(seed: int, sigma: float, sizes: int = 12, reps: int = 3) -> tuple[np.ndarray, np.ndarray]:
    n = np.repeat(np.geomspace(1e7, 1e11, sizes), reps)
    rng = np.random.default_rng(seed)
    return n, truth(n) * np.exp(rng.normal(0.0, sigma, n.size))


@pytest.mark.parametrize("loss", ["huber", "least_squares"])
def test_noise_free_points_give_back_the_parameters(loss: Loss) -> None:
    n = np.geomspace(1e8, 1e10, 9)
    f = fit(points(n, truth(n)), loss=loss, resamples=0)
    assert f.ok and f.converged and f.at_bounds == ()
    fitted_e, fitted_a = f.E, f.A
    assert fitted_e == pytest.approx(E, rel=1e-6)
    assert fitted_a == pytest.approx(A, rel=1e-6)
    assert f.alpha == pytest.approx(ALPHA, rel=1e-6)
    assert f.keys == tuple(f"cell{i:02d}" for i in range(9))


def test_huber_shrugs_off_outliers_that_pull_least_squares_away() -> None:
    n, obs = noisy(seed=3, sigma=0.003)
    obs[[2, 17, 30]] *= (1.4, 0.75, 1.3)  # diverged / mislabelled cells
    robust = fit(points(n, obs), resamples=0)
    plain = fit(points(n, obs), loss="least_squares", resamples=0)
    assert robust.ok and robust.converged
    fitted_e = robust.E
    assert fitted_e == pytest.approx(E, rel=0.02)
    assert robust.alpha == pytest.approx(ALPHA, rel=0.05)
    grid = np.geomspace(1e7, 1e11, 50)
    err_robust = max(abs(robust.predict(x) / truth(x) - 1) for x in grid)
    err_plain = max(abs(plain.predict(x) / truth(x) - 1) for x in grid)
    assert err_robust < 0.005
    assert err_plain > 3 * err_robust


def objective(n: np.ndarray, obs: np.ndarray, e: float, a: float, alpha: float, loss: str) -> float:
    """The fit's objective, written out here in the caller's units: 0.5 r^2 of L, or Huber of log L."""
    pred = e + a * n**-alpha
    if loss == "least_squares":
        return float(np.sum(0.5 * (pred - obs) ** 2))
    r = np.abs(np.log(pred) - np.log(obs))
    return float(np.sum(np.where(r <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (r - 0.5 * HUBER_DELTA))))


@pytest.mark.parametrize("loss", ["huber", "least_squares"])
def test_the_fit_is_the_optimum_of_its_objective_in_the_callers_units(loss: Loss) -> None:
    n, obs = noisy(seed=5, sigma=0.01, sizes=9, reps=4)
    obs[7] *= 1.3  # an outlier
    f = fit(points(n, obs), loss=loss, resamples=0)
    assert f.ok and f.converged and f.at_bounds == () and f.delta == (HUBER_DELTA if loss == "huber" else None)
    best = objective(n, obs, f.E, f.A, f.alpha, loss)
    assert f.objective == pytest.approx(best, rel=1e-9)  # A is reported in N's own units, not the fit's scale
    assert best <= objective(n, obs, E, A, ALPHA, loss)  # no worse than the parameters the data came from
    for i in range(3):  # and no step away from it is better
        for step in (1e-4, -1e-4):
            e, a, alpha = (v * (1 + step) if j == i else v for j, v in enumerate((f.E, f.A, f.alpha)))
            assert objective(n, obs, e, a, alpha, loss) >= best * (1 - 1e-12)


def test_band_contains_the_true_curve_for_well_behaved_data() -> None:
    n, obs = noisy(seed=11, sigma=0.005, sizes=10, reps=4)
    f = fit(points(n, obs), resamples=300, level=0.9, seed=0)
    assert f.band is not None and f.band.level == 0.9
    assert f.band.resamples >= 290  # almost no resample has fewer than 3 distinct sizes
    grid = np.array(f.band.n)
    assert grid[0] == pytest.approx(n.min()) and grid[-1] == pytest.approx(n.max()) and len(grid) == 64
    lo, hi, true = np.array(f.band.lo), np.array(f.band.hi), truth(grid)
    assert np.all(lo <= true) and np.all(true <= hi)
    assert np.all(lo <= [f.predict(x) for x in grid]) and np.all([f.predict(x) for x in grid] <= hi)
    # a band, not a wall: a few percent wide at most for 0.5% noise
    assert np.max((hi - lo) / true) < 0.03


def test_band_covers_the_truth_at_about_its_level_over_many_datasets() -> None:
    # a pointwise 90% band: over several noisy draws the true curve is inside at most grid points, not all
    covered = []
    for seed in range(100, 106):
        n, obs = noisy(seed=seed, sigma=0.005, sizes=10, reps=4)
        band = fit(points(n, obs), resamples=100, band_points=16).band
        assert band is not None
        true = truth(np.array(band.n))
        covered.append(np.mean((np.array(band.lo) <= true) & (true <= np.array(band.hi))))
    # too narrow would miss often; a band wide enough never to miss would say nothing
    assert 0.8 <= float(np.mean(covered)) < 1.0


def test_the_band_is_that_of_each_resample_refitted_by_least_squares() -> None:
    """The band refits the resamples all at once (numpy); refitting each alone with least_squares, from the same
    draws, must give the same band."""
    from scipy.optimize import least_squares

    n, obs = noisy(seed=21, sigma=0.01, sizes=8, reps=3)
    obs[5] *= 1.2
    f = fit(points(n, obs), resamples=200, band_points=24, seed=3)
    assert f.band is not None
    n0 = float(np.exp(np.mean(np.log(n))))
    start = [f.E, f.A * n0**-f.alpha, f.alpha]
    curves = []
    for idx in resample_indices(len(n), 200, 3):
        x, y = n[idx] / n0, np.log(obs[idx])
        if len(set(x.tolist())) < 3:
            continue
        res = least_squares(
            lambda t, x=x, y=y: np.log(t[0] + t[1] * x ** -t[2]) - y,
            start,
            loss="huber",
            f_scale=HUBER_DELTA,
            bounds=([0, 0, 0.01], [np.inf, np.inf, 2.0]),
            x_scale="jac",
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
        )
        curves.append(res.x[0] + res.x[1] * (np.array(f.band.n) / n0) ** -res.x[2])
    assert f.band.resamples == len(curves)
    lo, hi = np.quantile(np.array(curves), [0.05, 0.95], axis=0)
    width = hi - lo
    assert np.all(np.abs(np.array(f.band.lo) - lo) <= 0.05 * width)
    assert np.all(np.abs(np.array(f.band.hi) - hi) <= 0.05 * width)


def test_fit_and_band_are_deterministic_and_follow_the_seed() -> None:
    n, obs = noisy(seed=2, sigma=0.01, sizes=6, reps=3)
    one = fit(points(n, obs), resamples=200, seed=7).as_dict()
    two = fit(points(n, obs), resamples=200, seed=7).as_dict()
    other = fit(points(n, obs), resamples=200, seed=8).as_dict()
    assert one == two
    assert one["band"]["lo"] != other["band"]["lo"]
    assert (one["E"], one["A"], one["alpha"]) == (other["E"], other["A"], other["alpha"])


def test_too_few_points_is_no_fit_with_a_reason() -> None:
    f = fit([(1e8, 2.5, "a"), (1e9, 2.1, "b"), (1e9, 2.0, "c"), (2e9, float("nan"), "d"), (-1.0, 2.0, "e")])
    assert not f.ok and not f.converged and f.band is None
    assert "2 distinct N" in f.reason and "3" in f.reason
    assert f.keys == ("a", "b", "c")
    assert math.isnan(f.E)
    assert f.as_dict()["E"] is None


def test_bounds_hold_when_loss_rises_with_size() -> None:
    n = np.geomspace(1e8, 1e10, 6)
    f = fit(points(n, 2.0 + 0.01 * np.log10(n)), resamples=0)
    assert f.ok and f.E >= 0 and f.A >= 0 and 0.01 <= f.alpha <= 2.0
    fitted_a = f.A
    assert "A" in f.at_bounds and fitted_a == pytest.approx(0, abs=1e-9)  # no decreasing power law fits a rising loss


def test_an_exponent_beyond_its_bound_stops_on_it_and_says_so() -> None:
    n = np.geomspace(1e8, 1e9, 8)
    f = fit(points(n, 1.0 + 1e16 * n**-2.6), resamples=0)  # alpha 2.6, past the default bound of 2.0
    assert f.ok and f.alpha == pytest.approx(2.0) and f.at_bounds == ("alpha",)
    g = fit(points(n, 1.0 + 1e16 * n**-2.6), alpha_bounds=(0.01, 3.0), resamples=0)
    assert g.alpha == pytest.approx(2.6, rel=1e-6) and g.at_bounds == ()


def test_a_degenerate_recipe_is_reported_not_fitted() -> None:
    n = np.geomspace(1e8, 1e10, 5)
    cells = [
        {"key": f"ok{i}", "state": "completed", "recipe": "good", "params": float(x), "final_loss": float(truth(x))}
        for i, x in enumerate(n)
    ]
    # one recipe trained at two sizes only (three cells), another whose cells all failed or carry no loss
    cells += [
        {"key": f"two{i}", "state": "completed", "recipe": "two", "params": x, "final_loss": 2.0 + i / 10}
        for i, x in enumerate((1e8, 1e9, 1e9))
    ]
    cells += [
        {"key": "nan", "state": "completed", "recipe": "bad", "params": 1e9, "final_loss": float("nan")},
        {"key": "zero", "state": "completed", "recipe": "bad", "params": 2e9, "final_loss": 0.0},
    ]
    fits = {f["recipe"]: f for f in report_fits({"cells": cells}, xs=("params",), resamples=20)}
    assert set(fits) == {"good", "two"}  # "bad" has no usable point: nothing to say a curve of
    assert fits["good"]["ok"] and fits["good"]["band"]["resamples"] > 0
    two = fits["two"]
    assert not two["ok"] and two["band"] is None and (two["E"], two["A"], two["alpha"]) == (None, None, None)
    assert two["reason"] == ("3 usable points at 2 distinct N: fitting 3 parameters needs at least 3 distinct N")
    assert sorted(two["keys"]) == ["two0", "two1", "two2"]


def test_report_fits_one_per_recipe_from_completed_cells_only() -> None:
    n = np.geomspace(1e8, 1e10, 5)
    cells = []
    for recipe, shift in (("magpie", 0.0), ("wildchat", 0.2)):
        for i, x in enumerate(n):
            cells.append(
                {
                    "key": f"{recipe}-{i}",
                    "name": f"{recipe}-{i}",
                    "state": "completed",
                    "recipe": recipe,
                    "params": float(x),
                    "compute_budget": None,
                    "final_loss": float(truth(x)) + shift,
                    "scores": {"gsm8k/err": {"value": 0.5, "stderr": 0.01}},
                }
            )
    cells.append({"key": "magpie-run", "state": "running", "recipe": "magpie", "params": 5e9, "final_loss": 9.0})
    cells.append({"key": "wildchat-fail", "state": "failed", "recipe": "wildchat", "params": 5e9})
    fits = report_fits({"cells": cells}, metrics=["final_loss"], resamples=50)
    assert [(f["metric"], f["x"], f["recipe"]) for f in fits] == [
        ("final_loss", "params", "magpie"),
        ("final_loss", "params", "wildchat"),
    ]
    magpie, wildchat = fits
    assert magpie["ok"] and magpie["E"] == pytest.approx(E, rel=1e-4)
    assert wildchat["E"] == pytest.approx(E + 0.2, rel=1e-4)
    assert "magpie-run" not in magpie["keys"] and len(magpie["keys"]) == 5
    assert len(magpie["band"]["n"]) == 64


def test_accuracy_like_scores_are_fitted_as_their_error_and_losses_as_they_are() -> None:
    n = np.geomspace(1e8, 1e10, 6)
    err = 0.2 + 40.0 * n**-0.25  # 1 - accuracy falls towards 0.2: accuracy rises towards 0.8
    cells = [
        {
            "key": f"c{i}",
            "state": "completed",
            "recipe": "r",
            "params": float(x),
            "final_loss": float(truth(x)),
            "scores": {"mc/acc": {"value": float(1 - e)}, "ppl/bits_per_byte": {"value": float(truth(x)) / 10}},
        }
        for i, (x, e) in enumerate(zip(n, err, strict=True))
    ]
    fits = {f["metric"]: f for f in report_fits({"cells": cells}, xs=("params",), resamples=0)}
    assert set(fits) == {"final_loss", "mc/acc", "ppl/bits_per_byte"}
    acc = fits["mc/acc"]
    assert acc["flip"] is True and acc["ok"]
    assert acc["E"] == pytest.approx(0.2, rel=1e-5) and acc["alpha"] == pytest.approx(0.25, rel=1e-5)
    # bits per byte lie in [0, 1], but fall with scale: fitted as they are
    assert fits["final_loss"]["flip"] is False and fits["ppl/bits_per_byte"]["flip"] is False
