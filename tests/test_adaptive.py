"""Grids that steer themselves (sft_grid/adaptive/): the `prune:` and `adaptive:` blocks refused with their key, value
and fix; successive halving decided from files only, recorded before it is acted on, unchanged by kills; the next
cells from the fit (seed design, the large anchor worth its price, holdouts never used, the budget, the reasons).
The decisions are measured over 50 seeded grids by benchmarks/bench_adaptive.py; here on a few."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest

from sft_grid.adaptive import halving
from sft_grid.adaptive.candidates import Candidate
from sft_grid.adaptive.design import choose
from sft_grid.adaptive.spec import AdaptiveSpec, parse_adaptive, parse_prune
from sft_grid.analysis import forms
from sft_grid.in_venv import synthetic_train as law

# -- the blocks -------------------------------------------------------------------------------------------------


def test_a_good_prune_block_is_typed():
    spec, problems = parse_prune({"rungs": [11, 33], "keep": 0.4, "by": "vars.model"}, max_steps=100)
    assert not problems and spec is not None
    assert spec.rungs == (11.0, 33.0) and spec.by == ("vars.model",) and spec.guard == "cooldown"
    tokens, _ = parse_prune({"rungs": [1.5e6], "unit": "tokens"})
    assert tokens is not None and tokens.rung_steps(1e6) == (2,)


def test_the_extrapolate_guard_is_a_guard_and_a_typo_names_it():
    spec, problems = parse_prune({"rungs": [10, 30], "guard": "extrapolate"}, max_steps=100)
    assert not problems and spec is not None and spec.guard == "extrapolate"
    _, bad = parse_prune({"rungs": [10], "guard": "extrapolated"}, max_steps=100)
    assert "extrapolate" in bad[0].fix


@pytest.mark.parametrize(
    ("block", "key", "fix"),
    [
        ({"rungs": [33, 11]}, "prune.rungs", "sort them: [11, 33]"),
        ({"rungs": [11, 100]}, "prune.rungs", "rungs below 100"),
        ({"rungs": "11"}, "prune.rungs", "rungs: [12, 37]"),
        ({"rungs": [11], "keep": 1.5}, "prune.keep", "keep: 0.34"),
        ({"rungs": [11], "guard": "none"}, "prune.guard", "cooldown"),
        ({"rungs": [11], "metric": "acc"}, "prune.metric", "metric: loss"),
        ({"rungs": [11], "rung": 3}, "prune.rung", "use one of metric"),
    ],
)
def test_a_bad_prune_block_names_its_key_value_and_fix(block, key, fix):
    spec, problems = parse_prune(block, max_steps=100)
    assert spec is None
    (p,) = [p for p in problems if p.key == key]
    assert fix in p.fix and p.rule == "prune-block"
    assert repr(p.value) in p.render() or str(p.value) in p.render()


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({"question": "width", "at": 1e9, "budget_cells": 3}, "adaptive.question"),
        ({"question": "gap", "at": 1e9, "recipes": ["a"], "budget_cells": 3}, "adaptive.recipes"),
        ({"question": "gap", "at": 1e9, "recipes": ["a", "a"], "budget_cells": 3}, "adaptive.recipes"),
        ({"at": 1e9, "recipes": ["nope"], "budget_cells": 3}, "adaptive.recipes"),
        ({"at": 1e9}, "adaptive.budget_gpu_hours"),
        ({"at": 1e9, "budget_cells": 3, "budget_gpu_hours": 4}, "adaptive.budget_gpu_hours"),
        ({"at": -1, "budget_cells": 3}, "adaptive.at"),
        ({"at": 1e9, "budget_cells": 3, "holdout": "big"}, "adaptive.holdout"),
        # a size as a holdout only where sizes come from size_key (else a holdout is a model name)
        ({"at": 1e9, "budget_cells": 3, "holdout": [1638400]}, "adaptive.holdout"),
        ({"at": 1e9, "budget_cells": 3, "size_key": 3}, "adaptive.size_key"),
        ({"at": 1e9, "budget_cells": 3, "forms": ["tail", "quadratic"]}, "adaptive.forms"),
        ({"at": 1e9, "budget_cells": 3, "forms": "tail"}, "adaptive.forms"),
        ({"at": 1e9, "budget_cells": 3, "forms": []}, "adaptive.forms"),
        ({"at": 1e9, "budget_cells": 3, "forms": ["tail", "tail"]}, "adaptive.forms"),
    ],
)
def test_a_bad_adaptive_block_names_its_key(block, key):
    spec, problems = parse_adaptive(block, recipes=["a", "b"])
    assert spec is None and key in [p.key for p in problems], [p.render() for p in problems]


def test_a_size_key_takes_sizes_as_holdouts():
    block = {"at": 1638400, "budget_cells": 3, "size_key": "extra.replay.examples", "holdout": [1638400, "gpt2"]}
    spec, problems = parse_adaptive(block)
    assert not problems and spec is not None
    assert spec.size_key == "extra.replay.examples" and spec.holdout == ("1638400", "gpt2")


# -- successive halving ------------------------------------------------------------------------------------------


def test_a_rung_keeps_the_best_and_breaks_ties_by_name():
    d = halving.decide_rung("b", 0, 11, {"x": 1.0, "a": 1.0, "c": 0.5, "d": 2.0}, keep=0.4)
    assert d.kept == ("a", "c") and d.pruned == ("d", "x")
    assert "pruned at rung 1 (step 11): loss 2.0000" in d.why("d")


def _write_probe(root: Path, cell: str, step: int, loss: float) -> None:
    out = root / cell / "output"
    out.mkdir(parents=True, exist_ok=True)
    (out / halving.PROBE_FILE.format(step=step)).write_text(json.dumps({"loss": loss}))


def _plan_from(root: Path, cells: list[str], rungs: list[int], keep: float, recorded=None) -> halving.Plan:
    """The plan from the probes under `root` and its record (or `recorded`); every cell has reached every rung."""
    return halving.plan(
        {"b": cells},
        rungs,
        lambda c, s: halving.probe_loss(root / c, s),
        halving.read_record(root) if recorded is None else recorded,
        keep=keep,
        reached=lambda c, s: True,
    )


def test_a_rung_waits_for_its_whole_bracket_then_is_decided_from_the_files(tmp_path):
    def plan_now():
        return _plan_from(tmp_path, ["lr0", "lr1", "lr2"], [10, 30], 0.34)

    _write_probe(tmp_path, "lr0", 10, 3.0)
    _write_probe(tmp_path, "lr1", 10, 2.0)
    first = plan_now()
    assert not first.new and {(a.kind, a.cell, a.step) for a in first.actions} == {("probe", "lr2", 10)}
    _write_probe(tmp_path, "lr2", 10, 2.5)
    second = plan_now()
    (d,) = second.new
    assert d.kept == ("lr1", "lr2") and d.pruned == ("lr0",)
    halving.write_decision(tmp_path, d)
    # a cut line (a kill mid-write) is skipped; the decision already recorded is never recomputed, even when the
    # files change afterwards (a pruned cell resumed by hand writes more)
    with (tmp_path / halving.RECORD_FILE).open("a") as fh:
        fh.write('{"bracket": "b", "ru')
    _write_probe(tmp_path, "lr0", 10, 0.1)
    third = plan_now()
    assert not third.new and third.decisions[("b", 0)] == d
    assert ("prune", "lr0") in {(a.kind, a.cell) for a in third.actions}


def _halving_loop(root: Path, cfgs: dict[str, dict], kill_at: int | None = None) -> None:
    """A small orchestrator over real files (as benchmarks/bench_adaptive.py's): record, then act; `kill_at` stops it
    after that many effects, as a kill would."""
    effects = 0
    while True:
        p = _plan_from(root, sorted(cfgs), [11, 33], 0.4)
        steps = [a for a in p.actions if a.kind == "probe"]
        for d in p.new:
            effects += 1
            if kill_at is not None and effects > kill_at:
                return
            halving.write_decision(root, d)
        if not steps:
            return
        for a in steps:
            effects += 1
            if kill_at is not None and effects > kill_at:
                return
            assert a.step is not None
            _write_probe(root, a.cell, a.step, law.probe_loss(cfgs[a.cell], a.step, max(1, a.step // 10)))


def test_the_position_evidence_is_the_logged_loss_at_the_rung_smoothed_over_the_last_logging_points(tmp_path):
    out = tmp_path / "c" / "output"
    out.mkdir(parents=True)
    lines = [{"current_steps": s, "loss": float(s)} for s in (2, 4, 6)]
    lines.append({"current_steps": 6, "loss": None, "train_runtime": 1.0})  # the trainer's summary line
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert halving.logged_loss(tmp_path / "c", 5) is None  # no loss logged at the rung's step
    assert halving.logged_loss(tmp_path / "c", 6) == 4.0  # (2 + 4 + 6) / 3
    assert halving.logged_loss(tmp_path / "c", 4) == 3.0  # nothing after the rung counts (a resumed survivor)
    assert halving.logged_loss(tmp_path / "c", 6, points=1) == 6.0


def test_a_leg_saves_and_stops_at_its_rung_and_exits_before_the_final_save():
    """in_venv/leg_stop.py's callback, driven as the trainer drives it (transformers' TrainerState and
    TrainerControl stood in by plain objects: the real trainer runs it in tests/test_prune_real.py)."""
    from types import SimpleNamespace

    from sft_grid.in_venv import leg_stop

    assert leg_stop.callbacks({}) == [] and leg_stop.stop_step({leg_stop.LEG_ENV: " "}) is None
    with pytest.raises(ValueError, match="SFT_GRID_LEG_STOP"):
        leg_stop.stop_step({leg_stop.LEG_ENV: "0"})
    (cb,) = leg_stop.callbacks({leg_stop.LEG_ENV: "4"})
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    cb.on_train_begin(None, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_end(None, state, control)
        assert not control.should_save and not control.should_training_stop
    state.global_step = 4
    cb.on_step_end(None, state, control)
    assert control.should_save and control.should_training_stop
    with pytest.raises(SystemExit) as ended:
        cb.on_train_end(None, state, control)
    assert ended.value.code == 0
    with pytest.raises(SystemExit):  # a leg resumed at its rung trains nothing
        cb.on_train_begin(None, SimpleNamespace(global_step=4, is_world_process_zero=True), control)
    finished = SimpleNamespace(global_step=3, is_world_process_zero=True)  # a run shorter than the leg: its own end
    cb.on_train_end(None, finished, control)


def test_kills_anywhere_change_no_decision(tmp_path):
    cfgs = {
        f"lr{i}": {"identity": f"c{i}", "seed": 3, "params": 1e9, "learning_rate": 3e-4 * 10 ** (i / 4 - 1)}
        for i in range(9)
    }
    _halving_loop(tmp_path / "ref", cfgs)
    want = halving.read_record(tmp_path / "ref")
    assert len(want) == 2 and len(want[("b", 1)].kept) == 2
    rng = random.Random(5)
    for k in range(8):
        root = tmp_path / f"k{k}"
        _halving_loop(root, cfgs, kill_at=rng.randrange(0, 16))
        _halving_loop(root, cfgs)
        assert halving.read_record(root) == want, k
    # a second run over the finished grid decides nothing and probes nothing
    final = _plan_from(tmp_path / "ref", sorted(cfgs), [11, 33], 0.4, want)
    assert not final.new and not [a for a in final.actions if a.kind == "probe"]


def _cosine(s: int, total: int = 100, warmup: int = 5) -> float:
    return law.schedule(s, total, warmup, "cosine")


def _write_curve(root: Path, cell: str, loss, upto: int, peak_lr: float = 1e-4) -> None:
    """A trainer log of every step up to `upto` (loss and learning rate, as LLaMA-Factory's trainer_log.jsonl)."""
    out = root / cell / "output"
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        {"current_steps": s, "total_steps": 100, "loss": loss(s), "learning_rate": peak_lr * _cosine(s)}
        for s in range(1, upto + 1)
    ]
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_curves_that_cross_after_the_rung_the_later_winner_is_kept_by_extrapolate_and_dropped_by_position(tmp_path):
    """The decay's flip on two cells: `hot` (a higher learning rate) has the higher noise floor, so it is worse at
    the rung (step 33 of 100, the cosine decay barely begun) and better at the end, once the decay has removed the
    floor. Read from the cells' trainer logs as the grid reads them (adaptive/prune.py's evidence)."""

    def wobble(s: int) -> float:
        return 1 + 4e-4 * (-1) ** s

    curves = {
        "hot": lambda s: (1.8 + 2.5 * s**-0.4 + 0.6 * _cosine(s)) * wobble(s),
        "cold": lambda s: (1.8 + 3.0 * s**-0.4 + 0.15 * _cosine(s)) * wobble(s),
    }
    for cell, loss in curves.items():
        _write_curve(tmp_path, cell, loss, 33)
    assert curves["hot"](33) > curves["cold"](33) + 0.2  # worse at the rung
    ends = {c: 1.8 + b * 100**-0.4 for c, b in (("hot", 2.5), ("cold", 3.0))}
    assert ends["hot"] < ends["cold"] - 0.05  # better at the end

    def decide(evidence) -> halving.RungDecision:
        p = halving.plan({"b": ["cold", "hot"]}, [33], evidence, {}, keep=0.5, reached=lambda c, s: True)
        (d,) = p.new
        return d

    position = decide(lambda c, s: halving.logged_loss(tmp_path / c, s))
    assert position.kept == ("cold",) and position.pruned == ("hot",) and not position.bands
    extrapolated = decide(lambda c, s: halving.extrapolated_loss(tmp_path / c, s, 100, 0.0))
    assert extrapolated.kept == ("hot",) and extrapolated.pruned == ("cold",)
    for cell, end in ends.items():  # each cell's band holds its own end, and the two bands are apart
        lo, hi = extrapolated.bands[cell]
        assert lo <= end <= hi and extrapolated.evidence[cell] == pytest.approx(end, rel=2e-3)
    assert extrapolated.bands["cold"][0] > extrapolated.bands["hot"][1]
    assert "clear of the best's" in extrapolated.why("cold")
    # the band is recorded with the decision, and read back the same
    halving.write_decision(tmp_path, extrapolated)
    assert halving.read_record(tmp_path)[("b", 0)] == extrapolated


