"""Grids that steer themselves (sft_grid/adaptive/): the `prune:` and `adaptive:` blocks refused with their key, value
and fix; successive halving decided from files only, recorded before it is acted on, unchanged by kills; the next
cells from the fit (seed design, the large anchor worth its price, holdouts never used, the budget, the reasons).
The decisions are measured over 50 seeded grids by benchmarks/bench_adaptive.py; here on a few."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sft_grid.adaptive import halving
from sft_grid.adaptive.design import Candidate, choose
from sft_grid.adaptive.spec import AdaptiveSpec, parse_adaptive, parse_prune
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
        ({"at": 1e9, "recipes": ["nope"], "budget_cells": 3}, "adaptive.recipes"),
        ({"at": 1e9}, "adaptive.budget_gpu_hours"),
        ({"at": 1e9, "budget_cells": 3, "budget_gpu_hours": 4}, "adaptive.budget_gpu_hours"),
        ({"at": -1, "budget_cells": 3}, "adaptive.at"),
        ({"at": 1e9, "budget_cells": 3, "holdout": "big"}, "adaptive.holdout"),
    ],
)
def test_a_bad_adaptive_block_names_its_key(block, key):
    spec, problems = parse_adaptive(block, recipes=["a", "b"])
    assert spec is None and key in [p.key for p in problems], [p.render() for p in problems]


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
