"""The scaling-law fit: recovers known curves, resists outliers, agrees with curve_fit, bands cover the truth."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sft_grid.analysis.scaling import fit, report_fits

E, A, ALPHA = 1.6, 1.2e3, 0.35


def truth(n: np.ndarray | float) -> np.ndarray | float:
    return E + A * np.asarray(n, dtype=float) ** -ALPHA


def points(n: np.ndarray, l: np.ndarray) -> list[tuple[float, float, str]]:
    return [(float(a), float(b), f"cell{i:02d}") for i, (a, b) in enumerate(zip(n, l))]


def noisy(seed: int, sigma: float, sizes: int = 12, reps: int = 3) -> tuple[np.ndarray, np.ndarray]:
    n = np.repeat(np.geomspace(1e7, 1e11, sizes), reps)
    rng = np.random.default_rng(seed)
    return n, truth(n) * np.exp(rng.normal(0.0, sigma, n.size))


@pytest.mark.parametrize("loss", ["huber", "least_squares"])
def test_noise_free_points_give_back_the_parameters(loss: str) -> None:
    n = np.geomspace(1e8, 1e10, 9)
    f = fit(points(n, truth(n)), loss=loss, resamples=0)
    assert f.ok and f.converged and f.at_bounds == ()
    assert f.E == pytest.approx(E, rel=1e-6)
    assert f.A == pytest.approx(A, rel=1e-6)
    assert f.alpha == pytest.approx(ALPHA, rel=1e-6)
    assert f.keys == tuple(f"cell{i:02d}" for i in range(9))


def test_huber_shrugs_off_outliers_that_pull_least_squares_away() -> None:
    n, l = noisy(seed=3, sigma=0.003)
    l[[2, 17, 30]] *= (1.4, 0.75, 1.3)  # diverged / mislabelled cells
    robust = fit(points(n, l), resamples=0)
    plain = fit(points(n, l), loss="least_squares", resamples=0)
    assert robust.ok and robust.converged
    assert robust.E == pytest.approx(E, rel=0.02)
    assert robust.alpha == pytest.approx(ALPHA, rel=0.05)
    grid = np.geomspace(1e7, 1e11, 50)
    err_robust = max(abs(robust.predict(x) / truth(x) - 1) for x in grid)
    err_plain = max(abs(plain.predict(x) / truth(x) - 1) for x in grid)
    assert err_robust < 0.005
    assert err_plain > 3 * err_robust


def test_least_squares_option_matches_scipy_curve_fit() -> None:
    from scipy.optimize import curve_fit

    n, l = noisy(seed=5, sigma=0.01, sizes=9, reps=4)
    ours = fit(points(n, l), loss="least_squares", resamples=0)
    theirs, _ = curve_fit(lambda x, e, a, alpha: e + a * x ** -alpha, n, l, p0=[1.5, 1.0e3, 0.3],
                          ftol=1e-15, xtol=1e-15, gtol=1e-15, maxfev=100_000)
    assert ours.ok and ours.converged and ours.delta is None
    np.testing.assert_allclose([ours.E, ours.A, ours.alpha], theirs, rtol=1e-6)


def test_band_contains_the_true_curve_for_well_behaved_data() -> None:
    n, l = noisy(seed=11, sigma=0.005, sizes=10, reps=4)
    f = fit(points(n, l), resamples=300, level=0.9, seed=0)
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
        n, l = noisy(seed=seed, sigma=0.005, sizes=10, reps=4)
        band = fit(points(n, l), resamples=100, band_points=16).band
        assert band is not None
        true = truth(np.array(band.n))
        covered.append(np.mean((np.array(band.lo) <= true) & (true <= np.array(band.hi))))
    # too narrow would miss often; a band wide enough never to miss would say nothing
    assert 0.8 <= float(np.mean(covered)) < 1.0


def test_fit_and_band_are_deterministic_and_follow_the_seed() -> None:
    n, l = noisy(seed=2, sigma=0.01, sizes=6, reps=3)
    one = fit(points(n, l), resamples=200, seed=7).as_dict()
    two = fit(points(n, l), resamples=200, seed=7).as_dict()
    other = fit(points(n, l), resamples=200, seed=8).as_dict()
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
    assert "A" in f.at_bounds  # no decreasing power law fits a rising loss


def test_report_fits_one_per_recipe_from_completed_cells_only() -> None:
    n = np.geomspace(1e8, 1e10, 5)
    cells = []
    for recipe, shift in (("magpie", 0.0), ("wildchat", 0.2)):
        for i, x in enumerate(n):
            cells.append({"key": f"{recipe}-{i}", "name": f"{recipe}-{i}", "state": "completed", "recipe": recipe,
                          "params": float(x), "compute_budget": None, "final_loss": float(truth(x)) + shift,
                          "scores": {"gsm8k/err": {"value": 0.5, "stderr": 0.01}}})
    cells.append({"key": "magpie-run", "state": "running", "recipe": "magpie", "params": 5e9, "final_loss": 9.0})
    cells.append({"key": "wildchat-fail", "state": "failed", "recipe": "wildchat", "params": 5e9})
    fits = report_fits({"cells": cells}, metrics=["final_loss"], resamples=50)
    assert [(f["metric"], f["x"], f["recipe"]) for f in fits] == [
        ("final_loss", "params", "magpie"), ("final_loss", "params", "wildchat")]
    magpie, wildchat = fits
    assert magpie["ok"] and magpie["E"] == pytest.approx(E, rel=1e-4)
    assert wildchat["E"] == pytest.approx(E + 0.2, rel=1e-4)
    assert "magpie-run" not in magpie["keys"] and len(magpie["keys"]) == 5
    assert len(magpie["band"]["n"]) == 64


def test_accuracy_like_scores_are_fitted_as_their_error_and_losses_as_they_are() -> None:
    n = np.geomspace(1e8, 1e10, 6)
    err = 0.2 + 40.0 * n ** -0.25  # 1 - accuracy falls towards 0.2: accuracy rises towards 0.8
    cells = [{"key": f"c{i}", "state": "completed", "recipe": "r", "params": float(x), "final_loss": float(truth(x)),
              "scores": {"mc/acc": {"value": float(1 - e)}, "ppl/bits_per_byte": {"value": float(truth(x)) / 10}}}
             for i, (x, e) in enumerate(zip(n, err))]
    fits = {f["metric"]: f for f in report_fits({"cells": cells}, xs=("params",), resamples=0)}
    assert set(fits) == {"final_loss", "mc/acc", "ppl/bits_per_byte"}
    acc = fits["mc/acc"]
    assert acc["flip"] is True and acc["ok"]
    assert acc["E"] == pytest.approx(0.2, rel=1e-5) and acc["alpha"] == pytest.approx(0.25, rel=1e-5)
    assert fits["final_loss"]["flip"] is False and fits["ppl/bits_per_byte"]["flip"] is False  # in [0, 1], but it falls with scale