def test_a_rung_keeps_by_confidence_fewer_where_the_bands_part_more_where_they_overlap_at_most_one_more():
    evidence = {f"c{i}": 2.0 + 0.1 * i for i in range(9)}  # keep 0.4 of 9: the fixed fraction keeps 4
    assert halving.decide_rung("b", 0, 11, evidence, keep=0.4).kept == ("c0", "c1", "c2", "c3")
    apart = {c: (v - 0.01, v + 0.01) for c, v in evidence.items()}
    d = halving.decide_rung("b", 0, 11, evidence, keep=0.4, bands=apart)
    assert d.kept == ("c0",) and len(d.pruned) == 8  # the bands tell them apart: only the best goes on
    wide = {c: (v - 1.0, v + 1.0) for c, v in evidence.items()}
    d = halving.decide_rung("b", 0, 11, evidence, keep=0.4, bands=wide)
    assert d.kept == ("c0", "c1", "c2", "c3", "c4") and halving.BAND_EXTRA == 1  # bounded: 4 + 1
    assert "overlapping, past the most kept" in d.why("c5")
    # a worse value with a wide band is kept over a better one with a narrow band clear of the best's
    mixed = {**apart, "c1": (2.09, 2.11), "c3": (1.5, 2.5)}
    d = halving.decide_rung("b", 0, 11, evidence, keep=0.4, bands=mixed)
    assert d.kept == ("c0", "c3") and "c1" in d.pruned
    # a band missing for one cell: the fixed fraction, no band recorded
    d = halving.decide_rung("b", 0, 11, evidence, keep=0.4, bands={"c0": (1.0, 3.0)})
    assert d.kept == ("c0", "c1", "c2", "c3") and not d.bands and "bands" not in d.to_json()


