"""The grid flow, for every cell at once: plan -> validate -> check -> decide -> render -> submission plan -> schedule.

Called by the command line (sft_grid/app.py) with the cells Hydra composed. Nothing is written or submitted
unless every cell passes every rule and check (GridError, with every problem). A cell that is completed or in
flight is never submitted again; failed cells are listed and rerun on request. A dry run builds the same plan a
real run executes, writes its cells' files and returns; nothing else changes. The flow prints nothing: it
returns a `GridResult`, and tells an `Observer` when all is queued and as each local cell ends (the command line
shows progress).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from sft_grid.backends import BACKENDS
from sft_grid.checks.examples import Examples, first_examples
from sft_grid.checks.preflight import Preflight, preflight
from sft_grid.core.cellfiles import Check
from sft_grid.core.layout import OUTPUT_DIR, iter_cell_dirs, output_complete
from sft_grid.core.problems import GridError, Problem
from sft_grid.core.state import CellState, State
from sft_grid.core.submission import LocalJob, Role, SubmissionPlan
from sft_grid.grid import estimates
from sft_grid.grid.decide import Action, BaseDecision, Decision, decide, decide_base
from sft_grid.grid.execute import Executed, SubmitRefused, apply, run_local
from sft_grid.grid.lock import SweepLock
from sft_grid.grid.recover import plan_recovery
from sft_grid.grid.render import render, render_base, write_all
from sft_grid.grid.submission import build
from sft_grid.grid.triage import settle
from sft_grid.grid.view import read_view
from sft_grid.planning.cells import Cell, plan_cell
from sft_grid.planning.compose import Composed, CompositionError
from sft_grid.planning.evals import base_targets, merge_eval_axis
from sft_grid.planning.inputs import Prep, preps
from sft_grid.planning.messages import composition_problem
from sft_grid.planning.validate import validate
from sft_grid.schedulers import slurm

log = logging.getLogger(__name__)


@dataclass
class GridResult:
    cells: list[Cell]
    decisions: list[Decision]
    plan: SubmissionPlan
    dry_run: bool
    # cell name -> checks that could not run here and run as the job's first step
    deferred: dict[str, list[Check]]
    # each model prep the grid's cells need, with its cells
    preps: dict[Prep, list[Cell]]
    examples: Examples | None = None
    # the base models the cells' suites evaluate, once per grid
    bases: list[BaseDecision] = field(default_factory=list)
    # what each cell will cost (None: estimates turned off)
    costs: estimates.GridCosts | None = None
    executed: Executed | None = None
    # local cells this invocation ran and waited for: their final state
    final: dict[Path, CellState] = field(default_factory=dict)
    refused: SubmitRefused | None = None

    @property
    def states(self) -> list[str]:
        """The state of each requested cell, in request order, after this invocation."""
        failed = self.executed.prep_failed if self.executed else {}
        return [State.FAILED.value if d.dir in failed else (self.final.get(d.dir) or d.state).state.value
                for d in self.decisions]

    @property
    def failed(self) -> list[str]:
        """Cells this invocation ran that did not complete."""
        failed = set(self.executed.prep_failed if self.executed else {})
        failed |= {d for d, st in self.final.items() if st.state is not State.COMPLETED}
        return [d.cell.name for d in self.decisions if d.dir in failed and d.action is Action.RUN]


def _backend_rules(cell: Cell) -> Iterable[Problem]:
    backend = BACKENDS.get(cell.spec.backend.name)
    if backend is None:
        return [Problem(cell.name, "backend.name", cell.spec.backend.name, "backend-known",
                        "no such backend in sft_grid/backends", f"use one of {', '.join(sorted(BACKENDS))}")]
    return backend.problems(cell)


def plan_cells(composed: Sequence[Composed], errors: Sequence[CompositionError]) -> tuple[list[Cell], list[Problem]]:
    problems = [composition_problem(e.overrides, e.message) for e in errors]
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    problems += validate(cells, _backend_rules)
    return merge_eval_axis(cells), problems


def cell_dirs(cells: Sequence[Cell]) -> list[Path]:
    """Each cell's directory: an existing one with the same identity, else <runs_root>/<sweep>/<name>."""
    existing: dict[Path, dict[str, Path]] = {}
    dirs = []
    for cell in cells:
        sweep_dir = cell.sweep_dir
        if sweep_dir not in existing:
            existing[sweep_dir] = {p.name.rsplit("-", 1)[-1]: p for p in iter_cell_dirs(sweep_dir)}
        dirs.append(existing[sweep_dir].get(cell.key, sweep_dir / cell.name))
    return dirs


class Observer:
    """What the command line is told while the flow runs (it prints; the flow does not)."""

    def queued(self, result: "GridResult") -> None:
        """Everything is submitted or recorded; local cells are about to run."""

    def local_done(self, job: LocalJob, state: CellState) -> None:
        """A local job ended."""


def run(composed: Sequence[Composed], errors: Sequence[CompositionError], observer: Observer = Observer(),
        ) -> GridResult:
    cells, problems = plan_cells(composed, errors)
    checked: Preflight | None = preflight(cells) if not problems else None
    if checked is not None:
        problems += checked.problems
    if problems:
        raise GridError(problems)
    assert checked is not None
    dirs = cell_dirs(cells)
    dry_run = any(c.spec.dry_run for c in cells)
    needed = preps(cells)
    targets = base_targets(cells)
    costs = None if estimates.env_disabled() else estimates.estimate(cells, checked.lengths)
    if costs is not None:
        # before anything is written: every cell that would train (completed ones are skipped unless forced)
        too_long = estimates.problems(costs, [c for c, d in zip(cells, dirs)
                                              if c.spec.force or not output_complete(d / OUTPUT_DIR)])
        if too_long:
            raise GridError(too_long, "the estimates")
    with SweepLock({c.sweep_dir for c in cells}):
        view = read_view(dirs, [p.dir for p in needed], [t.dir for t in targets])
        if not dry_run:  # a dry run writes nothing but its cells' files
            settle(view, dirs)
        decisions = []
        for cell, cell_dir in zip(cells, dirs):
            state, recovery = view.state(cell_dir), None
            if state.recovered:
                recovery, state = plan_recovery(cell_dir, state, view.histories[cell_dir])
            decisions.append(decide(cell, cell_dir, state, view.histories[cell_dir], view.scheduler, recovery))
        bases = [decide_base(t, view.histories[t.dir], view.scheduler) for t in targets]
        writes = [estimates.with_file(render(d.cell, d.dir, checked.deferred.get(d.cell.name, [])), costs,
                                      d.cell.name if d.action is Action.RUN else None)
                  for d in decisions if d.touch_files and (dry_run or d.action is not Action.SKIP)]
        writes += [render_base(b.target) for b in bases if dry_run or b.evaluate]
        on_slurm = any(d.cell.spec.cluster.executor == "slurm" and d.action is not Action.SKIP for d in decisions)
        on_slurm |= any(b.target.cell.spec.cluster.executor == "slurm" and b.evaluate for b in bases)
        max_size = slurm.max_array_size() if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE
        plan = build(decisions, view.histories, view.scheduler, max_size, writes, bases)
        result = GridResult(cells, decisions, plan, dry_run, checked.deferred, needed, bases=bases, costs=costs)
        if dry_run:
            write_all(plan.writes)
            result.examples = first_examples(cells)
            return result
        try:
            result.executed = apply(plan)
        except SubmitRefused as exc:
            result.refused = exc
            return result
    observer.queued(result)
    result.final = run_local(plan, result.executed, observer.local_done)
    return result


__all__ = ["GridResult", "Role", "cell_dirs", "plan_cells", "run"]
