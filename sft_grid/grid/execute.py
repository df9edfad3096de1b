"""Executing a submission plan: the only part of the grid flow with effects, and it does what the plan says.

Order: cell files; model prep scripts; recoveries of jobs a killed orchestrator left; outputs moved aside (force);
local preps; cells marked submitted; Slurm jobs in plan order, each cell's ledger recording the array's name
before sbatch and the job id after it. Then (outside the grid's lock) the local jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import OUTPUT_DIR, progress
from sft_grid.core.state import CellState, state_of
from sft_grid.core.submission import LocalJob, Rescue, Role, SlurmJob, SubmissionPlan
from sft_grid.grid.render import write_all
from sft_grid.job.runner import archive_output
from sft_grid.schedulers import local, slurm
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import tokenize as tokenize_stage

log = logging.getLogger(__name__)


class SubmitRefused(Exception):
    """sbatch refused a job of the plan (after retrying the controller's transient errors)."""

    def __init__(self, job: SlurmJob, queued: int, not_queued: int, detail: str) -> None:
        self.job, self.queued, self.not_queued, self.detail = job, queued, not_queued, detail
        super().__init__(f"sbatch refused {job.name}: {detail}")


@dataclass
class Executed:
    # Slurm: each job of the plan -> the job id of each of its targets
    ids: dict[str, list[str]] = field(default_factory=dict)
    # local cells that did not run because their model's prep failed: cell dir -> the prep's reason
    prep_failed: dict[Path, str] = field(default_factory=dict)


def _first_id(ids: list[str]) -> str:
    """The id a dependency names: an array's own id, or the single job's."""
    return ids[0].split("_")[0]


# what a long step tells the caller as it goes: (phase, done, total, what)
PhaseTold = Callable[[str, int, int, str], None]


def apply(plan: SubmissionPlan, on_phase: PhaseTold = lambda name, done, total, what: None) -> Executed:
    """Everything of the plan but waiting for local jobs; run under the grid's lock. `on_phase` hears the local
    model preps' and tokenizations' progress (each runs a backend process here, seconds to minutes)."""
    done = Executed()
    write_all(plan.writes)
    for files in plan.scripts:
        for rel, text in files.files.items():
            (files.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                (files.dir / rel).write_bytes(text)
            else:
                (files.dir / rel).write_text(text)
    for r in plan.recoveries:
        if r.action is Rescue.RESTORE and r.orphan is not None and r.target is not None:
            r.orphan.rename(r.target)
        if r.action in (Rescue.ADOPT, Rescue.RESTORE):
            events.append(r.cell_dir, Event(Kind.JOB, job_id=r.job_id, note="recovered by the array's name"))
            continue
        if r.action is Rescue.CANCEL:
            slurm.cancel([r.job_id])
        events.append(
            r.cell_dir,
            Event(
                Kind.PLANNED,
                note=f"job {r.job_id} of {r.array} never got its submission"
                " file (the orchestrator died during sbatch): cancelled, to be submitted"
                " again",
            ),
        )
    for cell_dir in plan.archives:
        archive_output(cell_dir, "force=true rerun of a completed cell")
    before = {role: [j for j in plan.local if j.role is role] for role in (Role.PREP, Role.TOKENIZE)}
    for job in plan.local:
        if job.role in (Role.PREP, Role.TOKENIZE):
            name = "model prep" if job.role is Role.PREP else "tokenizing"
            peers = before[job.role]
            on_phase(name, peers.index(job), len(peers), f"{job.label}, here, before the cells")
            why = (prep_stage.run_here if job.role is Role.PREP else tokenize_stage.run_here)(job.target)
            on_phase(name, peers.index(job) + 1, len(peers), f"{job.label}: " + (f"failed: {why}" if why else "done"))
            if why:
                for cell in plan.local:
                    waits = cell.after == job.target or plan.tokenized.get(cell.target) == job.target
                    if waits and cell.role is Role.TRAIN and cell.target not in done.prep_failed:
                        done.prep_failed[cell.target] = why
                        events.append(cell.target, Event(Kind.FAILED, reason=why))
    for cell_dir in plan.submits:
        if cell_dir not in done.prep_failed:
            # before the job can start, so the job's own `running` comes after it; until then this process stands
            # for the cell: if it dies first, the cell reads as failed, not in flight
            events.append(
                cell_dir,
                Event.here(
                    Kind.SUBMITTED,
                    executor="local",
                    note=plan.notes.get(cell_dir, ""),
                    details=plan.provenance.get(cell_dir, {}),
                ),
            )
    _submit_slurm(plan, done)
    return done


def _submit_slurm(plan: SubmissionPlan, done: Executed) -> None:
    first_ids: dict[str, str] = {}
    target_ids: dict[Path, str] = {}  # each target's job id, for the prep a cell waits for
    for n, job in enumerate(plan.slurm):
        dependency = job.dependency.text(first_ids) if job.dependency else None
        if job.role is Role.TRAIN:
            for index, cell_dir in enumerate(job.targets):
                # before sbatch: a crash after sbatch but before the job id is recorded is recovered by name
                events.append(
                    cell_dir,
                    Event.here(
                        Kind.SUBMITTED,
                        executor="slurm",
                        array=job.name,
                        index=index,
                        note=plan.notes.get(cell_dir, ""),
                        details=plan.provenance.get(cell_dir, {}),
                    ),
                )
        elif job.role in (Role.PREP, Role.STAGE, Role.TOKENIZE):
            for index, prep_dir in enumerate(job.targets):
                events.append(prep_dir, Event.here(Kind.SUBMITTED, executor="slurm", array=job.name, index=index))
        try:
            ids = slurm.submit(job, dependency)
        except Exception as exc:  # sbatch's refusal, after retries of the transient kind
            queued = sum(len(j.targets) for j in plan.slurm[:n] if j.role is Role.TRAIN)
            left = sum(len(j.targets) for j in plan.slurm[n:] if j.role is Role.TRAIN)
            raise SubmitRefused(job, queued, left, " ".join(str(exc).split())[:500]) from exc
        done.ids[job.name] = ids
        first_ids[job.name] = _first_id(ids)
        if job.role in (Role.POST, Role.EVAL):
            after = first_ids.get(job.dependency.job, "") if job.dependency else ""
            for index, (cell_dir, job_id) in enumerate(zip(job.targets, ids, strict=True)):
                # not `job_id`: that field names the cell's training job wherever the ledger is read
                post = job.role is Role.POST
                events.append(
                    cell_dir,
                    Event(
                        Kind.POST_JOB if post else Kind.EVAL_JOB,
                        array=job.name,
                        index=index,
                        after=after,
                        post_job_id=job_id if post else "",
                        eval_job_id="" if post else job_id,
                    ),
                )
            continue
        for target, job_id in zip(job.targets, ids, strict=True):
            events.append(target, Event(Kind.JOB, job_id=job_id))
            target_ids[target] = job_id
        if job.role is Role.TRAIN:
            for wait in plan.waits:
                if wait.cell_dir in job.targets:
                    prep_id = target_ids.get(wait.prepared.parent, "") if wait.job.planned else wait.job.job
                    events.append(
                        wait.cell_dir,
                        Event(Kind.PREP, model=wait.model, prepared=str(wait.prepared), prep_job_id=prep_id),
                    )


def run_local(
    plan: SubmissionPlan,
    done: Executed,
    on_done: Callable[[LocalJob, CellState], None],
    on_progress: Callable[[Mapping[LocalJob, CellState]], None] = lambda running: None,
) -> dict[Path, CellState]:
    """Run the plan's local cells (the preps ran in `apply`); their final states, when the plan waits. `on_progress`
    hears, about once a second, each running cell's state (its step and loss so far, from its trainer's log)."""
    jobs = [j for j in plan.local if j.role not in (Role.PREP, Role.TOKENIZE) and j.target not in done.prep_failed]
    final: dict[Path, CellState] = {}

    def started(job: LocalJob, job_id: str) -> None:
        if job.role is Role.TRAIN:
            events.append(job.target, Event(Kind.JOB, job_id=job_id))

    def ended(job: LocalJob) -> None:
        if job.role is Role.EVAL:  # a base model's evaluation: its state is its scores (status, results)
            return
        final[job.target] = state_of(job.target)
        on_done(job, final[job.target])

    def poll(running: Sequence[LocalJob]) -> None:
        cells = [job for job in running if job.role is Role.TRAIN]
        if cells:
            on_progress(
                {job: replace(state_of(job.target), progress=progress(job.target / OUTPUT_DIR)) for job in cells}
            )

    local.run(jobs, plan.max_parallel, plan.wait, started, ended, poll)
    return final
