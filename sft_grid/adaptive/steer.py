"""An adaptive grid's invocation: which of the sweep's cells this run of `sft-grid run` queues, from the files.

The sweep's cells are the pool. Each invocation reads every cell's state and final loss (the report's reading,
analysis/table.py), fits (design.choose), and passes on to the grid only the cells that are done, in flight, a
pre-registered holdout (they run so that the forecast can be checked against them; never fitted, never chosen) or
chosen now; the grid skips the first two as always, so only the new choice is queued. Running the command again
continues the loop; it ends at the budget or once the band is narrower than `stop_halfwidth`.

A round is appended to `<sweep dir>/.sft_grid_adaptive.jsonl` (what was observed, the forecasts and their bands,
the choice and why) before the grid queues it: by the grid flow, under the grid lock, once every rule has passed
(effects.py), never in a dry run. An invocation that finds its round already recorded (the same
cells observed: the orchestrator was killed after recording, before or while queueing) replays that round's choice
instead of choosing again. `<sweep dir>/adaptive.json` holds the latest round and each holdout's forecast beside
its realised value, for the report.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sft_grid import backends
from sft_grid.adaptive import race
from sft_grid.adaptive.candidates import Candidate
from sft_grid.adaptive.design import Round, choose, sizes_needed
from sft_grid.adaptive.effects import Effects
from sft_grid.adaptive.spec import AdaptiveSpec, different_blocks, parse_adaptive
from sft_grid.analysis import forms
from sft_grid.analysis.report_data import ADAPTIVE_FILE
from sft_grid.analysis.table import final_loss, final_losses
from sft_grid.core.layout import LEDGER_FILE, OUTPUT_DIR
from sft_grid.core.problems import GRID, Problem
from sft_grid.core.schema import exact_params
from sft_grid.core.state import State, state_of
from sft_grid.planning.cells import Cell, dirs_of, plan_cell
from sft_grid.planning.compose import Composed

RECORD_FILE = ".sft_grid_adaptive.jsonl"
SUMMARY_FILE = ADAPTIVE_FILE


def _value(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key; a section (e.g. `dataset`, a mix) is named by its keys joined with `+`."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return "+".join(map(str, node)) if isinstance(node, Mapping) else node


def _stands_for(cell: Cell) -> tuple[str, int] | None:
    """The model a cell's result stands for where the backend says it is not the cell's own (a replayed curve's)."""
    return backends.get(cell.spec.backend.name).stands_for(cell)


def _params(cell: Cell) -> int:
    """The parameter count of the model a cell's result stands for: the backend's (a replayed curve's model), else
    the cell's own model's."""
    found = _stands_for(cell)
    return found[1] if found else exact_params(cell.spec.model)


def _model_name(cell: Cell) -> str:
    """The name of the model a cell's result stands for (a replayed curve's model, else model.name): what a holdout
    names."""
    found = _stands_for(cell)
    return found[0] if found else cell.spec.model.name


def _gpu_hours(cells: Sequence[Cell], sizes: Mapping[str, float] | None = None) -> tuple[dict[str, float], str]:
    """Each cell's estimated GPU-hours (planning/costs.py), or where any is unknown, parameters / 1e9 for every cell
    (cells that see the same tokens cost in proportion to their size), times the cell's size over the smallest where
    the size is a data amount (`sizes`, from size_key: training on more costs in proportion): the cost the choice
    weighs."""
    from sft_grid.planning import costs

    found = costs.estimate(cells, {})
    hours = {n: e.gpu_hours for n, e in found.estimates.items() if e.gpu_hours}
    if all(c.name in hours for c in cells):
        return {n: float(h) for n, h in hours.items()}, "estimated GPU-hours"
    if sizes:
        least = min(sizes.values())
        return (
            {c.name: _params(c) / 1e9 * sizes[c.name] / least for c in cells},
            "parameters / 1e9 x size / the smallest size (no estimate for every cell)",
        )
    return {c.name: _params(c) / 1e9 for c in cells}, "parameters / 1e9 (no estimate for every cell)"


def _size(spec: AdaptiveSpec, cell: Cell, config: Mapping[str, Any]) -> float | None:
    """A cell's size on the question's axis: the exact parameter count of the model it stands for (_params), or the
    number at `size_key` (None where that is not a number above 0)."""
    if not spec.size_key:
        return float(_params(cell))
    value = _value(config, spec.size_key)
    return float(value) if forms.positive(value) else None


def _held(spec: AdaptiveSpec, cell: Cell, size: float | None) -> bool:
    """A pre-registered holdout: the name of the model the cell stands for is in `holdout`, or (size_key) its size
    is."""
    return _model_name(cell) in spec.holdout or bool(
        spec.size_key and size is not None and any(_as_number(h) == size for h in spec.holdout)
    )


def _as_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_rounds(sweep_dir: Path) -> list[dict[str, Any]]:
    path = sweep_dir / RECORD_FILE
    out = []
    for line in path.read_bytes().splitlines() if path.is_file() else ():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill (or not UTF-8): that round is taken again
    return out


def _append(sweep_dir: Path, record: Mapping[str, Any]) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with (sweep_dir / RECORD_FILE).open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def select(composed: Sequence[Composed]) -> tuple[list[Composed], list[str], Effects]:
    """The cells this invocation passes to the grid, what to tell the user (the round: forecasts, choice, why), and
    what the round writes, for the flow to apply once the grid has passed every rule. A grid without an `adaptive:`
    block is passed on whole; so is one whose block is refused, its problems in the effects (`problems`), which the
    flow reports with every other rule's."""
    effects = Effects("adaptive")
    blocks = {json.dumps(c.config.get("adaptive") or {}, sort_keys=True, default=str) for c in composed}
    if blocks == {"{}"} or not composed:
        return list(composed), [], effects
    first = composed[0]
    if len(blocks) > 1:
        effects.problems.append(different_blocks("adaptive"))
        return list(composed), [], effects
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    values = [_value(c.config, _recipe_key(first)) for c in composed]
    # a recipe_key that names no key of the cells has no recipes to check `recipes` against: _grid_problems names
    # the key instead
    recipes = sorted({str(v or "") for v in values}) if any(v is not None for v in values) else []
    spec, problems = parse_adaptive(first.config.get("adaptive"), recipes)
    if spec is not None and not problems:
        problems = _grid_problems(spec, cells, composed)
    if problems or spec is None:
        effects.problems += problems
        return list(composed), [], effects
    dirs = dirs_of(cells)
    sizes = {cell.name: _size(spec, cell, c.config) or 0.0 for cell, c in zip(cells, composed, strict=True)}
    hours, unit = _gpu_hours(cells, sizes if spec.size_key else None)
    pool, observed, in_flight = [], {}, []
    for cell, composed_cell, cell_dir in zip(cells, composed, dirs, strict=True):
        recipe = recipe_of(spec, composed_cell.config)
        holdout = _held(spec, cell, sizes[cell.name])
        pool.append(Candidate(cell.name, recipe, sizes[cell.name], hours[cell.name], holdout))
        if not (cell_dir / LEDGER_FILE).is_file():
            continue
        st = state_of(cell_dir).state
        if st is State.COMPLETED:
            loss = final_loss(final_losses(cell_dir / OUTPUT_DIR))
            if loss is not None:
                observed[cell.name] = loss
        elif st.in_flight and not holdout:
            in_flight.append(cell.name)
    sweep_dir = cells[0].sweep_dir
    fitted = sorted(n for n in observed if not next(c for c in pool if c.name == n).holdout)
    rounds = read_rounds(sweep_dir)
    (block,) = blocks
    # a round recorded with the same cells observed is replayed (the orchestrator died after recording it); one
    # recorded under another adaptive: block (a budget raised, another `at` or design) is chosen again: its choice
    # answered another question (a round recorded before blocks were kept counts as this block's)
    same = [r for r in rounds if r.get("observed") == fitted]
    replay = next((r for r in reversed(same) if r.get("block", block) == block), None)
    changed = next((r for r in reversed(same) if r.get("block", block) != block), None) if replay is None else None
    if replay is not None:
        chosen, why, stop = list(replay["chosen"]), list(replay["why"]), str(replay.get("stop", ""))
        lines = [
            f"adaptive: round {replay['round']} already recorded (the same {len(fitted)} cells observed):"
            " its choice again"
        ]
        result = None
    else:
        result = choose(spec, pool, {n: observed[n] for n in fitted}, in_flight=in_flight)
        chosen, why, stop = list(result.chosen), list(result.why), result.stop
        lines = [f"adaptive: round {len(rounds) + 1}, {len(fitted)} cells fitted, cost in {unit}"]
        if changed is not None:
            lines.append(
                f"  the adaptive: block differs from round {changed['round']}'s (the same cells observed):"
                f" {_changed_keys(changed['block'], block)}; chosen again under this one"
            )
        lines += [_forecast_line(f) for f in result.forecasts]
        lines.append(f"  the question's band half width: {result.halfwidth:.4g}; spent {result.spent:.4g}")
        if result.decision and len(result.forecasts) > 1:
            odds = "no probability yet" if result.p_wrong is None else f"wrong with probability {result.p_wrong:.3f}"
            lines.append(f"  the decision: {result.decision} is the lowest at {spec.at:.4g}; {odds}")
        record = {
            "round": len(rounds) + 1,
            "observed": fitted,
            "in_flight": sorted(in_flight),
            "unit": unit,
            "block": block,
        }
        effects.add(functools.partial(_append, sweep_dir, {**record, **_round_json(result)}))
    lines += [f"  next: {w}" for w in why]
    if stop:
        lines.append(f"  stop: {stop}")
    holdouts = [c.name for c in pool if c.holdout]
    keep = set(observed) | set(in_flight) | set(chosen) | set(holdouts)
    if result is not None:
        effects.add(functools.partial(_summary, sweep_dir, spec, result, pool, observed))
    return [c for c, cell in zip(composed, cells, strict=True) if cell.name in keep], lines, effects


def _changed_keys(before: str, now: str) -> str:
    """The keys whose values differ between two adaptive: blocks (as recorded: JSON), said `key: old -> new`."""
    try:
        old, new = json.loads(before), json.loads(now)
    except (TypeError, ValueError):
        return "another block"
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys) or "another block"


