"""Slurm: sbatch a plan's jobs through submitit, read the queue back, cancel.

A job of the plan (core/submission.py) goes to Slurm as one sbatch: an array with a task per target, or a single
job. Its script is submitit's own (`sbatch_script` renders exactly what `submit` sends, so a dry run can print
it). A transient failure of the controller is retried with backoff; any other refusal is raised as it is. The
queue's view of a grid's jobs comes from one sacct call (accounting) plus one squeue call (the queue: a pending
array is one unexpanded record in sacct, and a job requeued after a node failure is still NODE_FAIL there while
the queue already holds it again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sft_grid.core import gate
from sft_grid.core.failures.sacct import SacctLeg, parse_sacct, sacct_argv
from sft_grid.core.state import JobState
from sft_grid.core.submission import AFTER_STEP, AFTER_STEP_ENV, Role, SlurmJob, SlurmRequest

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


def _run(argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None) -> str:
    full = {**os.environ, **env} if env else None
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=timeout, env=full).stdout


@contextmanager
def client_env(env: Mapping[str, str] | None) -> Iterator[None]:
    """The site's Slurm client environment (cluster.client_env, e.g. SLURM_CONF of a second cluster) for what runs
    within: submitit's sbatch inherits this process's environment, so it is set here and restored after."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def max_array_size(env: Mapping[str, str] | None = None) -> int:
    """The cluster's MaxArraySize; Slurm's default where the cluster cannot be asked (a dry run on a laptop)."""
    try:
        out = _run(["scontrol", "show", "config"], env=env)
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_MAX_ARRAY_SIZE
    for line in out.splitlines():
        if line.strip().startswith("MaxArraySize"):
            return int(line.split("=", 1)[1].strip())
    return DEFAULT_MAX_ARRAY_SIZE


ANSWER_TIMEOUT_S = 20  # one sinfo of a site's controller
ANSWER_BACKOFF_S = 2.0  # before its second try; doubled before each next one


def node_count(
    env: Mapping[str, str] | None = None, tries: int = 1, sleep: Callable[[float], None] = time.sleep
) -> int:
    """The cluster's nodes (sinfo), asked up to `tries` times, 2 s, 4 s, ... apart: one missed answer (a controller
    restarting, a slow reply) is not taken for its silence. Raises OSError/SubprocessError when none answered."""
    delay = ANSWER_BACKOFF_S
    for attempt in range(max(1, tries)):
        try:
            return len(_run(["sinfo", "-h", "-N", "-o", "%N"], timeout=ANSWER_TIMEOUT_S, env=env).split())
        except (OSError, subprocess.SubprocessError) as exc:
            if attempt + 1 >= tries:
                raise
            log.info("sinfo got no answer (%s); asking again in %.0f s", str(exc).strip()[:120], delay)
            sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # the loop returns or raises


def hold_pending(job_id: str, env: Mapping[str, str] | None = None) -> bool:
    """Hold a job, and whether it is now held while still pending: True only for a job that cannot start until
    `release` (a job that already started is not stopped by a hold: False, and its hold is lifted again)."""
    try:
        _run(["scontrol", "hold", job_id], timeout=ANSWER_TIMEOUT_S, env=env)
        out = _run(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=ANSWER_TIMEOUT_S, env=env).split()
    except (OSError, subprocess.SubprocessError):
        return False
    if out == ["PENDING"]:
        return True
    release(job_id, env)
    return False


