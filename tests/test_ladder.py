"""The ladder (`design: ladder`, a gap question's default design; sft_grid/adaptive/ladder.py): each recipe's foot and
rung first, the recipes far behind out, then a top for each recipe still in, as large as the budget the rungs left
reaches; the forecast the power law through a recipe's two largest sizes RATIO apart, the band from the held-out
errors of the secants through foot and rung at the tops."""

from __future__ import annotations

import math

import pytest

from sft_grid.adaptive import ladder
from sft_grid.adaptive.candidates import Candidate
from sft_grid.adaptive.design import choose, forecasts, sizes_needed
from sft_grid.adaptive.spec import AdaptiveSpec, parse_adaptive

# sizes 1e8 x 2^i; the largest, 2^12, held out (the question's size); a cell costs 2^i GPU-h times its price
XS = tuple(1e8 * 2**i for i in range(13))


def _pool(laws: dict[str, object], price: dict[str, float] | None = None) -> tuple[list[Candidate], dict[str, float]]:
    """Each recipe's cells `r0`..`r12` (r12 the holdout); a law is E for E + 40 x^-0.2 (with a 0.3% wobble), or a
    function of x."""
    pool, truth = [], {}
    for recipe, law in laws.items():
        for i, x in enumerate(XS):
            name = f"{recipe}{i}"
            pool.append(Candidate(name, recipe, x, 2**i * (price or {}).get(recipe, 1.0), holdout=i == len(XS) - 1))
            truth[name] = law(x) if callable(law) else (float(law) + 40.0 * x**-0.2) * (1 + 0.003 * (-1) ** i)  # type: ignore[arg-type]
    return pool, truth


def _spec(recipes: tuple[str, ...], **kw: object) -> AdaptiveSpec:
    return AdaptiveSpec(
        question="gap",
        recipes=recipes,
        **{"at": XS[-1], "budget_gpu_hours": 600.0, "batch": 2, "design": "ladder", **kw},
    )


def _run(spec: AdaptiveSpec, pool: list[Candidate], truth: dict[str, float]):
    """The loop to its stop: every round, and what it observed."""
    observed: dict[str, float] = {}
    rounds = []
    while True:
        r = choose(spec, pool, observed)
        rounds.append(r)
        assert r == choose(spec, pool, observed)  # pure: the same inputs, the same round
        if not r.chosen:
            return rounds, observed
        assert len(r.chosen) <= spec.batch
        observed.update({c: truth[c] for c in r.chosen})


def test_a_gap_question_climbs_a_ladder_by_default_and_the_design_key_names_it():
    block = {"question": "gap", "at": 1e9, "recipes": ["a", "b"], "budget_cells": 30}
    spec, problems = parse_adaptive(block, recipes=["a", "b"])
    assert not problems and spec is not None and spec.design == "ladder"
    for design in ("race", "value", "ladder"):
        spec, problems = parse_adaptive({**block, "design": design}, recipes=["a", "b"])
        assert not problems and spec is not None and spec.design == design
    _, bad = parse_adaptive({**block, "design": "greedy"}, recipes=["a", "b"])
    assert bad[0].key == "adaptive.design" and "ladder, race, value" in bad[0].fix


def test_feet_and_rungs_first_cheapest_first_then_the_tops_the_budget_reaches():
    """A ladder costs 2^k (1 + 1/8 + 1/64) for a top at size k: 600 GPU-h buy k = 8 for both recipes (584), not 9
    for either (876). So feet at 2, rungs at 5 (8 times below), tops at 8; the tops planned again from the 528
    GPU-h the rungs left, which still reach 8 (512), not 9."""
    pool, truth = _pool({"a": 1.70, "b": 1.72})
    rounds, observed = _run(_spec(("a", "b")), pool, truth)
    assert [r.chosen for r in rounds[:3]] == [("a2", "b2"), ("a5", "b5"), ("a8", "b8")]
    assert all("foot of" in w for w in rounds[0].why) and all("rung of" in w for w in rounds[1].why)
    assert "tops the budget reaches: a 2.56e+10, b 2.56e+10" in rounds[0].why[0]
    assert all("top of" in w for w in rounds[2].why)
    last = rounds[-1]
    assert last.stop.startswith("the ladder is measured") and last.decision == "a", last.stop
    assert sum(c.gpu_hours for c in pool if c.name in observed) == pytest.approx(584.0) == last.spent
    assert last.p_wrong is not None and all(f.form == "secant" and f.scale is not None for f in last.forecasts)


