"""The grid flow, for every cell at once: plan -> validate -> check -> decide -> render -> submission plan -> schedule.

Called by the command line (sft_grid/cli/app.py) with the cells Hydra composed. Nothing is written or submitted
unless every cell passes every rule and check (GridError, with every problem). A cell that is completed or in
flight is never submitted again; failed cells are listed and rerun on request. A dry run builds the same plan a
real run executes, writes its cells' files and returns; nothing else changes. The flow prints nothing: it
returns a `GridResult`, and tells an `Observer` when all is queued and as each local cell ends (the command line
shows progress).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

from sft_grid.backends import BACKENDS
from sft_grid.checks.examples import Examples, first_examples
from sft_grid.checks.preflight import preflight
from sft_grid.core.cellfiles import Check
from sft_grid.core.layout import LOCK_FILE, OUTPUT_DIR, iter_cell_dirs, output_complete
from sft_grid.core.lock import hold_all
from sft_grid.core.problems import GridError, Problem
from sft_grid.core.provenance import checkout
from sft_grid.core.state import CellState, State
from sft_grid.core.submission import LocalJob, Role, SubmissionPlan
from sft_grid.grid import costs as estimates
from sft_grid.grid.decide import Action, BaseDecision, Decision, decide, decide_base, plan_recovery
from sft_grid.grid.execute import Executed, SubmitRefused, apply, run_local
from sft_grid.grid.jobs import build
from sft_grid.grid.render import render, render_base, write_all
from sft_grid.grid.triage import settle
from sft_grid.grid.view import read_view
from sft_grid.planning.cells import Cell, plan_cell
from sft_grid.planning.compose import Composed, CompositionError, composition_problem
from sft_grid.planning.evaluation import base_targets, merge_eval_axis
from sft_grid.planning.inputs import Prep, preps
from sft_grid.planning.validate import validate
from sft_grid.schedulers import slurm
from sft_grid.stages import tokenize
from sft_grid.stages.staging import StagingFailed, StagingPlan, budget_for, plan_staging, provenance, stage_here
from sft_grid.stages.staging.in_job import StageWork, stage_dir
from sft_grid.stages.staging.values import Progress
from sft_grid.stages.tokenize import Tokenization

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
    # the grid's Hub inputs: pinned, staged or to stage, sizes and free space
    staging: StagingPlan | None = None
    # cell dir -> the tokenized dataset it shares (cells that run, tokenize_once)
    tokenized: dict[Path, Tokenization] = field(default_factory=dict)
    # kind of check -> distinct inputs that passed it before anything was queued
    passed: dict[str, int] = field(default_factory=dict)
    # a dry run's checks of inputs a real run stages here first (and then checks before queueing)
    after_staging: dict[str, list[Check]] = field(default_factory=dict)
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

    def staging(self, plan: StagingPlan) -> None:
        """Transfers of the grid's Hub inputs start here."""

    def progress(self, progress: Progress) -> None:
        """Bytes of a transfer arrived (often: a few times a second)."""


def run(composed: Sequence[Composed], errors: Sequence[CompositionError], observer: Observer = Observer(),
        ) -> GridResult:
    cells, problems = plan_cells(composed, errors)
    if problems:
        raise GridError(problems)
    dirs = cell_dirs(cells)
    dry_run = any(c.spec.dry_run for c in cells)
    cells, staged = _stage(cells, dirs, dry_run, observer)
    if any(c.spec.stage_only for c in cells):
        return GridResult(cells, [], SubmissionPlan(), dry_run, {}, {}, staging=staged)
    checked = preflight(cells)
    if checked.problems:
        raise GridError(checked.problems)
    needed = preps(cells)
    targets = base_targets(cells)
    tokens = tokenize.plan(cells)
    costs = None if estimates.env_disabled() else estimates.estimate(cells, checked.lengths)
    if costs is not None:
        # before anything is written: every cell that would train (completed ones are skipped unless forced)
        too_long = estimates.problems(costs, [c for c, d in zip(cells, dirs)
                                              if c.spec.force or not output_complete(d / OUTPUT_DIR)])
        if too_long:
            raise GridError(too_long, "the estimates")
    with hold_all(d / LOCK_FILE for d in {c.sweep_dir for c in cells}):  # one invocation per sweep at a time
        work = _stage_work(cells, dirs, staged)
        view = read_view(dirs, [p.dir for p in needed] + ([work.dir] if work else [])
                         + sorted({t.dir for t in tokens.values()}), [t.dir for t in targets])
        if not dry_run:  # a dry run writes nothing but its cells' files
            settle(view, dirs)
        decisions = []
        for cell, cell_dir in zip(cells, dirs):
            state, recovery = view.state(cell_dir), None
            if state.recovered:
                recovery, state = plan_recovery(cell_dir, state, view.histories[cell_dir])
            decisions.append(decide(cell, cell_dir, state, view.histories[cell_dir], view.scheduler, recovery))
        bases = [decide_base(t, view.histories[t.dir], view.scheduler) for t in targets]
        decisions, shared = _share_tokenized(decisions, tokens, checked.deferred)
        writes = [estimates.with_file(render(d.cell, d.dir, checked.deferred.get(d.cell.name, [])), costs,
                                      d.cell.name if d.action is Action.RUN else None)
                  for d in decisions if d.touch_files and (dry_run or d.action is not Action.SKIP)]
        writes += [render_base(b.target) for b in bases if dry_run or b.evaluate]
        on_slurm = any(d.cell.spec.cluster.executor == "slurm" and d.action is not Action.SKIP for d in decisions)
        on_slurm |= any(b.target.cell.spec.cluster.executor == "slurm" and b.evaluate for b in bases)
        max_size = slurm.max_array_size() if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE
        recorded = {d.dir: provenance(d.cell.pins, checkout()) for d in decisions if d.action is Action.RUN}
        plan = replace(build(decisions, view.histories, view.scheduler, max_size, writes, bases, work, shared),
                       provenance=recorded)
        result = GridResult(cells, decisions, plan, dry_run, checked.deferred, needed, bases=bases, costs=costs,
                            staging=staged, passed=checked.passed, tokenized=shared)
        if dry_run:
            result.deferred, result.after_staging = _after_staging(checked.deferred, staged)
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


