"""The grid flow, for every cell at once: observe, then plan, then execute.

    check(composed)          -> Inputs     compose -> validate -> stage -> preflight -> preps, tokenizations, estimates
    observe(inputs)          -> Observed   what the world says now: each ledger, the scheduler's jobs (one sacct and
                                           squeue call a site), the cluster's MaxArraySize, the checkout's revision,
                                           a grid across sites' facts and expected starts (sbatch --test-only); in a
                                           real run the triage of failures the scheduler ended, recorded in their
                                           ledgers, the notifications of cells and grids that ended, sent, and the
                                           steps of the moves off a failed site (sites/moves.py)
    plan(inputs, observed)   -> GridPlan   each cell's decision, its files and the submission plan: pure (it writes
                                           nothing, sends nothing, starts no process; it reads the cells' own marker
                                           files) and frozen
    execute(plan)            -> Executed   the plan's writes, sbatch calls and local jobs before the cells, and nothing
                                           else (a dry run's plan: its cells' files only)
    run(composed)            -> GridResult the four in order, under the grid's lock from the observation to the
                                           execution; then the local cells, waited for

Called by the command line (sft_grid/cli/app.py) with the cells Hydra composed. Nothing is written or submitted
unless every cell passes every rule and check (GridError, with every problem). A cell that is completed or in
flight is never submitted again; failed cells are listed and rerun on request. A dry run observes without
recording anything (no triage, no notification), makes the same plan a real run executes and writes its cells'
files; nothing else changes. The flow prints nothing: it tells an `Observer` what it is doing (the command line
shows it: the plan at once, then each phase's progress) and returns a `GridResult`.

Effects, all of them: `check` stages fetches into the site's Hugging Face cache (not in a dry run); `observe`
records triage and sends notifications (not in a dry run); `execute` does what the plan says. Planning twice over
one observation gives the same plan and changes nothing (tests/test_grid_decisions.py).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sft_grid.adaptive.effects import Effects
from sft_grid.adaptive.prune import select as halving_step
from sft_grid.adaptive.steer import select as design_step
from sft_grid.analysis.view import GridView, read_view
from sft_grid.backends import BACKENDS, extra
from sft_grid.checks import own_envs
from sft_grid.checks.examples import Examples, first_examples
from sft_grid.checks.preflight import Preflight, preflight
from sft_grid.core.cellfiles import Check
from sft_grid.core.layout import LEDGER_FILE, LOCK_FILE, OUTPUT_DIR, PREVIEW_DIR, output_complete
from sft_grid.core.lock import hold_all
from sft_grid.core.problems import GridError, Problem
from sft_grid.core.provenance import checkout
from sft_grid.core.schema import ClusterConf
from sft_grid.core.scores import checkpoint_steps
from sft_grid.core.state import CellState, State, state_of
from sft_grid.core.submission import CellFiles, CodeSnapshot, LocalJob, Role, SubmissionPlan
from sft_grid.grid.decide import Action, BaseDecision, Decision, decide, decide_base, plan_recovery
from sft_grid.grid.execute import Executed, SubmitRefused, apply, run_local
from sft_grid.grid.jobs import build
from sft_grid.grid.render import in_the_way, render, render_base, render_eval, runs_tree, write_all
from sft_grid.grid.spread import spread
from sft_grid.grid.triage import settle
from sft_grid.planning import costs as grid_costs
from sft_grid.planning.cells import Cell, dirs_of, plan_cell
from sft_grid.planning.compose import Composed, CompositionError
from sft_grid.planning.evaluation import BaseTarget, along_of, base_targets, merge_eval_axis
from sft_grid.planning.hydra_errors import composition_problem
from sft_grid.planning.inputs import Prep, preps
from sft_grid.planning.validate import validate
from sft_grid.schedulers import slurm
from sft_grid.sites import facts as site_facts
from sft_grid.sites import placement, snapshot
from sft_grid.sites.moves import observe_moves
from sft_grid.sites.placement import SiteFacts
from sft_grid.stages import tokenize
from sft_grid.stages.staging import StagingFailed, StagingPlan, budget_for, plan_staging, provenance, stage_here
from sft_grid.stages.staging.in_job import StageWork, stage_dir
from sft_grid.stages.staging.plan import check_inputs
from sft_grid.stages.staging.values import Progress
from sft_grid.stages.tokenize import Tokenization

log = logging.getLogger(__name__)


class Observer:
    """What the command line is told while the flow runs (it prints; the flow does not). Every method may be
    called from the flow's thread only; none may raise."""

    def steered(self, lines: Sequence[str]) -> None:
        """A steered grid's decision (adaptive/: the round's forecasts and choice, each rung's kept and pruned cells,
        the step each cell trains to), before the grid is checked: what this invocation runs, and why."""

    def planned(self, cells: int, counts: Mapping[str, int]) -> None:
        """The grid's cells, and how many will run or be skipped (by their state), before any check that needs a
        backend: what a person sees within a second or two."""

    def phase(self, name: str, done: int, total: int, detail: str = "") -> None:
        """A phase that may take a while (the loss-mask check, model preps, tokenizing, waiting for local cells):
        `done` of `total` so far; called when it starts (done=0), as it advances, and when it ends."""

    def staging(self, plan: StagingPlan) -> None:
        """Transfers of the grid's Hub inputs start here."""

    def progress(self, progress: Progress) -> None:
        """Bytes of a transfer arrived (often: a few times a second)."""

    def queued(self, result: GridResult) -> None:
        """Everything is submitted or recorded; local cells are about to run."""

    def local_progress(self, running: Mapping[LocalJob, CellState]) -> None:
        """The local cells that run now, each with its step and loss so far (about once a second)."""

    def local_done(self, job: LocalJob, state: CellState) -> None:
        """A local job ended."""


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What the checks found, before anything is decided: every cell passed every rule and check."""

    cells: tuple[Cell, ...]
    dirs: tuple[Path, ...]
    dry_run: bool
    staging: StagingPlan
    checked: Preflight = field(default_factory=lambda: Preflight([], {}, 0))
    # each model prep the grid's cells need, with its cells
    preps: Mapping[Prep, tuple[Cell, ...]] = field(default_factory=dict)
    targets: tuple[BaseTarget, ...] = ()
    tokens: Mapping[str, Tokenization] = field(default_factory=dict)
    costs: grid_costs.GridCosts | None = None
    # the commit (and any shipped changes) the grid's Slurm jobs run (sites/snapshot.py); None: no Slurm job, or
    # not a git checkout
    code: CodeSnapshot | None = None
    # the cluster profile of each site the grid is spread over (sites=[...]); empty: the cells' own cluster
    sites: Mapping[str, ClusterConf] = field(default_factory=dict)

    @property
    def work(self) -> StageWork | None:
        """The staging job of this invocation: what must be staged where the cluster says a job stages it."""
        return _stage_work(self.cells, self.dirs, self.staging)


@dataclass(frozen=True, kw_only=True)
class Observed:
    """What `observe` read of the world for a plan (the cells' own marker files `plan` reads itself)."""

    # each ledger (cells, preps, the staging job, tokenizations, base models), with the triage observe recorded,
    # the scheduler's jobs, each cell's state
    view: GridView
    # the cluster's MaxArraySize (Slurm's default where no cell goes to Slurm or the cluster cannot be asked)
    max_array_size: int
    # the sft_grid version and git revision each submission records (core/provenance.py)
    checkout: Mapping[str, Any]
    # cell dir -> the steps of its whole checkpoints, for the cells whose suites score along training
    checkpoints: Mapping[Path, tuple[int, ...]] = field(default_factory=dict)
    # each site of a grid across sites: reachable, its nodes, its scheduler's expected starts
    sites: tuple[SiteFacts, ...] = ()
    # cell dir -> the site it leaves, for the cells whose move is confirmed (sites/moves.py): queued elsewhere
    moving: Mapping[Path, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GridPlan:
    """Everything an invocation will do, decided before anything of it is written or run."""

    cells: tuple[Cell, ...]
    decisions: tuple[Decision, ...] = ()
    submission: SubmissionPlan = field(default_factory=SubmissionPlan)
    dry_run: bool
    # cell name -> checks that could not run here and run as the job's first step
    deferred: Mapping[str, tuple[Check, ...]] = field(default_factory=dict)
    # each model prep the grid's cells need, with its cells
    preps: Mapping[Prep, tuple[Cell, ...]] = field(default_factory=dict)
    # the base models the cells' suites evaluate, once per grid
    bases: tuple[BaseDecision, ...] = ()
    # what each cell will cost (None: estimates turned off)
    costs: grid_costs.GridCosts | None = None
    # the grid's Hub inputs: pinned, staged or to stage, sizes and free space
    staging: StagingPlan | None = None
    # cell dir -> the tokenized dataset it shares (cells that run, tokenize_once)
    tokenized: Mapping[Path, Tokenization] = field(default_factory=dict)
    # kind of check -> distinct inputs that passed it before anything was queued
    passed: Mapping[str, int] = field(default_factory=dict)
    # a dry run's checks of inputs a real run stages on this machine first (and then checks before queueing)
    after_staging: Mapping[str, tuple[Check, ...]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class GridResult:
    """A plan and what its execution did. The plan's fields read through (result.cells, result.decisions, ...);
    `result.plan` is its submission plan."""

    grid: GridPlan
    executed: Executed | None = None
    # local cells this invocation ran and waited for: their final state
    final: Mapping[Path, CellState] = field(default_factory=dict)
    refused: SubmitRefused | None = None
    examples: Examples | None = None  # a dry run's first example of each source

    @property
    def cells(self) -> tuple[Cell, ...]:
        return self.grid.cells

    @property
    def decisions(self) -> tuple[Decision, ...]:
        return self.grid.decisions

    @property
    def plan(self) -> SubmissionPlan:
        return self.grid.submission

    @property
    def dry_run(self) -> bool:
        return self.grid.dry_run

    @property
    def deferred(self) -> Mapping[str, tuple[Check, ...]]:
        return self.grid.deferred

    @property
    def preps(self) -> Mapping[Prep, tuple[Cell, ...]]:
        return self.grid.preps

    @property
    def bases(self) -> tuple[BaseDecision, ...]:
        return self.grid.bases

    @property
    def costs(self) -> grid_costs.GridCosts | None:
        return self.grid.costs

    @property
    def staging(self) -> StagingPlan | None:
        return self.grid.staging

    @property
    def tokenized(self) -> Mapping[Path, Tokenization]:
        return self.grid.tokenized

    @property
    def passed(self) -> Mapping[str, int]:
        return self.grid.passed

    @property
    def after_staging(self) -> Mapping[str, tuple[Check, ...]]:
        return self.grid.after_staging

    @property
    def states(self) -> list[str]:
        """The state of each requested cell, in request order, after this invocation."""
        failed = self.executed.prep_failed if self.executed else {}
        return [
            State.FAILED.value if d.dir in failed else (self.final.get(d.dir) or d.state).state.value
            for d in self.decisions
        ]

    @property
    def failed(self) -> list[str]:
        """Cells this invocation ran that did not complete."""
        failed = set(self.executed.prep_failed if self.executed else {})
        failed |= {d for d, st in self.final.items() if st.state is not State.COMPLETED}
        return [d.cell.name for d in self.decisions if d.dir in failed and d.action is Action.RUN]


def steer(composed: Sequence[Composed], observer: Observer) -> tuple[list[Composed], list[Effects]]:
    """A steered grid's decision: a sweep with an `adaptive:` block runs only the cells its fit chooses this round,
    one with a `prune:` block only the legs of the cells its rungs keep (adaptive/steer.py, prune.py: decided from
    the cells' files); a grid with neither passes whole. Returns the cells to run and what the decisions write (their
    `effects`, applied by `run` under the lock once every rule has passed; never in a dry run), and tells the
    observer the decision."""
    composed, steering, adaptive = design_step(composed)
    composed, pruning, pruned = halving_step(composed)
    if steering or pruning:
        observer.steered([*steering, *pruning])
    return composed, [adaptive, pruned]


def run(
    composed: Sequence[Composed],
    errors: Sequence[CompositionError],
    observer: Observer | None = None,
    only: Collection[str] | None = None,
) -> GridResult:
    """The grid: steer, check, observe, plan, execute. `only`: the names of the cells this invocation may act on (a
    site's share of a grid across remote sites, sites/coordinate.py); None: every cell."""
    observer = observer or Observer()
    # read before steering: a round may leave no cell to read it from, and a dry run's round is never recorded
    dry_run = any(bool(c.config.get("dry_run")) for c in composed)
    composed, steering = steer(composed, observer)
    inputs = check(composed, errors, observer, only, [p for s in steering for p in s.problems])
    if any(c.spec.stage_only or c.spec.check_only for c in inputs.cells):
        return GridResult(grid=GridPlan(cells=inputs.cells, dry_run=inputs.dry_run, staging=inputs.staging))
    with hold_all([d / LOCK_FILE for d in sorted({c.sweep_dir for c in inputs.cells})]):
        if not (inputs.dry_run or dry_run):
            for decision in steering:
                decision.apply()
        grid = plan(inputs, observe(inputs))
        try:
            executed = execute(grid, observer)
        except SubmitRefused as exc:
            return GridResult(grid=grid, refused=exc)
    if grid.dry_run:
        return GridResult(grid=grid, examples=first_examples(list(grid.cells)))
    result = GridResult(grid=grid, executed=executed)
    observer.queued(result)
    return replace(result, final=run_local(grid.submission, executed, observer.local_done, observer.local_progress))


# -- check: every rule and every check, before anything is decided ----------------------------------------------


def check(
    composed: Sequence[Composed],
    errors: Sequence[CompositionError],
    observer: Observer,
    only: Collection[str] | None = None,
    steering_problems: Sequence[Problem] = (),
) -> Inputs:
    cells, problems = plan_cells(composed, errors)
    problems += steering_problems  # the prune: and adaptive: blocks' (adaptive/spec.py), named with every other
    if only is not None:
        cells = [c for c in cells if c.name in only]
    sites, site_problems = placement.profiles(cells)  # sites=[...], every cell feasible on one
    problems += site_problems or placement.static_problems(cells, sites)
    if problems:
        raise GridError(problems)
    dirs = dirs_of(cells)
    in_the_runs_tree = runs_tree(cells, dirs)  # a file where a directory goes, ...: before a ledger is read
    if in_the_runs_tree:
        raise GridError(in_the_runs_tree)
    observer.planned(len(cells), _provisional(cells, dirs))
    dry_run = any(c.spec.dry_run for c in cells)
    code = None
    if not any(c.spec.stage_only or c.spec.check_only for c in cells):
        # the commit the jobs will run; a dirty checkout is refused here, before anything is written
        code = snapshot.find(cells, dry_run)
    if any(c.spec.check_only for c in cells):  # `sft-grid check`: the Hub's answers for every input, nothing else
        return Inputs(cells=tuple(cells), dirs=tuple(dirs), dry_run=True, staging=check_inputs(cells, dirs))
    # the environments the cells name themselves (a site's own venv or conda environment), before any transfer: a
    # python that does not run or lacks the backend stops the grid before hours of staging, not after
    environments = own_envs.check(cells)
    if environments[0]:
        raise GridError(environments[0])
    cells, staged = _stage(cells, dirs, dry_run, observer)
    if any(c.spec.stage_only for c in cells):
        return Inputs(cells=tuple(cells), dirs=tuple(dirs), dry_run=dry_run, staging=staged)
    checked = preflight(
        cells,
        on_phase=lambda done, total, detail: observer.phase("checks", done, total, detail),
        environments=environments,
    )
    if checked.problems:
        raise GridError(checked.problems)
    costs = None if grid_costs.env_disabled() else grid_costs.estimate(cells, checked.lengths)
    if costs is not None:
        # before anything is written: every cell that would train (completed ones are skipped unless forced)
        too_long = grid_costs.problems(
            costs, [c for c, d in zip(cells, dirs, strict=True) if c.spec.force or not output_complete(d / OUTPUT_DIR)]
        )
        if too_long:
            raise GridError(too_long, "the estimates")
    return Inputs(
        cells=tuple(cells),
        dirs=tuple(dirs),
        dry_run=dry_run,
        staging=staged,
        checked=checked,
        preps=MappingProxyType({p: tuple(users) for p, users in preps(cells).items()}),
        targets=tuple(base_targets(cells)),
        tokens=MappingProxyType(tokenize.plan(cells)),
        costs=costs,
        code=code,
        sites=MappingProxyType(sites),
    )


def plan_cells(composed: Sequence[Composed], errors: Sequence[CompositionError]) -> tuple[list[Cell], list[Problem]]:
    problems = [composition_problem(e.overrides, e.message) for e in errors]
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    problems += validate(cells, _backend_rules)
    return merge_eval_axis(cells), problems


def _backend_rules(cell: Cell) -> Iterable[Problem]:
    backend = BACKENDS.get(cell.spec.backend.name)
    if backend is None:
        return [
            Problem(
                cell=cell.name,
                key="backend.name",
                value=cell.spec.backend.name,
                rule="backend-known",
                message="no such backend in sft_grid/backends",
                fix=f"use one of {', '.join(sorted(BACKENDS))}",
            )
        ]
    return [*backend.problems(cell), *extra.collisions(backend, cell)]


def _provisional(cells: Sequence[Cell], dirs: Sequence[Path]) -> dict[str, int]:
    """How many cells will run and how many are skipped, by state, as their own files say now (no scheduler query:
    the decisions after the checks are the ones that hold): a new or planned cell runs, a forced one runs again."""
    counts: dict[str, int] = {}
    for cell, cell_dir in zip(cells, dirs, strict=True):
        state = state_of(cell_dir).state if (cell_dir / LEDGER_FILE).is_file() else State.PLANNED
        what = "to run" if state is State.PLANNED or (cell.spec.force and not state.in_flight) else state.value
        counts[what] = counts.get(what, 0) + 1
    return counts


def _stage(
    cells: list[Cell],
    dirs: list[Path],
    dry_run: bool,
    observer: Observer,
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


# -- plan: each cell's decision, its files, the submission plan ---------------------------------------------------


def observe(inputs: Inputs, *, record: bool | None = None) -> Observed:
    """What the world says now, for `plan`: each ledger and the scheduler's jobs (one query for the grid), the
    cluster's MaxArraySize, the checkout. When it records (a real run's, run under the grid's lock with `plan` and
    `execute` right after it; `record` None: unless a dry run) also its effects: failures the scheduler ended are
    triaged and recorded in their ledgers, and the cells and grids that ended are notified, once (grid/triage.py,
    as `status` does). Otherwise it only reads."""
    work = inputs.work
    view = read_view(
        inputs.dirs,
        [p.dir for p in inputs.preps] + ([work.dir] if work else []) + sorted({t.dir for t in inputs.tokens.values()}),
        [t.dir for t in inputs.targets],
    )
    if (not inputs.dry_run) if record is None else record:
        view = settle(view, inputs.dirs)
    # asked when any cell could go to Slurm: the plan decides which do
    on_slurm = any(c.spec.cluster.executor == "slurm" for c in [*inputs.cells, *(t.cell for t in inputs.targets)])
    along = {d: checkpoint_steps(d / OUTPUT_DIR) for c, d in zip(inputs.cells, inputs.dirs, strict=True) if along_of(c)}
    sites = site_facts.observe(inputs.sites, [placement.need_of(c) for c in inputs.cells]) if inputs.sites else ()
    recording = (not inputs.dry_run) if record is None else record
    # a site that does not answer, or cells queued past move_after: their moves' steps (sites/moves.py)
    moving = observe_moves(inputs.cells, inputs.dirs, view.histories, view.state, sites, recording) if sites else {}
    return Observed(
        view=view,
        max_array_size=slurm.max_array_size() if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE,
        checkout=MappingProxyType(checkout()),
        checkpoints=MappingProxyType(along),
        sites=sites,
        moving=MappingProxyType(moving),
    )


def plan(inputs: Inputs, observed: Observed) -> GridPlan:
    """The frozen plan of this invocation, from the checked inputs and what `observe` saw: pure (it writes nothing,
    sends nothing, starts no process; it reads the cells' own marker files: a prep or a tokenization built, a
    submission file in place, post-training stages done), so the same inputs and observation give the same plan."""
    cells, tokens, view = inputs.cells, inputs.tokens, observed.view
    decisions = [
        _decide(cell, cell_dir, view, observed.checkpoints.get(cell_dir, ()), observed.moving)
        for cell, cell_dir in zip(cells, inputs.dirs, strict=True)
    ]
    bases = tuple(decide_base(t, view.histories[t.dir], view.scheduler) for t in inputs.targets)
    hub_cells = {cell for i in inputs.staging.pending for cell, _ in i.users}
    # each cell on its site; a moving cell on another than the one it leaves. Placed before the stages
    # are planned: whether a tokenization is worth a job of its own, and where the jobs before training are
    # queued (grid/jobs.py: on each site that has a cell waiting for them), are the placed cells'
    decisions, on_sites = spread(decisions, observed.sites, view.histories, hub_cells, observed.moving)
    decisions, shared, deferred = _share_tokenized(decisions, tokens, inputs.checked.deferred)
    writes = [
        _previewed(
            grid_costs.with_file(
                render(d.cell, d.dir, list(deferred.get(d.cell.name, ()))),
                inputs.costs,
                d.cell.name if d.action is Action.RUN else None,
            ),
            d,
            inputs.dry_run,
        )
        for d in decisions
        if d.touch_files and (inputs.dry_run or d.action is not Action.SKIP)
    ]
    # a skipped cell whose checkpoints are scored now: its eval.json as the suites say today (its other files stay)
    scoring = [d for d in decisions if d.action is Action.SKIP and d.evaluate]
    writes += [_previewed(render_eval(d.cell, d.dir), d, inputs.dry_run) for d in scoring if d.touch_files]
    writes += [render_base(b.target) for b in bases if inputs.dry_run or b.evaluate]
    on_slurm = any(
        d.cell.spec.cluster.executor == "slurm" and (d.action is not Action.SKIP or d.evaluate) for d in decisions
    )
    on_slurm |= any(b.target.cell.spec.cluster.executor == "slurm" and b.evaluate for b in bases)
    max_size = observed.max_array_size if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE
    recorded = {
        d.dir: {**provenance(d.cell.pins, dict(observed.checkout)), **on_sites.get(d.dir, {})}
        for d in decisions
        if d.action is Action.RUN
    }
    submission = build(
        decisions,
        view.histories,
        view.scheduler,
        max_size,
        writes=writes,
        bases=bases,
        staging=inputs.work,
        tokenized=shared,
        provenance=recorded,
    )
    submission = snapshot.pin(submission, inputs.code)  # the Slurm jobs run the commit, never the live checkout
    after: Mapping[str, tuple[Check, ...]] = {}
    if inputs.dry_run:
        deferred, after = _after_staging(deferred, inputs.staging)
    return GridPlan(
        cells=cells,
        decisions=tuple(decisions),
        submission=submission,
        dry_run=inputs.dry_run,
        deferred=MappingProxyType(deferred),
        preps=inputs.preps,
        bases=bases,
        costs=inputs.costs,
        staging=inputs.staging,
        tokenized=MappingProxyType(shared),
        passed=MappingProxyType(dict(inputs.checked.passed)),
        after_staging=MappingProxyType(after),
    )


def _decide(cell: Cell, cell_dir: Path, view: GridView, steps: Sequence[int], moving: Mapping[Path, str]) -> Decision:
    if cell_dir in moving:  # its job on the site it leaves can train nothing (its gate): queued again, elsewhere
        return decide(cell, cell_dir, CellState(State.PLANNED), view.histories[cell_dir], view.scheduler)
    state, recovery = view.state(cell_dir), None
    if state.recovered:
        recovery, state = plan_recovery(cell_dir, state, view.histories[cell_dir])
    return decide(cell, cell_dir, state, view.histories[cell_dir], view.scheduler, recovery, steps)


def _share_tokenized(
    decisions: Sequence[Decision],
    tokens: Mapping[str, Tokenization],
    deferred: Mapping[str, Sequence[Check]],
) -> tuple[list[Decision], dict[Path, Tokenization], dict[str, tuple[Check, ...]]]:
    """The cells that run load their shared tokenized dataset, where one is worth a job of its own (`worth_a_job`: a
    cell that runs here alone on its data tokenizes in its own job); where it is not built yet (a job before the cell
    builds it), their first step checks that it was: the deferred checks with that one added."""
    users: dict[Path, list[Cell]] = {}
    for d in decisions:
        if d.action is Action.RUN and d.cell.name in tokens:
            users.setdefault(tokens[d.cell.name].dir, []).append(d.cell)
    shared: dict[Path, Tokenization] = {}
    built: dict[Path, bool] = {}  # each tokenization's marker read once, not once per cell
    out = []
    checks = {name: tuple(c) for name, c in deferred.items()}
    for d in decisions:
        tok = tokens.get(d.cell.name)
        if d.action is not Action.RUN or tok is None or not tokenize.worth_a_job(tok, users[tok.dir]):
            out.append(d)
            continue
        shared[d.dir] = tok
        out.append(replace(d, cell=replace(d.cell, tokenized=tok.data)))
        if tok.dir not in built:
            built[tok.dir] = tok.data.complete
        if not built[tok.dir]:
            checks[d.cell.name] = (*checks.get(d.cell.name, ()), Check("tokenized", "tokenized", str(tok.dir)))
    return out, shared, checks


def _stage_work(cells: Sequence[Cell], dirs: Sequence[Path], staged: StagingPlan) -> StageWork | None:
    """The staging job of this invocation: what must be staged where the cluster says a job stages it."""
    items = [i for i in staged.pending if not i.here and i.pin is not None]
    if not items:
        return None
    users = {cell for i in items for cell, _ in i.users}
    mine = [(c, d) for c, d in zip(cells, dirs, strict=True) if c.name in users]
    pins = tuple(i.pin for i in items if i.pin is not None)
    first = mine[0][0]
    return StageWork(
        dir=stage_dir(first.runs_root, pins), pins=pins, cells=frozenset(d for _, d in mine), cluster=first.spec.cluster
    )


def _after_staging(
    deferred: Mapping[str, tuple[Check, ...]],
    staged: StagingPlan,
) -> tuple[dict[str, tuple[Check, ...]], dict[str, tuple[Check, ...]]]:
    """A dry run's deferred checks split: those still deferred in a real run, and those that read an input a real
    run stages on this machine first (they run then, before anything is queued)."""
    here = tuple(str(i.pin.path) for i in staged.pending if i.here and i.pin is not None)
    later: dict[str, tuple[Check, ...]] = {}
    after: dict[str, tuple[Check, ...]] = {}
    for name, checks in deferred.items():
        for check_ in checks:
            reads = (check_.target, check_.model)
            waits = any(r and (r == h or r.startswith(h + "/")) for r in reads for h in here)
            target = after if waits else later
            target[name] = (*target.get(name, ()), check_)
    return later, after


# -- execute ----------------------------------------------------------------------------------------------------


def has_record(d: Decision) -> bool:
    """Whether the cell's directory holds the record of a run (submitted once: completed, failed, cancelled,
    pruned), which a dry run must leave as it is; a planned cell's files are only an earlier dry run's."""
    return d.archive or d.state.state is not State.PLANNED


def _previewed(files: CellFiles, d: Decision, dry_run: bool) -> CellFiles:
    """A dry run's files of a cell with a record (`has_record`: a finished cell skipped, or run again with
    force=true; a failed one rerun; one whose post-training stages run): written under the grid's .dry_run/ folder,
    as the real run would write them (the same text, naming the cell's own directory), so that the dry run leaves the
    cell's record (its cell.yaml, its estimate, its launch.sh) as it was."""
    if not (dry_run and has_record(d)):
        return files
    return replace(files, dir=d.cell.sweep_dir / PREVIEW_DIR / d.dir.name)


def execute(grid: GridPlan, observer: Observer | None = None) -> Executed:
    """Everything the plan says, but waiting for its local cells: its writes, the local jobs before the cells (model
    preps, tokenizations), the cells' submissions. A dry run's plan: its cells' files, and nothing else. Run under
    the grid's lock, right after `plan`."""
    blocked = in_the_way(grid.submission.writes)  # a directory where a backend's file goes: before the first write
    if blocked:
        raise GridError(blocked)
    if grid.dry_run:
        write_all(grid.submission.writes)
        return Executed()
    if grid.submission.code is not None:  # the snapshot is on the site before any job names it
        snapshot.materialize(grid.submission.code)
    return apply(grid.submission, (observer or Observer()).phase)


__all__ = [
    "GridPlan",
    "GridResult",
    "Inputs",
    "Observed",
    "Observer",
    "Role",
    "check",
    "execute",
    "observe",
    "plan",
    "plan_cells",
    "run",
]
