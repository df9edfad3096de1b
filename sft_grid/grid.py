"""The grid flow: compose -> plan -> validate -> preflight -> render -> submit, for every cell at once.

Called by the sft_grid Hydra launcher with all cells of a multirun, or by `python -m sft_grid` with one
composed cell. Nothing is written or submitted unless every cell passes every check; a cell that is
completed or in flight is never submitted again; failed cells are listed and rerun on request.
"""

from __future__ import annotations

import fcntl
import logging
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from sft_grid import backends, ledger, post, prep, render, report, show
from sft_grid.compose import Composed, CompositionError, GridComposer
from sft_grid.ledger import CellState, State
from sft_grid.plan import Cell, plan_cell
from sft_grid.preflight import preflight
from sft_grid.submit import mark_submitted
from sft_grid.validate import GridError, Problem, composition_problem, validate

log = logging.getLogger(__name__)

LOCK_FILE = ".sft_grid.lock"


@dataclass
class Outcome:
    """The state of each requested cell, in request order, and what this invocation did."""

    states: list[str]
    submitted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    # cells run by this invocation that did not complete
    failed: list[str] = field(default_factory=list)


def out(text: str = "") -> None:
    print(text, flush=True)


def plan_cells(composed: Sequence[Composed], errors: Sequence[CompositionError]) -> tuple[list[Cell], list[Problem]]:
    problems = [composition_problem(e.overrides, e.message) for e in errors]
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    problems += _duplicate_identities(cells)
    problems += validate(cells)
    return cells, problems


def _duplicate_identities(cells: Sequence[Cell]) -> list[Problem]:
    seen: dict[tuple[str, str], Cell] = {}
    problems = []
    for cell in cells:
        first = seen.setdefault((cell.spec.sweep_name, cell.key), cell)
        if first is not cell:
            problems.append(Problem(
                cell.name, "", None, "identity-unique",
                f"trains the same model as cell {first.name} ({' '.join(first.overrides)}): they differ only in"
                " where or how they run (nodes, micro batch, time, cluster), which is not part of a cell's identity",
                "sweep over a training value instead, or drop the duplicate axis",
            ))
    return problems


def cell_dirs(cells: Sequence[Cell]) -> list[Path]:
    """Each cell's directory: an existing one with the same identity, else <runs_root>/<sweep>/<name>."""
    existing: dict[Path, dict[str, Path]] = {}
    dirs = []
    for cell in cells:
        sweep_dir = cell.sweep_dir
        if sweep_dir not in existing:
            existing[sweep_dir] = {p.name.rsplit("-", 1)[-1]: p for p in ledger.iter_cell_dirs(sweep_dir)}
        dirs.append(existing[sweep_dir].get(cell.key, sweep_dir / cell.name))
    return dirs


def decide(cell: Cell, state: CellState) -> str | None:
    """None: run it. Otherwise why it is skipped."""
    if state.state is State.COMPLETED:
        return None if cell.spec.force else "completed (force=true reruns it)"
    if state.state.in_flight:
        return f"{state.state.value}" + (f" (job {state.job_id})" if state.job_id else "")
    if state.state in (State.FAILED, State.CANCELLED):
        return None if cell.spec.rerun_failed else f"{state.state.value}: {state.reason or 'no reason recorded'} (rerun_failed=true reruns it)"
    return None


