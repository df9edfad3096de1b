"""Run one rendered cell from its directory: what a cell's job does on its node.

Steps: record `running`; stop if the output is already complete; run the checks deferred by preflight (failing
the job with their message); resume from the last checkpoint, or move a partial output aside (never delete it);
run launch.sh, watching it for a hang (job/hang.py: a training silent past its bound is ended, recorded as the
failure `hang` with each node's last line, and requeued); record `completed` only when the output holds final
weights and trainer state, else `failed` with its triage (class, evidence, next step: core/failures/cell.py);
then the post-training stages where they run in this job (the local executor). A failure its policy requeues (a
collective timeout, a GPU fault, a hang) is submitted again at once, from its checkpoint, avoiding the nodes the
evidence names (`sft-grid requeue`; on Slurm by the job's batch script once the step ended: job/after.py); a
killed training (time limit, preemption, the OOM killer) is left to the scheduler's record, which the grid
triages. The end of the cell (and of the grid, when this was its last cell) is notified once (stages/notify.py).
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sft_grid.backends import get as backend_of
from sft_grid.backends.base import LEG_ENV, LEG_FILE
from sft_grid.checks.preflight import run_deferred
from sft_grid.core import events, gate
from sft_grid.core.cellfiles import CellYaml, PostFile, PreflightFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.cell import (
    WATCHDOG_FILE,
    cell_config,
    failed_event,
    missing_input,
    next_step,
    requeues_spent,
    triage,
)
from sft_grid.core.failures.classes import Failure, FailureClass
from sft_grid.core.failures.classify import summarize
from sft_grid.core.failures.policy import Remedy, RemedyKind
from sft_grid.core.layout import (
    ATTEMPTS_DIR,
    CELL_FILE,
    LAUNCH_FILE,
    LOGS_DIR,
    OUTPUT_DIR,
    checkpoints,
    output_complete,
    progress,
    resumable,
    train_log,
)
from sft_grid.core.paths import torch_extensions
from sft_grid.core.provenance import packages_hash
from sft_grid.core.scores import SCORES_DIR, EvalFile
from sft_grid.core.state import State, state_of
from sft_grid.core.submission import AFTER_STEP_ENV
from sft_grid.core.templates import effective_template, template_digest
from sft_grid.job import hang
from sft_grid.stages import evaluate, notify
from sft_grid.stages.post_training import IN_JOB
from sft_grid.stages.post_training import run as run_post

log = logging.getLogger(__name__)
# the most a job waits for its own requeue (sbatch through `sft-grid requeue`) before it ends regardless
REQUEUE_S = 300

# failures a job killed by a signal still triages itself: the step ended because a peer failed (srun's
# --kill-on-bad-exit), not because the scheduler ended the job (time limit, preemption, scancel, memory)
IN_JOB_REQUEUE = frozenset({FailureClass.COLLECTIVE_TIMEOUT, FailureClass.RENDEZVOUS, FailureClass.GPU_HARDWARE})


class CellFailed(RuntimeError):
    """The cell's training did not complete; the message is the reason recorded in its ledger."""


@dataclass(frozen=True)
class Where:
    """This job, as the scheduler knows it."""

    job_id: str  # the scheduler's id ("<array>_<task>" for an array's task); "" when run by hand
    rank: int  # this node's rank in the job: node 0 keeps the ledger
    on_slurm: bool


def where() -> Where:
    """This job as submitit's own job environment describes it (a job of its Slurm or local executor); run by hand
    (`python -m sft_grid.job CELL_DIR`), no job at all: node 0 of no scheduler."""
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # submitit's "could not figure out which environment the job is running in"
        return Where("", 0, False)
    return Where(str(env.job_id), env.global_rank, env.cluster == "slurm")


def _job_id() -> str:
    return where().job_id


def _here(kind: Kind, **fields: object) -> Event:
    """An event of this job: its process, its host and its job id."""
    return Event.here(kind, job_id=_job_id(), **fields)


