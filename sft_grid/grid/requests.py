"""The sbatch requests of a plan's jobs, and their names (pure): a cell's training and post-training jobs, and the
jobs before training (staging, model preps, tokenize once), each cut down from what it needs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from sft_grid.core.events import Event, Kind
from sft_grid.core.submission import JOB_PREFIX, Dependency, Role, SlurmRequest
from sft_grid.core.timefmt import parse_minutes
from sft_grid.grid.decide import Decision
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import tokenize as tokenize_stage

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


def job_name(role: Role, targets: Sequence[Path], request: SlurmRequest, dependency: Dependency | None,
             attempts: Sequence[int]) -> str:
    """`sft_grid-<hash>` of what the job runs and how often its targets were submitted before: a dry run and
    the real run that follows it name it alike; the next submission of the same targets gets a new name."""
    blob = json.dumps([role.value, [str(t) for t in targets], repr(request), repr(dependency), list(attempts)])
    return JOB_PREFIX + hashlib.sha256(blob.encode()).hexdigest()[:12]


def count(history: Sequence[Event], kind: Kind) -> int:
    return sum(1 for e in history if e.kind is kind)


def minutes(decision: Decision) -> int:
    return int(parse_minutes(decision.cell.spec.time))


def tokenize_request(spec: Any) -> SlurmRequest:
    """A tokenize-once job: one CPU task on one node of the cluster's partition, all its cores (the backend's
    preprocessing uses them), no GPU, never requeued."""
    request = request_for(spec, tokenize_stage.TIME_MIN)
    return SlurmRequest(request.replace(drop=("gpus_per_node", "gres", "signal_delay_s"), nodes=1,
                                        additional_parameters=()).params, 0)
