"""The grid command (`sft-grid run`): compose every cell, run the grid flow, and present its result.

The sft_grid Hydra launcher calls `run_grid` with every cell of a multirun at once; `sft-grid run` without
-m calls `run_single` with the one cell Hydra composed. Bad input is printed as one list of problems (exit 1,
nothing written); a dry run prints the check table, the first example of each source and the submission plan
with every sbatch script; a real run prints what it queued or ran, and, when it waited for local cells, their
final states.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import hydra
from omegaconf import DictConfig

from sft_grid.core.layout import PREVIEW_DIR
from sft_grid.core.problems import GRID, GridError, Problem
from sft_grid.planning.conf_files import YAML_ERROR
from sft_grid.planning.resolvers import register

if TYPE_CHECKING:  # annotations only: `--help` imports none of the grid
    from hydra.core.config_loader import ConfigLoader

    from sft_grid.core.state import CellState
    from sft_grid.core.submission import LocalJob, SlurmJob
    from sft_grid.grid.flow import GridResult
    from sft_grid.planning.compose import Composed, CompositionError
    from sft_grid.stages.staging import StagingPlan
    from sft_grid.stages.staging.values import Progress

register()  # the cell schema and sft_grid's resolvers, before Hydra composes anything

# the exit status of a run that staging had to stop before the site's process time limit: run it again
STAGING_STOPPED = 3


def out(text: str = "") -> None:
    print(text, flush=True)


def _fail(exc: GridError) -> None:
    print(str(exc), file=sys.stderr, flush=True)
    raise SystemExit(1)


def _run_remote(composed: Sequence[Any], errors: Sequence[Any]) -> None:
    """A grid of a remote site: validated here, then launched there over ssh (sft_grid/sites/remote.py); exits with
    the site's status. Returns only on the site's own invocation (it runs the grid as any other)."""
    from sft_grid.cli.options import default_runs_root
    from sft_grid.grid import flow
    from sft_grid.sites import remote
    from sft_grid.sites.transport import SiteUnreachable

    site, dry_run = None, False
    try:
        cells, problems = flow.plan_cells(composed, errors)
        if problems:
            raise GridError(problems)
        site = remote.site_of(cells)
        if site is None:
            return
        dry_run = any(c.spec.dry_run for c in cells)
        status = remote.launch(cells, site, sys.argv[1:], dry_run, Path(default_runs_root()))
    except GridError as exc:
        _fail(exc)
        raise
    except SiteUnreachable as exc:
        # a dry run queues nothing there: what it would do again is render and check the grid on the site
        again = (
            "a dry run renders and checks the grid on the site, and queues nothing"
            if dry_run
            else "what the site queued before the connection failed is skipped, the rest is submitted"
        )
        print(
            f"cannot reach site {site.name if site else ''}: {exc}. Run the same command again once it answers: "
            + again,
            file=sys.stderr,
        )
        raise SystemExit(1) from exc
    raise SystemExit(status)


def _run_across(composed: Sequence[Any], errors: Sequence[Any]) -> None:
    """A grid across remote sites (sites/coordinate.py): placed here, each site's share launched there; exits with
    the launch's status. On a site's own invocation asked for its answer (sites/call.py), prints it and exits.
    Returns for every other grid."""
    from sft_grid.cli.options import default_runs_root
    from sft_grid.grid import flow, site_answer
    from sft_grid.sites import call, coordinate, placement

    asked = call.current()
    if asked is not None and asked.answer:
        try:
            found = site_answer.answer(asked.site, composed, errors)
        except GridError as exc:
            _fail(exc)
            raise
        out(coordinate.answer_line(found))
        raise SystemExit(0)
    if asked is not None:
        return
    # the profiles first (a few files): a grid across clusters reached from here is planned once, by flow.run
    profiles, site_problems = placement.named_profiles({tuple(c.config.get("sites") or ()) for c in composed})
    if site_problems or not placement.all_remote(profiles):
        return  # flow.run's check reports the list's problems with the cells' own
    try:
        cells, problems = flow.plan_cells(composed, errors)
        problems += placement.static_problems(cells, profiles)
        steered = sorted({k for c in composed for k in ("prune", "adaptive") if c.config.get(k)})
        if steered:  # each site would decide its rungs or its next cells from its own cells' files alone
            problems.append(
                Problem(
                    cell=GRID,
                    key=steered[0],
                    value=", ".join(sorted(profiles)),
                    rule="steer-remote",
                    message=f"a {steered[0]}: grid decides from every cell's files, and a grid across remote sites"
                    " keeps each"
                    " cell's files on its own site, so each site would decide from its share alone",
                    fix="steer the grid on one site (one cluster, local or remote: its own invocation decides), or drop"
                    " sites=[...] for it",
                )
            )
        if problems:
            raise GridError(problems)
        status = coordinate.launch(cells, profiles, sys.argv[1:], Path(default_runs_root()))
    except GridError as exc:
        _fail(exc)
        raise
    raise SystemExit(status)


def fail_empty_axes(axes: Sequence[str]) -> None:
    """Swept axes that expand to no value: the grid would be empty. Named, and nothing runs."""
    from sft_grid.planning import axes as why

    _fail_axes(axes, "axis-empty", "this axis sweeps no value, so the grid has no cell", why.empty_fix)


def fail_zero_step_axes(axes: Sequence[str]) -> None:
    """Swept ranges with a step of 0 (`range(1,3,0)`): they never reach their stop (Python's range() refuses them with
    a traceback). Named, and nothing runs."""
    from sft_grid.planning import axes as why

    _fail_axes(
        axes,
        "axis-step",
        "a range's step is what it counts by from start towards stop, and a step of 0 never gets there",
        why.zero_step_fix,
    )


def fail_continuous_axes(axes: Sequence[str]) -> None:
    """Swept axes given as a continuous interval: a grid needs the values themselves. Named, and nothing runs."""
    from sft_grid.planning import axes as why

    _fail_axes(
        axes,
        "axis-continuous",
        "interval() is a continuous range for a sampling sweeper (Optuna, Nevergrad); a grid trains one cell per"
        " value and an interval has no list of values",
        why.interval_fix,
    )


def _fail_axes(axes: Sequence[str], rule: str, message: str, fix: Callable[[str], str]) -> None:
    """Refuse the sweep's axes (`key=value` as written), one problem each, before anything runs."""
    _fail(
        GridError(
            [
                Problem(
                    cell=GRID,
                    key=axis.split("=", 1)[0],
                    value=axis.split("=", 1)[1],
                    rule=rule,
                    message=message,
                    fix=fix(axis),
                )
                for axis in axes
            ],
            "planning",
        )
    )


