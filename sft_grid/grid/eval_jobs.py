"""The evaluation jobs of a submission plan (pure).

On Slurm a cell's evaluation is an array of its own, on the resources its suites ask for (a GPU, on GPU sites),
whose tasks each wait for the same cell's post-training task (aftercorr; afterok for a single job): the model it
evaluates is the one the post stages finish (ZeRO-3 weights consolidated, the tokenizer repaired), and a post job
holds no GPU while it uploads. So the training array, its post array and its evaluation array are one chain per
task. Completed cells with missing scores get an evaluation array after their post array when their stages are
pending too, else one that waits for nothing; base models get one that waits for nothing. Locally a cell
evaluates in its own job after its post stages, and each base model in a job after the cells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.submission import Dependency, LocalJob, Role, SlurmJob, SlurmRequest
from sft_grid.core.timefmt import parse_minutes
from sft_grid.grid.decide import BaseDecision, Decision
from sft_grid.grid.requests import count, job_name, request_for
from sft_grid.planning.evals import suites_of


def eval_minutes(suites: Sequence[Any], cluster: Any) -> int:
    """One job evaluates every suite of its target: their times add up, within the cluster's maximum."""
    total = sum(parse_minutes(s.resources.time) for s in suites)
    return int(min(total, parse_minutes(cluster.max_time)))


def eval_request(spec: Any, suites: Sequence[Any]) -> SlurmRequest:
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
    return SlurmRequest(request.replace(drop=("gpus_per_node", "gres", "signal_delay_s"), **changes).params, 0)


def _array(targets: Sequence[Path], request: SlurmRequest, dependency: Dependency | None,
           histories: Mapping[Path, Sequence[Event]], throttle: int | None) -> SlurmJob:
    dirs = list(targets)
    attempts = [count(histories.get(p, ()), Kind.EVAL_JOB) for p in dirs]
    name = job_name(Role.EVAL, dirs, request, dependency, attempts)
    return SlurmJob(name, Role.EVAL, tuple(dirs), request, dirs[0].parent / SUBMITIT_DIR / name, throttle, dependency)


def _after(dirs: Sequence[Path], post: SlurmJob | None) -> Dependency | None:
    """Each task after the same cell's post task when the arrays match, else after the whole post array."""
    if post is None:
        return None
    if tuple(dirs) == post.targets:
        return Dependency("aftercorr" if len(dirs) > 1 else "afterok", post.name)
    return Dependency("afterany", post.name)


def cell_eval_jobs(cells: Sequence[Decision], post: SlurmJob | None, histories: Mapping[Path, Sequence[Event]],
                   throttle: int | None = None) -> list[SlurmJob]:
    """The evaluation arrays of cells that evaluate (one per distinct request), each after their post array."""
    groups: dict[SlurmRequest, list[Decision]] = {}
    for d in cells:
        if d.evaluate:
            groups.setdefault(eval_request(d.cell.spec, suites_of(d.cell)), []).append(d)
    return [_array([d.dir for d in members], request, _after([d.dir for d in members], post), histories, throttle)
            for request, members in groups.items()]


def base_eval_jobs(bases: Sequence[BaseDecision], histories: Mapping[Path, Sequence[Event]]) -> list[SlurmJob]:
    """The base models' evaluation arrays (one per request and grid), waiting for nothing."""
    groups: dict[tuple[SlurmRequest, Path], list[Path]] = {}
    for b in bases:
        if b.evaluate:
            request = eval_request(b.target.cell.spec, b.target.suites)
            groups.setdefault((request, b.target.dir.parent), []).append(b.target.dir)
    return [_array(dirs, request, None, histories, None) for (request, _), dirs in groups.items()]


def local_base_jobs(bases: Sequence[BaseDecision]) -> list[LocalJob]:
    return [LocalJob(Role.EVAL, b.target.dir, f"base model {b.target.name}",
                     eval_minutes(b.target.suites, b.target.cell.spec.cluster)) for b in bases if b.evaluate]
