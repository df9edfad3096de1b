"""The fit that chooses its form (sft_grid/analysis/forms.py): on curves made from known forms it picks that form;
on a real replayed curve (sft_grid/conf/replay/) it extrapolates better than the single form E + A x^-alpha, whose
E ends on its bound there, and its band holds the held-out points; the joint form recovers a known surface; the
`guard: extrapolate` curve fit (adaptive/halving.py) recovers the end of a known training curve."""

from __future__ import annotations

import math

import pytest

from sft_grid.adaptive import halving
from sft_grid.analysis import forms, scaling
from sft_grid.backends.replay import curves

XS = [1e8 * 1.6**i for i in range(10)]


@pytest.mark.parametrize(
    ("form", "law"),
    [
        ("power_e", lambda x: 1.6 + 400.0 * x**-0.33),
        ("power", lambda x: 20.0 * x**-0.08),
        ("loglinear", lambda x: 6.0 - 0.2 * math.log(x)),
    ],
)
def test_the_form_a_curve_was_made_from_is_chosen_and_forecast(form, law):
    # a small deterministic wobble (0.05%), so that no form fits exactly by accident
    pts = [(x, law(x) * (1 + 5e-4 * (-1) ** i)) for i, x in enumerate(XS)]
    sel = forms.select(pts)
    assert sel.form == form, sel.scores
    value, lo, hi = sel.forecast(XS[-1] * 4)
    assert value == pytest.approx(law(XS[-1] * 4), rel=0.01)
    assert lo is not None and hi is not None and lo <= law(XS[-1] * 4) <= hi
    assert sel.as_dict()["form"] == form


def test_too_few_points_give_a_forecast_without_a_band():
    sel = forms.select([(1e8, 3.0), (2e8, 2.9)])
    assert sel.form in ("power", "loglinear") and sel.forecast(1e9)[1:] == (None, None)


def test_on_a_real_replayed_curve_the_chosen_form_beats_the_single_form_and_its_band_holds():
    pts = curves()[("flan", "gpt2")]["points"]
    train = [(float(x), v) for x, v in pts if x < 819200]
    test = [(float(x), v) for x, v in pts if x >= 819200]
    single = scaling.fit([(x, v, str(i)) for i, (x, v) in enumerate(train)], resamples=0)
    assert "E" in single.at_bounds  # the curve has not bent yet: the single form's floor ends on its bound
    sel = forms.select(train)
    for x, v in test:
        value, lo, hi = sel.forecast(x)
        assert abs(value - v) < abs(single.predict(x) - v)
        assert lo is not None and hi is not None and lo <= v <= hi


def test_the_joint_form_recovers_a_known_surface():
    def law(n: float, d: float) -> float:
        return 1.5 + 300.0 * n**-0.3 + 50.0 * d**-0.25

    pts = [(n, d, law(n, d)) for n in (1e8, 3e8, 1e9) for d in (1e3, 1e4, 1e5, 1e6)]
    fit = forms.fit_joint(pts)
    assert fit.ok and fit.predict(3e9, 4e6) == pytest.approx(law(3e9, 4e6), rel=2e-3)


def test_the_extrapolate_guard_recovers_the_end_of_a_curve_under_its_schedule():
    total = 100

    def factor(s: int) -> float:
        return s / 5 if s <= 5 else 0.5 * (1 + math.cos(math.pi * (s - 5) / 95))

    def loss(s: int) -> float:
        return 1.8 + 3.0 * s**-0.4 + 0.3 * factor(s)

    curve = [(float(s), loss(s), factor(s)) for s in range(1, 34)]
    end = halving.extrapolate(curve, total, 0.0)
    assert end == pytest.approx(1.8 + 3.0 * total**-0.4, rel=2e-3)
    # the loss at the rung, before the decay, would be off by the noise floor
    assert loss(33) - end > 0.2
    assert halving.extrapolate(curve[:4], total, 0.0) is None
