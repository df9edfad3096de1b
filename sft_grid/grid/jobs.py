"""The submission plan of a grid invocation, from its decisions (pure): every job, its name, size, throttle and
dependencies, before anything runs (see core/submission.py for why).

On Slurm: the jobs before training (the staging job where the site stages on a transfer partition,
one array of the model preps not done, one array of the tokenizations not built, in a chain); the
cells to train as job arrays, one per (sbatch request, sweep directory, prep job they wait for), split at
MaxArraySize and throttled by the grid's concurrency; for each training array a post-training array whose tasks
each wait for their training task (aftercorr; afterok for a single job), and an evaluation array whose tasks each
wait for their post task; one post array for completed cells whose stages are pending, and an
evaluation array for completed cells with missing scores; one evaluation array of the checkpoints of skipped cells
(training, failed, pruned) that have no score yet (scores along training: it waits for nothing, and
nothing waits for it); one evaluation array of the grid's base models.
Locally: the preps and tokenizations, then the cells in order (each evaluated in its own job), then completed
cells' pending stages and evaluations, then skipped cells' checkpoint scores, then the base models' evaluations.

Every Slurm job, whatever its kind, is made by one builder (`slurm_job`); what really differs between the six kinds
(train, post, eval, prep, tokenize, stage) is their request, their targets, what they wait for, and a few facts
in `_KINDS` (which ledger event counts their earlier attempts, whether what they wait for is part of their name,
whether they checkpoint, where their submitit folder lives). The names jobs had before stay as they were: a job's
name is what the next invocation recognises it by.

In order: the plan from the decisions; the jobs before training (staging, preps, tokenizations, in a chain, each
function returning its job); the sbatch requests and names of the training and post-training jobs; the evaluation
jobs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.schema import CellConf, ClusterConf, EvalConf
from sft_grid.core.state import SchedulerView
from sft_grid.core.submission import (
    JOB_PREFIX,
    CellFiles,
    Dependency,
    LocalJob,
    PrepWait,
    Role,
    SlurmJob,
    SlurmRequest,
    SubmissionPlan,
)
from sft_grid.core.timefmt import parse_minutes
from sft_grid.grid.decide import Action, BaseDecision, Decision
from sft_grid.planning.cells import Cell, layout_for
from sft_grid.planning.evaluation import suites_of
from sft_grid.planning.inputs import Prep, prep_for
from sft_grid.sites import facts as site_facts
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import tokenize as tokenize_stage
from sft_grid.stages.post_training import stages_for
from sft_grid.stages.staging.in_job import STAGE_FILE, StageWork
from sft_grid.stages.tokenize import Tokenization


def build(
    decisions: Sequence[Decision],
    histories: Mapping[Path, Sequence[Event]],
    view: SchedulerView | None,
    max_array_size: int,
    *,
    writes: Sequence[CellFiles] = (),
    bases: Sequence[BaseDecision] = (),
    staging: StageWork | None = None,
    tokenized: Mapping[Path, Tokenization] | None = None,
    provenance: Mapping[Path, Mapping[str, Any]] | None = None,
) -> SubmissionPlan:
    """The plan of these decisions; `writes`: the cell files to write (rendered by the flow); `bases`: the base
    models' evaluations; `staging`: the staging job the site needs for these cells' inputs; `tokenized`: cell dir
    -> the tokenized dataset it shares; `provenance`: cell dir -> what its `submitted` event records of its inputs
    and the checkout."""
    to_run = [d for d in decisions if d.action is Action.RUN]
    post_only = [d for d in decisions if d.action is Action.POST]
    local = [d for d in to_run + post_only if d.cell.spec.cluster.executor == "local"]
    on_slurm = [d for d in to_run + post_only if d.cell.spec.cluster.executor != "local"]
    preps = {d.dir: prep_for(d.cell) for d in to_run}
    pending_preps = {p.dir: (p, d) for d in to_run if (p := preps[d.dir]) is not None and not p.complete}
    # in a grid across sites each prep and tokenization also gets a script for each site, from that site's first
    # cell (its cluster's setup and environment: stages/once.py runs a site's own)
    prep_sites = _sites_of([(p.dir, d) for d in to_run if (p := preps[d.dir]) is not None and not p.complete])
    scripts = tuple(
        CellFiles(p.dir, prep_stage.files(p, d.cell, prep_sites.get(p.dir, {}))) for p, d in pending_preps.values()
    )
    work = staging if staging is not None and any(d.dir in staging.cells for d in to_run) else None
    scripts += (CellFiles(work.dir, {STAGE_FILE: work.file()}),) if work is not None else ()
    # each tokenization's marker read once, not once per cell
    built = {t.dir: t.data.complete for t in {t.dir: t for t in (tokenized or {}).values()}.values()}
    tokens = {d.dir: t for d in to_run if (t := (tokenized or {}).get(d.dir)) is not None and not built[t.dir]}
    firsts = {t.dir: (t, d) for d in reversed(to_run) if (t := tokens.get(d.dir)) is not None}
    tok_sites = _sites_of([(t.dir, d) for d in to_run if (t := tokens.get(d.dir)) is not None])
    scripts += tuple(
        CellFiles(t.dir, tokenize_stage.files(t, d.cell, tok_sites.get(t.dir, {}))) for t, d in firsts.values()
    )
    local_jobs, submits = _local(local, preps, pending_preps, tokens)
    slurm_jobs, waits = _slurm(on_slurm, preps, histories, view, max_array_size, work, tokens)
    scoring = [d for d in decisions if d.action is Action.SKIP and d.evaluate]
    local_jobs += tuple(local_checkpoint_jobs([d for d in scoring if d.cell.spec.cluster.executor == "local"]))
    by_sweep: dict[Path, list[Decision]] = {}  # (an array's submitit folder is beside its cells)
    for d in scoring:
        if d.cell.spec.cluster.executor != "local":
            by_sweep.setdefault(d.dir.parent, []).append(d)
    for members in by_sweep.values():
        slurm_jobs += tuple(cell_eval_jobs(members, None, histories, label="their checkpoints"))
    local_jobs += tuple(local_base_jobs([b for b in bases if b.target.cell.spec.cluster.executor == "local"]))
    slurm_jobs += tuple(base_eval_jobs([b for b in bases if b.target.cell.spec.cluster.executor != "local"], histories))
    first = local[0] if local else None
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
        provenance=dict(provenance or {}),
    )


def _sites_of(users: Sequence[tuple[Path, Decision]]) -> dict[Path, dict[str, Cell]]:
    """Of each directory's users (a prep's or a tokenization's cells, in order), the first cell of each site of a
    grid across sites (none in a one-site grid)."""
    found: dict[Path, dict[str, Cell]] = {}
    for directory, d in users:
        if site := site_of(d.cell.spec):
            found.setdefault(directory, {}).setdefault(site, d.cell)
    return found


def _local(
    decisions: Sequence[Decision],
    preps: Mapping[Path, Prep | None],
    pending: Mapping[Path, tuple[Prep, Decision]],
    tokens: Mapping[Path, Tokenization],
) -> tuple[tuple[LocalJob, ...], tuple[Path, ...]]:
    """The preps, then the tokenizations, then the cells, then completed cells' pending stages."""
    jobs: list[LocalJob] = []
    seen: set[Path] = set()
    for d in decisions:
        p = preps.get(d.dir)
        if d.action is Action.RUN and p is not None and p.dir in pending and p.dir not in seen:
            seen.add(p.dir)
            jobs.append(LocalJob(role=Role.PREP, target=p.dir, label=p.model, timeout_min=prep_stage.TIME_MIN))
    for d in decisions:
        t = tokens.get(d.dir)
        if t is not None and t.dir not in seen:
            seen.add(t.dir)
            label = f"{t.backend} {t.data.key}"
            jobs.append(LocalJob(role=Role.TOKENIZE, target=t.dir, label=label, timeout_min=tokenize_stage.TIME_MIN))
    runs = [d for d in decisions if d.action is Action.RUN]
    for d in runs:
        p = preps.get(d.dir)
        after = p.dir if p is not None and p.dir in pending else None
        jobs.append(LocalJob(role=Role.TRAIN, target=d.dir, label=d.cell.name, timeout_min=minutes(d), after=after))
    jobs += [
        LocalJob(role=Role.POST, target=d.dir, label=d.cell.name, timeout_min=POST_TIME_MIN)
        for d in decisions
        if d.action is Action.POST
    ]
    return tuple(jobs), tuple(d.dir for d in runs)


