"""Slurm: sbatch parameters of a cell, job arrays through submitit, and the scheduler's view of jobs.

Cells with the same resource request share a job array; arrays are split at the cluster's MaxArraySize
and throttled (%N) by the grid's `concurrency`. Every array is submitted under a fresh name
(`sft_grid-<token>`) that is written to each cell's ledger *before* sbatch runs, so an orchestrator killed
between sbatch and recording the job id is recovered by name on the next invocation, never resubmitted.
Scheduler state comes from one `sacct` call for a whole grid.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sft_grid import ledger

log = logging.getLogger(__name__)

JOB_PREFIX = "sft_grid-"
SUBMIT_RETRIES = 5
TRANSIENT = ("Socket timed out", "Unable to contact slurm controller", "Slurm temporarily unable",
             "Resource temporarily unavailable", "Connection refused", "Transport endpoint")
# sacct states -> what they mean for a cell
IN_FLIGHT = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED", "REQUEUE_HOLD",
             "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "PREEMPTED"}


@dataclass(frozen=True)
class SlurmRequest:
    """sbatch parameters, in submitit's SlurmExecutor vocabulary; equal requests share an array."""

    params: tuple[tuple[str, Any], ...]
    max_requeues: int

    def as_dict(self) -> dict[str, Any]:
        return {k: dict(v) if k == "additional_parameters" else list(v) if isinstance(v, tuple) else v
                for k, v in self.params}


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


def with_dependency(request: SlurmRequest, job_id: str, kind: str = "afterok") -> SlurmRequest:
    """The request, to start only after job `job_id` succeeded (`kind` afterok; aftercorr: each array task
    after the same task of array `job_id`), and be cancelled if it fails: cells that
    wait on different jobs differ in their request, so they go to different arrays."""
    params = dict(request.params)
    extra = {**dict(params.get("additional_parameters", ())), "dependency": f"{kind}:{job_id}",
             "kill_on_invalid_dep": "yes"}
    params["additional_parameters"] = tuple(sorted(extra.items()))
    return SlurmRequest(tuple(sorted(params.items())), request.max_requeues)


def _run(argv: Sequence[str], timeout: float = 60) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=timeout).stdout


def max_array_size() -> int:
    for line in _run(["scontrol", "show", "config"]).splitlines():
        if line.strip().startswith("MaxArraySize"):
            return int(line.split("=", 1)[1].strip())
    return 1001  # Slurm's default


@dataclass(frozen=True)
class JobState:
    state: str
    elapsed: str = ""
    reason: str = ""
    # the job's name (an array's `sft_grid-<token>`) and id (<array>_<index> for array tasks)
    name: str = ""
    job_id: str = ""

    @property
    def in_flight(self) -> bool:
        return self.state in IN_FLIGHT


def _task_key(name: str, job_id: str) -> str | None:
    """'<name>#<index>' for an array task or a single job (index 0); None for an unexpanded array record."""
    if "[" in job_id:
        return None
    return f"{name}#{job_id.rsplit('_', 1)[1] if '_' in job_id else '0'}"


def sacct(job_ids: Iterable[str] = (), names: Iterable[str] = ()) -> dict[str, JobState]:
    """The scheduler's view of jobs, by id and by '<name>#<index>': one sacct call (accounting) plus one
    squeue call (the queue: a pending array is one unexpanded record in sacct, and a job requeued after a
    node failure is still NODE_FAIL there while the queue already holds it again)."""
    ids, names = sorted(set(job_ids)), sorted(set(names))
    if not ids and not names:
        return {}
    argv = ["sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,Elapsed,Reason"]
    if ids:
        argv.append("--jobs=" + ",".join(ids))
    if names:
        argv += ["--name=" + ",".join(names), "--starttime=now-30days"]
    out: dict[str, JobState] = {}
    for line in _run(argv).splitlines():
        parts = line.split("|")
        if len(parts) >= 5:
            job_id, name, state, elapsed, reason = parts[:5]
            # "CANCELLED by 0" -> CANCELLED
            _add(out, JobState(state.split()[0], elapsed, "" if reason in ("None", "") else reason, name, job_id))
    wanted_ids, wanted_names = set(ids), set(names)
    for line in _run(["squeue", "-h", "-r", "-o", "%i|%j|%T|%M|%r"]).splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and (parts[0] in wanted_ids or parts[1] in wanted_names):
            job_id, name, state, elapsed, reason = parts[:5]
            _add(out, JobState(state, elapsed, "" if reason in ("None", "") else reason, name, job_id))
    return out


def _add(out: dict[str, JobState], job: JobState) -> None:
    out[job.job_id] = job
    key = _task_key(job.name, job.job_id)
    if key:
        out[key] = job


def cancel(job_ids: Iterable[str]) -> None:
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids])


@dataclass
class ArrayChunk:
    request: SlurmRequest
    cell_dirs: list[Path] = field(default_factory=list)
    name: str = ""


