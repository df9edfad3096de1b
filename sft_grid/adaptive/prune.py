"""A pruned grid's invocation: each run of `sft-grid run` reads the cells' files, takes the rungs' decisions
(halving.py), records them, and passes on to the grid only the cells that train a leg now.

A cell's legs: its job trains to the next rung (leg.json beside its cell.yaml: the step, and the cooldown probe's
length; the backend ends the leg there with its checkpoint saved and, under `guard: cooldown`, writes the probe;
LLaMA-Factory and axolotl end it through the job runner's SFT_GRID_LEG_STOP, in_venv/leg_stop.py, and run no probe,
so for them only `guard: position` is accepted), and
then the cell is `planned` again, waiting at its rung. Once every surviving cell of its bracket is at the rung, the
next invocation decides it: the kept cells get their next leg (from their checkpoint; the last leg trains to the
end), the others are marked `pruned` in their ledger with the rung's evidence (their checkpoints stay: resume one by
hand with `bash launch.sh resume_from_checkpoint=output/checkpoint-<step>` in its directory). Nothing here talks to
a job: the files on the shared filesystem are the only channel, so it works on offline sites and multi-node cells.

Kill-safety: decisions are recorded (fsynced) before anything acts on them and never recomputed (halving.py); a
leg file is written before its cell is queued, and rewriting it is idempotent; a `pruned` event is written once.
Nothing is written here: the writes are returned (effects.py) and the grid flow applies them under the grid lock
once every rule has passed, never in a dry run, which prints the decision instead.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sft_grid.adaptive import halving
from sft_grid.adaptive.effects import Effects
from sft_grid.adaptive.spec import PruneSpec, different_blocks, parse_adaptive, parse_prune
from sft_grid.adaptive.steer import recipe_of
from sft_grid.backends import BACKENDS
from sft_grid.backends.base import LEG_FILE
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import LEDGER_FILE, OUTPUT_DIR
from sft_grid.core.problems import GRID, Problem
from sft_grid.core.state import State, state_of
from sft_grid.planning.cells import Cell, dirs_of, plan_cell
from sft_grid.planning.compose import Composed


def _value(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def total_steps(cell: Cell) -> int:
    """The cell's last step: its max_steps, else its backend's default (the synthetic backend's)."""
    s = cell.spec
    return s.max_steps if s.max_steps > 0 else int(s.backend.train_defaults.get("max_steps") or 0)


def _tokens_per_step(cell: Cell) -> int:
    return cell.spec.global_batch_size * cell.spec.cutoff_len


def _problems(spec: PruneSpec, cells: Sequence[Cell]) -> list[Problem]:
    out = []
    for cell in cells:
        name = cell.spec.backend.name
        backend = BACKENDS.get(name)
        if backend is not None and backend.legs is None:
            out.append(
                Problem(
                    cell=cell.name,
                    key="backend.name",
                    value=name,
                    rule="prune-block",
                    message="pruning ends legs of training at rungs, and this backend cannot end a leg at a step yet",
                    fix="backend=llamafactory (guard: position or extrapolate), backend=synthetic (the simulator) or"
                    " backend=replay (real curves), or drop the prune: block",
                )
            )
        elif backend is not None and spec.guard == "cooldown" and not backend.cooldown_probe:
            out.append(
                Problem(
                    cell=cell.name,
                    key="prune.guard",
                    value=spec.guard,
                    rule="prune-block",
                    message=f"the {name} backend runs no cooldown probe from a rung's checkpoint yet (only the"
                    " synthetic"
                    " simulator does)",
                    fix="guard: extrapolate (each cell's logged curve extrapolated to the schedule's end), or guard:"
                    " position (the logged loss at the rung's step, smoothed over the last logging points)",
                )
            )
        if not total_steps(cell):
            out.append(
                Problem(
                    cell=cell.name,
                    key="max_steps",
                    value=cell.spec.max_steps,
                    rule="prune-block",
                    message="pruning needs the cells' last step to place the rungs before it",
                    fix="set max_steps",
                )
            )
        every = cell.spec.logging_steps
        off = [r for r in spec.rung_steps(_tokens_per_step(cell)) if r % every]
        first = min(spec.rung_steps(_tokens_per_step(cell)), default=0)
        if spec.guard == "extrapolate" and every and first // every < halving.MIN_POINTS:
            # the evidence is a fit of the logged curve: the first rung needs enough logged points before it
            out.append(
                Problem(
                    cell=cell.name,
                    key="prune.rungs",
                    value=list(spec.rungs),
                    rule="prune-block",
                    message=f"under guard: extrapolate each cell's logged curve is fitted up to the rung, and the"
                    " first rung"
                    f" (step {first}) has {first // every} logged point(s) before it (logging_steps {every}); the fit"
                    f" needs {halving.MIN_POINTS}",
                    fix=_enough_points(spec, cell, first, every),
                )
            )
        if spec.guard in ("position", "extrapolate") and off:
            # the evidence is the loss logged at the rung; a rung between logging points has none, and the resumed
            # leg's first log would average a different span of steps than an unbroken run's
            out.append(
                Problem(
                    cell=cell.name,
                    key="prune.rungs",
                    value=off,
                    rule="prune-block",
                    message=f"under guard: {spec.guard} each rung (in steps) must be a step the trainer logs: a"
                    " multiple of"
                    f" logging_steps ({every})",
                    fix=_logged_rungs(spec, cell, every),
                )
            )
    return out


def _steps_text(spec: PruneSpec, cell: Cell, steps: Sequence[int]) -> str:
    """Rungs at these steps, as the block writes them (steps, or the tokens those steps have seen)."""
    if spec.unit == "steps":
        return f"rungs: [{', '.join(map(str, steps))}]"
    tokens = _tokens_per_step(cell)
    return f"rungs: [{', '.join(f'{s * tokens:g}' for s in steps)}] (tokens: steps {', '.join(map(str, steps))})"


def _enough_points(spec: PruneSpec, cell: Cell, first: int, every: int) -> str:
    """The fix for a first rung with too few logged points before it under guard: extrapolate, only the changes that
    keep every rung before the cell's last step and at a logged step: a later first rung at this logging_steps, a
    finer logging_steps for these rungs, else both (or a longer cell, or a guard that fits nothing)."""
    need, last = halving.MIN_POINTS * every, total_steps(cell)
    rungs = spec.rung_steps(_tokens_per_step(cell))
    fixes = []
    if not last or need < last:
        later = sorted({need, *(r for r in rungs if r > need and r % every == 0)})
        fixes.append(
            f"a first rung at step {need} or later"
            + (f", before the last step {last}" if last else "")
            + f" ({_steps_text(spec, cell, later)})"
        )
    # the largest logging_steps that logs enough points before the first rung and logs every rung
    finer = next((n for n in range(first // halving.MIN_POINTS, 0, -1) if all(r % n == 0 for r in rungs)), 0)
    if 0 < finer < every:
        fixes.append(f"logging_steps={finer}")
    if not fixes and every > 1 and last and last > halving.MIN_POINTS:
        fixes.append(
            f"logging_steps=1 with a first rung at step {halving.MIN_POINTS} or later, before the last step {last}"
            f" ({_steps_text(spec, cell, [halving.MIN_POINTS])})"
        )
    if not fixes:
        fixes.append(
            f"longer cells (max_steps above {need}), or guard: position (the logged loss at the rung, no fit of the"
            " curve)"
        )
    return "; or ".join(fixes)


def _logged_rungs(spec: PruneSpec, cell: Cell, every: int) -> str:
    """The fix for rungs between logging points: the rungs moved down to logged steps where that keeps one before
    the cell's last step, or logging at every step."""
    last = total_steps(cell)
    steps = spec.rung_steps(_tokens_per_step(cell))
    moved = sorted({max(every, r // every * every) for r in steps})
    fixes = ["logging_steps=1"]
    if moved and (not last or moved[-1] < last):
        fixes.insert(0, f"rungs at multiples of {every} ({_steps_text(spec, cell, moved)})")
    return ", or ".join(fixes)


def _grid_problems(
    spec: PruneSpec, cells: Sequence[Cell], composed: Sequence[Composed], brackets: Mapping[str, Sequence[str]]
) -> list[Problem]:
    """What makes a pruned grid unable to work, seen over its cells: a grouping key that names nothing, rungs past
    a cell's end, brackets with nothing to compare, brackets that mix model sizes."""
    out = [
        Problem(
            cell=GRID,
            key="prune.by",
            value=key,
            rule="prune-block",
            message=f"{key!r} names no key of the cells: every cell would fall in one bracket",
            fix="name a key the cells set, as the sweep's axes write it (e.g. model.name, lr, vars.recipe)",
        )
        for key in spec.by
        if all(_value(c.config, key) is None for c in composed)
    ]
    for cell in cells:
        last = total_steps(cell)
        rungs = spec.rung_steps(_tokens_per_step(cell))
        if last and rungs and rungs[-1] >= last:
            unit = "tokens" if spec.unit == "tokens" else "steps"
            out.append(
                Problem(
                    cell=cell.name,
                    key="prune.rungs",
                    value=list(spec.rungs),
                    rule="prune-block",
                    message=f"the last rung ({spec.rungs[-1]:g} {unit}, step {rungs[-1]}) is not before this cell's"
                    " last step"
                    f" ({last}): the cell would never be compared there",
                    fix=f"rungs before every cell's end (the shortest cell ends at step"
                    f" {min(total_steps(c) for c in cells)}), or cells of one length",
                )
            )
    repeated = next((c for c in cells if len(set(r := spec.rung_steps(_tokens_per_step(c)))) < len(r)), None)
    if repeated is not None:  # rungs in tokens closer than a step: two rungs on one step
        last = total_steps(repeated)
        below = sorted({max(1, last // 9), max(1, last // 3)} - {last}) if last else []
        out.append(
            Problem(
                cell=repeated.name,
                key="prune.rungs",
                value=list(spec.rungs),
                rule="prune-block",
                message=f"fall on the steps {list(spec.rung_steps(_tokens_per_step(repeated)))} (a step here is"
                f" {_tokens_per_step(repeated)} tokens): two rungs on one step compare the cells there twice",
                fix="rungs a step or more apart"
                + (f", e.g. {_steps_text(spec, repeated, below)}" if len(below) > 1 else "")
                + (" (or unit: steps, if these are steps)" if spec.unit == "tokens" else ""),
            )
        )
    if all(len(names) < 2 for names in brackets.values()):
        out.append(
            Problem(
                cell=GRID,
                key="prune",
                value=f"{len(cells)} cell(s) in {len(brackets)} bracket(s)",
                rule="prune-block",
                message="no bracket has two cells: pruning compares the cells of a bracket, so it would prune nothing",
                fix="sweep the values a bracket compares (e.g. lr=1e-5,2e-5,4e-5), or drop prune:",
            )
        )
    compared = [len(names) for names in brackets.values() if len(names) > 1]
    # the fixed fraction (halving.decide_rung's count); guard: extrapolate keeps by the bands, fewer where they part
    fixed = spec.guard != "extrapolate"
    if fixed and compared and all(math.ceil(n * spec.keep - 1e-9) >= n for n in compared):
        n = max(compared)
        out.append(
            Problem(
                cell=GRID,
                key="prune.keep",
                value=spec.keep,
                rule="prune-block",
                message=f"keeps every cell of every bracket (the best ceil(keep x n) of a bracket's n cells go on, and"
                f" the largest bracket has {n}): it would prune nothing",
                fix=f"keep: {math.floor((n - 1) / n * 100) / 100:g} or less",
            )
        )
    by_name = {c.name: c for c in cells}
    for label, names in brackets.items():
        sizes = sorted({by_name[n].spec.model.name for n in names})
        if len(sizes) > 1:
            out.append(
                Problem(
                    cell=GRID,
                    key="prune.by",
                    value=list(spec.by),
                    rule="prune-block",
                    message=f"bracket {label} mixes models ({', '.join(sizes)}): the smaller would be pruned for"
                    " being small,"
                    " not for its learning rate",
                    fix="group by the model: prune.by=[model.name" + "".join(f",{b}" for b in spec.by) + "]",
                )
            )
    return out + _mixed_recipes(spec, cells, composed, brackets)


def _mixed_recipes(
    spec: PruneSpec, cells: Sequence[Cell], composed: Sequence[Composed], brackets: Mapping[str, Sequence[str]]
) -> list[Problem]:
    """Brackets that hold cells of two or more of the recipes the grid's `adaptive:` question compares: halving
    would drop a recipe for its loss at a rung, and the question needs every recipe's cells (a refused adaptive:
    block is named by steer.py, not here)."""
    block = composed[0].config.get("adaptive") if composed else None
    adaptive, problems = parse_adaptive(block) if isinstance(block, Mapping) and block else (None, [])
    if adaptive is None or problems:
        return []
    recipe = {cell.name: recipe_of(adaptive, c.config) for cell, c in zip(cells, composed, strict=True)}
    adaptive, _ = parse_adaptive(block, sorted(set(recipe.values())))  # `recipes` named as numbers: the grid's
    if adaptive is None:
        return []
    asked = set(adaptive.recipes) or set(recipe.values())
    mixed = {
        label: found
        for label, names in brackets.items()
        if len(found := sorted({recipe[n] for n in names} & asked)) > 1
    }
    if not mixed:
        return []
    label, found = next(iter(mixed.items()))
    by = ",".join([*spec.by, adaptive.recipe_key])
    return [
        Problem(
            cell=GRID,
            key="prune.by",
            value=list(spec.by),
            rule="prune-block",
            message=f"bracket {label} mixes recipes the adaptive: question compares ({', '.join(found)})"
            + (f", and {len(mixed) - 1} more bracket(s) do" if len(mixed) > 1 else "")
            + f": halving would prune a recipe for its loss at a rung, and the {adaptive.question} question needs"
            " every recipe's cells",
            fix=f"group by the recipe too: prune.by=[{by}]",
        )
    ]


def select(composed: Sequence[Composed]) -> tuple[list[Composed], list[str], Effects]:
    """The cells this invocation passes to the grid, what to tell the user (each rung's decision, the step each
    cell trains to), and what the decision writes, for the flow to apply once the grid has passed every rule. A
    grid without a `prune:` block is passed on whole; so is one whose block is refused, its problems in the effects
    (`problems`), which the flow reports with every other rule's."""
    effects = Effects("prune")
    blocks = {json.dumps(c.config.get("prune") or {}, sort_keys=True, default=str) for c in composed}
    if blocks == {"{}"} or not composed:
        return list(composed), [], effects
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    totals = {total_steps(c) for c in cells}
    spec, problems = parse_prune(composed[0].config.get("prune"), min(totals) if len(totals) == 1 else None)
    if len(blocks) > 1:
        problems.append(different_blocks("prune"))
    if spec is not None:
        problems += _problems(spec, cells)
    brackets: dict[str, list[str]] = {}
    for cell, c in zip(cells, composed, strict=True):
        label = ",".join(f"{k}={_value(c.config, k)}" for k in (spec.by if spec is not None else ()))
        brackets.setdefault(label or "all", []).append(cell.name)
    if spec is not None and not problems:
        problems = _grid_problems(spec, cells, composed, brackets)
    if problems or spec is None:
        effects.problems += problems
        return list(composed), [], effects
    dirs = dirs_of(cells)
    by_name = dict(zip((c.name for c in cells), dirs, strict=True))
    cells_by = {c.name: c for c in cells}
    rungs = spec.rung_steps(_tokens_per_step(cells[0]))
    states = {n: (state_of(d) if (d / LEDGER_FILE).is_file() else None) for n, d in by_name.items()}

    def at_least(name: str, step: int) -> bool:
        return (by_name[name] / OUTPUT_DIR / f"checkpoint-{step}").is_dir()

    def evidence(name: str, step: int) -> float | None:
        if spec.guard == "cooldown":
            return halving.probe_loss(by_name[name], step)
        if not at_least(name, step):
            return None
        if spec.guard == "extrapolate":
            cell = cells_by[name]
            end = halving.schedule_end(cell.spec.scheduler)
            return halving.extrapolated_loss(by_name[name], step, total_steps(cell), end)
        return halving.logged_loss(by_name[name], step)

    sweep_dir = cells[0].sweep_dir
    plan = halving.plan(
        brackets, rungs, evidence, halving.read_record(sweep_dir), spec.keep, at_least, spec.guard, spec.metric
    )
    lines = [
        f"prune: {len(brackets)} bracket(s), rungs at steps {list(rungs)}, {spec.keep:.0%} kept, guard {spec.guard}"
    ]
    for d in plan.new:
        lines.append(f"  rung {d.rung + 1} of {d.bracket}: kept {', '.join(d.kept)}; pruned {', '.join(d.pruned)}")
        effects.add(functools.partial(halving.write_decision, sweep_dir, d))
    run: set[str] = set()
    pruned: set[str] = set()
    for a in plan.actions:
        st = states[a.cell]
        if a.kind == "prune":
            pruned.add(a.cell)
            if st is None or st.state is not State.PRUNED:
                event = Event.here(Kind.PRUNED, reason=a.why, step=a.step)
                effects.add(functools.partial(events.append, by_name[a.cell], event))
            continue
        if st is not None and (st.state.in_flight or st.state is State.COMPLETED):
            continue  # in flight: waiting for it; completed: nothing left (the grid skips it)
        # a probe: at its rung without its evidence (a leg cut after its checkpoint): the same leg again, which
        # resumes at the rung and only probes
        effects.add(functools.partial(_write_leg, by_name[a.cell], a.step, spec))
        lines.append(f"  {a.cell} trains to step {a.step if a.step is not None else total_steps(cells_by[a.cell])}")
        run.add(a.cell)
    # the grid also gets the cells it only reports (in flight, completed, pruned: it skips them, saying why); a cell
    # waiting at its rung for its bracket is left out, so that nothing queues it
    shown = {n for n, st in states.items() if st is not None and (st.state.in_flight or st.state is not State.PLANNED)}
    held = sorted(n for n in by_name if n not in run | shown | pruned and states[n] is not None)
    lines.append(f"  {len(run)} cell(s) train a leg now" + (f"; {len(held)} wait at their rung" if held else ""))
    return [c for c, cell in zip(composed, cells, strict=True) if cell.name in run | shown], lines, effects


def _write_leg(cell_dir: Path, step: int | None, spec: PruneSpec) -> None:
    """leg.json for the cell's next job (written before it is queued); the last leg trains to the end: none."""
    path = cell_dir / LEG_FILE
    if step is None:
        path.unlink(missing_ok=True)
        return
    probe = max(1, round(spec.probe * step)) if spec.guard == "cooldown" else 0
    cell_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LEG_FILE}.tmp")
    tmp.write_text(json.dumps({"stop_at_step": step, "probe_steps": probe}) + "\n")
    tmp.replace(path)