def test_a_recipe_far_behind_from_its_rungs_gets_no_top_and_the_rest_reach_further():
    """Three recipes at one price, c far worse: 600 GPU-h plan tops a 8, b 7, c 7 (a raised first: cheapest, then by
    name). After the rungs c is out (its forecast more than MARGIN above the lowest), and the 528 GPU-h left, planned
    over a and b alone, take b to 8: beyond the top it had in the plan of three."""
    pool, truth = _pool({"a": 1.70, "b": 1.72, "c": 8.0})
    rounds, observed = _run(_spec(("a", "b", "c")), pool, truth)
    assert set(rounds[0].chosen) | set(rounds[1].chosen) | set(rounds[2].chosen) == {"a2", "a5", "b1", "b4", "c1", "c4"}
    tops = [r for r in rounds if r.chosen and all("top of" in w for w in r.why)]
    assert [set(r.chosen) for r in tops] == [{"a8", "b8"}], [r.why for r in rounds]
    assert "out after the rungs: c" in tops[0].why[0]
    assert not any(name.startswith("c") and int(name[1:]) > 4 for name in observed)  # c: foot and rung only
    assert sum(c.gpu_hours for c in pool if c.name in observed) <= 600.0


def test_one_recipe_left_after_the_rungs_is_decided_by_elimination():
    pool, truth = _pool({"a": 1.70, "c": 8.0})
    rounds, observed = _run(_spec(("a", "c")), pool, truth)
    said = f"decided by elimination: a is the only recipe within {ladder.MARGIN:g} (log L) of the lowest"
    assert rounds[-1].stop.startswith(said), rounds[-1].stop
    assert rounds[-1].decision == "a" and len(observed) == 4  # two feet and two rungs, no top


def test_the_forecast_is_the_secant_and_its_band_the_pooled_held_out_error_grown_with_the_distance():
    """On an exact power law the secant is exact and the band zero; on a law that bends (E + A x^-alpha, log L convex
    in log x) the secant through foot and rung misses the top by e, and the band at `at` is |e| / log(top/rung)
    times log(at/top) (never below log(top/rung) times), the errors of the recipes pooled (root mean square),
    Student-t with one df per error."""
    from scipy.stats import t as student

    spec = _spec(("p", "q"))
    pool, truth = _pool({"p": lambda x: 3.0 * x**-0.1, "q": lambda x: 1.5 + 40.0 * x**-0.2})
    seen = {f"{r}{i}": truth[f"{r}{i}"] for r in "pq" for i in (2, 5, 8)}
    p_only = {k: v for k, v in seen.items() if k[0] == "p"}
    (p,) = (f for f in forecasts(spec, pool, p_only) if f.recipe == "p")
    assert p.value == pytest.approx(3.0 * XS[-1] ** -0.1) and p.scale == pytest.approx(0.0, abs=1e-12)
    found = {f.recipe: f for f in forecasts(spec, pool, seen)}
    q = found["q"]
    x2, x5, x8 = XS[2], XS[5], XS[8]
    law = truth
    slope = math.log(law["q8"] / law["q5"]) / math.log(x8 / x5)
    assert q.value == pytest.approx(law["q8"] * (XS[-1] / x8) ** slope)
    assert q.value < truth["q12"]  # the secant falls too fast on a curve that flattens
    early = math.log(law["q5"]) + math.log(law["q5"] / law["q2"]) / math.log(x5 / x2) * math.log(x8 / x5)
    unit = math.hypot(0.0, (math.log(law["q8"]) - early) / math.log(x8 / x5)) / math.sqrt(2)  # p's error is 0
    assert q.scale == pytest.approx(unit * math.log(XS[-1] / x8)) and q.df == 2
    half = student.ppf(0.5 + spec.level / 2, 2) * q.scale
    assert q.hi == pytest.approx(q.value * math.exp(half)) and q.lo == pytest.approx(q.value * math.exp(-half))
    # a recipe of the pool outside the question (z, a wild curve) lends the band no error
    wild, wild_truth = _pool({"z": lambda x: 9.0 * x**-0.3 if x < XS[6] else 0.3})
    mixed = {**seen, **{f"z{i}": wild_truth[f"z{i}"] for i in (2, 5, 8)}}
    (again,) = (f for f in forecasts(spec, [*pool, *wild], mixed) if f.recipe == "q")
    assert again.scale == pytest.approx(q.scale) and again.df == 2
    # nearer than the errors were measured (one doubling beyond the top, against three), the band stays at them
    (near,) = (f for f in forecasts(_spec(("p", "q"), at=XS[9]), pool, seen) if f.recipe == "q")
    assert near.scale == pytest.approx(unit * math.log(x8 / x5))


@pytest.mark.parametrize("budget", [20.0, 90.0, 300.0, 1000.0, 5000.0])
def test_the_ladder_never_spends_beyond_its_budget_and_each_foot_is_eight_times_below_its_rung(budget):
    pool, truth = _pool({"a": 1.70, "b": 1.72, "c": 1.9}, price={"b": 0.3, "c": 3.0})
    rounds, observed = _run(_spec(("a", "b", "c"), budget_gpu_hours=budget), pool, truth)
    assert sum(c.gpu_hours for c in pool if c.name in observed) <= budget + 1e-9
    assert rounds[-1].stop and rounds[-1].decision
    for r in "abc":
        have = sorted(int(n[1:]) for n in observed if n[0] == r)
        # a foot at least three doublings (RATIO 8) below its rung, or, where the sizes below the rung span less, in
        # their middle; a top above both
        assert len(have) <= 3 and (len(have) < 2 or have[1] - have[0] >= 3 or have[1] < 3), (r, have)


