"""What to do with each cell, from its state (pure): the grid's rerun policy in one place.

- completed: skipped (force=true runs it again, its output moved aside first); when its post-training stages
  are not all done, or a score its evaluation suites ask for is missing, only those run, never the training;
- in flight (submitted or running): skipped, and its files are left alone (its job reads them);
- failed or cancelled: listed with the reason and the failure's class, run again only with rerun_failed=true
  (resuming from the last checkpoint), unless the class's policy requeues it (a transient fault within its
  budget: core/failures/policy.py): then it runs again at once, avoiding the nodes its evidence names;
- planned (new, or its earlier submission never reached the scheduler): run.
Scores along training (a suite's `along`): a cell's checkpoints that exist (observed) and have no score
are scored by an evaluation job of their own: a completed cell's with its other missing scores; a cell that trains
on Slurm, failed, was cancelled or pruned, by a job that waits for nothing, while it is skipped (never a dependency
of its training, which never waits for it); a local cell that trains scores its checkpoints in its own job, after.
A cell whose job an orchestrator killed mid-submit left behind is first recovered (`plan_recovery`), and its
recovered state decides. A base model its cells' suites ask to evaluate is evaluated when a score of it is missing
and no evaluation of it runs (`decide_base`).

Recovery (`plan_recovery`) is decided here too, from reads only; grid/execute.py does it, in a real run only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.cell import REQUEUE_NOTE, requeue_nodes
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.state import CellState, SchedulerView, State, slurm_ref
from sft_grid.core.submission import Recovery, Rescue
from sft_grid.planning.cells import Cell
from sft_grid.planning.evaluation import BaseTarget, along_scores, cell_scores
from sft_grid.schedulers import slurm
from sft_grid.stages import evaluate, post_training


class Action(str, Enum):
    RUN = "run"  # submit its training (then its post-training stages and its evaluation)
    POST = "post"  # completed: run its pending post-training stages and its missing evaluations only
    SKIP = "skip"


@dataclass(frozen=True, kw_only=True)
class Decision:
    cell: Cell
    dir: Path
    state: CellState  # after recovery
    action: Action
    why: str = ""  # why it is skipped, or what happens to it
    archive: bool = False  # a completed cell run again: its output is moved aside first
    recovery: Recovery | None = None
    # a failure its policy requeues: the nodes to avoid, and the note its submission records
    exclude: tuple[str, ...] = ()
    note: str = ""
    post: bool = False  # its post-training stages run (after its training, or alone)
    # its evaluation runs (after its post-training stages; alone, for a skipped cell's checkpoints)
    evaluate: bool = False

    @property
    def touch_files(self) -> bool:
        """Whether its files may be (re)written: not while a job of it may read them."""
        return not self.state.state.in_flight


def skip_reason(cell: Cell, state: CellState) -> str | None:
    """None: run it. Otherwise why it is skipped."""
    if state.state is State.COMPLETED:
        return None if cell.spec.force else "completed (force=true reruns it)"
    if state.state.in_flight:
        return f"{state.state.value}" + (f" (job {state.job_id})" if state.job_id else "")
    if state.state is State.PRUNED:  # stopped at a rung (sft_grid/adaptive/prune.py); resumed by hand
        return f"pruned: {state.reason}"
    if state.state in (State.FAILED, State.CANCELLED):
        if cell.spec.rerun_failed or _requeued(state):
            return None
        why = f" [{state.failure_class}]" if state.failure_class else ""
        return f"{state.state.value}{why}: {state.reason or 'no reason recorded'} (rerun_failed=true reruns it)"
    return None


def _requeued(state: CellState) -> bool:
    """A failure whose policy requeues it (a transient fault, within its budget): run again without asking."""
    return state.state is State.FAILED and state.action is RemedyKind.REQUEUE


def decide(
    cell: Cell,
    cell_dir: Path,
    state: CellState,
    history: Sequence[Event],
    view: SchedulerView | None,
    recovery: Recovery | None = None,
    steps: Sequence[int] = (),
) -> Decision:
    """`steps`: the cell's checkpoints that exist now (observed), for the scores along training."""
    why = skip_reason(cell, state)
    scores = cell_scores(cell)
    if why is None and _requeued(state) and not cell.spec.rerun_failed:
        return Decision(
            cell=cell,
            dir=cell_dir,
            state=state,
            action=Action.RUN,
            why=f"requeued after {state.failure_class}",
            recovery=recovery,
            exclude=requeue_nodes(history),
            note=f"{REQUEUE_NOTE}{state.failure_class}",
            post=True,
            evaluate=bool(scores),
        )
    if why is None:
        return Decision(
            cell=cell,
            dir=cell_dir,
            state=state,
            action=Action.RUN,
            archive=state.state is State.COMPLETED,
            recovery=recovery,
            post=True,
            evaluate=bool(scores),
        )
    if state.state is State.COMPLETED:
        todo = post_training.todo(cell, cell_dir, history, view)
        evaluation = evaluate.todo(cell_dir, (*scores, *along_scores(cell, steps)), history, view)
        why += "".join(f"; {note}" for note in (todo.note, evaluation.note) if note)
        if todo.stages or evaluation.needed:
            return Decision(
                cell=cell,
                dir=cell_dir,
                state=state,
                action=Action.POST,
                why=why,
                recovery=recovery,
                post=bool(todo.stages),
                evaluate=evaluation.needed,
            )
        scoring = evaluate.EvalTodo(False, "")
    else:
        scoring = _checkpoints_todo(cell, cell_dir, state, history, view, steps)
    why += f"; checkpoint {scoring.note}" if scoring.needed else ""
    return Decision(
        cell=cell, dir=cell_dir, state=state, action=Action.SKIP, why=why, recovery=recovery, evaluate=scoring.needed
    )


