"""A sweep's `prune:` and `adaptive:` blocks, typed, and every bad value refused before anything is queued.

    prune:                        # successive halving of the cells of each bracket
      metric: loss                # the loss (on the cooldown probe, or logged at the rung)
      rungs: [12, 37]             # where the cells are compared: steps, or tokens with unit: tokens; increasing,
      unit: steps                 #   each before the cells' last step
      keep: 0.34                  # the fraction of each bracket kept at each rung (at least one cell)
      by: [vars.model, seed]      # the keys whose values make a bracket: cells alike in them are compared together
      guard: cooldown             # cooldown: compare short cooldown probes from the rung's checkpoint (no decay
      probe: 0.1                  #   flip; the synthetic simulator only); position: the logged loss at the rung,
                                  #   smoothed (all cells at the same step); extrapolate: each logged curve
                                  #   extrapolated to the schedule's end (no probe; every backend)

    adaptive:                     # the next cells from the fit
      question: loss              # loss (each recipe's at `at`) or gap (which of the recipes is lowest at `at`)
      at: 9.715e9                 # the size the question is about (parameters, or size_key's unit)
      recipes: [magpie, wildchat] # for gap: the recipes compared, two or more (each needs a band: four sizes)
      holdout: [delphi-1e22]      # pre-registered model names (or size_key values): run, never fitted, never
                                  #   chosen (their realised values are shown beside the forecast)
      recipe_key: vars.recipe     # the cell key whose value names a cell's recipe (one fit per recipe)
      size_key: ""                # the cell key whose number is a cell's size (e.g. max_steps, or
                                  #   extra.replay.examples); empty: the model's parameter count
      budget_gpu_hours: 400       # or budget_cells: 12
      batch: 2                    # cells chosen per round
      stop_halfwidth: 0.01        # stop once the question's band is narrower than this (its half width)
      level: 0.9
      seed: 0
      forms: [tail]               # the forms the forecasts choose among on held-out points (analysis/forms.py;
                                  #   loss, race and value only); default all five: power_e, power, loglinear,
                                  #   rectified, tail
      design: race                # gap only: ladder (two sizes far apart per recipe, adaptive/ladder.py; the
                                  #   default, which takes no forms), race (successive elimination,
                                  #   adaptive/race.py) or value (each plan's expected fall in P(wrong) per GPU-hour)

`question: gap` takes two or more recipes and asks which is lowest at `at` (sft_grid/adaptive/design.py decides,
with the probability that another is lower); each recipe needs three sizes besides the holdouts for a ladder's band
(four under `design: race` or `value`; `loss` needs three: design.sizes_needed), which the grid is checked for before
anything is queued (steer.py).

`parse_prune` / `parse_adaptive` return the typed block and the problems found (each with its key, value and
fix): a sweep with any problem is refused whole (core/problems.GridError).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sft_grid.analysis.forms import FORMS
from sft_grid.core.problems import GRID, Problem
from sft_grid.planning.hydra_errors import did_you_mean

PRUNE_KEYS = ("metric", "rungs", "unit", "keep", "by", "guard", "probe")
ADAPTIVE_KEYS = (
    "question",
    "at",
    "recipes",
    "holdout",
    "budget_gpu_hours",
    "budget_cells",
    "batch",
    "stop_halfwidth",
    "level",
    "seed",
    "recipe_key",
    "size_key",
    "forms",
    "design",
)
GUARDS = ("cooldown", "position", "extrapolate")
UNITS = ("steps", "tokens")
QUESTIONS = ("loss", "gap")
# how a gap question's next cells are chosen: ladder (adaptive/ladder.py), race (adaptive/race.py) or value
# (design.py's plans by their worth)
DESIGNS = ("ladder", "race", "value")


@dataclass(frozen=True)
class PruneSpec:
    metric: str = "loss"
    rungs: tuple[float, ...] = ()
    unit: str = "steps"
    keep: float = 1 / 3
    by: tuple[str, ...] = ()
    guard: str = "cooldown"
    probe: float = 0.1  # the cooldown probe's length, a fraction of the rung's steps

    def rung_steps(self, tokens_per_step: float) -> tuple[int, ...]:
        """The rungs in steps (tokens are rounded up to the step that has seen them)."""
        if self.unit == "steps":
            return tuple(int(r) for r in self.rungs)
        return tuple(math.ceil(r / tokens_per_step) for r in self.rungs)


@dataclass(frozen=True)
class AdaptiveSpec:
    question: str = "loss"
    at: float = 0.0
    recipes: tuple[str, ...] = ()
    holdout: tuple[str, ...] = ()
    budget_gpu_hours: float | None = None
    budget_cells: int | None = None
    batch: int = 2
    stop_halfwidth: float | None = None
    level: float = 0.9
    seed: int = 0
    recipe_key: str = "vars.recipe"
    size_key: str = ""  # the dotted key whose number is a cell's size; empty: the model's parameter count
    forms: tuple[str, ...] = ()  # the forms the forecasts choose among (analysis/forms.py FORMS); empty: all
    design: str = DESIGNS[0]  # gap: how the next cells are chosen (DESIGNS; the first, the ladder, by default)


def _problem(block: str, key: str, value: object, message: str, fix: str) -> Problem:
    return Problem(
        cell=GRID,
        key=f"{block}.{key}" if key else block,
        value=value,
        rule=f"{block}-block",
        message=message,
        fix=fix,
    )


def _unknown(block: str, data: Mapping[str, Any], known: Sequence[str]) -> list[Problem]:
    return [
        _problem(
            block,
            str(k),
            data[k],
            f"not a key of {block}{did_you_mean(str(k), known)}",
            f"use one of {', '.join(known)}",
        )
        for k in data
        if k not in known
    ]


def _get(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return data.get(key, default)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _rungs_below(max_steps: int, guard: object) -> str:
    """The fix for rungs past the cells' last step: rungs that fall before it, from step 1 on, and under guard:
    extrapolate from the first step with enough logged points before it at logging_steps=1 (a cell too short for
    either has no step to stop at before its end)."""
    from sft_grid.adaptive.halving import MIN_POINTS

    least = MIN_POINTS if guard == "extrapolate" else 1
    below = sorted({r for r in (max(least, max_steps // 9), max(least, max_steps // 3)) if r < max_steps})
    if not below:
        return (
            f"longer cells (max_steps above {least}: a rung must fall before the last step"
            + (f", after {MIN_POINTS} logged points" if guard == "extrapolate" else "")
            + "), or drop prune:"
        )
    return f"rungs below {max_steps}, e.g. rungs: [{', '.join(map(str, below))}]"


def parse_prune(data: Any, max_steps: int | None = None) -> tuple[PruneSpec | None, list[Problem]]:
    """The `prune:` block (None: the sweep prunes nothing). `max_steps`: the cells' steps, when known here, which
    every rung must precede."""
    if data is None:
        return None, []
    if not isinstance(data, Mapping):
        return None, [_problem("prune", "", data, "is not a mapping", "write prune: {metric: loss, rungs: [...], ...}")]
    problems = _unknown("prune", data, PRUNE_KEYS)
    metric = _get(data, "metric", "loss")
    if metric != "loss":
        problems.append(
            _problem(
                "prune",
                "metric",
                metric,
                "is not a metric the rungs can read: a rung compares the logged training loss (scores along training,"
                " eval.along, are shown in results and the report but not read by the rungs)",
                "metric: loss",
            )
        )
    unit = _get(data, "unit", "steps")
    if unit not in UNITS:
        problems.append(_problem("prune", "unit", unit, "is not a unit of the rungs", f"one of {', '.join(UNITS)}"))
    rungs = _get(data, "rungs")
    ok = isinstance(rungs, Sequence) and not isinstance(rungs, str) and len(rungs) > 0
    if not ok or not all(_number(r) and r > 0 for r in rungs):
        problems.append(
            _problem("prune", "rungs", rungs, "must be a list of positive numbers", "e.g. rungs: [12, 37] (steps)")
        )
        rungs = ()
    elif any(b <= a for a, b in itertools.pairwise(rungs)):
        problems.append(_problem("prune", "rungs", list(rungs), "must increase", f"sort them: {sorted(set(rungs))}"))
    elif unit == "steps" and any(float(r) != int(r) for r in rungs):  # a step is whole: 4.5 would be read as 4
        whole = sorted({max(1, round(r)) for r in rungs})
        problems.append(
            _problem("prune", "rungs", list(rungs), "are steps, and a step is a whole number", f"e.g. rungs: {whole}")
        )
    elif max_steps and unit == "steps" and rungs[-1] >= max_steps:
        problems.append(
            _problem(
                "prune",
                "rungs",
                list(rungs),
                f"the last rung ({rungs[-1]}) is not before the cells' last step ({max_steps})",
                _rungs_below(max_steps, _get(data, "guard", "cooldown")),
            )
        )
    keep = _get(data, "keep", 1 / 3)
    if not _number(keep) or not 0 < keep < 1:
        problems.append(_problem("prune", "keep", keep, "must lie in (0, 1)", "e.g. keep: 0.34 (a third kept)"))
    by = _get(data, "by", [])
    if isinstance(by, str):
        by = [by]
    if not isinstance(by, Sequence) or not all(isinstance(b, str) and b for b in by):
        problems.append(_problem("prune", "by", by, "must be a list of cell keys", "e.g. by: [vars.model, seed]"))
        by = []
    guard = _get(data, "guard", "cooldown")
    if guard not in GUARDS:
        problems.append(
            _problem(
                "prune",
                "guard",
                guard,
                "is not a guard against the decay's flip",
                "cooldown (compare short cooldown probes), position (the loss at the rung's step) or extrapolate"
                " (each logged curve extrapolated to the schedule's end)",
            )
        )
    probe = _get(data, "probe", 0.1)
    if not _number(probe) or not 0 < probe <= 0.5:
        problems.append(_problem("prune", "probe", probe, "must lie in (0, 0.5]", "e.g. probe: 0.1"))
    elif "probe" in data and guard in GUARDS and guard != "cooldown":  # read by the cooldown guard alone
        problems.append(
            _problem(
                "prune",
                "probe",
                probe,
                f"is the length of a cooldown probe, and guard: {guard} runs none",
                "drop probe, or guard: cooldown",
            )
        )
    if problems:
        return None, problems
    return PruneSpec(metric, tuple(float(r) for r in rungs), unit, float(keep), tuple(by), guard, float(probe)), []


def _recipe_named(name: Any, recipes: Sequence[str]) -> Any:
    """The grid's recipe a `recipes:` entry names: itself, or where it is a number, the recipe of the same number
    (YAML and Hydra read `0.001` as a number, the cells' values are compared as text). Anything else as given."""
    if str(name) in recipes or isinstance(name, bool):
        return str(name)
    try:
        number = float(name)
    except (TypeError, ValueError):
        return name
    for recipe in recipes:
        try:
            if float(recipe) == number:
                return recipe
        except ValueError:
            continue
    return str(name) if isinstance(name, int | float) else name


def parse_adaptive(data: Any, recipes: Sequence[str] = ()) -> tuple[AdaptiveSpec | None, list[Problem]]:
    """The `adaptive:` block (None: a fixed grid). `recipes`: the grid's recipes, which `recipes` must name."""
    if data is None:
        return None, []
    if not isinstance(data, Mapping):
        return None, [_problem("adaptive", "", data, "is not a mapping", "write adaptive: {question: loss, ...}")]
    problems = _unknown("adaptive", data, ADAPTIVE_KEYS)
    question = _get(data, "question", "loss")
    if question not in QUESTIONS:
        problems.append(_problem("adaptive", "question", question, "is not a question", "loss or gap"))
    at = _get(data, "at")
    if not _number(at) or at <= 0:
        problems.append(
            _problem(
                "adaptive", "at", at, "must be a size (parameters, or size_key's unit) above 0", "e.g. at: 9.715e9"
            )
        )
    # a recipe named as a number (`recipes=[0.001,0.002]` with recipe_key: lr) is the recipe of that value: the
    # cells' values are compared as text, and 1e-3 is the same learning rate as the cells' 0.001
    given_recipes = _get(data, "recipes") or []
    if not isinstance(given_recipes, list | tuple):  # a string would be read letter by letter
        names = [n.strip() for n in str(given_recipes).split(",") if n.strip()]
        problems.append(
            _problem(
                "adaptive",
                "recipes",
                given_recipes,
                "must be a list of recipes, not one " + ("string" if isinstance(given_recipes, str) else "value"),
                f"recipes: [{', '.join(names) or '<recipe a>, <recipe b>'}] (on the command line:"
                f" '+adaptive.recipes=[{','.join(names) or 'a,b'}]')",
            )
        )
        given_recipes = None
    given = list(given_recipes or [])
    chosen = [_recipe_named(r, recipes) for r in given]
    distinct = {str(r) for r in chosen}
    if question == "gap" and len(distinct) < 2 and given_recipes is not None:
        problems.append(
            _problem(
                "adaptive",
                "recipes",
                chosen,
                "a gap asks which of two or more recipes is lowest at `at`",
                "recipes: [<recipe a>, <recipe b>, ...]",
            )
        )
    elif len(distinct) < len(chosen):
        twice = sorted({str(r) for r in chosen if [str(c) for c in chosen].count(str(r)) > 1})
        problems.append(
            _problem(
                "adaptive",
                "recipes",
                chosen,
                f"names {', '.join(twice)} twice: a recipe is compared once",
                f"recipes: [{', '.join(sorted(distinct))}]",
            )
        )
    unknown = [r for r in chosen if recipes and r not in recipes]
    if unknown:
        problems.append(
            _problem(
                "adaptive",
                "recipes",
                given,
                f"names no recipe of the grid: {', '.join(map(str, unknown))} (the cells'"
                f" {_get(data, 'recipe_key', 'vars.recipe')} holds {', '.join(recipes)})",
                f"recipes: [{', '.join(recipes)}], or two or more of them",
            )
        )
    hours, cells = _get(data, "budget_gpu_hours"), _get(data, "budget_cells")
    if (hours is None) == (cells is None):
        problems.append(
            _problem(
                "adaptive",
                "budget_gpu_hours",
                hours,
                "exactly one budget is needed (budget_gpu_hours or budget_cells)",
                "e.g. budget_gpu_hours: 400",
            )
        )
    if hours is not None and (not _number(hours) or hours <= 0):
        problems.append(_problem("adaptive", "budget_gpu_hours", hours, "must be positive", "e.g. 400"))
    if cells is not None and (not isinstance(cells, int) or isinstance(cells, bool) or cells < 1):
        problems.append(_problem("adaptive", "budget_cells", cells, "must be a whole number >= 1", "e.g. 12"))
    batch = _get(data, "batch", 2)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        problems.append(_problem("adaptive", "batch", batch, "must be a whole number >= 1", "e.g. batch: 2"))
    level = _get(data, "level", 0.9)
    if not _number(level) or not 0 < level < 1:
        problems.append(_problem("adaptive", "level", level, "must lie in (0, 1)", "e.g. level: 0.9"))
    stop = _get(data, "stop_halfwidth")
    if stop is not None and (not _number(stop) or stop <= 0):
        problems.append(_problem("adaptive", "stop_halfwidth", stop, "must be positive", "e.g. 0.01 (nats)"))
    size_key = _get(data, "size_key", "")
    if not isinstance(size_key, str):
        problems.append(_problem("adaptive", "size_key", size_key, "must be a dotted key", "e.g. size_key: max_steps"))
        size_key = ""
    holdout = _get(data, "holdout") or []
    # a model name, or with size_key a size (a number)
    if isinstance(holdout, str) or not all(isinstance(h, str) or (size_key and _number(h)) for h in holdout):
        problems.append(
            _problem(
                "adaptive",
                "holdout",
                holdout,
                "must be a list of model names" + (" or sizes" if size_key else ""),
                "holdout: [delphi-1e22]" + (" (or holdout: [1638400])" if size_key else ""),
            )
        )
        holdout = []
    recipe_key = _get(data, "recipe_key", "vars.recipe")
    if not isinstance(recipe_key, str) or not recipe_key:
        problems.append(_problem("adaptive", "recipe_key", recipe_key, "must be a dotted key", "e.g. vars.recipe"))
    seed = _get(data, "seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        # numpy's seeded draws (design.py) take a whole number >= 0 only
        problems.append(_problem("adaptive", "seed", seed, "must be a whole number >= 0", "e.g. seed: 0"))
    candidates = _get(data, "forms")
    listed = [] if candidates is None or isinstance(candidates, (str, Mapping)) else list(candidates)
    if candidates is not None and (
        not listed or len(set(map(str, listed))) < len(listed) or any(f not in FORMS for f in listed)
    ):
        strange = [f for f in listed if f not in FORMS]
        problems.append(
            _problem(
                "adaptive",
                "forms",
                candidates,
                f"names no form: {strange}" if strange else "must be a list of distinct forms, one or more",
                f"some of {', '.join(FORMS)}, e.g. forms: [tail]",
            )
        )
    design = _get(data, "design")
    if design is not None and (design not in DESIGNS or question != "gap"):
        wrong = design not in DESIGNS
        problems.append(
            _problem(
                "adaptive",
                "design",
                design,
                "is not a design" if wrong else "chooses a gap question's cells; a loss question has one design",
                f"one of {', '.join(DESIGNS)}" if wrong else "drop design, or question: gap",
            )
        )
    if candidates is not None and question == "gap" and (design or DESIGNS[0]) == "ladder":
        problems.append(
            _problem(
                "adaptive",
                "forms",
                candidates,
                "chooses the forms of a race's or value's forecasts; a ladder (the default design of a gap question)"
                " forecasts by the power law through its two largest sizes, with no form to choose",
                "drop forms, or design: race",
            )
        )
    if problems:
        return None, problems
    return (
        AdaptiveSpec(
            str(question),
            float(at),
            tuple(chosen),
            tuple(str(h) for h in holdout),
            None if hours is None else float(hours),
            cells,
            int(batch),
            None if stop is None else float(stop),
            float(level),
            int(seed),
            str(recipe_key),
            size_key,
            tuple(str(f) for f in listed),
            DESIGNS[0] if design is None else str(design),
        ),
        [],
    )


def different_blocks(key: str) -> Problem:
    """The problem of a grid whose cells carry different `key:` blocks (prune or adaptive): a grid steers by one."""
    return Problem(
        cell=GRID,
        key=key,
        value="...",
        rule=f"{key}-block",
        message=f"the cells carry different {key}: blocks",
        fix=f"set {key}: once, in the sweep file",
    )