def _stage(cells: list[Cell], dirs: list[Path], dry_run: bool, observer: Observer,
           ) -> tuple[list[Cell], StagingPlan]:
    """Pin every Hub input of the grid, and stage what must be staged here (not in a dry run): the cells as they
    then load their inputs. Problems (a missing repository, too little space, a failed transfer) are raised."""
    staged = plan_staging(cells, dirs, dry_run)
    if staged.problems():
        raise GridError(staged.problems(), "staging")
    cells = [replace(c, pins=staged.pins[c.name]) if staged.pins.get(c.name) else c for c in cells]
    if not dry_run and any(i.here for i in staged.pending):
        observer.staging(staged)
        try:
            stage_here(staged, budget_for(cells), observer.progress)
        except StagingFailed as exc:
            raise GridError(exc.problems(), "staging") from exc
    return cells, staged


def _share_tokenized(decisions: list[Decision], tokens: dict[str, Tokenization], deferred: dict[str, list[Check]],
                     ) -> tuple[list[Decision], dict[Path, Tokenization]]:
    """The cells that run load their shared tokenized dataset; where it is not built yet, their first step checks
    that it was (`deferred` gets that check)."""
    shared: dict[Path, Tokenization] = {}
    built: dict[Path, bool] = {}  # each tokenization's marker read once, not once per cell
    out = []
    for d in decisions:
        tok = tokens.get(d.cell.name)
        if d.action is not Action.RUN or tok is None:
            out.append(d)
            continue
        shared[d.dir] = tok
        out.append(replace(d, cell=replace(d.cell, tokenized=tok.data)))
        if tok.dir not in built:
            built[tok.dir] = tok.data.complete
        if not built[tok.dir]:
            deferred.setdefault(d.cell.name, []).append(Check("tokenized", "tokenized", str(tok.dir)))
    return out, shared


def _stage_work(cells: Sequence[Cell], dirs: Sequence[Path], staged: StagingPlan) -> StageWork | None:
    """The staging job of this invocation: what must be staged where the cluster says a job stages it."""
    items = [i for i in staged.pending if not i.here and i.pin is not None]
    if not items:
        return None
    users = {cell for i in items for cell, _ in i.users}
    mine = [(c, d) for c, d in zip(cells, dirs) if c.name in users]
    pins = tuple(i.pin for i in items if i.pin is not None)
    first = mine[0][0]
    return StageWork(stage_dir(first.runs_root, pins), pins, frozenset(d for _, d in mine), first.spec.cluster)


def _after_staging(deferred: dict[str, list[Check]], staged: StagingPlan,
                   ) -> tuple[dict[str, list[Check]], dict[str, list[Check]]]:
    """A dry run's deferred checks split: those still deferred in a real run, and those that read an input a real
    run stages on this machine first (they run then, before anything is queued)."""
    here = tuple(str(i.pin.path) for i in staged.pending if i.here and i.pin is not None)
    later: dict[str, list[Check]] = {}
    after: dict[str, list[Check]] = {}
    for name, checks in deferred.items():
        for check in checks:
            reads = (check.target, check.model)
            waits = any(r and (r == h or r.startswith(h + "/")) for r in reads for h in here)
            (after if waits else later).setdefault(name, []).append(check)
    return later, after


__all__ = ["GridResult", "Role", "cell_dirs", "plan_cells", "run"]