def plan_arrays(items: Sequence[tuple[Path, SlurmRequest]], max_size: int) -> list[ArrayChunk]:
    """Group cells by identical request, then split groups at MaxArraySize."""
    groups: dict[SlurmRequest, list[Path]] = {}
    for cell_dir, req in items:
        groups.setdefault(req, []).append(cell_dir)
    chunks = []
    for req, dirs in groups.items():
        for i in range(0, len(dirs), max_size):
            chunks.append(ArrayChunk(req, dirs[i:i + max_size], f"{JOB_PREFIX}{uuid.uuid4().hex[:12]}"))
    return chunks


def executor_params(chunk: ArrayChunk, concurrency: int | None) -> dict[str, Any]:
    params = chunk.request.as_dict()
    params["job_name"] = chunk.name
    params["array_parallelism"] = concurrency or len(chunk.cell_dirs)
    params["stderr_to_stdout"] = True
    return params


def sbatch_preview(chunk: ArrayChunk, concurrency: int | None, folder: Path) -> str:
    """The sbatch script submitit writes for this array (submitit's own renderer)."""
    from submitit.slurm.slurm import _make_sbatch_string

    import sys

    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return _make_sbatch_string(command=command, folder=folder, map_count=len(chunk.cell_dirs),
                               **executor_params(chunk, concurrency))


def submit_chunk(chunk: ArrayChunk, concurrency: int | None, folder: Path) -> list[str]:
    """sbatch one array; retried with backoff on the controller's transient errors. Returns job ids."""
    from sft_grid.slurm_job import CellJob

    for index, cell_dir in enumerate(chunk.cell_dirs):
        # before sbatch: a crash after sbatch but before the job id is recorded is recovered by name
        ledger.append(cell_dir, "submitted", executor="slurm", name=chunk.name, index=index,
                      pid=os.getpid(), host=socket.gethostname())
    ids = sbatch(chunk, concurrency, folder, CellJob)
    for cell_dir, job_id in zip(chunk.cell_dirs, ids):
        ledger.append(cell_dir, "job", job_id=job_id)
    return ids


# post-training jobs (sft_grid/post.py): consolidation of a 32B checkpoint takes minutes, an upload more
POST_TIME_MIN = 120


def post_request_for(spec: Any, needs_hub: bool) -> SlurmRequest:
    """A cell's post job: one node without GPUs, on the cluster's post_partition when the job must reach the
    Hub from a site whose compute nodes have no internet."""
    params = dict(request_for(spec, POST_TIME_MIN).params)
    params["nodes"] = 1
    # a few cores: consolidation and uploads are bound by memory and network, and training needs the rest
    params["cpus_per_task"] = max(1, min(4, spec.cluster.cpus_per_node // 2))
    params.pop("gpus_per_node", None)
    params.pop("gres", None)
    if needs_hub and not spec.cluster.internet_on_compute and spec.cluster.post_partition:
        params["partition"] = spec.cluster.post_partition
    return SlurmRequest(tuple(sorted(params.items())), 0)


def submit_post_chunk(chunk: ArrayChunk, folder: Path, after: str | None) -> list[str]:
    """sbatch the post jobs of one array of cells; `after`: the training array (or job) they wait for, task
    by task (aftercorr) or as a whole single job (afterok). Each cell's ledger records its post job."""
    from sft_grid.slurm_job import PostJob

    ids = sbatch(chunk, None, folder, PostJob)
    for index, (cell_dir, job_id) in enumerate(zip(chunk.cell_dirs, ids)):
        # not `job_id`: that field names the cell's training job wherever the ledger is read
        ledger.append(cell_dir, "post_job", post_job_id=job_id, name=chunk.name, index=index,
                      **({"after": after} if after else {}))
    return ids


def sbatch(chunk: ArrayChunk, concurrency: int | None, folder: Path, make_job: Any) -> list[str]:
    """sbatch one array (a single job when it has one cell) of make_job(cell_dir) jobs; retried with backoff
    on the controller's transient errors. Returns the job ids."""
    import submitit

    delay = 2.0
    for attempt in range(SUBMIT_RETRIES + 1):
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=chunk.request.max_requeues)
        executor._throttling = 0  # one sbatch per array: nothing to throttle
        executor.update_parameters(**executor_params(chunk, concurrency))
        try:
            with executor.batch():
                jobs = [executor.submit(make_job(str(d))) for d in chunk.cell_dirs]
            break
        except Exception as exc:  # submitit wraps sbatch's failure; only the controller's hiccups are retried
            text = str(exc) + str(getattr(exc, "output", "") or "")
            if attempt == SUBMIT_RETRIES or not any(t in text for t in TRANSIENT):
                # nothing was queued: with this process gone and no job of that name, the cells read as
                # planned again, so fixing the cause and rerunning is enough
                raise
            log.warning("sbatch failed (%s); retrying in %.0f s", text.strip()[:120], delay)
            time.sleep(delay)
            delay = min(delay * 2, 60)
    return [job.job_id for job in jobs]
