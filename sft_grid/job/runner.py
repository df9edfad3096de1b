"""Run one rendered cell from its directory: what a cell's job does on its node.

Steps: record `running`; stop if the output is already complete; run the checks deferred by preflight (failing
the job with their message); resume from the last checkpoint, or move a partial output aside (never delete it);
run launch.sh; record `completed` only when the output holds final weights and trainer state, else `failed` with
the reason from the log; then the post-training stages where they run in this job (the local executor).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import yaml

from sft_grid.backends import get as backend_of
from sft_grid.checks.preflight import run_deferred
from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile, PreflightFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import (ATTEMPTS_DIR, CELL_FILE, LAUNCH_FILE, LOGS_DIR, OUTPUT_DIR, TRAIN_LOG, checkpoints,
                                  output_complete, progress, tail_lines)
from sft_grid.core.provenance import packages_hash
from sft_grid.core.state import State
from sft_grid.stages.post import IN_JOB
from sft_grid.stages.post_run import run as run_post

_WRAPPER_ERROR = re.compile(r"CalledProcessError|ChildFailedError|torch.distributed.elastic")
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Killed|CUDA out of memory)")


class CellFailed(RuntimeError):
    """The cell's training did not complete; the message is the reason recorded in its ledger."""


def _job_id() -> str:
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or ""


def _here(kind: Kind, **fields: object) -> Event:
    """An event of this job: its process, its host and its job id."""
    return Event.here(kind, job_id=_job_id(), **fields)  # type: ignore[arg-type]


def archive_output(cell_dir: Path, why: str) -> Path | None:
    """Move output/ to attempts/<time>/output: a rerun starts clean and nothing is lost."""
    output = cell_dir / OUTPUT_DIR
    if not output.exists() or not any(output.iterdir()):
        return None
    dest = cell_dir / ATTEMPTS_DIR / time.strftime("%Y%m%d-%H%M%S") / OUTPUT_DIR
    while dest.parent.exists():
        dest = dest.parent.with_name(dest.parent.name + "x") / OUTPUT_DIR
    dest.parent.mkdir(parents=True)
    shutil.move(str(output), str(dest))
    events.append(cell_dir, Event(Kind.ARCHIVED, path=str(dest.relative_to(cell_dir)), why=why))
    return dest


def backend_name(cell_dir: Path) -> str:
    """The backend the cell was rendered for, from its cell.yaml."""
    return yaml.safe_load((cell_dir / CELL_FILE).read_text())["backend"]["name"]


def failure_reason(log_file: Path, rc: int) -> str:
    lines = tail_lines(log_file, 32768) if log_file.is_file() else []
    errors = [line.strip() for line in lines if _ERROR_LINE.search(line)]
    # launchers re-raise their child's failure; the child's own error says what went wrong
    errors = [e for e in errors if not _WRAPPER_ERROR.search(e)] or errors
    detail = errors[-1] if errors else (lines[-1].strip() if lines else "no output")
    return f"backend exited with {rc}: {detail[:400]}"


def run_cell(cell_dir: str | Path) -> str:
    """Run the cell; returns the final state, raises CellFailed on failure. Safe to call again.

    On a multi-node allocation every node calls this; node 0 alone keeps the ledger, runs the deferred
    checks and moves partial output aside, and the others only start their share of the training.
    """
    cell_dir = Path(cell_dir).resolve()
    output = cell_dir / OUTPUT_DIR
    lead = int(os.environ.get("SLURM_PROCID", "0")) == 0
    if output_complete(output):
        if lead:
            events.append(cell_dir, _here(Kind.COMPLETED, note="already complete; nothing run"))
            _post_stages(cell_dir)
        return State.COMPLETED.value
    if lead:
        events.append(cell_dir, _here(Kind.RUNNING, details=_environment(cell_dir)))
        _run_deferred_checks(cell_dir)

    args: list[str] = []
    ckpts = checkpoints(output)
    if ckpts:
        args += backend_of(backend_name(cell_dir)).resume_args(ckpts[-1])
        if lead:
            events.append(cell_dir, Event(Kind.RESUMED, checkpoint=ckpts[-1].name))
    elif lead:
        archive_output(cell_dir, "partial output without a checkpoint")

    log_file = cell_dir / LOGS_DIR / (TRAIN_LOG if lead else f"train.node{os.environ.get('SLURM_PROCID')}.log")
    log_file.parent.mkdir(exist_ok=True)
    with log_file.open("ab") as fh:
        fh.write(f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} bash {LAUNCH_FILE} {' '.join(args)}\n".encode())
        fh.flush()
        rc = subprocess.run(["bash", str(cell_dir / LAUNCH_FILE), *args], stdout=fh, stderr=subprocess.STDOUT,
                            cwd=cell_dir).returncode
    if rc < 0:
        # killed by a signal: Slurm cancelling, requeueing or timing the job out, or the OOM killer. What
        # the cell became is for the scheduler (or, locally, the dead process) to say, not this process.
        if lead:
            events.append(cell_dir, _here(Kind.INTERRUPTED, signal=-rc))
        raise CellFailed(f"training was killed by signal {-rc}")
    if not lead:
        if rc:
            raise CellFailed(failure_reason(log_file, rc))
        return "done"
    if rc == 0 and output_complete(output):
        done = progress(output)
        events.append(cell_dir, _here(Kind.COMPLETED, step=done.step, loss=done.loss))
        _post_stages(cell_dir)
        return State.COMPLETED.value
    reason = failure_reason(log_file, rc) if rc else "backend exited 0 but output/ has no final weights and trainer_state.json"
    events.append(cell_dir, _here(Kind.FAILED, reason=reason, rc=rc))
    raise CellFailed(reason)


def _environment(cell_dir: Path) -> dict[str, object]:
    """The packages of the environment that trains the cell (its python is in post.json), for its provenance."""
    post = PostFile.load(cell_dir)
    return packages_hash(post.python) if post is not None and post.python else {}


def _post_stages(cell_dir: Path) -> None:
    """The post-training chain, in this job when the cell's post.json says so (the local executor; on Slurm
    a dependent post job runs it). A stage's failure is its own state in the ledger: the training stays
    completed, and the next run of the grid retries only the stages."""
    post = PostFile.load(cell_dir)
    if post is not None and post.in_train_job:
        run_post(cell_dir, IN_JOB)


def _run_deferred_checks(cell_dir: Path) -> None:
    pre = PreflightFile.load(cell_dir)
    if pre is None:
        return
    for check, verdict in run_deferred(pre.deferred, pre.python or None, cell_dir / LOGS_DIR / "preflight",
                                       pre.variables):
        if not verdict.ok:
            reason = f"preflight: {check.describe()}: {verdict.message}"
            events.append(cell_dir, _here(Kind.FAILED, reason=reason))
            raise CellFailed(reason)