def test_the_band_holds_the_end_of_a_noisy_curve_and_narrows_as_the_rung_comes_later():
    total = 100

    def loss(s: int) -> float:
        return (1.8 + 3.0 * s**-0.4 + 0.3 * _cosine(s)) * (1 + 2e-3 * math.sin(7.3 * s))

    end = 1.8 + 3.0 * total**-0.4
    widths = []
    for rung in (11, 33):
        est = halving.extrapolate_band([(float(s), loss(s), _cosine(s)) for s in range(1, rung + 1)], total, 0.0)
        assert est is not None and est.band is not None
        assert est.lo <= end <= est.hi and est.lo < float(est) < est.hi
        widths.append(est.hi - est.lo)
    assert widths[1] < widths[0]
    # too short to hold its first half out: the value, no band (the rung then keeps the fixed fraction)
    seven = [(float(s), loss(s), _cosine(s)) for s in range(1, 8)]
    short = halving.extrapolate_band(seven, total, 0.0)
    assert short is not None and short.band is None and float(short) == halving.extrapolate(seven, total, 0.0)


# -- the next cells from the fit ----------------------------------------------------------------------------------

SIZES = (0.447e9, 0.55e9, 0.837e9, 0.998e9, 1.385e9, 1.935e9, 2.545e9, 3.383e9, 9.715e9)