def _checkpoints_todo(
    cell: Cell,
    cell_dir: Path,
    state: CellState,
    history: Sequence[Event],
    view: SchedulerView | None,
    steps: Sequence[int],
) -> evaluate.EvalTodo:
    """Whether a skipped cell's checkpoints need a job that scores them now: some has no score, and no evaluation
    that could score them runs or waits. The evaluation after its post stages, queued with its training, waits for
    the training: it is left out (that it waits does not make the checkpoints wait)."""
    along = along_scores(cell, steps)
    if not along or (state.state.in_flight and cell.spec.cluster.executor == "local"):
        return evaluate.EvalTodo(False, "")
    alone = [e for e in history if not (e.kind is Kind.EVAL_JOB and e.after)]
    return evaluate.todo(cell_dir, along, alone, view)


@dataclass(frozen=True, kw_only=True)
class BaseDecision:
    """A base model's evaluation: whether it runs now, and why not."""

    target: BaseTarget
    evaluate: bool
    why: str = ""


def decide_base(target: BaseTarget, history: Sequence[Event], view: SchedulerView | None) -> BaseDecision:
    todo = evaluate.todo(target.dir, target.scores, history, view)
    return BaseDecision(target=target, evaluate=todo.needed, why=todo.note or "every score computed")


def plan_recovery(cell_dir: Path, state: CellState, history: Sequence[Event]) -> tuple[Recovery, CellState]:
    """What to do about a cell's job found by its array's name, and the cell's state once that is done."""
    ref = slurm_ref(history)
    assert ref is not None and state.job_id
    folder = cell_dir.parent / SUBMITIT_DIR / ref.array
    target = slurm.submission_file(folder, state.job_id)
    adopted = replace(state, recovered=False)
    array, job_id = ref.array, state.job_id

    def rescue(action: Rescue, orphan: Path | None = None, target: Path | None = None) -> Recovery:
        return Recovery(cell_dir=cell_dir, job_id=job_id, array=array, action=action, orphan=orphan, target=target)

    if target.exists():
        return rescue(Rescue.ADOPT), adopted
    if state.state.in_flight:
        orphan = slurm.orphan_for(folder, cell_dir)
        if orphan is not None:
            return rescue(Rescue.RESTORE, orphan, target), adopted
        return rescue(Rescue.CANCEL), CellState(State.PLANNED)
    # the job ended without ever running the cell (its pickle never arrived): nothing to cancel
    return rescue(Rescue.REPLAN), CellState(State.PLANNED)
