"""The evaluation stage's state, derived (never stored) from a target's score files, its ledger and the scheduler.

A score is done when its file exists (core/scores.py), whatever the ledger says. The rest comes from the ledger's
`eval` events (the stage running, failed with a reason) and, on Slurm, from the target's latest evaluation job.
What a target still needs from an invocation of the grid (`todo`) follows: nothing while its evaluation runs or
waits in Slurm, and only the missing scores otherwise, never the training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.scores import EvalFile, ScoreSpec, has_score
from sft_grid.core.state import SchedulerView, alive


@dataclass(frozen=True)
class EvalState:
    planned: int
    done: int
    state: str  # "" (nothing to evaluate), done, pending, queued, running, failed
    reason: str = ""
    job_id: str = ""

    def text(self) -> str:
        """The `eval` column of status: what the scores are, in a few words."""
        if not self.planned:
            return ""
        if self.state == "done":
            return f"done ({self.done})"
        job = f" in job {self.job_id}" if self.job_id else ""
        return f"{self.state}{job} ({self.done}/{self.planned})"


def eval_job_id(history: Sequence[Event]) -> str:
    """The Slurm id of the target's latest evaluation job ("" when it has none)."""
    queued = events.last(list(history), Kind.EVAL_JOB)
    return queued.eval_job_id if queued is not None else ""


def stage_event(history: Sequence[Event]) -> Event | None:
    """The latest event about the whole stage (running, completed, failed), not about one score."""
    return next((e for e in reversed(history) if e.kind is Kind.EVAL and not e.score_id), None)


def state_of(target_dir: Path, history: Sequence[Event] | None = None, view: SchedulerView | None = None,
             scores: Sequence[ScoreSpec] | None = None) -> EvalState:
    """The evaluation's state; `scores`: those the grid asks for now (default: the target's eval.json)."""
    history = events.read(target_dir) if history is None else history
    if scores is None:
        plan = EvalFile.load(target_dir)
        scores = plan.scores if plan is not None else ()
    done = sum(1 for s in scores if has_score(target_dir, s.score_id))
    if done == len(scores):
        return EvalState(len(scores), done, "done" if scores else "")
    job_id = eval_job_id(history)
    job = view.job(job_id) if view is not None and job_id else None
    if job is not None and job.in_flight:
        running = job.state in ("RUNNING", "COMPLETING")
        return EvalState(len(scores), done, "running" if running else "queued", job_id=job_id)
    last = stage_event(history)
    if last is not None and last.state == "running":
        if job is not None:
            return EvalState(len(scores), done, "failed", f"evaluation job {job_id} ended {job.state} during the"
                             " evaluation", job_id)
        if alive(last) is False:
            return EvalState(len(scores), done, "failed", f"its process {last.pid} on {last.host} ended during the"
                             " evaluation")
        if alive(last) is True:
            return EvalState(len(scores), done, "running")
    if last is not None and last.state == "failed":
        return EvalState(len(scores), done, "failed", last.reason, job_id)
    return EvalState(len(scores), done, "pending")


@dataclass(frozen=True)
class EvalTodo:
    needed: bool  # an evaluation job must run
    note: str  # for the skip message


def todo(target_dir: Path, scores: Sequence[ScoreSpec], history: Sequence[Event],
         view: SchedulerView | None) -> EvalTodo:
    """Whether this invocation must evaluate the target: some score is missing and nothing evaluates it now."""
    st = state_of(target_dir, history, view, scores)
    if st.state in ("", "done"):
        return EvalTodo(False, "")
    if st.state == "queued" or (st.state == "running" and st.job_id):
        return EvalTodo(False, f"evaluation waiting in Slurm (job {st.job_id})")
    if st.state == "running":
        return EvalTodo(False, "evaluation running")
    missing = st.planned - st.done
    again = " again" if st.state == "failed" else ""
    return EvalTodo(True, f"evaluation to run{again}: {missing} score(s)")
