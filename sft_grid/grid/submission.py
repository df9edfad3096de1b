"""The submission plan of a grid invocation, from its decisions (pure): every job, its name, size, throttle and
dependencies, before anything runs (see core/submission.py for why).

On Slurm: the staging job, where the site stages its Hub inputs on a transfer partition (stages/stage_job.py),
which the preps and the cells that need those inputs wait for (afterany); one array of the model preps that are not done (a task per model, unless one is already queued); the
cells to train as job arrays, one per (sbatch request, sweep directory, prep job they wait for), split at
MaxArraySize and throttled by the grid's concurrency; for each training array a post-training array whose tasks each wait for their training
task (aftercorr; afterok for a single job); and one post array for completed cells whose stages are pending.
Locally: the preps, then the cells in order, then completed cells' pending stages.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.state import SchedulerView
from sft_grid.core.submission import (JOB_PREFIX, CellFiles, Dependency, LocalJob, PrepWait, Role, SlurmJob,
                                      SlurmRequest, SubmissionPlan)
from sft_grid.core.timefmt import parse_minutes
from sft_grid.core import events
from sft_grid.grid.decide import Action, Decision
from sft_grid.planning.inputs import Prep, prep_for
from sft_grid.stages import prep as prep_stage
from sft_grid.stages.post import stages_for
from sft_grid.stages.stage_job import STAGE_FILE, StageWork

# post-training jobs: consolidation of a 32B checkpoint takes minutes, an upload more
POST_TIME_MIN = 120


def request_for(spec: Any, timeout_min: int) -> SlurmRequest:
    """The sbatch request of a cell (spec: the cell's CellConf)."""
    c = spec.cluster
    params: dict[str, Any] = {
        "time": timeout_min,
        "nodes": spec.nodes,
        "ntasks_per_node": 1,  # one launcher per node: torchrun/accelerate start the ranks
        "cpus_per_task": c.cpus_per_node,
        # USR2 this long before the limit: the job checkpoints, requeues itself and resumes
        "signal_delay_s": min(120, max(30, timeout_min * 60 // 10)),
        "additional_parameters": tuple(sorted({"requeue": True, **c.sbatch_extra}.items())),
        # a node whose launcher fails ends the whole step: the others would wait at the rendezvous forever
        "srun_args": ("--kill-on-bad-exit=1",),
    }
    for key in ("partition", "account", "qos", "constraint", "exclude"):
        if getattr(c, key):
            params[key] = getattr(c, key)
    if c.mem_gb:
        params["mem"] = f"{c.mem_gb}GB"
    if c.gpus_per_node and c.gpu_directive == "gpus_per_node":
        params["gpus_per_node"] = c.gpus_per_node
    elif c.gpus_per_node and c.gpu_directive == "gres":
        params["gres"] = f"gpu:{c.gpus_per_node}"
    return SlurmRequest(tuple(sorted(params.items())), c.max_requeues)


def post_request_for(spec: Any, needs_hub: bool) -> SlurmRequest:
    """A cell's post job: one node without GPUs, on the cluster's post_partition when the job must reach the
    Hub from a site whose compute nodes have no internet."""
    request = request_for(spec, POST_TIME_MIN)
    changes: dict[str, Any] = {"nodes": 1, "cpus_per_task": max(1, min(4, spec.cluster.cpus_per_node // 2))}
    if needs_hub and not spec.cluster.internet_on_compute and spec.cluster.post_partition:
        changes["partition"] = spec.cluster.post_partition
    # a few cores: consolidation and uploads are bound by memory and network, and training needs the rest
    return SlurmRequest(request.replace(drop=("gpus_per_node", "gres"), **changes).params, 0)


def prep_request(request: SlurmRequest) -> SlurmRequest:
    """A model prep's job, cut down from its first cell's request: one node, at most an hour, one GPU at most
    (it loads one checkpoint on one process; partitions may insist on one), never requeued."""
    params = dict(request.params)
    extra = tuple(sorted((k, v) for k, v in dict(params.get("additional_parameters", ())).items() if k != "requeue"))
    changes: dict[str, Any] = {"nodes": 1, "time": min(prep_stage.TIME_MIN, int(params["time"])),
                               "additional_parameters": extra}
    if params.get("gpus_per_node"):
        changes["gpus_per_node"] = 1
    if params.get("gres"):
        changes["gres"] = "gpu:1"
    return SlurmRequest(request.replace(drop=("signal_delay_s",), **changes).params, 0)


def stage_request(cluster: Any) -> SlurmRequest:
    """The staging job: one node of the transfer partition (the cluster's own when it names none), a few cores, no
    GPU, the staging wall time, the staging setup lines first; never requeued."""
    st = cluster.staging
    params: dict[str, Any] = {"time": int(parse_minutes(st.time)), "nodes": 1, "ntasks_per_node": 1,
                              "cpus_per_task": max(1, min(2, cluster.cpus_per_node))}
    for key in ("account", "qos"):
        if getattr(cluster, key):
            params[key] = getattr(cluster, key)
    if st.partition or cluster.partition:
        params["partition"] = st.partition or cluster.partition
    if st.setup:
        params["setup"] = tuple(st.setup)
    return SlurmRequest(tuple(sorted(params.items())), 0)


def _stage_job(work: StageWork | None, histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None,
               jobs: list[SlurmJob]) -> Dependency | None:
    """What the cells that need the staging wait for: the staging job (appended to `jobs`), or the one an earlier
    invocation queued while it is still queued or running."""
    if work is None:
        return None
    queued = _queued_prep(histories.get(work.dir, ()), view)
    if queued:
        return Dependency("afterany", queued, planned=False)
    request = stage_request(work.cluster)
    name = job_name(Role.STAGE, [work.dir], request, None, [_count(histories.get(work.dir, ()), Kind.SUBMITTED)])
    jobs.append(SlurmJob(name, Role.STAGE, (work.dir,), request, work.dir / SUBMITIT_DIR / name,
                         label=f"{len(work.pins)} Hub repositories"))
    return Dependency("afterany", name)


def job_name(role: Role, targets: Sequence[Path], request: SlurmRequest, dependency: Dependency | None,
             attempts: Sequence[int]) -> str:
    """`sft_grid-<hash>` of what the job runs and how often its targets were submitted before: a dry run and
    the real run that follows it name it alike; the next submission of the same targets gets a new name."""
    blob = json.dumps([role.value, [str(t) for t in targets], repr(request), repr(dependency), list(attempts)])
    return JOB_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]


def _count(history: Sequence[Event], kind: Kind) -> int:
    return sum(1 for e in history if e.kind is kind)


def _minutes(decision: Decision) -> int:
    return int(parse_minutes(decision.cell.spec.time))


def build(decisions: Sequence[Decision], histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None,
          max_array_size: int, writes: Sequence[CellFiles] = (), staging: StageWork | None = None) -> SubmissionPlan:
    """The plan of these decisions; `writes`: the cell files to write (rendered by the flow); `staging`: the
    staging job the site needs for these cells' inputs."""
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
    local_jobs, submits = _local(local, preps, pending_preps)
    slurm_jobs, waits = _slurm(on_slurm, preps, histories, view, max_array_size, work)
    first = (local or [None])[0]
    return SubmissionPlan(
        writes=tuple(writes),
        recoveries=tuple(d.recovery for d in decisions if d.recovery is not None),
        archives=tuple(d.dir for d in to_run if d.archive),
        submits=submits,
        scripts=scripts,
        local=local_jobs,
        slurm=slurm_jobs,
        waits=waits,
        max_parallel=first.cell.spec.cluster.max_parallel if first else 1,
        wait=first.cell.spec.cluster.wait if first else True,
        max_array_size=max_array_size,
    )


def _local(decisions: Sequence[Decision], preps: Mapping[Path, Prep | None],
           pending: Mapping[Path, tuple[Prep, Decision]]) -> tuple[tuple[LocalJob, ...], tuple[Path, ...]]:
    jobs: list[LocalJob] = []
    seen: set[Path] = set()
    for d in decisions:
        p = preps.get(d.dir)
        if d.action is Action.RUN and p is not None and p.dir in pending and p.dir not in seen:
            seen.add(p.dir)
            jobs.append(LocalJob(Role.PREP, p.dir, p.model, prep_stage.TIME_MIN))
    runs = [d for d in decisions if d.action is Action.RUN]
    for d in runs:
        p = preps.get(d.dir)
        jobs.append(LocalJob(Role.TRAIN, d.dir, d.cell.name, _minutes(d),
                             after=p.dir if p is not None and p.dir in pending else None))
    for d in decisions:
        if d.action is Action.POST:
            jobs.append(LocalJob(Role.POST, d.dir, d.cell.name, POST_TIME_MIN))
    return tuple(jobs), tuple(d.dir for d in runs)


def _slurm(decisions: Sequence[Decision], preps: Mapping[Path, Prep | None],
           histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None,
           max_array_size: int, work: StageWork | None = None) -> tuple[tuple[SlurmJob, ...], tuple[PrepWait, ...]]:
    runs = [d for d in decisions if d.action is Action.RUN]
    jobs: list[SlurmJob] = []
    after_staging = _stage_job(work, histories, view, jobs)
    waits = _preps(runs, preps, histories, view, jobs, after_staging)
    wait_of = {w.cell_dir: w.job for w in waits}
    if after_staging is not None and work is not None:  # cells without a prep of their own wait for the staging
        wait_of.update({d.dir: after_staging for d in runs if d.dir in work.cells and d.dir not in wait_of})
    concurrency = [d.cell.spec.concurrency for d in runs if d.cell.spec.concurrency]
    throttle = min(concurrency) if concurrency else None
    groups: dict[tuple[Any, ...], list[Decision]] = {}
    for d in runs:
        request = request_for(d.cell.spec, _minutes(d))
        groups.setdefault((request, d.dir.parent, wait_of.get(d.dir)), []).append(d)
    for (request, sweep_dir, dependency), members in groups.items():
        for i in range(0, len(members), max_array_size):
            chunk = members[i:i + max_array_size]
            dirs = [d.dir for d in chunk]
            attempts = [_count(histories.get(p, ()), Kind.SUBMITTED) for p in dirs]
            name = job_name(Role.TRAIN, dirs, request, dependency, attempts)
            jobs.append(SlurmJob(name, Role.TRAIN, tuple(dirs), request, sweep_dir / SUBMITIT_DIR / name, throttle,
                                 dependency, checkpointable=True))
            after = Dependency("aftercorr" if len(dirs) > 1 else "afterok", name)
            jobs.append(_post_job(chunk, after, histories))
    by_sweep: dict[Path, list[Decision]] = {}
    for d in decisions:
        if d.action is Action.POST:
            by_sweep.setdefault(d.dir.parent, []).append(d)
    for members in by_sweep.values():
        jobs.append(_post_job(members, None, histories))
    return tuple(jobs), tuple(waits)


def _post_job(cells: Sequence[Decision], after: Dependency | None,
              histories: Mapping[Path, Sequence[Event]]) -> SlurmJob:
    needs_hub = any("upload" in stages_for(d.cell.spec) for d in cells)
    request = post_request_for(cells[0].cell.spec, needs_hub)
    dirs = [d.dir for d in cells]
    attempts = [_count(histories.get(p, ()), Kind.POST_JOB) for p in dirs]
    name = job_name(Role.POST, dirs, request, after, attempts)
    return SlurmJob(name, Role.POST, tuple(dirs), request, dirs[0].parent / SUBMITIT_DIR / name, None, after)


def _preps(runs: Sequence[Decision], preps: Mapping[Path, Prep | None], histories: Mapping[Path, Sequence[Event]],
           view: SchedulerView | None, jobs: list[SlurmJob], after: Dependency | None = None) -> list[PrepWait]:
    """The model preps these cells wait for: one array of every prep not done and not already queued (a task
    per model), and the cells' dependency on it. A cell waits for the preps to end, not to succeed (afterany):
    its job's first step finds whether its own model's prep succeeded, so one broken checkpoint never cancels
    the cells of the others, and the grid needs one prep job, not one per model."""
    waits: list[PrepWait] = []
    new: dict[Path, tuple[Prep, Decision]] = {}
    queued: dict[Path, str] = {}
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        if p.dir not in new and p.dir not in queued:
            job_id = _queued_prep(histories.get(p.dir, ()), view)
            if job_id:
                queued[p.dir] = job_id
            else:
                new[p.dir] = (p, d)
    name = ""
    if new:
        targets = sorted(new)
        request = prep_request(request_for(new[targets[0]][1].cell.spec, _minutes(new[targets[0]][1])))
        attempts = [_count(histories.get(t, ()), Kind.SUBMITTED) for t in targets]
        name = job_name(Role.PREP, targets, request, None, attempts)
        jobs.append(SlurmJob(name, Role.PREP, tuple(targets), request, targets[0].parent / SUBMITIT_DIR / name,
                             dependency=after, label=", ".join(new[t][0].model for t in targets)))
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        dependency = (Dependency("afterany", queued[p.dir], planned=False) if p.dir in queued
                      else Dependency("afterany", name))
        waits.append(PrepWait(d.dir, p.model, p.model_dir, dependency))
    return waits


def _queued_prep(history: Sequence[Event], view: SchedulerView | None) -> str:
    """The prep's job an earlier invocation queued, while it is still queued or running ("" if none)."""
    queued = events.last(list(history), Kind.JOB)
    if queued is None or view is None:
        return ""
    job = view.job(queued.job_id)
    return queued.job_id if job is not None and job.in_flight else ""