def _grid_problems(spec: AdaptiveSpec, cells: Sequence[Cell], composed: Sequence[Composed]) -> list[Problem]:
    """What makes an adaptive grid unable to answer, seen over its cells: a recipe key or holdout that names
    nothing, a recipe with fewer sizes than the question needs (design.sizes_needed: `loss` three to fit the law,
    `gap` three for a ladder's band, four for the race's and value's), cells of one recipe and size that differ in
    something else (a swept learning rate inside one fit)."""
    out = []
    if all(_value(c.config, spec.recipe_key) is None for c in composed):
        out.append(
            Problem(
                cell=GRID,
                key="adaptive.recipe_key",
                value=spec.recipe_key,
                rule="adaptive-block",
                message=f"{spec.recipe_key!r} names no key of the cells: every cell would be one recipe",
                fix="name the key whose value is a cell's recipe (e.g. vars.recipe, dataset), or set vars.recipe per"
                " cell",
            )
        )
    sizes = [_size(spec, cell, c.config) for cell, c in zip(cells, composed, strict=True)]
    unsized = [(cell, c) for cell, c, n in zip(cells, composed, sizes, strict=True) if n is None]
    if unsized:
        cell, c = unsized[0]
        out.append(
            Problem(
                cell=cell.name,
                key="adaptive.size_key",
                value=spec.size_key,
                rule="adaptive-block",
                message=f"{spec.size_key!r} holds {_value(c.config, spec.size_key)!r} in this cell"
                + (f" (and {len(unsized) - 1} more)" if len(unsized) > 1 else "")
                + ": a cell's size must be a number above 0",
                fix="name the key whose number is each cell's size (e.g. max_steps), or leave size_key"
                " empty to size cells by their model's parameters",
            )
        )
        return out
    if spec.size_key == spec.recipe_key:  # every recipe would be one size, every size one recipe
        out.append(
            Problem(
                cell=GRID,
                key="adaptive.size_key",
                value=spec.size_key,
                rule="adaptive-block",
                message="is recipe_key too: a cell's size and its recipe must be different keys (each recipe a curve"
                " over sizes)",
                fix="size_key: the key whose number is a cell's size (e.g. max_steps), recipe_key: the key that names"
                " its recipe (e.g. vars.recipe)",
            )
        )
        return out
    models = {_model_name(c) for c in cells}
    # a size names a holdout only on a size_key axis (as `_held` reads it): else a holdout is a model name
    unknown = [h for h in spec.holdout if h not in models and not (spec.size_key and _as_number(h) in set(sizes))]
    if unknown:
        what = "a model name (model.name, or the model a replayed cell stands for)" + (
            f" or a {spec.size_key} of a cell" if spec.size_key else ""
        )
        values = sorted(models) + ([f"{n:g}" for n in sorted({n for n in sizes if n})] if spec.size_key else [])
        out.append(
            Problem(
                cell=GRID,
                key="adaptive.holdout",
                value=list(spec.holdout),
                rule="adaptive-block",
                message=f"{', '.join(unknown)} names no model of the grid"
                + (f" and no {spec.size_key} of a cell" if spec.size_key else "")
                + f": a holdout is {what}",
                fix=f"one of {', '.join(values)}",
            )
        )
    groups: dict[tuple[str, str], list[Cell]] = {}
    size_at: dict[str, float] = {}  # each size's label (a model name, or the size as text) -> its size
    for cell, c, n in zip(cells, composed, sizes, strict=True):
        at = f"{n:g}" if spec.size_key else _model_name(cell)
        groups.setdefault((recipe_of(spec, c.config), at), []).append(cell)
        size_at[at] = n or 0.0
    size_of = {cell.name: n for cell, n in zip(cells, sizes, strict=True)}
    held = {m for (_, m), same in groups.items() if all(_held(spec, x, size_of[x.name]) for x in same)}
    need, why = sizes_needed(spec)
    for recipe in sorted({r for r, _ in groups}):
        if spec.recipes and recipe not in spec.recipes:
            continue  # a recipe the question does not name is never chosen from
        distinct = {m for r, m in groups if r == recipe and m not in held}
        if len(distinct) < need:
            out.append(
                Problem(
                    cell=GRID,
                    key="adaptive",
                    value=f"recipe {recipe or '(one recipe)'}: {len(distinct)} size(s)",
                    rule="adaptive-block",
                    message=f"question {spec.question} needs at least {need}"
                    f" {f'sizes ({spec.size_key})' if spec.size_key else 'model sizes'} per recipe besides the"
                    f" holdouts ({why})",
                    fix=f"sweep at least {need} sizes per recipe (or hold out fewer)",
                )
            )
    asked = {
        (r, m): same for (r, m), same in groups.items() if m not in held and (not spec.recipes or r in spec.recipes)
    }
    out += _at_problems(spec, {m for _, m in asked}, size_at, need)
    out += _budget_problems(spec, cells, sizes, asked, need, why)
    mixed = {key: same for key, same in sorted(groups.items()) if len(same) > 1}
    if mixed:
        differ = sorted(
            {o.split("=", 1)[0].lstrip("+") for same in mixed.values() for c in same for o in c.overrides}
            - {
                o.split("=", 1)[0].lstrip("+")
                for same in mixed.values()
                for o in set.intersection(*(set(c.overrides) for c in same))
            }
        )
        shown = ", ".join(f"{r or '(one recipe)'} at {m}" for r, m in list(mixed)[:3])
        out.append(
            Problem(
                cell=GRID,
                key=", ".join(differ) or "adaptive",
                value=f"{len(mixed)} recipe-size pair(s) with several cells"
                f" ({shown}{', ...' if len(mixed) > 3 else ''})",
                rule="adaptive-block",
                message="cells of one recipe and size differ in "
                + (", ".join(differ) or "something else")
                + ": one fit would mix them as if they were one curve",
                fix="make it part of the recipe (adaptive.recipe_key names a key that tells them apart), or fix it per"
                " size (e.g. each size's best lr from a pruned sweep)",
            )
        )
    return out