def archive_output(cell_dir: Path, why: str) -> Path | None:
    """Move output/ (and the scores of that output, eval/) to attempts/<time>/: a rerun starts clean and nothing
    is lost."""
    output = cell_dir / OUTPUT_DIR
    if not output.exists() or not any(output.iterdir()):
        return None
    dest = cell_dir / ATTEMPTS_DIR / time.strftime("%Y%m%d-%H%M%S") / OUTPUT_DIR
    while dest.parent.exists():
        dest = dest.parent.with_name(dest.parent.name + "x") / OUTPUT_DIR
    dest.parent.mkdir(parents=True)
    shutil.move(str(output), str(dest))
    if (cell_dir / SCORES_DIR).is_dir():
        shutil.move(str(cell_dir / SCORES_DIR), str(dest.parent / SCORES_DIR))
    events.append(cell_dir, Event(Kind.ARCHIVED, path=str(dest.relative_to(cell_dir)), why=why))
    return dest


def _leg(cell_dir: Path) -> tuple[int, list[str]] | None:
    """(the step this leg ends at, the backend's arguments for it) from the cell's leg.json; None: train
    to the end. The step also reaches the leg's processes as LEG_ENV (run_cell exports it): the real backends'
    trainers end the leg from it (in_venv/leg_stop.py)."""
    import json

    path = cell_dir / LEG_FILE
    if not path.is_file():
        return None
    leg = json.loads(path.read_text())
    legs = backend_of(backend_name(cell_dir)).legs
    if legs is None:
        raise CellFailed(f"{path}: the backend {backend_name(cell_dir)} cannot end a leg at a rung")
    stop = int(leg["stop_at_step"])
    return stop, legs(stop, int(leg.get("probe_steps") or 0))


def backend_name(cell_dir: Path) -> str:
    """The backend the cell was rendered for, from its cell.yaml."""
    return CellYaml.load(cell_dir, ("backend",)).spec.backend.name


class MovedAway(RuntimeError):
    """This job's cell was queued on another site before the job started (a grid across sites)."""


def _moved_away(cell_dir: Path, job_id: str) -> bool:
    """A cell of a grid across sites claims its job's gate before it starts: False when it got it; True when a move
    had claimed it first (the cell is queued on another site: this job trains nothing and records nothing)."""
    if not job_id or not events.submitted_site(events.read(cell_dir))[0]:
        return False
    # every node of the job claims it: the same party, so the same word (a node that did not would wait for the
    # others at the rendezvous until its timeout)
    if gate.claim(cell_dir, gate.key(os.environ.get(gate.SITE_ENV, ""), job_id), gate.STARTED) == gate.STARTED:
        return False
    log.warning("job %s: %s moved to another site before this job started; nothing run here", job_id, cell_dir.name)
    return True