def _pool() -> tuple[list[Candidate], dict[str, float]]:
    pool, truth = [], {}
    for recipe, e in (("a", 1.7), ("b", 1.8)):
        for n in SIZES:
            name = f"{recipe}{n / 1e9:.3f}"
            pool.append(Candidate(name, recipe, n, n / 1e9, holdout=n == SIZES[-1]))
            truth[name] = law.loss_at({**law.LAW_DEFAULTS, "E": e}, n, law.lr_opt(law.LAW_DEFAULTS, n), 1e8, 0.0)
    return pool, truth


def test_the_loop_seeds_then_buys_the_large_anchor_and_never_touches_a_holdout():
    pool, truth = _pool()
    spec = AdaptiveSpec(at=SIZES[-1], budget_gpu_hours=13.0, batch=2, seed=0)
    observed: dict[str, float] = {}
    rounds = []
    while True:
        r = choose(spec, pool, observed, resamples=50)
        rounds.append(r)
        if not r.chosen:
            break
        assert len(r.why) == len(r.chosen) and all(w.startswith(c) for c, w in zip(r.chosen, r.why, strict=True))
        observed.update({c: truth[c] for c in r.chosen})
    assert "seed design" in rounds[0].why[0] and set(rounds[0].chosen) == {"a0.447", "b0.447"}
    assert {"a3.383", "b3.383"} <= set(observed)  # the large anchor, chosen by the variance per GPU-hour
    assert not {"a9.715", "b9.715"} & set(observed)
    assert sum(c.gpu_hours for c in pool if c.name in observed) <= 13.0
    assert "budget is spent" in rounds[-1].stop
    last = rounds[-1].forecasts
    assert {f.form for f in last} == {"power_e"}  # the law's own form, chosen on the held-out sizes
    for f in last:  # the noiseless law is fitted exactly: the forecast at the holdout is its value
        assert f.value == pytest.approx(truth[f"{f.recipe}9.715"], rel=1e-3)
    # pure: the same inputs, the same round
    assert choose(spec, pool, dict(list(observed.items())[:6]), resamples=50) == choose(
        spec, pool, dict(list(observed.items())[:6]), resamples=50
    )