def _slurm(
    decisions: Sequence[Decision],
    preps: Mapping[Path, Prep | None],
    histories: Mapping[Path, Sequence[Event]],
    view: SchedulerView | None,
    max_array_size: int,
    work: StageWork | None,
    tokens: Mapping[Path, Tokenization],
) -> tuple[tuple[SlurmJob, ...], tuple[PrepWait, ...]]:
    runs = [d for d in decisions if d.action is Action.RUN]
    concurrency = [d.cell.spec.concurrency for d in runs if d.cell.spec.concurrency]
    throttle = min(concurrency) if concurrency else None
    jobs: list[SlurmJob] = []
    waits: list[PrepWait] = []
    # each cluster's chain, then its training arrays: a cell's prep job is queued before the cell (its ledger
    # records the prep's job id of its own cluster)
    clusters = _by_cluster(runs)
    for members in clusters:
        # an earlier invocation's job of a stage is waited for in a grid of one cluster only: the stage's ledger
        # does not say which cluster's job it is (its id may be another cluster's), so elsewhere a new one is queued
        earlier = view if len(clusters) == 1 and not site_of(members[0].cell.spec) else None
        before, wait_of, prep_waits = _before_training(members, preps, histories, earlier, work, tokens)
        jobs += before
        waits += prep_waits
        groups: dict[tuple[Any, ...], list[Decision]] = {}
        for d in members:
            request = _avoiding(request_for(d.cell.spec, minutes(d)), d.exclude)
            groups.setdefault((request, d.dir.parent, wait_of.get(d.dir)), []).append(d)
        for (request, _sweep_dir, dependency), group in groups.items():
            for i in range(0, len(group), max_array_size):
                chunk = group[i : i + max_array_size]
                train = slurm_job(
                    Role.TRAIN, [d.dir for d in chunk], request, histories, dependency=dependency, throttle=throttle
                )
                after = Dependency("aftercorr" if len(chunk) > 1 else "afterok", train.name)
                post = _post_job(chunk, after, histories)
                jobs += [train, post, *cell_eval_jobs(chunk, post, histories, throttle)]
    by_sweep: dict[Path, list[Decision]] = {}
    for d in decisions:
        if d.action is Action.POST:
            by_sweep.setdefault(d.dir.parent, []).append(d)
    for post_only in by_sweep.values():
        staged = [d for d in post_only if d.post]
        post_job = _post_job(staged, None, histories) if staged else None
        jobs += [post_job] if post_job is not None else []
        jobs += cell_eval_jobs(post_only, post_job, histories, throttle)
    return tuple(jobs), tuple(waits)


