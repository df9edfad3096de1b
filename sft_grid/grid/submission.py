"""The submission plan of a grid invocation, from its decisions (pure): every job, its name, size, throttle and
dependencies, before anything runs (see core/submission.py for why).

On Slurm: the jobs before training (grid/before.py: the staging job where the site stages on a transfer partition,
one array of the model preps not done, one array of the tokenizations not built, in a chain); the
cells to train as job arrays, one per (sbatch request, sweep directory, prep job they wait for), split at
MaxArraySize and throttled by the grid's concurrency; for each training array a post-training array whose tasks
each wait for their training task (aftercorr; afterok for a single job), and an evaluation array whose tasks each
wait for their post task (grid/eval_jobs.py); one post array for completed cells whose stages are pending, and an
evaluation array for completed cells with missing scores; one evaluation array of the grid's base models.
Locally: the preps and tokenizations, then the cells in order (each evaluated in its own job), then completed
cells' pending stages and evaluations, then the base models' evaluations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.state import SchedulerView
from sft_grid.core.submission import CellFiles, Dependency, LocalJob, PrepWait, Role, SlurmJob, SubmissionPlan
from sft_grid.grid import before
from sft_grid.grid.decide import Action, BaseDecision, Decision
from sft_grid.grid.eval_jobs import base_eval_jobs, cell_eval_jobs, local_base_jobs
from sft_grid.grid.requests import (POST_TIME_MIN, count, job_name, minutes, post_request_for,  # noqa: F401
                                    request_for)  # (request_for, post_request_for: re-exported)
from sft_grid.planning.inputs import Prep, prep_for
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import tokenize as tokenize_stage
from sft_grid.stages.post import stages_for
from sft_grid.stages.staging.in_job import STAGE_FILE, StageWork
from sft_grid.stages.tokenize import Tokenization


def build(decisions: Sequence[Decision], histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None,
          max_array_size: int, writes: Sequence[CellFiles] = (), bases: Sequence[BaseDecision] = (),
          staging: StageWork | None = None, tokenized: Mapping[Path, Tokenization] | None = None) -> SubmissionPlan:
    """The plan of these decisions; `writes`: the cell files to write (rendered by the flow); `bases`: the base
    models' evaluations; `staging`: the staging job the site needs for these cells' inputs; `tokenized`: cell dir
    -> the tokenized dataset it shares."""
    to_run = [d for d in decisions if d.action is Action.RUN]
    post_only = [d for d in decisions if d.action is Action.POST]
    local = [d for d in to_run + post_only if d.cell.spec.cluster.executor == "local"]
    on_slurm = [d for d in to_run + post_only if d.cell.spec.cluster.executor != "local"]
    preps = {d.dir: prep_for(d.cell) for d in to_run}
    pending_preps = {p.dir: (p, d) for d in to_run if (p := preps[d.dir]) is not None and not p.complete}
    scripts = tuple(CellFiles(p.dir, {prep_stage.SCRIPT: prep_stage.script(p, d.cell)})
                    for p, d in pending_preps.values())
    work = staging if staging is not None and any(d.dir in staging.cells for d in to_run) else None
    scripts += (CellFiles(work.dir, {STAGE_FILE: work.file()}),) if work is not None else ()
    tokens = {d.dir: t for d in to_run if (t := (tokenized or {}).get(d.dir)) is not None and not t.data.complete}
    firsts = {t.dir: (t, d) for d in reversed(to_run) if (t := tokens.get(d.dir)) is not None}
    scripts += tuple(CellFiles(t.dir, tokenize_stage.files(t, d.cell)) for t, d in firsts.values())
    local_jobs, submits = _local(local, preps, pending_preps, tokens)
    slurm_jobs, waits = _slurm(on_slurm, preps, histories, view, max_array_size, work, tokens)
    local_jobs += tuple(local_base_jobs([b for b in bases if b.target.cell.spec.cluster.executor == "local"]))
    slurm_jobs += tuple(base_eval_jobs([b for b in bases if b.target.cell.spec.cluster.executor != "local"], histories))
    first = (local or [None])[0]
    return SubmissionPlan(
        writes=tuple(writes),
        recoveries=tuple(d.recovery for d in decisions if d.recovery is not None),
        archives=tuple(d.dir for d in to_run if d.archive),
        submits=submits,
        notes={d.dir: d.note for d in to_run if d.note},
        scripts=scripts,
        local=local_jobs,
        slurm=slurm_jobs,
        waits=waits,
        max_parallel=first.cell.spec.cluster.max_parallel if first else 1,
        wait=first.cell.spec.cluster.wait if first else True,
        max_array_size=max_array_size,
        tokenized={cell_dir: t.dir for cell_dir, t in tokens.items()},
    )


def _local(decisions: Sequence[Decision], preps: Mapping[Path, Prep | None],
           pending: Mapping[Path, tuple[Prep, Decision]], tokens: Mapping[Path, Tokenization],
           ) -> tuple[tuple[LocalJob, ...], tuple[Path, ...]]:
    """The preps, then the tokenizations, then the cells, then completed cells' pending stages."""
    jobs: list[LocalJob] = []
    seen: set[Path] = set()
    for d in decisions:
        p = preps.get(d.dir)
        if d.action is Action.RUN and p is not None and p.dir in pending and p.dir not in seen:
            seen.add(p.dir)
            jobs.append(LocalJob(Role.PREP, p.dir, p.model, prep_stage.TIME_MIN))
    for d in decisions:
        t = tokens.get(d.dir)
        if t is not None and t.dir not in seen:
            seen.add(t.dir)
            jobs.append(LocalJob(Role.TOKENIZE, t.dir, f"{t.backend} {t.data.key}", tokenize_stage.TIME_MIN))
    runs = [d for d in decisions if d.action is Action.RUN]
    for d in runs:
        p = preps.get(d.dir)
        jobs.append(LocalJob(Role.TRAIN, d.dir, d.cell.name, minutes(d),
                             after=p.dir if p is not None and p.dir in pending else None))
    for d in decisions:
        if d.action is Action.POST:
            jobs.append(LocalJob(Role.POST, d.dir, d.cell.name, POST_TIME_MIN))
    return tuple(jobs), tuple(d.dir for d in runs)