class _SweepLock:
    """One grid invocation at a time decides and submits for a sweep directory."""

    def __init__(self, sweep_dirs: set[Path]) -> None:
        self.paths = sorted(sweep_dirs)
        self.handles: list[Any] = []

    def __enter__(self) -> "_SweepLock":
        for path in self.paths:
            path.mkdir(parents=True, exist_ok=True)
            handle = open(path / LOCK_FILE, "w")
            fcntl.flock(handle, fcntl.LOCK_EX)
            self.handles.append(handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.close()


def execute(composed: Sequence[Composed], errors: Sequence[CompositionError]) -> Outcome:
    started = time.perf_counter()
    cells, problems = plan_cells(composed, errors)
    checked = preflight(cells) if not problems else None
    if checked is not None:
        problems += checked.problems
    if problems:
        raise GridError(problems)
    assert checked is not None
    dirs = cell_dirs(cells)
    dry_run = any(c.spec.dry_run for c in cells)
    with _SweepLock({c.sweep_dir for c in cells}):
        outcome, to_write, to_run, forced, post_only = _decide(cells, dirs, checked.deferred, dry_run)
        _write_all(to_write)
        log.debug("planned %d cells in %.2f s", len(cells), time.perf_counter() - started)
        on_slurm = [r for r in to_run if r.request.slurm is not None]
        local = [r for r in to_run if r.request.slurm is None]
        if dry_run:
            _print_dry_run(cells, dirs, checked.deferred, outcome)
            _print_sbatch(on_slurm or [r for r in to_write if r.request.slurm is not None])
            return outcome
        if forced:
            from sft_grid.runner import archive_output

            for rendered in forced:
                archive_output(rendered.dir, "force=true rerun of a completed cell")
        local, unprepared = _prepare_local(local, cells, outcome)
        # a completed cell whose post-training stages are pending: locally its job runs only the stages
        local += [r for r in post_only if r.request.slurm is None]
        for rendered in local:
            # queued under the lock: a second invocation now sees these cells in flight
            mark_submitted(rendered.request)
        _print_launch(cells, to_run, outcome, checked.deferred)
        train_arrays = []
        if on_slurm:
            outcome.submitted += [r.cell.name for r in on_slurm]
            train_arrays = _submit_slurm(prep.slurm_dependencies(on_slurm))
        _submit_post(train_arrays, [r for r in post_only if r.request.slurm is not None], on_slurm + post_only)
    outcome.failed = unprepared
    if not local:
        return outcome
    finished = _submit_local(local)
    index = {c.name: i for i, c in enumerate(cells)}
    for f in finished:
        outcome.states[index[f.request.cell_name]] = f.state.state.value
    outcome.submitted += [r.cell.name for r in local]
    outcome.failed += [f.request.cell_name for f in finished if f.state.state is not State.COMPLETED]
    if finished:
        _print_final(dirs)
    return outcome


def scheduler_view(dirs: Sequence[Path]) -> tuple[dict[Path, list[dict[str, Any]]], dict[str, Any] | None]:
    """Each cell's ledger, and Slurm's state of every job they name: one sacct call for the whole grid."""
    histories = {d: ledger.events(d) for d in dirs}
    refs = [r for r in (ledger.slurm_ref(h) for h in histories.values()) if r is not None]
    if not refs:
        return histories, None
    from sft_grid import slurm

    ids = [r.job_id for r in refs if r.job_id]
    ids += [i for i in (post.post_job_id(h) for h in histories.values()) if i]
    names = [r.name for r in refs if not r.job_id and r.name]
    try:
        return histories, slurm.sacct(ids, names)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sacct failed (%s): Slurm cells keep their last recorded state", exc)
        return histories, None


def _recover(cell_dir: Path, state: CellState, history: list[dict[str, Any]]) -> CellState:
    """sbatch ran, but the orchestrator died before it recorded the job id (found again by the array's
    name). submitit moves each task's pickle into place only after sbatch returns; a task that cannot find
    its pickle waits a minute, then fails. So: adopt the job if its pickle is there, or put the pickle left
    under its temporary name in place while the job is still queued or waiting; otherwise cancel what is
    left of the job (it never ran the cell) and plan the cell again."""
    from submitit.core.utils import DelayedSubmission, JobPaths

    from sft_grid import slurm

    ref = ledger.slurm_ref(history)
    assert ref is not None
    folder = cell_dir.parent / ".submitit" / ref.name
    target = JobPaths(folder, job_id=state.job_id).submitted_pickle
    if not target.exists() and state.state.in_flight:
        for orphan in folder.glob("*.pkl"):
            if not orphan.name.endswith("_submitted.pkl") and Path(
                    getattr(DelayedSubmission.load(orphan).function, "cell_dir", "")) == cell_dir:
                orphan.rename(target)
                break
    if target.exists():  # the job has (or had) what it needs: it is this cell's job
        ledger.append(cell_dir, "job", job_id=state.job_id, note="recovered by the array's name")
        return state
    if state.state.in_flight:
        slurm.cancel([state.job_id])
    ledger.append(cell_dir, "planned", note=f"job {state.job_id} of {ref.name} never got its submission file"
                  " (the orchestrator died during sbatch): cancelled, to be submitted again")
    return CellState(State.PLANNED)


def _decide(cells: Sequence[Cell], dirs: Sequence[Path], deferred: dict[str, list[Any]], dry_run: bool,
            ) -> tuple[Outcome, list[render.RenderedCell], list[render.RenderedCell], list[render.RenderedCell],
                       list[render.RenderedCell]]:
    """Each cell's state and what to do with it: (outcome, cells to write, cells to run, completed cells
    to run again, whose output is moved aside first, completed cells whose post-training stages run)."""
    outcome = Outcome(states=[""] * len(cells))
    to_write: list[render.RenderedCell] = []
    to_run: list[render.RenderedCell] = []
    forced: list[render.RenderedCell] = []
    post_only: list[render.RenderedCell] = []
    histories, jobs = scheduler_view(dirs)
    for i, (cell, cell_dir) in enumerate(zip(cells, dirs)):
        state = ledger.state_of(cell_dir, jobs=jobs, history=histories[cell_dir])
        if state.recovered:
            state = _recover(cell_dir, state, histories[cell_dir])
        why_not = decide(cell, state)
        todo: list[str] = []
        if state.state is State.COMPLETED and why_not is not None:
            todo, why_post = _post_todo(cell, cell_dir, histories[cell_dir], jobs)
            why_not += why_post
        outcome.states[i] = state.state.value
        if why_not is not None:
            outcome.skipped[cell.name] = why_not
        if state.state.in_flight:
            continue  # its files are in use by its job
        rendered = render.render(cell, cell_dir, deferred.get(cell.name, []))
        if why_not is None or dry_run:
            to_write.append(rendered)
        if why_not is None:
            to_run.append(rendered)
            if state.state is State.COMPLETED:
                forced.append(rendered)
        elif todo:
            post_only.append(rendered)
            if not dry_run:
                to_write.append(rendered)
    return outcome, to_write, to_run, forced, post_only


def _post_todo(cell: Cell, cell_dir: Path, history: list[dict[str, Any]], jobs: dict[str, Any] | None,
               ) -> tuple[list[str], str]:
    """The post-training stages a completed cell still needs that a job can run (an upload that must wait
    for the login node is not one), and a note for the skip message."""
    planned = post.stages_for(cell.spec)
    states = post.states(cell_dir, history, planned)
    left = [n for n in planned if states[n].state != "completed"]
    if not left:
        return [], ""
    job = post.post_job(history, jobs)
    if job is not None and job.in_flight:
        return [], f"; post stages waiting in Slurm (job {job.job_id})"
    # a stage left `running` by a post job that has ended did not finish: it runs again
    if job is None and any(states[n].state == "running" for n in left):
        return [], "; post stages running"
    todo = []
    for name in left:
        if name in ("upload", "register") and not post.upload_in_job(cell.spec):
            break
        todo.append(name)
    if todo:
        return todo, f"; post stages to run: {', '.join(todo)}"
    return [], f"; {left[0]} waits: python -m sft_grid.post {cell_dir}"


def _submit_post(train_arrays: Sequence[tuple[Any, list[str]]], post_only: Sequence[render.RenderedCell],
                 rendered: Sequence[render.RenderedCell]) -> None:
    """Slurm post jobs: one array per training array, each task after its training task (aftercorr; afterok
    for a single job), and one array for completed cells whose stages are pending."""
    from sft_grid import slurm

    by_dir = {r.dir: r for r in rendered}

    def chunk_for(dirs: Sequence[Path]) -> Any:
        cells = [by_dir[d].cell for d in dirs]
        needs_hub = any("upload" in post.stages_for(c.spec) for c in cells)
        request = slurm.post_request_for(cells[0].spec, needs_hub)
        return slurm.plan_arrays([(d, request) for d in dirs], 10**9)[0]

    for train, ids in train_arrays:
        chunk = chunk_for(train.cell_dirs)
        array = "_" in ids[0]
        after = ids[0].split("_")[0] if array else ids[0]
        chunk.request = slurm.with_dependency(chunk.request, after, "aftercorr" if array else "afterok")
        slurm.submit_post_chunk(chunk, _submit_folder(chunk), after)
        out(f"  post-training stages of {len(ids)} cell(s): array {chunk.name}, each task after its training")
    if post_only:
        chunk = chunk_for([r.dir for r in post_only])
        ids = slurm.submit_post_chunk(chunk, _submit_folder(chunk), None)
        out(f"  post-training stages of {len(ids)} completed cell(s): array {chunk.name}")


def _prepare_local(local: list[render.RenderedCell], cells: Sequence[Cell], outcome: Outcome,
                   ) -> tuple[list[render.RenderedCell], list[str]]:
    """Run the model preps these local cells need (once per model, skipped when done); a cell whose prep
    failed is recorded as failed with the prep's reason and not run. Returns (cells to run, failed cells)."""
    failed = prep.run_local([r.cell for r in local])
    index = {c.name: i for i, c in enumerate(cells)}
    for r in local:
        if r.cell.name in failed:
            ledger.append(r.dir, "failed", reason=failed[r.cell.name])
            outcome.states[index[r.cell.name]] = State.FAILED.value
            out(f"  failed    {r.cell.name}  {failed[r.cell.name]}")
    return [r for r in local if r.cell.name not in failed], list(failed)


def _write_all(rendered: Sequence[render.RenderedCell]) -> None:
    """Write cell directories; a few threads, since small-file syscalls dominate a large dry run."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(render.write, rendered))


def _slurm_chunks(on_slurm: Sequence[render.RenderedCell]) -> tuple[list[Any], int | None]:
    from sft_grid import slurm

    try:
        max_size = slurm.max_array_size()
    except (OSError, subprocess.SubprocessError):
        max_size = 1001  # no Slurm here (a dry run on a laptop): Slurm's default
    items = [(r.dir, r.request.slurm) for r in on_slurm]
    limits = [r.cell.spec.concurrency for r in on_slurm if r.cell.spec.concurrency]
    return slurm.plan_arrays(items, max_size), min(limits) if limits else None


def _submit_folder(chunk: Any) -> Path:
    return chunk.cell_dirs[0].parent / ".submitit" / chunk.name


def _submit_slurm(on_slurm: Sequence[render.RenderedCell]) -> list[tuple[Any, list[str]]]:
    """Queue the training arrays; returns each array with its job ids (the post jobs depend on them)."""
    from sft_grid import slurm

    chunks, concurrency = _slurm_chunks(on_slurm)
    queued = []
    for n, chunk in enumerate(chunks):
        try:
            ids = slurm.submit_chunk(chunk, concurrency, _submit_folder(chunk))
        except Exception as exc:  # sbatch's refusal, after retries of the transient kind
            detail = " ".join(str(exc).split())[:500]
            print(f"sbatch refused array {chunk.name} ({len(chunk.cell_dirs)} cell(s)): {detail}\n"
                  f"{sum(len(c.cell_dirs) for c in chunks[n:])} cell(s) were not queued and read as planned;"
                  f" {sum(len(c.cell_dirs) for c in chunks[:n])} were. Fix the cause and run the grid again.",
                  file=sys.stderr, flush=True)
            raise SystemExit(1) from exc
        first, last = ids[0], ids[-1]
        out(f"  queued {len(ids)} cell(s) as {chunk.name}: jobs {first}" + (f" .. {last}" if len(ids) > 1 else "")
            + (f" (at most {concurrency} at once)" if concurrency else ""))
        queued.append((chunk, ids))
    return queued


def _print_sbatch(on_slurm: Sequence[render.RenderedCell]) -> None:
    if not on_slurm:
        return
    from sft_grid import slurm

    chunks, concurrency = _slurm_chunks(on_slurm)
    for chunk in chunks:
        out(f"\n# sbatch script for {len(chunk.cell_dirs)} cell(s), array {chunk.name}:")
        out(slurm.sbatch_preview(chunk, concurrency, _submit_folder(chunk)))


def _submit_local(to_run: list[render.RenderedCell]) -> list[Any]:
    from sft_grid.submit import submit_local

    cluster = to_run[0].cell.spec.cluster

    def done(f: Any) -> None:
        out(f"  {f.state.state.value:<9} {f.request.cell_name}  {report.progress_text(f.state)}"
            + (f"  {f.state.reason}" if f.state.reason else ""))

    return submit_local([r.request for r in to_run], cluster.max_parallel, cluster.wait, done)


def _print_dry_run(cells: Sequence[Cell], dirs: Sequence[Path], deferred: dict[str, list[Any]], outcome: Outcome) -> None:
    out(report.table(report.CHECK_HEADERS, report.check_rows(cells, dirs)))
    out()
    configs = sorted({backends.get(c.spec.backend.name).CONFIG_FILE for c in cells})
    out(f"dry run: {len(cells)} cell(s) rendered, nothing submitted. Each cell's files: <cell dir>/"
        f"{{{','.join([render.CELL_FILE, *configs, render.LAUNCH_FILE])}}}")
    examples = show.first_examples(cells, color=sys.stdout.isatty())
    if examples:
        out("\nthe first example of each source, as the backend trains on it (trained text "
            + ("in green):" if sys.stdout.isatty() else "in [[ ]]):"))
        for line in examples:
            out(line)
    out(f"  what a cell trains on, token by token: python -m sft_grid.show {report.relative(dirs[0])}")
    _print_deferred(deferred)
    for line in prep.describe(cells) + post.describe(cells):
        out(line)
    for name, why in outcome.skipped.items():
        out(f"  would skip {name}: {why}")


def _print_deferred(deferred: dict[str, list[Any]]) -> None:
    by_check: dict[str, list[str]] = defaultdict(list)
    for name, checks in deferred.items():
        for check in checks:
            by_check[check.describe()].append(name)
    for what, names in by_check.items():
        out(f"  deferred to the job's first step (input not readable here): {what}: {len(names)} cell(s)")


def _print_launch(cells: Sequence[Cell], to_run: Sequence[render.RenderedCell], outcome: Outcome,
                  deferred: dict[str, list[Any]]) -> None:
    skipped = Counter(why.split(" ", 1)[0].rstrip(":") for why in outcome.skipped.values())
    parts = [f"{len(to_run)} to run"] + [f"{n} {what}" for what, n in sorted(skipped.items())]
    out(f"{len(cells)} cell(s): " + ", ".join(parts) + ("" if to_run else " - nothing to run."))
    for name, why in outcome.skipped.items():
        if not why.startswith("completed") or "; " in why:  # (a completed cell's post stages: what happens)
            out(f"  skipped {name}: {why}")
    _print_deferred({r.cell.name: deferred[r.cell.name] for r in to_run if r.cell.name in deferred})


def _print_final(dirs: Sequence[Path]) -> None:
    from sft_grid.status import HEADERS, rows

    out()
    out(report.table(HEADERS, rows(dirs)))
    out(f"outputs: <cell>/{render.OUTPUT_DIR}/ under {report.relative(dirs[0].parent)}/")


# -- entry points ---------------------------------------------------------------------------------------


def _fail(exc: GridError) -> None:
    print(str(exc), file=sys.stderr, flush=True)
    raise SystemExit(1)


def run_grid(master: Any, overrides: list[list[str]], loader: Any) -> Outcome:
    """All cells of a Hydra multirun (called by the sft_grid launcher)."""
    from omegaconf import OmegaConf

    hydra_overrides = OmegaConf.to_container(master.hydra.overrides.hydra)
    composer = GridComposer(loader, master.hydra.job.config_name, hydra_overrides)
    composed, errors = composer.compose_all(overrides)
    try:
        if not overrides:
            raise GridError([Problem("<grid>", "", None, "grid-empty", "the sweep expanded to no cells",
                                     "check the swept values; glob() matches only options under conf/")], "planning")
        outcome = execute(composed, errors)
    except GridError as exc:
        _fail(exc)
        raise
    _exit_on_failures(outcome)
    return outcome


def _exit_on_failures(outcome: Outcome) -> None:
    if outcome.failed:
        print(f"{len(outcome.failed)} cell(s) failed; their reasons are above and in <cell>/events.jsonl,"
              " their logs in <cell>/logs/. Rerun them with rerun_failed=true.", file=sys.stderr, flush=True)
        raise SystemExit(1)


def run_single(cfg: Any) -> Outcome:
    """One cell, composed by Hydra (`python -m sft_grid <overrides>` without -m)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    overrides = list(HydraConfig.get().overrides.task)
    with open_dict(cfg):
        cfg.pop("hydra", None)
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        outcome = execute([Composed(tuple(overrides), config)], [])
    except GridError as exc:
        _fail(exc)
        raise
    except Exception as exc:  # an interpolation that cannot resolve, reported like any other problem
        if type(exc).__module__.startswith("omegaconf"):
            _fail(GridError([composition_problem(overrides, str(exc))], "composition"))
        raise
    _exit_on_failures(outcome)
    return outcome
