"""Slurm: sbatch a plan's jobs through submitit, read the queue back, cancel.

A job of the plan (core/submission.py) goes to Slurm as one sbatch: an array with a task per target, or a single
job. Its script is submitit's own (`sbatch_script` renders exactly what `submit` sends, so a dry run can print
it). A transient failure of the controller is retried with backoff; any other refusal is raised as it is. The
queue's view of a grid's jobs comes from one sacct call (accounting) plus one squeue call (the queue: a pending
array is one unexpanded record in sacct, and a job requeued after a node failure is still NODE_FAIL there while
the queue already holds it again).
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sft_grid.core.failures.sacct import SacctLeg, parse_sacct, sacct_argv
from sft_grid.core.state import JobState
from sft_grid.core.submission import SlurmJob

log = logging.getLogger(__name__)

SUBMIT_RETRIES = 5
TRANSIENT = (
    "Socket timed out",
    "Unable to contact slurm controller",
    "Slurm temporarily unable",
    "Resource temporarily unavailable",
    "Connection refused",
    "Transport endpoint",
)
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default


def _run(argv: Sequence[str], timeout: float = 60) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=timeout).stdout


def max_array_size() -> int:
    """The cluster's MaxArraySize; Slurm's default where the cluster cannot be asked (a dry run on a laptop)."""
    try:
        out = _run(["scontrol", "show", "config"])
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_MAX_ARRAY_SIZE
    for line in out.splitlines():
        if line.strip().startswith("MaxArraySize"):
            return int(line.split("=", 1)[1].strip())
    return DEFAULT_MAX_ARRAY_SIZE


def query(job_ids: Iterable[str] = (), names: Iterable[str] = ()) -> list[JobState]:
    """The jobs with these ids or names, accounting first, then the queue (later records are fresher).
    Raises OSError/SubprocessError when Slurm cannot be asked."""
    ids, names = sorted(set(job_ids)), sorted(set(names))
    if not ids and not names:
        return []
    argv = ["sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,Elapsed,Reason"]
    if ids:
        argv.append("--jobs=" + ",".join(ids))
    if names:
        argv += ["--name=" + ",".join(names), "--starttime=now-30days"]
    found: list[JobState] = []
    for line in _run(argv).splitlines():
        parts = line.split("|")
        if len(parts) >= 5:
            job_id, name, state, elapsed, reason = parts[:5]
            # "CANCELLED by 0" -> CANCELLED
            found.append(JobState(state.split()[0], elapsed, "" if reason in ("None", "") else reason, name, job_id))
    wanted_ids, wanted_names = set(ids), set(names)
    ended = {j.job_id for j in found if not j.in_flight}
    for line in _run(["squeue", "-h", "-r", "-o", "%i|%j|%T|%M|%r"]).splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and (parts[0] in wanted_ids or parts[1] in wanted_names):
            job_id, name, state, elapsed, reason = parts[:5]
            if state == "COMPLETING" and job_id in ended:
                continue  # accounting already has how it ended; the queue is only running its epilog
            found.append(JobState(state, elapsed, "" if reason in ("None", "") else reason, name, job_id))
    return found


def cancel(job_ids: Iterable[str]) -> None:
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids])


def executor_params(job: SlurmJob, dependency: str | None) -> dict[str, Any]:
    """submitit's SlurmExecutor parameters of a job; `dependency`: its `kind:<id>` once the id is known."""
    params = job.request.as_dict()
    if dependency:
        # cancelled, not left pending forever, when what it waits for fails
        params["additional_parameters"] = {
            **params.get("additional_parameters", {}),
            "dependency": dependency,
            "kill_on_invalid_dep": "yes",
        }
    params["job_name"] = job.name
    params["array_parallelism"] = job.throttle or len(job.targets)
    params["stderr_to_stdout"] = True
    return params


def sbatch_script(job: SlurmJob, dependency: str | None) -> str:
    """The sbatch script submitit writes for this job (submitit's own renderer, the same call it makes)."""
    from submitit.slurm.slurm import _make_sbatch_string

    # submitit's own command line (SlurmExecutor._submitit_command_str)
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(job.folder))])
    return _make_sbatch_string(
        command=command,
        folder=job.folder,
        map_count=len(job.targets) if len(job.targets) > 1 else None,
        **executor_params(job, dependency),
    )


def submit(job: SlurmJob, dependency: str | None) -> list[str]:
    """sbatch one job of the plan; retried with backoff on the controller's transient errors. Returns the job
    id of each target, in order."""
    import submitit

    from sft_grid.schedulers.entry import CheckpointableEntry, Entry

    make = CheckpointableEntry if job.checkpointable else Entry
    delay = 2.0
    for attempt in range(SUBMIT_RETRIES + 1):
        executor = submitit.SlurmExecutor(folder=job.folder, max_num_timeout=job.request.max_requeues)
        executor._throttling = 0  # one sbatch per job: nothing to throttle
        executor.update_parameters(**executor_params(job, dependency))
        try:
            with executor.batch():
                jobs = [executor.submit(make(job.entry, str(t))) for t in job.targets]
            break
        except Exception as exc:  # submitit wraps sbatch's failure; only the controller's hiccups are retried
            text = str(exc) + str(getattr(exc, "output", "") or "")
            if attempt == SUBMIT_RETRIES or not any(t in text for t in TRANSIENT):
                raise
            log.warning("sbatch failed (%s); retrying in %.0f s", text.strip()[:120], delay)
            time.sleep(delay)
            delay = min(delay * 2, 60)
    return [j.job_id for j in jobs]


# -- what crash recovery looks at -------------------------------------------------------------------------


def submission_file(folder: Path, job_id: str) -> Path:
    """Where a submitted task's job looks for its pickle (submitit moves it there after sbatch returns)."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id=job_id).submitted_pickle


def orphan_for(folder: Path, target: Path) -> Path | None:
    """A pickle left under its temporary name for this target: sbatch ran, but its submitter died before
    moving the pickle into place."""
    from submitit.core.utils import DelayedSubmission

    for pickle in sorted(folder.glob("*.pkl")) if folder.is_dir() else ():
        if pickle.name.endswith("_submitted.pkl"):
            continue
        try:
            function = DelayedSubmission.load(pickle).function
        except Exception:  # a pickle of another version or a torn write: not this target's
            continue
        if Path(getattr(function, "target", "") or getattr(function, "cell_dir", "")) == target:
            return pickle
    return None


def legs(job_ids: Iterable[str]) -> list[SacctLeg]:
    """Every record sacct keeps of these jobs: each leg of a requeued job, with its steps (one call)."""
    ids = sorted(set(job_ids))
    return parse_sacct(_run(sacct_argv(ids))) if ids else []