def site_of(spec: CellConf) -> str:
    """The site a grid across sites placed the cell on (its cluster profile's name); "" in a one-site grid."""
    return spec.cluster.name if spec.sites else ""


def _by_cluster(runs: Sequence[Decision]) -> list[list[Decision]]:
    """The cells to train, by the cluster their jobs go to (their site, and the Slurm client environment that
    reaches it), in the order of their first cell: one group in a one-site grid."""
    groups: dict[tuple[Any, ...], list[Decision]] = {}
    for d in runs:
        c = d.cell.spec.cluster
        groups.setdefault((site_of(d.cell.spec), c.name, tuple(sorted(c.client_env.items()))), []).append(d)
    return list(groups.values())


def _before_training(
    runs: Sequence[Decision],
    preps: Mapping[Path, Prep | None],
    histories: Mapping[Path, Sequence[Event]],
    view: SchedulerView | None,
    work: StageWork | None,
    tokens: Mapping[Path, Tokenization],
) -> tuple[list[SlurmJob], dict[Path, Dependency], list[PrepWait]]:
    """The chain before training of the cells of one cluster, queued on that cluster (a Slurm dependency can only
    name a job of its own cluster): staging -> preps -> tokenizations; each cell waits for the last it needs.
    `view`: the scheduler's jobs, where an earlier invocation's job still queued may be waited for (None: never).

    A staging, prep or tokenization that cells of two sites need is queued on each site (their jobs build it in
    one directory: the first builds it, the others find it built, stages/once.py); one already complete is
    queued nowhere."""
    first = runs[0].cell.spec
    needing = [d for d in runs if work is not None and d.dir in work.cells]
    here = replace(work, cluster=needing[0].cell.spec.cluster) if work is not None and needing else None
    stage, after_staging = stage_job(here, histories, view, site_of(first))
    prep, waits = prep_jobs(runs, preps, histories, view, after_staging)
    prep_array = Dependency("afterany", prep.name) if prep is not None else None
    wait_of = {w.cell_dir: w.job for w in waits}
    if after_staging is not None:  # cells without a prep of their own wait for the staging
        wait_of.update({d.dir: after_staging for d in needing if d.dir not in wait_of})
    tokenizing, tokenize_waits = tokenize_jobs(runs, tokens, histories, view, prep_array or after_staging)
    wait_of.update(tokenize_waits)
    return [j for j in (stage, prep, tokenizing) if j is not None], wait_of, waits