def run_grid(master: DictConfig, overrides: list[list[str]], loader: ConfigLoader) -> GridResult:
    """All cells of a Hydra multirun (called by the sft_grid launcher)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import OmegaConf

    from sft_grid.planning.compose import GridComposer

    # the composer reuses the implementation's caching repository (planning/compose.py): Hydra's one loader
    assert isinstance(loader, ConfigLoaderImpl), type(loader)
    hydra_overrides = OmegaConf.to_container(master.hydra.overrides.hydra)
    assert isinstance(hydra_overrides, list)  # hydra.overrides.hydra: Hydra's own list of override strings
    composer = GridComposer(loader, master.hydra.job.config_name, hydra_overrides)
    composed, errors = composer.compose_all(overrides)
    if not overrides:
        _fail(
            GridError(
                [
                    Problem(
                        cell=GRID,
                        key="",
                        value=None,
                        rule="grid-empty",
                        message="the sweep expanded to no cells",
                        fix="check the swept values; glob() matches only options under conf/",
                    )
                ],
                "planning",
            )
        )
    return _run(composed, errors)


def run_single(cfg: DictConfig) -> GridResult:
    """One cell, composed by Hydra (`sft-grid run <overrides>` without -m)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from sft_grid.planning.compose import Composed
    from sft_grid.planning.hydra_errors import composition_problem

    # as written, not resolved: an override's value may hold an interpolation (`runs_root=${oc.env:SCRATCH}/runs`)
    # that is resolved, and refused when it cannot be, with the cell's config below
    overrides = [str(o) for o in OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False) or []]
    from sft_grid.planning import sweep_files

    axes = HydraConfig.get().sweeper.get("params")
    axes = OmegaConf.to_container(axes, resolve=False) if OmegaConf.is_config(axes) else axes
    unswept = sweep_files.unswept(overrides, dict(axes) if isinstance(axes, dict) else {})
    if unswept:
        _fail(GridError([unswept], "planning"))
    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot resolve, reported like any other problem
        if type(exc).__module__.startswith("omegaconf"):
            _fail(GridError([composition_problem(overrides, str(exc))], "composition"))
        raise
    assert isinstance(config, dict)  # the composed config: a mapping of its keys (strings) at its root
    return _run([Composed(tuple(overrides), cast(dict[str, Any], config))], [])