def test_on_real_curves_the_ladder_picks_the_lowest_model_more_often_than_the_cells_of_its_cost_taken_at_random():
    """The replayed fine-tuning curves of sft_grid/conf/replay/ (Lin et al. 2024): which of three models is lowest at
    1.6M examples, from cells of fewer examples, at 30% of the fitted grid's GPU-hours (parameters x examples), 100
    draws a dataset (seeds the benchmark does not use). The ladder stays in its budget, and its pick is right more
    often than the same forecast on random designs of its cost (benchmarks/bench_adaptive.py measures this on 930
    decisions, against the fixed design too)."""
    import random

    from sft_grid.backends.replay import curves

    found, target = curves(), 1638400
    right = rand_right = 0
    decisions = 0
    for dataset in sorted({d for d, _ in found}):
        models = sorted(m for d, m in found if d == dataset)
        for seed in range(100):
            drawn = random.Random(f"test-ladder:{dataset}:{seed}").sample(models, 3)
            pool, truth = [], {}
            for m in drawn:
                for x, v in found[(dataset, m)]["points"]:
                    pool.append(
                        Candidate(f"{m}@{x}", m, float(x), found[(dataset, m)]["params"] * x / 1e15, x == target)
                    )
                    truth[f"{m}@{x}"] = v
            fitted = [c for c in pool if not c.holdout]
            budget = 0.3 * sum(c.gpu_hours for c in fitted)
            spec = _spec(tuple(sorted(drawn)), at=float(target), budget_gpu_hours=budget, level=0.95)
            rounds, observed = _run(spec, pool, truth)
            spent = sum(c.gpu_hours for c in fitted if c.name in observed)
            assert spent <= budget * (1 + 1e-9) and rounds[-1].stop
            best = min(drawn, key=lambda m: truth[f"{m}@{target}"])
            right += rounds[-1].decision == best
            order = list(fitted)
            random.Random(seed).shuffle(order)
            rand, cost = {}, 0.0
            for c in order:
                if cost + c.gpu_hours <= spent:
                    rand[c.name], cost = truth[c.name], cost + c.gpu_hours
            known = {f.recipe: f.value for f in forecasts(spec, pool, rand) if f.value is not None}
            rand_right += bool(known) and min(known, key=known.__getitem__) == best
            decisions += 1
    assert right / decisions >= 0.85 and right > rand_right * 1.03, (right, rand_right, decisions)


def test_a_grid_narrower_than_a_ladder_takes_its_rung_from_the_middle_and_still_has_a_band():
    """The Delphi grid's shape: nine sizes spanning 7 times (2^0 .. 2^2.8, x 1e8), less than one step of a ladder,
    the question at 2^5. The rung is the size nearest the middle (in log) of the span below the top, the foot the
    same below the rung, so the decision still reads a band."""
    sizes = [1e8 * 2 ** (0.35 * i) for i in range(9)]
    pool, truth = [], {}
    for recipe, e in (("a", 1.70), ("b", 1.80)):
        for i, x in enumerate([*sizes, 1e8 * 2**5]):
            pool.append(Candidate(f"{recipe}{i}", recipe, x, x / 1e8, holdout=i == 9))
            truth[f"{recipe}{i}"] = (e + 40.0 * x**-0.2) * (1 + 0.003 * (-1) ** i)
    assert ladder.below(sizes, sizes[8]) == sizes[4] and ladder.below(sizes, sizes[4]) == sizes[2]
    rounds, observed = _run(_spec(("a", "b"), at=1e8 * 2**5, budget_gpu_hours=None, budget_cells=20), pool, truth)
    assert sorted(observed) == ["a2", "a4", "a8", "b2", "b4", "b8"], observed
    assert rounds[-1].p_wrong is not None and all(f.scale is not None for f in rounds[-1].forecasts)


def test_three_sizes_per_recipe_are_a_whole_ladder_with_a_band():
    """A grid of three sizes per recipe (besides the holdout; what the flow's check asks of a ladder,
    design.sizes_needed): foot, rung and top are all of them, and the decision has its band."""
    pool, truth = _pool({"a": 1.70, "b": 1.78})
    kept = {f"{r}{i}" for r in "ab" for i in (0, 3, 6, 12)}  # 1e8, 8e8, 6.4e9; 12 the holdout
    pool = [c for c in pool if c.name in kept]
    spec = _spec(("a", "b"), budget_gpu_hours=1000.0)
    assert sizes_needed(spec)[0] == 3 and sizes_needed(_spec(("a", "b"), design="race"))[0] == 4
    rounds, observed = _run(spec, pool, truth)
    assert set(observed) == kept - {"a12", "b12"}
    last = rounds[-1]
    assert last.stop.startswith("the ladder is measured") and last.decision == "a", last.stop
    assert last.p_wrong is not None and all(f.scale is not None for f in last.forecasts)