def _avoiding(request: SlurmRequest, nodes: Sequence[str]) -> SlurmRequest:
    """The request with these nodes added to its --exclude (a requeue away from a node its failure named)."""
    if not nodes:
        return request
    have = [n for n in str(dict(request.params).get("exclude") or "").split(",") if n]
    return request.replace(exclude=",".join(dict.fromkeys([*have, *nodes])))


def _post_job(
    cells: Sequence[Decision], after: Dependency | None, histories: Mapping[Path, Sequence[Event]]
) -> SlurmJob:
    needs_hub = any("upload" in stages_for(d.cell.spec) for d in cells)
    request = post_request_for(cells[0].cell.spec, needs_hub)
    return slurm_job(Role.POST, [d.dir for d in cells], request, histories, dependency=after)


# post-training jobs: consolidation of a 32B checkpoint takes minutes, an upload more
POST_TIME_MIN = 120


def request_for(spec: CellConf, timeout_min: int) -> SlurmRequest:
    """The sbatch request of a cell: its site's request (sites/facts.py: the same one `sbatch --test-only` is asked
    with) for its nodes, the cell's own or the fewest that fit (planning/gpus.py)."""
    nodes = spec.nodes if spec.nodes is not None else layout_for(spec).nodes
    return site_facts.request_at(spec.cluster, nodes, timeout_min, site_of(spec))