def _exact(n: float) -> str:
    """A size as a holdout or `at` names it: whole numbers in full (1557611200, not 1.55761e+09)."""
    return str(int(n)) if float(n).is_integer() else repr(float(n))


def _at_problems(spec: AdaptiveSpec, fitted: set[str], size_at: Mapping[str, float], need: int) -> list[Problem]:
    """`at` is the size the question forecasts, beyond the sizes the grid fits: one at or below a size the grid
    trains (not held out) would be read off that cell, interpolated, or extrapolated downward, which is no forecast."""
    above = sorted((m for m in fitted if size_at[m] >= spec.at), key=lambda m: (size_at[m], m))
    if not above:
        return []
    largest = max(size_at[m] for m in fitted)
    axis = spec.size_key or "parameters"
    names = [_exact(size_at[m]) if spec.size_key else m for m in above]
    shown = names if spec.size_key else [f"{m} at {size_at[m]:.4g}" for m in above]
    if len(above) == len(fitted) and spec.at < size_at[above[0]]:
        message = (
            f"is below every size the grid fits (the smallest: {shown[0]}): the question would be extrapolated down"
            " from larger cells, not forecast beyond them"
        )
    else:
        message = (
            f"is not beyond the sizes the grid fits: it trains {', '.join(shown)} (at or above `at`, not held out),"
            " so the question would be read off cells it trains or interpolated, not forecast beyond them"
        )
    fixes = [f"at: the size to forecast, above {_exact(largest)} (the largest size the grid fits, in {axis})"]
    if len(fitted) - len(above) >= need:
        held = ", ".join([*spec.holdout, *names])
        fixes.append(f"hold those sizes out to check the forecast against them (holdout: [{held}])")
    else:
        fixes.append(f"sweep {need} or more sizes below {_exact(spec.at)}")
    value = int(spec.at) if spec.at.is_integer() else spec.at
    return [
        Problem(
            cell=GRID, key="adaptive.at", value=value, rule="adaptive-block", message=message, fix=", or ".join(fixes)
        )
    ]