def release(job_id: str, env: Mapping[str, str] | None = None) -> None:
    """Lift a hold (`hold_pending`); a job that no longer waits, or a site that does not answer, is left as it is."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _run(["scontrol", "release", job_id], timeout=ANSWER_TIMEOUT_S, env=env)


def query(
    job_ids: Iterable[str] = (), names: Iterable[str] = (), env: Mapping[str, str] | None = None
) -> list[JobState]:
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
    for line in _run(argv, env=env).splitlines():
        parts = line.split("|")
        if len(parts) >= 5:
            job_id, name, state, elapsed, reason = parts[:5]
            # "CANCELLED by 0" -> CANCELLED
            found.append(JobState(state.split()[0], elapsed, "" if reason in ("None", "") else reason, name, job_id))
    wanted_ids, wanted_names = set(ids), set(names)
    ended = {j.job_id for j in found if not j.in_flight}
    for line in _run(["squeue", "-h", "-r", "-o", "%i|%j|%T|%M|%r"], env=env).splitlines():
        parts = line.split("|")
        if len(parts) >= 5 and (parts[0] in wanted_ids or parts[1] in wanted_names):
            job_id, name, state, elapsed, reason = parts[:5]
            if state == "COMPLETING" and job_id in ended:
                continue  # accounting already has how it ended; the queue is only running its epilog
            found.append(JobState(state, elapsed, "" if reason in ("None", "") else reason, name, job_id))
    return found


def cancel(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = sorted(set(job_ids))
    if ids:
        _run(["scancel", *ids], env=env)


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
    if job.role is Role.TRAIN:
        params["setup"] = [*params.get("setup", []), *after_step_lines(job.folder)]
    return params


def after_step_lines(folder: Path) -> list[str]:
    """The batch script's lines that run job/after.py once the training step ended, however it ended (bash's EXIT
    trap, after srun returns): the requeue a failure's policy asks for is submitted by the batch script, which
    Slurm does not kill with the step (srun ends the step when a task fails, and kills what is left of it KillWait
    seconds later). The script's exit status stays srun's."""
    command = " ".join([shlex.quote(sys.executable), "-u -m", AFTER_STEP, shlex.quote(str(folder))])
    return [
        f"export {AFTER_STEP_ENV}=1",
        f"sft_grid_after_step() {{ {command}; }}",
        "trap sft_grid_after_step EXIT",
    ]


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
    from sft_grid.schedulers.entry import CheckpointableEntry, Entry

    make = CheckpointableEntry if job.checkpointable else Entry
    # a job of a grid across sites knows its site (its gate's name, core/gate.py): sbatch's environment, inherited
    site = {gate.SITE_ENV: job.request.site} if job.request.site else {}
    with client_env({**dict(job.request.client_env), **site}):
        return _submit(job, dependency, make)


def _submit(job: SlurmJob, dependency: str | None, make: Any) -> list[str]:
    import submitit

    delay = 2.0
    jobs: list[Any] = []
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


def legs(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> list[SacctLeg]:
    """Every record sacct keeps of these jobs: each leg of a requeued job, with its steps (one call)."""
    ids = sorted(set(job_ids))
    return parse_sacct(_run(sacct_argv(ids), env=env)) if ids else []


def test_only_argv(request: SlurmRequest) -> list[str]:
    """`sbatch --test-only` for a job of this request: every option the job's own sbatch script carries (submitit's
    renderer, the call `submit` makes: nodes, time, partition, account, qos, GPUs as --gres or --gpus-per-node,
    CPUs, memory, constraint, exclude and the cluster's own sbatch options), but its log files."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = {k: v for k, v in request.as_dict().items() if k != "dependency"}
    script = _make_sbatch_string(
        command="true", folder="/dev/null", job_name="sft_grid-test-only", stderr_to_stdout=True, **params
    )
    flags = [ln.removeprefix("#SBATCH ").strip() for ln in script.splitlines() if ln.startswith("#SBATCH ")]
    kept = [f for f in flags if not f.startswith(("--output", "--error", "--open-mode"))]
    return ["sbatch", "--test-only", *kept, "--wrap=true"]


def test_only(request: SlurmRequest, env: Mapping[str, str] | None = None) -> float | None:
    """When the scheduler expects a job of this request to start, in seconds from now (`sbatch --test-only` with the
    job's own options, `test_only_argv`: nothing is queued); None when it cannot be asked or does not say (a site
    down, a request it refuses: e.g. GPUs on a site without them)."""
    argv = test_only_argv(request)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, env={**os.environ, **env} if env else None
        )
    except (OSError, subprocess.SubprocessError):
        return None
    # "sbatch: Job 123 to start at 2026-12-02T11:40:00 using 2 processors on nodes n1 in partition debug"
    m = _STARTS.search(done.stderr + done.stdout)
    if done.returncode != 0 or m is None:
        log.info("%s: no start estimate: %s", " ".join(argv), (done.stderr + done.stdout).strip()[:200])
        return None
    import datetime as dt

    start = dt.datetime.fromisoformat(m.group(1))
    return max(0.0, (start - dt.datetime.now()).total_seconds())


_STARTS = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