def test_the_loop_stops_once_the_band_is_narrow_enough():
    pool, truth = _pool()
    observed = {c.name: truth[c.name] for c in pool if not c.holdout and c.n < 1.5e9}
    spec = AdaptiveSpec(at=SIZES[-1], budget_cells=18, stop_halfwidth=0.05, seed=0)
    r = choose(spec, pool, observed, resamples=50)
    assert not r.chosen and "half width" in r.stop and r.halfwidth < 0.05


def test_the_report_shows_each_holdout_forecast_and_band_beside_its_realised_value():
    from sft_grid.analysis.page import render

    data = {
        "grid": {"name": "g"},
        "cells": [],
        "adaptive": {
            "question": {"level": 0.9},
            "holdouts": [
                {"cell": "big_a", "recipe": "a", "forecast": 2.0, "lo": 1.9, "hi": 2.1, "realised": 2.05},
                {"cell": "big_b", "recipe": "b", "forecast": 2.0, "lo": 1.95, "hi": 2.05, "realised": 2.2},
            ],
            "why": ["x1: seed design"],
            "stop": "the budget is spent",
        },
    }
    page = render(data)
    section = page[page.index('id="adaptive"') :]
    assert "big_a" in section and "[1.9, 2.1]" in section and "2.05" in section and "-2.44%" in section
    assert section.index("big_b") < section.index(">no<")  # 2.2 is outside [1.95, 2.05]
    assert "x1: seed design" in section and "stop: the budget is spent" in section


# -- a design that decides: which recipe wins at `at` (question gap) ---------------------------------------------

XS = tuple(1e8 * 2**i for i in range(13))


def _decision_pool(
    laws: dict[str, float], price: dict[str, float] | None = None
) -> tuple[list[Candidate], dict[str, float]]:
    """Recipes whose losses follow E + 40 x^-0.2 (E per recipe) with a deterministic 0.3% wobble, so that each form
    chosen on held-out points has a band; a cell costs x / 1e8 GPU-hours times its recipe's `price`."""
    pool, truth = [], {}
    for recipe, e in laws.items():
        for i, x in enumerate(XS):
            name = f"{recipe}{i}"
            hours = x / 1e8 * (price or {}).get(recipe, 1.0)
            pool.append(Candidate(name, recipe, x, hours, holdout=i == len(XS) - 1))
            truth[name] = (e + 40.0 * x**-0.2) * (1 + 0.003 * (-1) ** i)
    return pool, truth


def _gap(recipes: tuple[str, ...], **kw) -> AdaptiveSpec:
    """A gap question chosen by the value of its plans (design: value); _race for the default, the race."""
    return AdaptiveSpec(
        question="gap", at=XS[-1], recipes=recipes, **{"budget_gpu_hours": 5000.0, "batch": 2, "design": "value", **kw}
    )


CELLS = {"budget_gpu_hours": None, "budget_cells": 100}


def _race(recipes: tuple[str, ...], **kw) -> AdaptiveSpec:
    return dataclasses.replace(_gap(recipes, **kw), design=kw.get("design", "race"))


def _first_sizes(truth: dict[str, float], recipes: str, k: int) -> dict[str, float]:
    return {f"{r}{i}": truth[f"{r}{i}"] for r in recipes for i in range(k)}


def test_a_gap_asks_which_of_two_or_more_recipes_is_lowest():
    block = {"question": "gap", "at": 1e9, "recipes": ["a", "b", "c"], "budget_cells": 3}
    spec, problems = parse_adaptive(block, recipes=["a", "b", "c"])
    assert not problems and spec is not None and spec.recipes == ("a", "b", "c")