def _up(x: float) -> str:
    """x rounded up to three significant figures: a budget that affords x."""
    if x <= 0:
        return "0"
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / unit - 1e-6) * unit:.3g}"


def _budget_problems(
    spec: AdaptiveSpec,
    cells: Sequence[Cell],
    sizes: Sequence[float | None],
    asked: Mapping[tuple[str, str], Sequence[Cell]],
    need: int,
    why: str,
) -> list[Problem]:
    """A budget below the question's seed design (`need` sizes of each recipe asked, design.sizes_needed; a race's
    seed window, race.window, where the recipe has that many sizes) never reaches a decision: refused with the least
    budget that does, in cells or in the cost the choice weighs (_gpu_hours: the seed's cheapest sizes)."""
    recipes = sorted({r for r, _ in asked})
    if not recipes:
        return []
    # each recipe's sizes, the cheapest cell's cost of each (in cells: 1)
    hours: Mapping[str, float] = {}
    unit = ""
    if spec.budget_cells is None:
        by_size = {cell.name: n or 0.0 for cell, n in zip(cells, sizes, strict=True)}
        hours, unit = _gpu_hours(cells, by_size if spec.size_key else None)
    costs: dict[str, list[float]] = {
        r: sorted(min(hours.get(c.name, 1.0) for c in same) for (q, _), same in asked.items() if q == r)
        for r in recipes
    }
    raced = spec.question == "gap" and spec.design == "race"
    if raced:
        need, why = (
            max(need, race.window(spec.forms)),
            "a race's seed window: the fewest sizes its forms need for a band",
        )
    fewer = " (all its sizes, where a recipe has fewer)" if any(len(costs[r]) < need for r in recipes) else ""
    seed = f"the question's seed design, {need} sizes of each of {len(recipes)} recipe(s){fewer} ({why})"
    if spec.budget_cells is not None:
        fewest = sum(len(costs[r][:need]) for r in recipes)
        if spec.budget_cells >= fewest:
            return []
        return [
            Problem(
                cell=GRID,
                key="adaptive.budget_cells",
                value=spec.budget_cells,
                rule="adaptive-block",
                message=f"affords fewer cells than {seed}: the loop would stop before any decision",
                fix=f"budget_cells: {fewest} or more",
            )
        ]
    if spec.budget_gpu_hours is None:
        return []
    least = sum(sum(costs[r][:need]) for r in recipes)
    if spec.budget_gpu_hours >= least * (1 - 1e-9):
        return []
    return [
        Problem(
            cell=GRID,
            key="adaptive.budget_gpu_hours",
            value=spec.budget_gpu_hours,
            rule="adaptive-block",
            message=f"affords less than {seed}: their cheapest cells cost {least:.4g} in {unit}, so the loop"
            " would stop before any decision",
            fix=f"budget_gpu_hours: {_up(least)} or more",
        )
    ]


