"""The job side: run one rendered cell from its directory.

    python -m sft_grid.runner <cell_dir>

It never re-composes from conf/: what was rendered is what runs, so editing conf/ after submission
cannot change a queued cell. Steps: record `running`; stop if the output is already complete; run the
checks deferred by preflight (failing the job with their message); resume from the last checkpoint, or
move a partial output aside (never delete it); run launch.sh; record `completed` only when the output
holds final weights and trainer state, else `failed` with the reason from the log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from sft_grid import backends, ledger, post
from sft_grid.preflight import Check, run_deferred
from sft_grid.render import CELL_FILE, LAUNCH_FILE, LOGS_DIR, OUTPUT_DIR, PREFLIGHT_FILE

log = logging.getLogger(__name__)

TRAIN_LOG = "train.log"
_WRAPPER_ERROR = re.compile(r"CalledProcessError|ChildFailedError|torch.distributed.elastic")
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Killed|CUDA out of memory)")


class CellFailed(RuntimeError):
    """The cell's training did not complete; the message is the reason recorded in its ledger."""


def _job_id() -> str:
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or ""


def _job_fields() -> dict[str, object]:
    job_id = _job_id()
    return {"pid": os.getpid(), "host": socket.gethostname(), **({"job_id": job_id} if job_id else {})}


def archive_output(cell_dir: Path, why: str) -> Path | None:
    """Move output/ to attempts/<time>/output: a rerun starts clean and nothing is lost."""
    output = cell_dir / OUTPUT_DIR
    if not output.exists() or not any(output.iterdir()):
        return None
    dest = cell_dir / "attempts" / time.strftime("%Y%m%d-%H%M%S") / OUTPUT_DIR
    while dest.parent.exists():
        dest = dest.parent.with_name(dest.parent.name + "x") / OUTPUT_DIR
    dest.parent.mkdir(parents=True)
    shutil.move(str(output), str(dest))
    ledger.append(cell_dir, "archived", path=str(dest.relative_to(cell_dir)), why=why)
    return dest


def backend_name(cell_dir: Path) -> str:
    """The backend the cell was rendered for, from its cell.yaml."""
    return yaml.safe_load((cell_dir / CELL_FILE).read_text())["backend"]["name"]


def failure_reason(log_file: Path, rc: int) -> str:
    lines = ledger._tail_lines(log_file, 32768) if log_file.is_file() else []
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
    if ledger.output_complete(output):
        if lead:
            ledger.append(cell_dir, "completed", note="already complete; nothing run", **_job_fields())
            _post_stages(cell_dir)
        return ledger.State.COMPLETED.value
    if lead:
        ledger.append(cell_dir, "running", **_job_fields())
        _run_deferred_checks(cell_dir)

    args: list[str] = []
    ckpts = ledger.checkpoints(output)
    if ckpts:
        args += backends.get(backend_name(cell_dir)).resume_args(ckpts[-1])
        if lead:
            ledger.append(cell_dir, "resumed", checkpoint=ckpts[-1].name)
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
            ledger.append(cell_dir, "interrupted", signal=-rc, **_job_fields())
        raise CellFailed(f"training was killed by signal {-rc}")
    if not lead:
        if rc:
            raise CellFailed(failure_reason(log_file, rc))
        return "done"
    if rc == 0 and ledger.output_complete(output):
        step, total, loss = ledger.progress(output)
        ledger.append(cell_dir, "completed", step=step, loss=loss, **_job_fields())
        _post_stages(cell_dir)
        return ledger.State.COMPLETED.value
    reason = failure_reason(log_file, rc) if rc else "backend exited 0 but output/ has no final weights and trainer_state.json"
    ledger.append(cell_dir, "failed", reason=reason, rc=rc, **_job_fields())
    raise CellFailed(reason)


def _post_stages(cell_dir: Path) -> None:
    """The post-training chain, in this job when the cell's post.json says so (the local executor; on Slurm
    a dependent post job runs it). A stage's failure is its own state in the ledger: the training stays
    completed, and the next run of the grid retries only the stages."""
    if post.load(cell_dir).get("in_train_job"):
        post.run(cell_dir, post.IN_JOB)


def _run_deferred_checks(cell_dir: Path) -> None:
    pre_file = cell_dir / PREFLIGHT_FILE
    pre = json.loads(pre_file.read_text()) if pre_file.is_file() else {}
    checks = [Check.from_json(c) for c in pre.get("deferred", [])]
    for check, outcome in run_deferred(checks, pre.get("python"), cell_dir / LOGS_DIR / "preflight", pre.get("env")):
        if not outcome.ok:
            reason = f"preflight: {check.describe()}: {outcome.message}"
            ledger.append(cell_dir, "failed", reason=reason, **_job_fields())
            raise CellFailed(reason)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sft_grid.runner <cell_dir>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(run_cell(args[0]))
    except CellFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