def test_the_band_grows_with_the_distance_as_the_nested_extrapolations_show_and_wide_where_they_cannot_tell():
    """forms.growth: a curve that bends away from every form gets a band at ten doublings beyond its largest size
    wider than ten times its band at one (the errors of its nested extrapolations grow faster than linearly); a
    straight one, about ten times (linear growth, the least the band assumes); from four sizes, which cannot tell,
    about fifty times (the flat prior over linear to quadratic growth: the conservative side)."""

    def band(law, k: int) -> tuple[float, forms.Growth]:
        pts = [(XS[i], law(i) * (1 + 0.003 * (-1) ** i)) for i in range(k)]
        sel = forms.select(pts)
        g = sel.growth
        assert g is not None
        (_, lo_far, hi_far), (_, lo_near, hi_near) = (sel.forecast(XS[k - 1] * 2**d) for d in (10, 1))
        assert lo_far and hi_far and lo_near and hi_near and hi_far / lo_far > hi_near / lo_near  # the band itself
        return g.scale(10 * math.log(2)) / g.scale(math.log(2)), g

    def straight(i: int) -> float:
        return 3.0 - 0.05 * i

    def bends(i: int) -> float:
        return 3.3 - 0.01 * i - 0.006 * i * i

    few_straight, _ = band(straight, 4)
    few_bends, _ = band(bends, 4)
    assert few_straight > 35 and few_bends > 35
    ratio_straight, g_straight = band(straight, 12)
    ratio_bends, g_bends = band(bends, 12)
    assert 10 <= ratio_straight < 15 < ratio_bends and g_straight.exponent < 1.15 < g_bends.exponent


def test_a_decision_seeds_each_recipe_to_a_band_then_records_the_winner_and_its_probability():
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72})
    spec = _gap(("a", "b"))
    observed: dict[str, float] = {}
    rounds = []
    while len(rounds) < 4:
        r = choose(spec, pool, observed)
        rounds.append(r)
        observed.update({c: truth[c] for c in r.chosen})
    # four sizes a recipe before its band (two held-out sizes, each extrapolated from two below it), cheapest first
    assert all("seed design" in w for r in rounds[:4] for w in r.why)
    assert set(observed) == set(_first_sizes(truth, "ab", 4))
    assert rounds[0].decision == "" and rounds[0].p_wrong is None
    r = choose(spec, pool, observed)
    assert r.decision == "a" and r.p_wrong is not None and 0.1 < r.p_wrong < 0.6 and r.chosen and not r.stop
    assert "lowers the expected probability of a wrong decision" in r.why[0]
    assert r == choose(spec, pool, observed)  # pure: the same inputs (and the spec's seed), the same round


def test_a_decision_already_certain_stops_with_no_new_cells():
    """Eight sizes a recipe, four doublings short of `at`: the bands are learnt from extrapolations that far."""
    pool, truth = _decision_pool({"a": 1.70, "b": 2.60})
    spec = _gap(("a", "b"))
    r = choose(spec, pool, _first_sizes(truth, "ab", 8))
    assert not r.chosen and r.decision == "a" and r.p_wrong is not None and r.p_wrong < 0.1
    assert r.stop.startswith("decided: a is the lowest")
    # the same fits asked at a stricter level are not certain enough: the loop goes on
    strict = choose(_gap(("a", "b"), level=1 - r.p_wrong / 2), pool, _first_sizes(truth, "ab", 8))
    assert strict.chosen and not strict.stop
    # from five sizes, eight doublings short, the same recipes are not yet decided: the band grows faster than
    # linearly with the distance while the errors cannot tell how fast (forms.growth's prior)
    early = choose(spec, pool, _first_sizes(truth, "ab", 5))
    assert early.chosen and early.p_wrong is not None and early.p_wrong > 0.1


def test_a_decision_is_not_called_from_sizes_whose_span_is_shorter_than_the_reach_to_at():
    """Six sizes (five doublings) seven doublings short of `at`: the bands already put the wrong decision under
    1 - level, but the growth of the band that far is assumed, not measured, so the loop buys the next size; from
    seven sizes (six doublings, six short) it is called decided."""
    pool, truth = _decision_pool({"a": 1.70, "b": 3.60})
    spec = _gap(("a", "b"))
    short = choose(spec, pool, _first_sizes(truth, "ab", 6))
    assert short.p_wrong is not None and short.p_wrong < 1 - spec.level and short.decision == "a"
    assert short.chosen and not short.stop, short.stop
    assert "not yet called decided: a, b forecast further beyond their largest size" in short.why[0], short.why
    wide = choose(spec, pool, _first_sizes(truth, "ab", 7))
    assert not wide.chosen and wide.stop.startswith("decided: a is the lowest")
    # the budget spent on those six sizes: the loop ends undecided and says why it did not call it
    six = _first_sizes(truth, "ab", 6)
    spent = sum(c.gpu_hours for c in pool if c.name in six)
    broke = choose(_gap(("a", "b"), budget_gpu_hours=spent), pool, six)
    assert not broke.chosen and broke.decision == "a", broke
    assert broke.stop.startswith("the budget is spent") and "not called decided: a, b forecast" in broke.stop, broke


