"""Bad input, ninth round: steering blocks accepted that could never answer their question (an `at` the grid trains
or lies below, a budget short of the seed design, a prune bracket that halves away a recipe the question compares,
rungs on one step, a keep that prunes nothing, keys that contradict each other). Each is refused before anything is
queued, naming the key, the value and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sft_grid.adaptive import prune, steer
from sft_grid.adaptive.spec import parse_prune
from sft_grid.planning.compose import Composed, GridComposer

from .conftest import run_sft

DELPHI = ["delphi-3e18", "delphi-9e18", "delphi-2e19", "delphi-3e19"]  # 447M, 550M, 837M, 998M parameters


@pytest.fixture
def compose(hydra_loader: Any, tmp_path: Path):
    """The composed cells of a grid, one override list per cell (runs_root in a tmp dir)."""

    def make(*cells: list[str]) -> list[Composed]:
        composed, errors = GridComposer(hydra_loader, "config").compose_all(
            [[*c, f"runs_root={tmp_path / 'runs'}"] for c in cells]
        )
        assert not errors, [e.message for e in errors]
        return composed

    return make


def _delphi(compose, block: str, recipes=("magpie",), models=DELPHI, more=()) -> list[Composed]:
    return compose(
        *(
            ["+sweep=synthetic_delphi", f"vars.model={m}", f"vars.recipe={r}", f"+adaptive={block}", *more]
            for r in recipes
            for m in models
        )
    )


def _adaptive_problems(composed: list[Composed]) -> dict[str, Any]:
    _, _, effects = steer.select(composed)
    return {p.key: p for p in effects.problems}


# -- 1: `at` is the size forecast, beyond the sizes the grid fits --------------------------------------------------


@pytest.mark.parametrize(
    ("at", "said", "fix"),
    [
        (1e8, "is below every size the grid fits (the smallest: delphi-3e18 at 4.472e+08)", "sweep 3 or more sizes"),
        (998036992, "it trains delphi-3e19 at 9.98e+08 (at or above `at`, not held out)", "holdout: [delphi-3e19]"),
        (9e8, "it trains delphi-3e19 at 9.98e+08", "above 998036992 (the largest size the grid fits"),
    ],
)
def test_an_at_the_grid_trains_or_lies_below_is_refused_with_the_sizes_there_are(compose, at, said, fix):
    p = _adaptive_problems(_delphi(compose, f"{{at: {at}, budget_cells: 3}}"))["adaptive.at"]
    assert said in p.message and fix in p.fix and p.rule == "adaptive-block", p.render()


def test_an_at_the_grid_trains_is_a_forecast_once_that_size_is_held_out(compose):
    trained = "{at: 998036992, budget_cells: 3}"
    assert "adaptive.at" in _adaptive_problems(_delphi(compose, trained))
    assert not _adaptive_problems(_delphi(compose, trained.replace("}", ", holdout: [delphi-3e19]}")))
    assert not _adaptive_problems(_delphi(compose, "{at: 9.7e9, budget_cells: 3}"))


# -- 2: a budget short of the seed design ----------------------------------------------------------------------


def test_a_budget_in_cells_below_the_seed_design_names_the_least_that_can(compose):
    p = _adaptive_problems(_delphi(compose, "{at: 9.7e9, budget_cells: 1}"))["adaptive.budget_cells"]
    assert "3 sizes of each of 1 recipe(s)" in p.message and p.fix == "budget_cells: 3 or more", p.render()
    # a gap's ladder: a foot, a rung and a top of each of two recipes
    gap = "{at: 9.7e9, question: gap, recipes: [magpie, wildchat], budget_cells: 5}"
    p = _adaptive_problems(_delphi(compose, gap, recipes=("magpie", "wildchat")))["adaptive.budget_cells"]
    assert p.fix == "budget_cells: 6 or more", p.render()
    assert not _adaptive_problems(_delphi(compose, gap.replace("5}", "6}"), recipes=("magpie", "wildchat")))
    # a race's seed is a window of five sizes of each recipe (race.window), not the four its band needs
    five = [*DELPHI, "delphi-9e19"]
    raced = _delphi(compose, gap.replace("5}", "8, design: race}"), recipes=("magpie", "wildchat"), models=five)
    p = _adaptive_problems(raced)["adaptive.budget_cells"]
    assert "5 sizes of each of 2 recipe(s) (a race's seed window" in p.message and p.fix == "budget_cells: 10 or more"


def test_a_budget_in_gpu_hours_below_the_seed_design_names_the_least_that_can(compose):
    # no GPU-hour estimate for the synthetic cells: a cell costs its parameters / 1e9; the three cheapest sizes
    # cost 0.447 + 0.550 + 0.837 = 1.834
    p = _adaptive_problems(_delphi(compose, "{at: 9.7e9, budget_gpu_hours: 1.8}"))["adaptive.budget_gpu_hours"]
    assert "cost 1.835 in parameters / 1e9" in p.message and p.fix == "budget_gpu_hours: 1.84 or more", p.render()
    assert not _adaptive_problems(_delphi(compose, "{at: 9.7e9, budget_gpu_hours: 1.84}"))


# -- 3: a prune bracket that mixes the recipes the question compares --------------------------------------------


def test_a_prune_bracket_mixing_the_recipes_of_the_question_is_refused_with_the_recipe_key_to_add(compose):
    gap = "{at: 9.7e9, question: gap, recipes: [magpie, wildchat], budget_cells: 6}"
    mixed = "+prune={rungs: [10], keep: 0.5, by: [vars.model]}"
    composed = _delphi(compose, gap, recipes=("magpie", "wildchat"), models=DELPHI[:3], more=[mixed, "max_steps=90"])
    _, _, effects = prune.select(composed)
    (p,) = effects.problems
    assert p.key == "prune.by" and "mixes recipes the adaptive: question compares (magpie, wildchat)" in p.message
    assert p.fix == "group by the recipe too: prune.by=[vars.model,vars.recipe]", p.render()


# -- 4: the rest of the class ----------------------------------------------------------------------------------


def test_rungs_in_tokens_on_one_step_and_a_keep_that_prunes_nothing_are_refused(compose):
    lrs = [["backend=synthetic", "max_steps=90", "save_steps=1000", f"lr={lr}"] for lr in ("1e-4", "2e-4", "4e-4")]
    tokens = compose(*([*c, "+prune={rungs: [12, 37], unit: tokens, keep: 0.5}"] for c in lrs))
    (p,) = prune.select(tokens)[2].problems
    assert p.key == "prune.rungs" and "fall on the steps [1, 1]" in p.message and "unit: steps" in p.fix, p.render()
    kept = compose(*([*c, "+prune={rungs: [30], keep: 0.9, guard: position}"] for c in lrs))
    (p,) = prune.select(kept)[2].problems
    assert p.key == "prune.keep" and "prune nothing" in p.message and p.fix == "keep: 0.66 or less", p.render()


def test_contradictory_keys_of_a_block_are_refused():
    _, (p,) = parse_prune({"rungs": [10], "guard": "position", "probe": 0.2}, max_steps=100)
    assert p.key == "prune.probe" and p.fix == "drop probe, or guard: cooldown"
    spec, problems = parse_prune({"rungs": [10], "probe": 0.2}, max_steps=100)  # the cooldown guard reads it
    assert spec is not None and not problems


def test_a_size_key_that_is_the_recipe_key_is_named_as_such(compose):
    block = "{at: 1e6, budget_cells: 3, size_key: max_steps, recipe_key: max_steps}"
    steps = compose(*(["model=tiny_llama", f"max_steps={n}", f"+adaptive={block}"] for n in (2, 4, 8)))
    (p,) = _adaptive_problems(steps).values()
    assert p.key == "adaptive.size_key" and "is recipe_key too" in p.message, p.render()


def test_the_cli_names_a_wrong_at_and_a_short_budget_together_with_nothing_written(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft(
        "run",
        "-m",
        "+sweep=synthetic_delphi",
        "+adaptive={at: 1e8, budget_cells: 1}",
        "dry_run=true",
        f"runs_root={here / 'runs'}",
        cwd=here,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said
    assert "adaptive.at=100000000: is below every size the grid fits" in said, said
    assert "adaptive.budget_cells=1: affords fewer cells than the question's seed design" in said, said
    assert "fix: budget_cells: 6 or more" in said, said
    assert list(here.iterdir()) == [], said
