"""What a Slurm training job's batch script runs once its training step ended: the requeue its failure's policy
asks for, submitted from outside the step.

srun ends the whole step when one task fails (--kill-on-bad-exit: one rank lost, the others would wait in their
collectives), and Slurm kills what is left of the step KillWait seconds later (30 s by default; 5 s or less on
some sites). The runner on node 0 records the failure in that window (a line in the ledger), but a submission
from inside the step (`sft-grid requeue`: the grid's imports, the controller's answers, two sbatch calls) can
take longer on a busy node or controller, and killed half-way it left the cell `planned` with no job, or failed
with its requeue never made. The batch script is not part of the step: it runs until the job ends. So the runner
records, and the script's EXIT trap (schedulers/slurm.py) runs this, which submits (and says so in the cell's
logs/after_step.log):

- the job's last record a failure its policy requeues, with no submission after it: submitted (`sft-grid
  requeue`, which decides again under the sweep's lock: never twice);
- the job's last record `interrupted` (the runner killed before its triage was written): triaged here, as the
  runner would have, and requeued when the class is one a job triages itself;
- anything else (completed, a failure to stop at, a cell this job never started): nothing.

    python -m sft_grid.job.after SUBMITIT_FOLDER     # in the batch script's EXIT trap, never by hand
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from sft_grid.core import events
from sft_grid.core.events import STATE_KINDS, Event, Kind
from sft_grid.core.failures.cell import triage
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import LOGS_DIR

LOG_FILE = "after_step.log"  # in the cell's logs/: what the batch script did once the training step ended
DECIDING = STATE_KINDS | {Kind.INTERRUPTED, Kind.REQUEUED}


def _job_target(folder: Path) -> tuple[str, Path] | None:
    """This job's id (submitit's: "<array>_<task>" for an array's task) and the cell its pickle trains; None when
    the pickle is not there (the job never got as far as its task)."""
    import submitit
    from submitit.core.utils import DelayedSubmission, JobPaths

    job_id = str(submitit.JobEnvironment().job_id)
    pickle = JobPaths(folder, job_id=job_id).submitted_pickle
    if not pickle.is_file():
        return None
    target = getattr(DelayedSubmission.load(pickle).function, "target", "")
    return (job_id, Path(target)) if target else None


def _this_job(history: list[Event], job_id: str) -> list[Event]:
    """The ledger from this job's last `running` on (what this job did to the cell); empty when it never ran it."""
    starts = [i for i, e in enumerate(history) if e.kind is Kind.RUNNING and e.job_id == job_id]
    return history[starts[-1] :] if starts else []


def finish(cell_dir: Path, job_id: str) -> str | None:
    """Submit the requeue the job's failure asks for, once (see the module's docstring); what was done, in a line.
    None: this job never started the cell (it moved to another site first): nothing to do, nothing to write."""
    from sft_grid.job import runner

    since = _this_job(events.read(cell_dir), job_id)
    if not since:
        return None
    # the cell's last change of state, or the runner's word that the training was killed: not the annotations
    # written after them (a notification of the failure, a stage's record)
    last = next(e for e in reversed(since) if e.kind in DECIDING)
    if last.kind is Kind.FAILED:
        if last.action is not RemedyKind.REQUEUE:
            return f"{cell_dir.name}: failed ({last.failure_class or 'no class'}), not requeued by its policy"
        return runner.submit_requeue(cell_dir)
    if last.kind is Kind.INTERRUPTED:
        failure, remedy = triage(cell_dir, events.read(cell_dir))
        if failure.klass in runner.IN_JOB_REQUEUE and remedy.kind is RemedyKind.REQUEUE:
            runner.record_failure(cell_dir, failure, remedy, None, job_id=job_id)
            return runner.submit_requeue(cell_dir)
        return f"{cell_dir.name}: interrupted ({failure.klass.value}); the scheduler's record decides it"
    return f"{cell_dir.name}: {last.kind.value}; nothing to do"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sft_grid.job.after <submitit folder>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        found = _job_target(Path(args[0]))
        if found is None:
            print("sft_grid after the training step: no task pickle", file=sys.stderr)
            return 0
        job_id, cell_dir = found
        said = finish(cell_dir, job_id)
        if said is None:
            print(f"sft_grid after the training step: {cell_dir.name} not started by job {job_id}", file=sys.stderr)
            return 0
    except Exception as exc:  # the job's own end stands; the next run of the grid decides the cell
        print(f"sft_grid after the training step: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    # in the cell's logs, not the job's: the job's log is evidence its triage reads, this line is none
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} job {job_id}: {said}\n"
    try:
        (cell_dir / LOGS_DIR).mkdir(exist_ok=True)
        with (cell_dir / LOGS_DIR / LOG_FILE).open("a") as fh:
            fh.write(line)
    except OSError as exc:  # a full disk: what was done stands
        print(f"sft_grid after the training step: {line.strip()} (not written to logs/: {exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