def test_a_cell_is_worth_what_it_does_to_the_decision_not_to_a_band():
    """Recipe c is far worse than a and b: narrowing its band cannot change which recipe wins, so its cells are never
    chosen, not even at a hundredth of the price; a design minimising the bands' variance would buy them. (From
    eight sizes: from four, eight doublings short of `at`, the bands are wide enough that c might still win. Far:
    its loss about four times theirs; at three times, 5.0, its local power law's band, Student's t with two
    degrees of freedom, still reaches below theirs in about one draw in a thousand, and a cell at a hundredth of the
    price that settles those draws is worth its price.)"""
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72, "c": 8.0}, price={"c": 0.01})
    spec = _gap(("a", "b", "c"))
    r = choose(spec, pool, _first_sizes(truth, "abc", 8))
    assert r.decision == "a" and r.chosen and not any(c.startswith("c") for c in r.chosen), r.why


@pytest.mark.parametrize(("price", "first"), [({"b": 10.0}, "a"), ({"a": 10.0}, "b")])
def test_of_two_cells_that_separate_the_recipes_alike_the_cheaper_per_gpu_hour_is_chosen(price, first):
    """The next size of either recipe moves the decision about as much; the one at a tenth of the price is the plan,
    alone: a larger plan would lower the probability more, but less per GPU-hour."""
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72}, price=price)
    r = choose(_gap(("a", "b")), pool, _first_sizes(truth, "ab", 4))
    assert r.chosen == (f"{first}4",) and f"of the plan {first}4 (16 GPU-h)" in r.why[0], r.why


def test_a_decision_never_spends_past_its_budget_and_says_why_it_stopped():
    pool, truth = _decision_pool({"a": 1.70, "b": 1.705})
    spec = _gap(("a", "b"), budget_gpu_hours=60.0)
    observed: dict[str, float] = {}
    while True:
        r = choose(spec, pool, observed)
        if not r.chosen:
            break
        observed.update({c: truth[c] for c in r.chosen})
    assert sum(c.gpu_hours for c in pool if c.name in observed) <= 60.0
    assert r.stop and not {"a12", "b12"} & set(observed)
    assert r.stop.startswith(("the budget is spent", "no affordable cell", "decided"))


def test_the_forms_a_decision_chooses_among_are_the_blocks_own():
    """`forms: [tail]` (a race's): every recipe's forecast is the local power law through its largest three sizes,
    with its band; without the key the form is chosen among all five (here a saturating law: E + A x^-alpha). A form
    that does not exist is refused, naming it and the forms there are; forms for a ladder, which has none to choose,
    too."""
    block = {"question": "gap", "at": XS[-1], "recipes": ["a", "b"], "budget_cells": 30, "forms": ["tail"]}
    spec, problems = parse_adaptive({**block, "design": "race"}, recipes=["a", "b"])
    assert not problems and spec is not None and spec.forms == ("tail",)
    # the ladder (the default) has no form to choose: said, with the fix
    _, ladder = parse_adaptive(block, recipes=["a", "b"])
    assert ladder[0].key == "adaptive.forms" and "no form to choose" in ladder[0].message
    assert ladder[0].fix == "drop forms, or design: race"
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72})
    observed = _first_sizes(truth, "ab", 8)
    found = choose(spec, pool, observed).forecasts
    for f in found:
        pts = [(c.n, observed[c.name]) for c in pool if c.recipe == f.recipe and c.name in observed]
        assert f.form == "tail" and f.scale is not None
        assert f.value == pytest.approx(forms.fit_form("tail", pts).predict(XS[-1]))
    default = choose(_gap(("a", "b")), pool, observed).forecasts
    assert {f.form for f in default} != {"tail"}
    _, bad = parse_adaptive({"at": 1e9, "budget_cells": 3, "forms": ["tail", "cubic"]})
    assert "names no form: ['cubic']" in bad[0].render() and "power_e, power, loglinear, rectified, tail" in bad[0].fix


# -- the race (design: race): successive elimination (the default, the ladder: tests/test_ladder.py) ------------------