def post_request_for(spec: CellConf, needs_hub: bool) -> SlurmRequest:
    """A cell's post job: one node without GPUs, on the cluster's post_partition when the job must reach the
    Hub from a site whose compute nodes have no internet."""
    request = request_for(spec, POST_TIME_MIN)
    changes: dict[str, Any] = {"nodes": 1, "cpus_per_task": max(1, min(4, spec.cluster.cpus_per_node // 2))}
    if needs_hub and not spec.cluster.internet_on_compute and spec.cluster.post_partition:
        changes["partition"] = spec.cluster.post_partition
    # a few cores: consolidation and uploads are bound by memory and network, and training needs the rest
    changes["additional_parameters"] = _without_gpus(request)
    return SlurmRequest(
        request.replace(drop=("gpus_per_node", "gres"), **changes).params, 0, request.client_env, request.site
    )


def _asks_for_gpus(option: str, value: Any) -> bool:
    name = option.replace("-", "_")
    return name.startswith(("gpu", "gres")) and (name != "gres" or "gpu" in str(value))


def _without_gpus(request: SlurmRequest) -> tuple[tuple[str, Any], ...]:
    """The cell's own sbatch options (cluster.sbatch_extra: licenses, a reservation, a hold, ...) for a job that
    needs no GPU: every option but those that ask for GPUs (a typed `gres: gpu:b200:4`, `gpus`, ...)."""
    extra = dict(dict(request.params).get("additional_parameters", ()))
    return tuple(sorted((k, v) for k, v in extra.items() if not _asks_for_gpus(k, v)))


def prep_request(request: SlurmRequest) -> SlurmRequest:
    """A model prep's job, cut down from its first cell's request: one node, at most an hour, one GPU at most
    (it loads one checkpoint on one process; partitions may insist on one), never requeued."""
    params = dict(request.params)
    extra = tuple(sorted((k, v) for k, v in dict(params.get("additional_parameters", ())).items() if k != "requeue"))
    changes: dict[str, Any] = {
        "nodes": 1,
        "time": min(prep_stage.TIME_MIN, int(params["time"])),
        "additional_parameters": extra,
    }
    if params.get("gpus_per_node"):
        changes["gpus_per_node"] = 1
    if params.get("gres"):
        changes["gres"] = "gpu:1"
    return SlurmRequest(
        request.replace(drop=("signal_delay_s",), **changes).params, 0, request.client_env, request.site
    )


def stage_request(cluster: ClusterConf, site: str = "") -> SlurmRequest:
    """The staging job: one node of the transfer partition (the cluster's own when it names none), a few cores, no
    GPU, the staging wall time, the staging setup lines first; never requeued. `site`: where a grid across sites
    queues it ("" in a one-site grid)."""
    st = cluster.staging
    params: dict[str, Any] = {
        "time": math.ceil(parse_minutes(st.time)),  # rounded up: a limit truncated to 0 is none
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": max(1, min(2, cluster.cpus_per_node)),
    }
    for key in ("account", "qos"):
        if getattr(cluster, key):
            params[key] = getattr(cluster, key)
    if st.partition or cluster.partition:
        params["partition"] = st.partition or cluster.partition
    if st.setup:
        params["setup"] = tuple(st.setup)
    return SlurmRequest(tuple(sorted(params.items())), 0, tuple(sorted(cluster.client_env.items())), site)


@dataclass(frozen=True, kw_only=True)
class _Kind:
    """What really differs between the kinds of Slurm job, beside their requests and targets."""

    # the ledger event that counts how often each target was submitted before (part of the job's name)
    attempts: Kind
    # whether what it waits for is part of its name (the jobs before training were named without it)
    named_by_dependency: bool = True
    # it requeues itself on USR2 (time limit near, preemption) and resumes from its last checkpoint
    checkpointable: bool = False
    # its submitit folder: inside its one target (the staging job's own directory), else beside its targets
    folder_in_target: bool = False


_KINDS = {
    Role.TRAIN: _Kind(attempts=Kind.SUBMITTED, checkpointable=True),
    Role.POST: _Kind(attempts=Kind.POST_JOB),
    Role.EVAL: _Kind(attempts=Kind.EVAL_JOB),
    Role.PREP: _Kind(attempts=Kind.SUBMITTED, named_by_dependency=False),
    Role.TOKENIZE: _Kind(attempts=Kind.SUBMITTED, named_by_dependency=False),
    Role.STAGE: _Kind(attempts=Kind.SUBMITTED, named_by_dependency=False, folder_in_target=True),
}


def slurm_job(
    role: Role,
    targets: Sequence[Path],
    request: SlurmRequest,
    histories: Mapping[Path, Sequence[Event]],
    *,
    dependency: Dependency | None = None,
    throttle: int | None = None,
    label: str = "",
) -> SlurmJob:
    """The one way a job of the plan is made, whatever its kind: a task per target, named by what it runs and how
    often its targets were submitted before, its submitit folder beside its targets."""
    kind = _KINDS[role]
    dirs = tuple(targets)
    attempts = [count(histories.get(t, ()), kind.attempts) for t in dirs]
    name = job_name(role, dirs, request, dependency if kind.named_by_dependency else None, attempts)
    home = dirs[0] if kind.folder_in_target else dirs[0].parent
    return SlurmJob(
        name=name,
        role=role,
        targets=dirs,
        request=request,
        folder=home / SUBMITIT_DIR / name,
        throttle=throttle,
        dependency=dependency,
        checkpointable=kind.checkpointable,
        label=label,
    )


def job_name(
    role: Role, targets: Sequence[Path], request: SlurmRequest, dependency: Dependency | None, attempts: Sequence[int]
) -> str:
    """`sft_grid-<hash>` of what the job runs and how often its targets were submitted before: a dry run and
    the real run that follows it name it alike; the next submission of the same targets gets a new name."""
    blob = json.dumps([role.value, [str(t) for t in targets], repr(request), repr(dependency), list(attempts)])
    return JOB_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]


def count(history: Sequence[Event], kind: Kind) -> int:
    return sum(1 for e in history if e.kind is kind)


def minutes(decision: Decision) -> int:
    """The cell's wall time in whole minutes, rounded up: Slurm's --time and submitit's timeout take minutes, and
    a limit under a minute truncated would be 0, which Slurm reads as no limit at all."""
    return math.ceil(parse_minutes(decision.cell.spec.time))


def tokenize_request(spec: CellConf) -> SlurmRequest:
    """A tokenize-once job: one CPU task on one node of the cluster's partition, all its cores (the backend's
    preprocessing uses them), no GPU, never requeued; the cluster's other sbatch options as its cells have them."""
    request = request_for(spec, tokenize_stage.TIME_MIN)
    extra = tuple((k, v) for k, v in _without_gpus(request) if k != "requeue")
    return SlurmRequest(
        request.replace(drop=("gpus_per_node", "gres", "signal_delay_s"), nodes=1, additional_parameters=extra).params,
        0,
        request.client_env,
        request.site,
    )


def stage_job(
    work: StageWork | None, histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None, site: str = ""
) -> tuple[SlurmJob | None, Dependency | None]:
    """The staging job to submit (None: none, or an earlier invocation's is still queued or running), and what the
    cells that need the staging wait for; `site`: where a grid across sites queues it."""
    if work is None:
        return None, None
    earlier = queued_job(histories.get(work.dir, ()), view)
    if earlier:
        return None, Dependency("afterany", earlier, planned=False)
    label = f"{len(work.pins)} Hub repositories"
    job = slurm_job(Role.STAGE, [work.dir], stage_request(work.cluster, site), histories, label=label)
    return job, Dependency("afterany", job.name)


def prep_jobs(
    runs: Sequence[Decision],
    preps: Mapping[Path, Prep | None],
    histories: Mapping[Path, Sequence[Event]],
    view: SchedulerView | None,
    after: Dependency | None = None,
) -> tuple[SlurmJob | None, list[PrepWait]]:
    """The model preps these cells wait for: one array of every prep not done and not already queued (a task
    per model; None when there is none to submit), and the cells' dependency on it. A cell waits for the preps to
    end, not to succeed (afterany): its job's first step finds whether its own model's prep succeeded, so one
    broken checkpoint never cancels the cells of the others, and the grid needs one prep job, not one per model."""
    waits: list[PrepWait] = []
    new: dict[Path, tuple[Prep, Decision]] = {}
    queued: dict[Path, str] = {}
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        if p.dir not in new and p.dir not in queued:
            job_id = queued_job(histories.get(p.dir, ()), view)
            if job_id:
                queued[p.dir] = job_id
            else:
                new[p.dir] = (p, d)
    job = None
    if new:
        targets = sorted(new)
        request = prep_request(request_for(new[targets[0]][1].cell.spec, minutes(new[targets[0]][1])))
        label = ", ".join(new[t][0].model for t in targets)
        job = slurm_job(Role.PREP, targets, request, histories, dependency=after, label=label)
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        dependency = (
            Dependency("afterany", queued[p.dir], planned=False)
            if p.dir in queued
            else Dependency("afterany", job.name if job is not None else "")
        )
        waits.append(PrepWait(cell_dir=d.dir, model=p.model, prepared=p.model_dir, job=dependency))
    return job, waits


def queued_job(history: Sequence[Event], view: SchedulerView | None) -> str:
    """The job an earlier invocation queued for a prep, a staging or a tokenization, while it is still queued or
    running ("" if none): the scheduler's job of the id its ledger recorded last, under the name recorded with it
    (a job of another cluster, queued for the same directory by a grid across sites, may have the same id)."""
    at = next((i for i in range(len(history) - 1, -1, -1) if history[i].kind is Kind.JOB), None)
    if at is None or view is None:
        return ""
    queued = history[at]
    job = view.job(queued.job_id)
    named = next((e.array for e in reversed(history[:at]) if e.kind is Kind.SUBMITTED), "")
    if job is None or not job.in_flight or (named and job.name and job.name != named):
        return ""
    return queued.job_id


def tokenize_jobs(
    runs: Sequence[Decision],
    tokenized: Mapping[Path, Tokenization],
    histories: Mapping[Path, Sequence[Event]],
    view: SchedulerView | None,
    after: Dependency | None,
) -> tuple[SlurmJob | None, dict[Path, Dependency]]:
    """One array of the tokenizations these cells share that are not built (a task each, unless one is queued
    already; None when there is none to submit); each cell -> what it waits for."""
    new: dict[Path, Decision] = {}
    waits: dict[Path, Dependency] = {}
    built: dict[Path, bool] = {}  # each tokenization's marker read once, not once per cell
    for d in runs:
        tok = tokenized.get(d.dir)
        if tok is not None and tok.dir not in built:
            built[tok.dir] = tok.data.complete
        if tok is None or built[tok.dir]:
            continue
        job_id = queued_job(histories.get(tok.dir, ()), view)
        if job_id:
            waits[d.dir] = Dependency("afterany", job_id, planned=False)
        else:
            new.setdefault(tok.dir, d)
    if not new:
        return None, waits
    targets = sorted(new)
    label = f"{len(targets)} tokenized dataset(s)"
    request = tokenize_request(new[targets[0]].cell.spec)
    job = slurm_job(Role.TOKENIZE, targets, request, histories, dependency=after, label=label)
    for d in runs:
        tok = tokenized.get(d.dir)
        if tok is not None and tok.dir in new:
            waits[d.dir] = Dependency("afterany", job.name)
    return job, waits


def eval_minutes(suites: Sequence[EvalConf], cluster: ClusterConf) -> int:
    """One job evaluates every suite of its target: their times add up, within the cluster's maximum."""
    total = sum(parse_minutes(s.resources.time) for s in suites)
    return math.ceil(min(total, parse_minutes(cluster.max_time)))


def eval_request(spec: CellConf, suites: Sequence[EvalConf]) -> SlurmRequest:
    """The sbatch request of an evaluation: one node, the suites' largest GPU, CPU and memory asks, their partition
    (else the cluster's), never requeued."""
    cluster = spec.cluster
    request = request_for(spec, eval_minutes(suites, cluster))
    gpus = max(s.resources.gpus for s in suites)
    changes: dict[str, Any] = {"nodes": 1, "cpus_per_task": max(s.resources.cpus for s in suites)}
    partition = next((s.resources.partition for s in suites if s.resources.partition), None)
    if partition:
        changes["partition"] = partition
    mem = max((s.resources.mem_gb or 0) for s in suites)
    if mem:
        changes["mem"] = f"{mem}GB"
    if gpus and cluster.gpu_directive == "gpus_per_node":
        changes["gpus_per_node"] = gpus
    elif gpus and cluster.gpu_directive == "gres":
        changes["gres"] = f"gpu:{gpus}"
    return SlurmRequest(
        request.replace(drop=("gpus_per_node", "gres", "signal_delay_s"), **changes).params,
        0,
        request.client_env,
        request.site,
    )


def _after(dirs: Sequence[Path], post: SlurmJob | None) -> Dependency | None:
    """Each task after the same cell's post task when the arrays match, else after the whole post array."""
    if post is None:
        return None
    if tuple(dirs) == post.targets:
        return Dependency("aftercorr" if len(dirs) > 1 else "afterok", post.name)
    return Dependency("afterany", post.name)


def cell_eval_jobs(
    cells: Sequence[Decision],
    post: SlurmJob | None,
    histories: Mapping[Path, Sequence[Event]],
    throttle: int | None = None,
    label: str = "",
) -> list[SlurmJob]:
    """The evaluation arrays of cells that evaluate (one per distinct request), each after their post array."""
    groups: dict[SlurmRequest, list[Decision]] = {}
    for d in cells:
        if d.evaluate:
            groups.setdefault(eval_request(d.cell.spec, suites_of(d.cell)), []).append(d)
    return [
        slurm_job(
            Role.EVAL,
            [d.dir for d in members],
            request,
            histories,
            dependency=_after([d.dir for d in members], post),
            throttle=throttle,
            label=label,
        )
        for request, members in groups.items()
    ]


def base_eval_jobs(bases: Sequence[BaseDecision], histories: Mapping[Path, Sequence[Event]]) -> list[SlurmJob]:
    """The base models' evaluation arrays (one per request and grid), waiting for nothing."""
    groups: dict[tuple[SlurmRequest, Path], list[Path]] = {}
    for b in bases:
        if b.evaluate:
            request = eval_request(b.target.cell.spec, b.target.suites)
            groups.setdefault((request, b.target.dir.parent), []).append(b.target.dir)
    return [slurm_job(Role.EVAL, dirs, request, histories) for (request, _), dirs in groups.items()]


def local_checkpoint_jobs(cells: Sequence[Decision]) -> list[LocalJob]:
    """Skipped local cells whose checkpoints are scored (failed, cancelled or pruned ones): after the others."""
    return [
        LocalJob(
            role=Role.EVAL,
            target=d.dir,
            label=f"{d.cell.name} checkpoints",
            timeout_min=eval_minutes(suites_of(d.cell), d.cell.spec.cluster),
        )
        for d in cells
    ]


def local_base_jobs(bases: Sequence[BaseDecision]) -> list[LocalJob]:
    return [
        LocalJob(
            role=Role.EVAL,
            target=b.target.dir,
            label=f"base model {b.target.name}",
            timeout_min=eval_minutes(b.target.suites, b.target.cell.spec.cluster),
        )
        for b in bases
        if b.evaluate
    ]