def _run(composed: Sequence[Composed], errors: Sequence[CompositionError]) -> GridResult:
    if any(c.config.get("sites") for c in composed):  # a grid across remote sites is placed here
        _run_across(composed, errors)
    if any((c.config["cluster"].get("remote") or {}).get("host") for c in composed):
        _run_remote(composed, errors)
    from sft_grid.cli.live import Live
    from sft_grid.cli.present import failure_lines, progress_text, staged_lines, staging_lines
    from sft_grid.grid import flow

    live = Live(sys.stderr)

    class Show(flow.Observer):
        def steered(self, lines: Sequence[str]) -> None:
            for line in lines:
                out(line)

        def planned(self, cells: int, counts: Mapping[str, int]) -> None:
            what = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: kv[0] != "to run"))
            # progress, not a result: on stderr with the live lines, so stdout stays the table or plan alone
            live.note(
                f"grid of {cells} cell(s) ({what}): checking every cell before anything is written or sent",
                doing="checking and planning the grid",
            )

        def phase(self, name: str, done: int, total: int, detail: str = "") -> None:
            live.phase(name, done, total, detail)

        def staging(self, plan: StagingPlan) -> None:
            for line in staging_lines(plan):
                out(line)

        def progress(self, p: Progress) -> None:
            live.transfer(p)

        def queued(self, result: GridResult) -> None:
            live.end()
            _print_launch(result)
            live.working("running the local cells")

        def local_progress(self, running: Mapping[LocalJob, CellState]) -> None:
            live.cells(running)

        def local_done(self, job: LocalJob, state: CellState) -> None:
            live.cell_done(job)
            out(
                f"  {state.state.value:<9} {job.label}  {progress_text(state)}"
                + (f"  {state.reason}" if state.reason else "")
            )

    from sft_grid.core.cellfiles import DamagedFile
    from sft_grid.stages.staging import StagingStopped, TimeLimitTooShort

    try:
        from sft_grid.sites import call

        asked = call.current()  # a site's own invocation: its share of a grid across remote sites
        result = flow.run(
            composed,
            errors,
            Show(),
            only=None if asked is None or asked.only is None else set(asked.only),
        )
    except GridError as exc:
        live.end()
        _fail(exc)
        raise
    except DamagedFile as exc:  # a cell's file the flow must read to decide (its ledger, its cell.yaml)
        live.end()
        where = f"{exc.path}: {exc.damage.what}" if exc.path is not None else str(exc)
        print(f"stopped on a damaged file: {where}; sft-grid status shows which cells", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except StagingStopped as exc:  # the site's process time limit: a rerun continues where this one stopped
        live.end()
        print(f"staging stopped: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(STAGING_STOPPED) from None
    except TimeLimitTooShort as exc:  # a rerun would stop having done nothing too: not exit 3
        live.end()
        print(f"staging refused: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        live.stop()
    live.end()
    if any(c.spec.check_only for c in result.cells):
        from sft_grid.cli.present import check_table

        text, ok = check_table(result.staging)
        out(text)
        n = len(result.staging.items) if result.staging else 0
        out(
            f"\n{n} Hub repositories of {len(result.cells)} cell(s): "
            + ("every one found; nothing written, staged or queued" if ok else "NOT all found (the verdicts above)")
        )
        if result.staging and result.staging.unreachable:
            out(f"the Hub cannot be reached from here: {result.staging.unreachable}")
        if not ok:
            raise SystemExit(1)
        return result
    if any(c.spec.stage_only for c in result.cells):
        for line in staged_lines(result.staging, len(result.cells), result.dry_run):
            out(line)
        return result
    if result.dry_run:
        _print_dry_run(result)
        return result
    if result.refused is not None:
        _print_launch(result)
        r = result.refused
        print(
            f"sbatch refused array {r.job.name} ({len(r.job.targets)} {r.job.role.value} target(s)): {r.detail}\n"
            f"{r.not_queued} cell(s) were not queued and read as planned; {r.queued} were. Fix the cause and run"
            " the grid again.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)
    if result.final:
        _print_final(result)
    if result.failed:
        failed = [
            (d.cell.name, result.final.get(d.dir) or d.state) for d in result.decisions if d.cell.name in result.failed
        ]
        print(
            "\n".join(
                [
                    f"{len(result.failed)} cell(s) failed, by class (<cell>/events.jsonl has each triage,"
                    " <cell>/logs/ the logs):",
                    *failure_lines(failed),
                ]
            ),
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(1)
    return result


# -- what is printed ---------------------------------------------------------------------------------------


def _sbatch_previews(result: GridResult) -> list[tuple[SlurmJob, str]]:
    from sft_grid.schedulers import slurm

    return [
        (job, slurm.sbatch_script(job, job.dependency.text() if job.dependency else None)) for job in result.plan.slurm
    ]


def _print_dry_run(result: GridResult) -> None:
    from sft_grid.backends import get as backend_of
    from sft_grid.cli.present import (
        CHECK_HEADERS,
        check_rows,
        deferred_lines,
        eval_lines,
        example,
        layout_lines,
        model_lines,
        passed_line,
        plan_lines,
        post_lines,
        prep_lines,
        relative,
        staging_lines,
        table,
        tokenize_lines,
    )
    from sft_grid.core.layout import CELL_FILE, LAUNCH_FILE

    cells = result.cells
    dirs = [d.dir for d in result.decisions]
    color = sys.stdout.isatty()
    out(table(CHECK_HEADERS, check_rows(cells, dirs)))
    for line in _science_lines(result):
        out(line)
    out()
    configs = sorted({backend_of(c.spec.backend.name).config_file for c in cells})
    out(
        f"dry run: {len(cells)} cell(s) rendered, nothing submitted. Each cell's files: <cell dir>/"
        f"{{{','.join([CELL_FILE, *configs, LAUNCH_FILE])}}}"
    )
    for line in layout_lines(cells):
        out(line)
    examples = result.examples
    if examples is not None and examples.shown:
        out(
            "\nthe first example of each source, as the backend trains on it (trained text "
            + ("in green):" if color else "in [[ ]]):")
        )
        for e in examples.shown:
            out(example(e.label, e.row, 0, color))
    if examples is not None and examples.unreadable:
        out(
            f"  first examples not shown, their inputs are not readable here (the job's preflight checks them):"
            f" {', '.join(examples.unreadable)}"
        )
    if examples is not None and examples.more:
        out(f"  ... {examples.more} more source(s): sft-grid show <cell dir>")
    out(f"  what a cell trains on, token by token: sft-grid show {relative(dirs[0])}")
    here = frozenset(c.name for c in cells if c.spec.cluster.executor == "local")
    for line in (
        model_lines(cells, result.staging)
        + staging_lines(result.staging)
        + passed_line(result.passed)
        + deferred_lines(result.deferred, full=bool(os.environ.get("SFT_GRID_VERBOSE")), here=here)
    ):
        out(line)
    if result.after_staging:
        n = sum(map(len, result.after_staging.values()))
        out(
            f"  {n} check(s) of {len(result.after_staging)} cell(s) read inputs not staged yet: a real run stages"
            " them here first, then runs these checks before anything is queued"
        )
    for line in prep_lines(result) + tokenize_lines(result.tokenized) + post_lines(cells) + eval_lines(result):
        out(line)
    for d in result.decisions:
        if d.why:
            out(f"  would skip {d.cell.name}: {d.why}")
    for line in _start_lines(result):
        out(line)
    _print_costs(result)
    lines = plan_lines(result.plan)
    if lines:
        out("\nsubmission plan (what a real run does):")
        for line in lines:
            out(line)
    from sft_grid.grid.flow import has_record

    recorded = [d for d in result.decisions if has_record(d) and d.touch_files]
    if recorded:
        out(
            f"  the files of the {len(recorded)} cell(s) that hold a run's record (rerun, skipped or posted):"
            f" {relative(cells[0].sweep_dir / PREVIEW_DIR)}/<cell>/ (this dry run leaves their own files as they are)"
        )
    previews = _sbatch_previews(result)
    if previews:
        folder = cells[0].sweep_dir / PREVIEW_DIR
        shown = (
            previews
            if len(previews) <= 8
            else [p for i, p in enumerate(previews) if p[0].role not in {q[0].role for q in previews[:i]}]
        )
        for job, script in shown:
            out(f"\n# sbatch script of {job.name} ({job.role.value}, {len(job.targets)} target(s)):")
            out(script)
        _write_previews(folder, previews)
        out(f"\nevery sbatch script of the plan: {relative(folder)}/<job name>.sbatch")
    _print_unset_variables(cells)


def _print_unset_variables(cells: Sequence[Any]) -> None:
    """What a real run needs that this dry run rendered without: the per-user variables its placeholders stand for."""
    from sft_grid.planning import resolvers

    unset = [v for v in resolvers.UNSET_IN_DRY_RUN if not os.environ.get(v)]
    if not unset:
        return
    out(
        f"\nrendered with placeholders for {len(unset)} per-user variable(s) that are not set here"
        f" ({', '.join(f'<{v}>' for v in unset)}; a runs folder among them: the cells rendered under the local"
        " runs/). A real run needs:"
    )
    out("  export " + " ".join(f"{v}={resolvers.kind_of(v)[1]}" for v in unset))
    for v in unset:
        out(f"    {v}: {resolvers.kind_of(v)[0]} ({resolvers.UNSET_IN_DRY_RUN[v] or 'read by the config'})")


def _print_costs(result: GridResult) -> None:
    from sft_grid.cli.present import cost_lines
    from sft_grid.grid.decide import Action

    names = [c.name for c in result.cells]
    to_run = [d.cell.name for d in result.decisions if d.action is Action.RUN]
    for line in cost_lines(names, to_run, result.costs):
        out(line)


def _write_previews(folder: Path, previews: Sequence[tuple[SlurmJob, str]]) -> None:
    """The dry run's own rendered files beside its cells: each planned job's sbatch script."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    for job, script in previews:
        (folder / f"{job.name}.sbatch").write_text(script)


def _start_lines(result: GridResult) -> list[str]:
    """Where each cell of a spread grid goes and when its scheduler expects it to start (grid/spread.py); a site
    that gave no estimate says so, ranked after every site that did."""
    out = []
    provenance = result.plan.provenance if result.plan else {}
    for d in result.decisions:
        record = provenance.get(d.dir) or {}
        if "site" not in record or "expected_start_s" not in record:
            continue
        start = record["expected_start_s"]
        when = (
            "at an unknown time (its scheduler gave no estimate)"
            if start == "unknown"
            else f"expected to start in {start} s"
        )
        out.append(f"  {d.cell.name}: on site {record['site']}, {when}")
    return out


def _science_lines(result: GridResult) -> list[str]:
    """Settings that train but not as meant (planning/science.py), each once over the grid."""
    from sft_grid.planning import science

    estimates = result.costs.estimates if result.costs else {}
    steps = {
        c.name: c.spec.max_steps if c.spec.max_steps > 0 else (e.tokens.steps if (e := estimates.get(c.name)) else None)
        for c in result.cells
    }
    return science.lines(result.cells, steps)


def _print_launch(result: GridResult) -> None:
    from collections import Counter

    from sft_grid.cli.present import deferred_lines, failure_lines, no_throughput_lines, pinned_lines, relative
    from sft_grid.core.state import State
    from sft_grid.core.submission import Role
    from sft_grid.grid.decide import Action

    to_run = [d for d in result.decisions if d.action is Action.RUN]
    skipped = Counter(d.why.split(" ", 1)[0].rstrip(":") for d in result.decisions if d.action is not Action.RUN)
    parts = [f"{len(to_run)} to run"] + [f"{n} {what}" for what, n in sorted(skipped.items())]
    out(f"{len(result.cells)} cell(s): " + ", ".join(parts) + ("" if to_run else " - nothing to run."))
    for line in _science_lines(result) if to_run else ():
        out(line)
    for d in result.decisions:
        if (
            d.action is not Action.RUN
            and d.state.state not in (State.FAILED, State.CANCELLED)
            and (not d.why.startswith("completed") or "; " in d.why)
        ):
            out(f"  skipped {d.cell.name}: {d.why}")
    stopped = failure_lines([(d.cell.name, d.state) for d in result.decisions if d.action is not Action.RUN])
    if stopped:
        out("  skipped, failed or cancelled (rerun_failed=true reruns them):")
        out("\n".join(stopped))
    for d in to_run:
        if d.note:
            out(f"  {d.cell.name}: {d.why}" + (f", avoiding {','.join(d.exclude)}" if d.exclude else ""))
    here = frozenset(d.cell.name for d in to_run if d.cell.spec.cluster.executor == "local")
    for line in no_throughput_lines([d.cell.name for d in to_run], result.costs):
        out(line)
    for line in pinned_lines(result.staging) + deferred_lines(
        {d.cell.name: result.deferred[d.cell.name] for d in to_run if d.cell.name in result.deferred}, here=here
    ):
        out(line)
    for here_job in result.plan.local:
        if here_job.role is Role.PREP:
            out(f"  tokenizer prep of {here_job.label}: ran here before its cells ({here_job.target / 'model'})")
        elif here_job.role is Role.TOKENIZE:
            out(f"  tokenized {here_job.label} here before its cells ({relative(here_job.target)})")
    for d in result.decisions:
        if result.executed and d.dir in result.executed.prep_failed:
            out(f"  failed    {d.cell.name}  {result.executed.prep_failed[d.dir]}")
    ids = result.executed.ids if result.executed else {}
    for job in result.plan.slurm:
        got = ids.get(job.name)
        if not got:
            continue
        span = got[0] + (f" .. {got[-1]}" if len(got) > 1 else "")
        if job.role is Role.PREP:
            out(f"  tokenizer prep of {job.label}: job {got[0]} -> {job.targets[0]}")
        elif job.role is Role.STAGE:
            out(f"  staging of {job.label}: job {got[0]} -> {job.targets[0]} (the cells that need them wait for it)")
        elif job.role is Role.TRAIN:
            out(
                f"  queued {len(got)} cell(s) as {job.name}: jobs {span}"
                + (f" (at most {job.throttle} at once)" if job.throttle else "")
                + (f" on site {job.request.site}" if job.request.site else "")
            )
        elif job.role is Role.TOKENIZE:
            out(f"  tokenize once: {job.label} as {job.name}: jobs {span} (the cells that load them wait for it)")
        elif job.role is Role.EVAL:
            what = "base model" if "/_base/" in str(job.targets[0]) else "cell"
            out(
                f"  evaluation of {len(got)} {what}(s)"
                + (f" ({job.label})" if job.label else "")
                + f": array {job.name}"
                + (f", after {job.dependency.kind} {job.dependency.job}" if job.dependency else "")
            )
        elif job.dependency is not None:
            out(f"  post-training stages of {len(got)} cell(s): array {job.name}, each task after its training")
        else:
            out(f"  post-training stages of {len(got)} completed cell(s): array {job.name}")
    for b in result.bases:
        out(f"  base model {b.target.name}: " + ("to evaluate, once for the grid" if b.evaluate else b.why))


def _print_final(result: GridResult) -> None:
    from sft_grid.cli.cmd_status import read, shown
    from sft_grid.cli.present import relative, table

    dirs = [d.dir for d in result.decisions]
    out()
    out(table(*shown(read(dirs, [b.target.dir for b in result.bases]))))
    out(f"outputs: <cell>/output/ under {relative(dirs[0].parent)}/")


# -- the Hydra app -------------------------------------------------------------------------------------------------


@hydra.main(version_base=None, config_path="pkg://sft_grid.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    # Without -m Hydra hands over one composed cell; with -m the sft_grid launcher gets all cells (run_grid).
    run_single(cfg)


class _KeyHints:
    """Passes stderr through and remembers Hydra's errors, to add the valid keys or options after them
    (Hydra composes the grid's base config itself and prints its own error before exiting)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.seen: list[str] = []

    def write(self, text: str) -> int:
        if "HYDRA_FULL_ERROR" in text and any(YAML_ERROR in seen for seen in self.seen):
            return len(text)  # a file that is not YAML is named by its line: no stack trace to ask for
        self.seen.append(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


# Hydra's flags that list every config group and its options: --help (the app's), --hydra-help (Hydra's own)
HELP_FLAGS = ("--help", "-h", "--hydra-help")


@contextmanager
def _one_repository_copy() -> Iterator[None]:
    """Hydra's help lists the options of every config group (88 of them here, hydra/ included) by asking its config
    loader once per group, and each question deep-copies the whole config repository, sft_grid's schema with it
    (ConfigLoaderImpl.get_group_options): most of what `--help` took (0.56 s, now 0.26 s: benchmarks/README.md).
    Every question is asked of the same repository with the same search path, so one copy answers them all: the
    same text, computed once."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.object_type import ObjectType

    original = ConfigLoaderImpl.get_group_options
    if not hasattr(ConfigLoaderImpl, "_parse_overrides_and_create_caching_repo"):  # another Hydra: as it is
        yield
        return
    copies: dict[tuple[int, str | None, tuple[str, ...]], Any] = {}

    def get_group_options(
        self: ConfigLoaderImpl,
        group_name: str,
        results_filter: ObjectType | None = ObjectType.CONFIG,
        config_name: str | None = None,
        overrides: list[str] | None = None,
    ) -> list[str]:
        key = (id(self), config_name, tuple(overrides or ()))
        if key not in copies:
            copies[key] = self._parse_overrides_and_create_caching_repo(config_name, list(overrides or ()))[1]
        return list(copies[key].get_group_options(group_name, results_filter))

    ConfigLoaderImpl.get_group_options = get_group_options  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.get_group_options = original  # type: ignore[method-assign]


def _config_dirs_to_env(argv: list[str]) -> list[str]:
    """Hydra's `--config-dir DIR` (`-cd`), taken as the first of the team's config folders ($SFT_GRID_CONF): then
    every reader of a group (the options `--help` lists, the sites' profiles, a cell's rerun line) sees it, not
    Hydra's composition alone. The arguments without it; a folder that does not exist is refused here."""
    from sft_grid.core import project

    try:
        project.check_conf_env()  # before --config-dir's folders join it: an empty one is named as empty
    except project.ProjectError as exc:
        print(f"sft-grid run: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    rest, dirs = [], []
    words = iter(argv)
    for word in words:
        flag, eq, value = word.partition("=")
        if flag in ("--config-dir", "-cd"):
            value = value if eq else next(words, "")
            path = Path(value).expanduser().resolve()
            if not value or not path.is_dir():
                raise SystemExit(
                    f"sft-grid run: --config-dir {value!r} is not a folder; name the folder of your configs"
                )
            dirs.append(str(path))
        else:
            rest.append(word)
    if dirs:
        os.environ[project.CONF_ENV] = os.pathsep.join([*dirs, *filter(None, [os.environ.get(project.CONF_ENV)])])
    try:
        project.find()
    except project.ProjectError as exc:
        print(f"sft-grid run: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return rest


def hydra_app() -> None:
    """`sft-grid run`: the Hydra app, with a hint after Hydra's own errors (the valid keys, the closest)."""
    if "--version" in sys.argv[1:]:  # sft_grid's version, not Hydra's
        from sft_grid import __version__

        print(f"sft_grid {__version__}")
        raise SystemExit(0)
    sys.argv = [sys.argv[0], *_config_dirs_to_env(sys.argv[1:])]
    helping = any(a in HELP_FLAGS for a in sys.argv[1:])
    if not helping:
        from sft_grid.planning import command_line, sweep_files

        found = command_line.problems(sys.argv[1:])
        if found:
            _fail(GridError(found, "reading the command line"))
        found = sweep_files.problems(sys.argv[1:])
        if found:
            _fail(GridError(found, "reading the sweep files"))
    hints = _KeyHints(sys.stderr)
    sys.stderr = hints
    try:
        with _one_repository_copy() if helping else nullcontext():
            _hydra_main()
    except SystemExit as exc:
        sys.stderr = hints.stream
        if exc.code:
            from sft_grid.planning.command_line import flag_hint
            from sft_grid.planning.hydra_errors import key_hint, malformed_override

            seen = "".join(hints.seen)
            hint = key_hint(seen) or malformed_override(sys.argv[1:]) or flag_hint(sys.argv[1:])
            if hint and hint not in seen:
                print(f"hint: {hint}", file=sys.stderr)
        raise
    finally:
        sys.stderr = hints.stream


def main(argv: Sequence[str]) -> int:
    """`sft-grid run ...`: the Hydra app (python -m sft_grid), with these arguments."""
    # check and stage run this app with their own name (RUN_AS), so that its usage errors say theirs
    from sft_grid.cli.options import RUN_AS

    sys.argv = [os.environ.pop(RUN_AS, "") or "sft-grid run", *argv]
    hydra_app()
    return 0