def test_the_design_key_is_checked():
    block = {"question": "gap", "at": 1e9, "recipes": ["a", "b"], "budget_cells": 30}
    spec, problems = parse_adaptive({**block, "design": "race"}, recipes=["a", "b"])
    assert not problems and spec is not None and spec.design == "race"
    _, bad = parse_adaptive({**block, "design": "greedy"}, recipes=["a", "b"])
    assert bad[0].key == "adaptive.design" and "is not a design" in bad[0].message and "race, value" in bad[0].fix
    _, loss = parse_adaptive({"at": 1e9, "budget_cells": 3, "design": "race"})
    assert loss[0].key == "adaptive.design" and "a loss question has one design" in loss[0].message


def test_the_race_seeds_every_recipe_with_the_largest_window_that_half_the_budget_buys():
    """Cells cost x / 1e8 GPU-h (size k: 2^k): the windows of five sizes (the fewest a band needs among all five
    forms: two sizes, two held out, one more origin) ending at size k cost 2 x 31 x 2^(k-4) for two recipes; half
    of 5000 GPU-h buys k = 9 (1984), not 10 (3968): sizes 5 to 9 of each, cheapest first, whole (a band from four
    of them does not cut the window short)."""
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72})
    spec = _race(("a", "b"))
    observed: dict[str, float] = {}
    seeded = []
    while True:
        r = choose(spec, pool, observed)
        if not r.chosen or not all("seed window" in w for w in r.why):
            break
        seeded += r.chosen
        assert len(r.chosen) <= spec.batch
        observed.update({c: truth[c] for c in r.chosen})
    assert sorted(seeded) == sorted(f"{x}{i}" for x in "ab" for i in range(5, 10))
    assert seeded[:2] == ["a5", "b5"]  # cheapest first
    # once every band is in, the race: each recipe's next size up
    assert r.chosen and all("in the race for the lowest" in w for w in r.why), r.why
    assert set(r.chosen) == {"a10", "b10"} and r == choose(spec, pool, observed)  # pure


def test_a_recipe_that_cannot_win_is_out_of_the_race_and_gets_no_more_cells():
    """c is far worse than a and b: its probability of being the lowest is under 1 - level, so the race measures a
    and b one size further and c not at all, even at a hundredth of the price (the value design's test above
    shows the same for its plans)."""
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72, "c": 8.0}, price={"c": 0.01})
    spec = _race(("a", "b", "c"), **CELLS)  # a budget in cells: the seed windows are the smallest, measured here
    r = choose(spec, pool, _first_sizes(truth, "abc", 8))
    assert set(r.chosen) == {"a8", "b8"}, r.why
    assert all("out: c" in w for w in r.why) and "c 0.00" in r.why[0]  # its chance, under 1 - level


def test_the_race_measures_the_recipe_with_fewer_sizes_first_then_the_cheaper():
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72}, price={"b": 0.1})
    observed = {**_first_sizes(truth, "a", 8), **_first_sizes(truth, "b", 9)}
    r = choose(_race(("a", "b"), batch=1, **CELLS), pool, observed)
    assert r.chosen == ("a8",), r.why  # b is cheaper but a level behind
    even = choose(_race(("a", "b"), batch=1, **CELLS), pool, _first_sizes(truth, "ab", 8))
    assert even.chosen == ("b8",), even.why  # level: the cheaper first


def test_the_race_stops_where_no_recipe_in_it_can_afford_its_next_size_and_never_overspends():
    pool, truth = _decision_pool({"a": 1.70, "b": 1.705})
    spec = _race(("a", "b"), budget_gpu_hours=300.0)
    observed: dict[str, float] = {}
    rounds = 0
    while True:
        r = choose(spec, pool, observed)
        if not r.chosen:
            break
        rounds += 1
        observed.update({c: truth[c] for c in r.chosen})
    assert sum(c.gpu_hours for c in pool if c.name in observed) <= 300.0 and rounds > 1
    assert r.stop.startswith(("no recipe in the race", "decided")), r.stop
    if r.stop.startswith("no recipe in the race"):
        assert "(a, b) has an affordable next size" in r.stop


def test_the_race_drops_no_recipe_while_a_forecast_reaches_beyond_its_span():
    """Three recipes, c clearly worse, measured at their six smallest sizes: seven doublings short of `at`, further
    than the five they span (design.MAX_REACH); c stays in the race until the sizes reach far enough."""
    pool, truth = _decision_pool({"a": 1.70, "b": 1.72, "c": 3.6})
    r = choose(_race(("a", "b", "c"), batch=3, **CELLS), pool, _first_sizes(truth, "abc", 6))
    assert set(r.chosen) == {"a6", "b6", "c6"} and "no recipe dropped while a forecast reaches" in r.why[0], r.why