def recipe_of(spec: AdaptiveSpec, config: Mapping[str, Any]) -> str:
    """A cell's recipe: the value its config holds at the question's recipe_key, as text (empty: none)."""
    return str(_value(config, spec.recipe_key) or "")


def _recipe_key(c: Composed) -> str:
    block = c.config.get("adaptive") or {}
    return str(block.get("recipe_key") or "vars.recipe") if isinstance(block, Mapping) else "vars.recipe"


def _forecast_line(f: Any) -> str:
    if f.value is None:
        return f"  {f.recipe or '(one recipe)'}: no fit yet ({f.points} cells)"
    if f.lo is None:  # three parameters through three points: every resample that fits is the same curve
        return f"  {f.recipe or '(one recipe)'}: forecast {f.value:.4f} from {f.points} cells (an exact fit, no band)"
    return f"  {f.recipe or '(one recipe)'}: forecast {f.value:.4f} [{f.lo:.4f}, {f.hi:.4f}] from {f.points} cells"


def _round_json(r: Round) -> dict[str, Any]:
    return {
        "forecasts": [asdict(f) for f in r.forecasts],
        "halfwidth": r.halfwidth if r.halfwidth != float("inf") else None,
        "spent": r.spent,
        "chosen": list(r.chosen),
        "why": list(r.why),
        "stop": r.stop,
        "decision": r.decision,
        "p_wrong": r.p_wrong,
    }


def _summary(
    sweep_dir: Path, spec: AdaptiveSpec, r: Round, pool: Sequence[Candidate], observed: Mapping[str, float]
) -> None:
    """adaptive.json: the latest round, and each holdout's realised value beside its recipe's forecast and band."""
    by = {f.recipe: f for f in r.forecasts}
    holdouts = []
    for c in pool:
        if c.holdout:
            f = by.get(c.recipe)
            holdouts.append(
                {
                    "cell": c.name,
                    "recipe": c.recipe,
                    "params": None if spec.size_key else c.n,
                    "size": c.n,
                    "forecast": f.value if f else None,
                    "lo": f.lo if f else None,
                    "hi": f.hi if f else None,
                    "realised": observed.get(c.name),
                    "at_question_size": c.n == spec.at,
                }
            )
    data = {"question": asdict(spec), **_round_json(r), "holdouts": holdouts}
    tmp = sweep_dir / f".{SUMMARY_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(sweep_dir / SUMMARY_FILE)