def run_cell(cell_dir: str | Path) -> str:
    """Run the cell; returns the final state, raises CellFailed on failure. Safe to call again.

    On a multi-node allocation every node calls this; node 0 alone keeps the ledger, runs the deferred
    checks and moves partial output aside, and the others only start their share of the training.
    """
    cell_dir = Path(cell_dir).resolve()
    output = cell_dir / OUTPUT_DIR
    job = where()
    lead = job.rank == 0
    if _moved_away(cell_dir, job.job_id):
        # the cell moved to another site before this job started (core/gate.py): the job fails, so its
        # post-training job here (after it, kill_on_invalid_dep) is cancelled by Slurm; the ledger is not touched
        raise MovedAway(f"{cell_dir.name} moved to another site before job {job.job_id} started: nothing run here")
    if output_complete(output):
        if lead:
            events.append(cell_dir, _here(Kind.COMPLETED, note="already complete; nothing run"))
            _post_stages(cell_dir)
        return State.COMPLETED.value
    post = PostFile.load(cell_dir)  # the environment that trains the cell: its python
    if lead:
        events.append(cell_dir, _here(Kind.RUNNING, details=_environment(post)))
        _set_aside_verdict(cell_dir)
        _run_deferred_checks(cell_dir)

    args: list[str] = []
    ckpts = resume_point(output, lead)
    if ckpts:
        args += backend_of(backend_name(cell_dir)).resume_args(ckpts[-1])
        if lead:
            events.append(cell_dir, Event(Kind.RESUMED, checkpoint=ckpts[-1].name))
    elif lead:
        archive_output(cell_dir, "partial output without a checkpoint")
    leg = _leg(cell_dir)  # a leg that ends at a pruning rung (sft_grid/adaptive/prune.py)
    env = {k: v for k, v in os.environ.items() if k != LEG_ENV}  # no leg: to the end, whatever this job inherited
    if post is not None and post.python:  # DeepSpeed's ops built once per environment, where every job finds them
        env["TORCH_EXTENSIONS_DIR"] = torch_extensions(post.python)
    if leg is not None:
        args += leg[1]
        env[LEG_ENV] = str(leg[0])

    log_file = cell_dir / LOGS_DIR / train_log(job.rank)
    log_file.parent.mkdir(exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log_file.open("ab") as fh:
        fh.write(f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} bash {LAUNCH_FILE} {' '.join(args)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            ["bash", str(cell_dir / LAUNCH_FILE), *args], stdout=fh, stderr=subprocess.STDOUT, cwd=cell_dir, env=env
        )
        try:  # node 0 ends a hung training at its bound; the other nodes at twice it, should srun not end theirs
            hung = hang.wait(proc, cell_dir, hang.Bound.of(cell_config(cell_dir)), 1.0 if lead else 2.0, log_file)
        except BaseException:  # as subprocess.run does: the training never outlives its runner
            stuck = hang.end(proc)  # within its bound: a process in D state is left behind, named
            if stuck:
                log.error("%s: left behind: %s", cell_dir.name, ", ".join(s.text() for s in stuck))
            raise
        rc = proc.returncode  # None only for a hung training whose launcher could not be reaped
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU time of the training's processes on this node: what a CPU-only cell costs (planning/costs.py)
    used = {"cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)}
    if hung is not None:
        if lead:
            _record_hang(cell_dir, hung, rc, used)
        raise CellFailed(hung.message())
    if rc < 0:
        # killed by a signal: Slurm cancelling, requeueing or timing the job out, the OOM killer, or srun ending
        # the step because a task on another node failed. Only that last one is this job's to triage (a rank
        # lost: its peers' collectives failed, a transient fault); the others are for the scheduler's record
        # (or, locally, the dead process) to say, read by the grid.
        if lead:
            events.append(cell_dir, _here(Kind.INTERRUPTED, signal=-rc, details=used))
            failure, remedy = triage(cell_dir, events.read(cell_dir))
            if failure.klass in IN_JOB_REQUEUE and remedy.kind is RemedyKind.REQUEUE:
                _record_and_requeue(cell_dir, failure, remedy, rc)
        raise CellFailed(f"training was killed by signal {-rc}")
    if not lead:
        if rc:  # node 0 triages the failure for the cell; this node's log is logs/<its log>
            raise CellFailed(f"node {job.rank}: backend exited with {rc} (see {log_file})")
        return "done"
    if rc == 0 and output_complete(output):
        done = progress(output)
        template = effective_template(output)
        trained = {evaluate.TRAINED_TEMPLATE: template_digest(template)} if template is not None else {}
        events.append(cell_dir, _here(Kind.COMPLETED, step=done.step, loss=done.loss, details={**trained, **used}))
        _ended(cell_dir)
        _post_stages(cell_dir)
        return State.COMPLETED.value
    if rc == 0 and leg is not None and (output / f"checkpoint-{leg[0]}").is_dir():
        # the leg ended at its rung: the cell waits, planned, for the rung's decision (the grid queues
        # it again, resuming from this checkpoint, once it is kept)
        events.append(cell_dir, _here(Kind.PLANNED, step=leg[0], note=f"at rung: checkpoint-{leg[0]}", details=used))
        _ended(cell_dir)
        return "at_rung"
    if rc == 0:
        reason = "backend exited 0 but output/ has no final weights and trainer_state.json"
        events.append(cell_dir, _here(Kind.FAILED, reason=reason, rc=rc, details=used))
        _ended(cell_dir)
        raise CellFailed(reason)
    failure, remedy = triage(cell_dir, events.read(cell_dir))
    _record_and_requeue(cell_dir, failure, remedy, rc)
    raise CellFailed(f"{failure.klass.value}: {remedy.message}")


def resume_point(output: Path, lead: bool) -> list[Path]:
    """The checkpoints a run resumes from, the newest last: the complete ones (layout.resumable). The lead sets the
    cut ones newer than them aside (renamed `.cut-checkpoint-N-<time>` in output/: kept, and out of the trainer's and
    our own `checkpoint-*`), so that neither the trainer's own rotation nor a later leg reads them; every node
    chooses the same checkpoint, whether or not the lead has renamed yet."""
    every = checkpoints(output)
    whole = resumable(every)
    if lead:  # both oldest first: the cut ones are those after the newest whole one
        for cut in every[every.index(whole[-1]) + 1 :] if whole else every:
            aside = output / f".cut-{cut.name}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(cut, aside)
            log.warning("%s has no trainer state (cut mid-save): set aside as %s", cut.name, aside.name)
    return whole


def _record_and_requeue(
    cell_dir: Path, failure: Failure, remedy: Remedy, rc: int | None, details: dict[str, Any] | None = None
) -> None:
    record_failure(cell_dir, failure, remedy, rc, details)
    if remedy.kind is RemedyKind.REQUEUE:
        _requeue(cell_dir)
    _ended(cell_dir)


def record_failure(
    cell_dir: Path,
    failure: Failure,
    remedy: Remedy,
    rc: int | None,
    details: dict[str, Any] | None = None,
    job_id: str | None = None,
) -> None:
    """The failed event, with its class, evidence and the policy's next step."""
    job_id = _job_id() if job_id is None else job_id
    try:
        events.append(cell_dir, failed_event(failure, remedy, job_id=job_id, rc=rc, details=details or {}))
    except OSError as exc:  # a full disk: the grid triages the job's end again when it reads the cell
        raise CellFailed(f"{failure.klass.value}: {remedy.message} (not recorded: {exc})") from exc


def _record_hang(cell_dir: Path, hung: hang.Hung, rc: int | None, used: dict[str, float]) -> None:
    """The failure `hang` with its evidence, and its policy's next step (a requeue from the checkpoint); `rc` None:
    the training's launcher could not be reaped (the evidence names it, with its state)."""
    history = events.read(cell_dir)
    done = progress(cell_dir / OUTPUT_DIR)
    evidence, details = hang.evidence(cell_dir, hung)
    spent = requeues_spent(history, FailureClass.HANG)  # its budget is the policy's (2 by default)
    summary = summarize(FailureClass.HANG, "", (), spent, 0, done.step, done.total)
    summary += f": no progress for {hung.silent_s:.0f} s (bound {hung.bound_s:.0f} s)"
    if hung.unreaped:
        summary += f"; {hung.unreaped_text()}"
    failure = Failure(
        klass=FailureClass.HANG,
        evidence=evidence,
        nodes=(),
        summary=summary,
        step=done.step,
        total=done.total,
        requeues=spent,
    )
    _record_and_requeue(cell_dir, failure, next_step(cell_dir, history, failure), rc, {**details, **used})


def _set_aside_verdict(cell_dir: Path) -> None:
    """A loss watchdog's verdict of an earlier run must not decide this run's failure: kept in logs/."""
    verdict = cell_dir / OUTPUT_DIR / WATCHDOG_FILE
    if verdict.is_file():
        os.replace(verdict, cell_dir / LOGS_DIR / f"{WATCHDOG_FILE[:-5]}.{time.strftime('%Y%m%d-%H%M%S')}.json")


def _requeue(cell_dir: Path) -> None:
    """Submit the cell again, a Slurm cell only (locally, the next invocation of the grid runs it again). In a job
    whose batch script submits it once the step ended (AFTER_STEP_ENV, job/after.py), this step only records: a
    submission from inside the step can be killed half-way when srun ends the step."""
    if not where().on_slurm:
        return
    if os.environ.get(AFTER_STEP_ENV):
        log.info("%s: requeued by the job's script once this step ends", cell_dir.name)
        return
    log.info("%s", submit_requeue(cell_dir))


def submit_requeue(cell_dir: Path) -> str:
    """Submit the cell again through the grid's own code, in a process of its own (the job side never imports
    the grid's): `sft-grid requeue` decides again under the sweep's lock, so a cell already requeued is not
    submitted twice. What was done, in a line."""
    try:  # bounded: a controller that does not answer must not hold the job past its own end
        proc = subprocess.run(
            [sys.executable, "-m", "sft_grid", "requeue", str(cell_dir)],
            capture_output=True,
            text=True,
            check=False,
            timeout=REQUEUE_S,
        )
    except subprocess.TimeoutExpired:
        text = f"requeue of {cell_dir.name}: no answer within {REQUEUE_S} s; the next sft-grid run decides it"
        log.error("%s", text)
        return text
    if proc.returncode:
        text = f"requeue of {cell_dir.name} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}"
        log.error("%s", text)
        return text
    return proc.stdout.strip()


def _ended(cell_dir: Path) -> None:
    """Notify the cell's end, and the grid's when no cell of it is left to run (seen from the ledgers)."""
    try:
        history = events.read(cell_dir)
        if not notify.settings_for(cell_dir).enabled:
            return
        notify.cell_ended(cell_dir, state_of(cell_dir, None, history), history)
        siblings = [d for d in cell_dir.parent.iterdir() if (d / CELL_FILE).is_file() and not d.name.startswith(".")]
        notify.grid_ended(cell_dir.parent, {d: state_of(d, None) for d in sorted(siblings)})
    except OSError as exc:  # a notification never fails the cell; the next reader of the grid sends it
        log.warning("notification of %s deferred: %s", cell_dir.name, exc)


def _environment(post: PostFile | None) -> dict[str, object]:
    """The packages of the environment that trains the cell (its python is in post.json), for its provenance."""
    return packages_hash(post.python) if post is not None and post.python else {}


def _post_stages(cell_dir: Path) -> None:
    """The post-training chain, in this job when the cell's post.json says so (the local executor; on Slurm
    a dependent post job runs it). A stage's failure is its own state in the ledger: the training stays
    completed, and the next run of the grid retries only the stages."""
    post = PostFile.load(cell_dir)
    if post is not None and post.in_train_job:
        run_post(cell_dir, IN_JOB)
    evaluate_here(cell_dir)


def evaluate_here(cell_dir: Path) -> None:
    """The evaluation, in this job when the cell's eval.json says so (the local executor; on Slurm an evaluation
    job runs it). Its failure is its own state in the ledger: the training stays completed."""
    plan = EvalFile.load(cell_dir)
    if plan is not None and plan.in_train_job:
        evaluate.run(cell_dir)


def _run_deferred_checks(cell_dir: Path) -> None:
    pre = PreflightFile.load(cell_dir)
    if pre is None:
        return
    for check, verdict in run_deferred(
        pre.deferred, pre.python or None, cell_dir / LOGS_DIR / "preflight", pre.variables
    ):
        if not verdict.ok:
            reason = f"preflight: {check.describe()}: {verdict.message}"
            missing = missing_input(cell_dir, check.kind, check.target, verdict.message)
            if missing is not None:  # an input the grid builds before the cell is not there: the grid's order
                failure, remedy = missing
                reason = failure.summary
                recorded = _here(
                    Kind.FAILED,
                    reason=reason,
                    note=remedy.message,
                    failure_class=failure.klass,
                    evidence=failure.evidence[:500],
                    action=remedy.kind,
                )
            else:  # a deferred check refusing the cell's inputs is positive evidence on its config or data
                recorded = _here(
                    Kind.FAILED,
                    reason=reason,
                    failure_class=FailureClass.BACKEND_ERROR,
                    evidence=verdict.message[:500],
                    action=RemedyKind.STOP,
                )
            events.append(cell_dir, recorded)
            _ended(cell_dir)
            raise CellFailed(reason)