def _slurm(decisions: Sequence[Decision], preps: Mapping[Path, Prep | None],
           histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None, max_array_size: int,
           work: StageWork | None, tokens: Mapping[Path, Tokenization],
           ) -> tuple[tuple[SlurmJob, ...], tuple[PrepWait, ...]]:
    runs = [d for d in decisions if d.action is Action.RUN]
    jobs: list[SlurmJob] = []
    # the chain before training: staging -> preps -> tokenizations; a cell waits for the last it needs
    after_staging = before.stage_job(work, histories, view, jobs)
    waits = before.prep_jobs(runs, preps, histories, view, jobs, after_staging)
    prep_array = next((Dependency("afterany", j.name) for j in jobs if j.role is Role.PREP), None)
    wait_of = {w.cell_dir: w.job for w in waits}
    if after_staging is not None and work is not None:  # cells without a prep of their own wait for the staging
        wait_of.update({d.dir: after_staging for d in runs if d.dir in work.cells and d.dir not in wait_of})
    wait_of.update(before.tokenize_jobs(runs, tokens, histories, view, jobs, prep_array or after_staging))
    concurrency = [d.cell.spec.concurrency for d in runs if d.cell.spec.concurrency]
    throttle = min(concurrency) if concurrency else None
    groups: dict[tuple[Any, ...], list[Decision]] = {}
    for d in runs:
        request = _avoiding(request_for(d.cell.spec, minutes(d)), d.exclude)
        groups.setdefault((request, d.dir.parent, wait_of.get(d.dir)), []).append(d)
    for (request, sweep_dir, dependency), members in groups.items():
        for i in range(0, len(members), max_array_size):
            chunk = members[i:i + max_array_size]
            dirs = [d.dir for d in chunk]
            attempts = [count(histories.get(p, ()), Kind.SUBMITTED) for p in dirs]
            name = job_name(Role.TRAIN, dirs, request, dependency, attempts)
            jobs.append(SlurmJob(name, Role.TRAIN, tuple(dirs), request, sweep_dir / SUBMITIT_DIR / name, throttle,
                                 dependency, checkpointable=True))
            after = Dependency("aftercorr" if len(dirs) > 1 else "afterok", name)
            post = _post_job(chunk, after, histories)
            jobs += [post, *cell_eval_jobs(chunk, post, histories, throttle)]
    by_sweep: dict[Path, list[Decision]] = {}
    for d in decisions:
        if d.action is Action.POST:
            by_sweep.setdefault(d.dir.parent, []).append(d)
    for members in by_sweep.values():
        staged = [d for d in members if d.post]
        post_job = _post_job(staged, None, histories) if staged else None
        jobs += [post_job] if post_job is not None else []
        jobs += cell_eval_jobs(members, post_job, histories, throttle)
    return tuple(jobs), tuple(waits)


def _avoiding(request: SlurmRequest, nodes: Sequence[str]) -> SlurmRequest:
    """The request with these nodes added to its --exclude (a requeue away from a node its failure named)."""
    if not nodes:
        return request
    have = [n for n in str(dict(request.params).get("exclude") or "").split(",") if n]
    return request.replace(exclude=",".join(dict.fromkeys([*have, *nodes])))


def _post_job(cells: Sequence[Decision], after: Dependency | None,
              histories: Mapping[Path, Sequence[Event]]) -> SlurmJob:
    needs_hub = any("upload" in stages_for(d.cell.spec) for d in cells)
    request = post_request_for(cells[0].cell.spec, needs_hub)
    dirs = [d.dir for d in cells]
    attempts = [count(histories.get(p, ()), Kind.POST_JOB) for p in dirs]
    name = job_name(Role.POST, dirs, request, after, attempts)
    return SlurmJob(name, Role.POST, tuple(dirs), request, dirs[0].parent / SUBMITIT_DIR / name, None, after)
