"""The evaluation stage: score a target (a cell's trained output, or a base model) on the tasks of its eval.json
that have no score yet, each once, with lm-evaluation-harness in its own environment (in_venv/lm_eval_run.py).

Steps: record `eval running`; for a cell, check train == serve (the template every copy saved with the model
carries is the one the trainer saved when training completed, core/templates.py); write the project's tiny
tasks if asked; run the harness once per (engine, batch size, device, dtype, seed) with every missing task; turn
each result into its score file (core/scores.py) and record it; record `eval completed`, or `failed` with the
reason (a task's own error, or the harness's last line). A failed task fails only its own score: the next run of
the grid computes what is missing and nothing else, never the training. Jobs run offline: the harness gets the
Hugging Face offline switches, and tasks read only the local files or the staged cache.

Scores along training (a suite's `along`): the checkpoints' scores are computed the same way, one model load per
checkpoint, each on its checkpoint's directory; while the cell has no final model yet (it trains, or it failed) only
those. One evaluation of a target runs at a time (a lock in its logs/), so two jobs never compute one score twice.

The stage's state (`state_of`, `todo`) is derived, never stored, from a target's score files, its ledger and the
scheduler: what the grid decides on and what `status` shows in its eval column.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import LOGS_DIR, checkpoints, tail_lines
from sft_grid.core.lock import Lock
from sft_grid.core.paths import IN_VENV_DIR, cache_root
from sft_grid.core.scores import EvalFile, ScoreSpec, has_score, write_score
from sft_grid.core.state import SchedulerView, alive
from sft_grid.core.templates import effective_template, template_digest, template_matches

log = logging.getLogger(__name__)

SCRIPT = IN_VENV_DIR / "lm_eval_run.py"
EVAL_LOG = "eval.log"
EVAL_LOCK = "eval.lock"
# the key under which the training job records the digest of the template the trainer saved (a `completed` event)
TRAINED_TEMPLATE = "chat_template"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class EvalFailed(RuntimeError):
    """The evaluation could not run at all; the message is the reason recorded for each missing score."""


def record(target_dir: Path, state: Ledger, reason: str = "", **fields: Any) -> None:
    events.append(target_dir, Event.here(Kind.EVAL, state=state.value, reason=reason, **fields))


def trained_digest(cell_dir: Path, model: Path) -> str | None:
    """The template the cell trained with: recorded when its training completed, else the one its trainer saved
    with its oldest checkpoint (cells trained before the record existed); None when neither says."""
    for e in reversed(events.read(cell_dir)):
        if e.kind is Kind.COMPLETED and e.details.get(TRAINED_TEMPLATE):
            return str(e.details[TRAINED_TEMPLATE])
    for ckpt in checkpoints(model):
        text = effective_template(ckpt)
        if text is not None:
            return template_digest(text)
    return None


def model_of(plan: EvalFile, score: ScoreSpec) -> Path:
    """The model a score is computed on: the target's, or the checkpoint of the step a score along training names."""
    model = Path(plan.model_path)
    return model if score.step is None else model / f"checkpoint-{score.step}"


def served_digest(target_dir: Path, plan: EvalFile, todo: Sequence[ScoreSpec]) -> str | None:
    """The digest of the template the model is evaluated with; for a cell, train == serve is checked first."""
    model = model_of(plan, todo[0])
    if plan.base:
        text = effective_template(model) if model.is_dir() else None
        return template_digest(text) if text is not None else None
    if not (model / "config.json").is_file():
        raise EvalFailed(
            f"{model} holds no saved model (no config.json): did training complete, and did the"
            " post-training stages (consolidate) finish?"
        )
    trained = trained_digest(target_dir, Path(plan.model_path))
    if not any(s.settings.get("apply_chat_template") for s in todo):
        return trained
    if trained is None:
        raise EvalFailed(
            f"no record of the chat template {target_dir.name} trained with (no `completed` event with"
            f" one, no checkpoint with a template): retrain it (force=true), or evaluate it with"
            " apply_chat_template=false"
        )
    ok, message = template_matches(model, trained)
    if not ok:
        raise EvalFailed(f"train == serve: {message}")
    return trained


def include_paths(plan: EvalFile, todo: Sequence[ScoreSpec]) -> list[str]:
    """The task directories the harness reads: the suite's own, and the project's tiny tasks written here."""
    from sft_grid.planning.evaluation import TINY_TASKS, tasks_digest, write_tiny_tasks  # status reads no plan

    paths = list(plan.include_paths)
    if any(s.task in TINY_TASKS for s in todo):
        where = cache_root() / "eval_tasks" / f"tiny-{tasks_digest()}"
        write_tiny_tasks(where)
        paths.append(str(where))
    return paths


def _task(score: ScoreSpec) -> dict[str, Any]:
    keys = ("num_fewshot", "limit", "gen_kwargs", "apply_chat_template", "fewshot_as_multiturn")
    return {"name": score.task, "id": score.score_id, **{k: score.settings[k] for k in keys}}


def _harness(target_dir: Path, plan: EvalFile, group: Sequence[ScoreSpec], paths: Sequence[str]) -> tuple[Path, str]:
    """Run the harness on one group of scores; (its results folder, the last line it said on failure)."""
    first = group[0]
    run_dir = target_dir / LOGS_DIR / "eval" / f"{time.strftime('%Y%m%d-%H%M%S')}-{first.score_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": str(model_of(plan, first)),
        "tasks": [_task(s) for s in group],
        "include_path": list(paths),
        "engine": first.engine,
        "batch_size": first.batch_size,
        "device": first.device,
        "dtype": first.settings["dtype"],
        "seed": first.settings["seed"],
        "output_dir": str(run_dir / "results"),
        "datasets": dict(plan.datasets),
    }
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    env = {**os.environ, **{k: str(v) for k, v in plan.variables.items()}, **OFFLINE}
    log_file = target_dir / LOGS_DIR / EVAL_LOG
    with log_file.open("ab") as fh:
        fh.write(
            f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} {plan.python} {SCRIPT}"
            f" {run_dir}/spec.json\n".encode()
        )
        fh.flush()
        try:
            rc = subprocess.run(
                [plan.python, str(SCRIPT), str(run_dir / "spec.json")],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=target_dir,
            ).returncode
        except OSError as exc:
            raise EvalFailed(
                f"cannot run the harness's python {plan.python}: {exc} (build the environment:"
                " sft-grid venv build lm_eval)"
            ) from None
    said = [
        line.removeprefix("lm_eval_run.py: error: ")
        for line in tail_lines(log_file, 16384)
        if line.startswith("lm_eval_run.py: error:")
    ]
    return run_dir / "results", ((said[-1] if said else f"the harness exited {rc}") if rc else "")


def _score(target_dir: Path, plan: EvalFile, score: ScoreSpec, results: Path, digest: str | None, failure: str) -> str:
    """Turn one task's result into its score file; returns why it failed ("" when it did not)."""
    result, error = results / f"{score.score_id}.json", results / f"{score.score_id}.error.json"
    if error.is_file():
        return json.loads(error.read_text()).get("error") or failure
    if not result.is_file():
        return failure or "the harness wrote no result"
    data = json.loads(result.read_text())
    version = plan.harness.partition("==")[2]
    if version and data.get("harness_version") != version:
        return (
            f"the harness environment has version {data.get('harness_version')}, and the score's identity says"
            f" {plan.harness}: rebuild it (sft-grid venv build lm_eval)"
        )
    record_ = {
        "score_id": score.score_id,
        "task": score.task,
        "suite": score.suite,
        "settings": dict(score.settings),
        "harness": plan.harness,
        "model": plan.target,
        "model_path": str(model_of(plan, score)),
        "template_digest": digest,
        "metrics": data["metrics"],
        "time": datetime.now().astimezone().isoformat(timespec="seconds"),
        "seconds": data.get("seconds"),
    }
    write_score(target_dir, {**record_, "base": True} if plan.base else record_)
    return ""


def _groups(todo: Sequence[ScoreSpec]) -> list[list[ScoreSpec]]:
    """Scores the harness computes with one model load: the same model (the final one, or a checkpoint), engine,
    batch size, device, dtype and seed."""
    groups: dict[tuple[str, ...], list[ScoreSpec]] = {}
    for s in todo:
        key = (str(s.step), s.engine, str(s.batch_size), s.device, str(s.settings["dtype"]), str(s.settings["seed"]))
        groups.setdefault(key, []).append(s)
    return list(groups.values())


def run(target_dir: Path | str) -> bool:
    """Compute the target's missing scores; True when it has all of them. Safe to call again."""
    target_dir = Path(target_dir).resolve()
    plan = EvalFile.load(target_dir)
    if plan is None or not plan.missing(target_dir):
        return True
    (target_dir / LOGS_DIR).mkdir(exist_ok=True)
    # one evaluation of a target at a time (a job scoring checkpoints while the cell trains, and the evaluation
    # after its post stages): the second finds what the first computed, so each score is computed once
    with Lock(target_dir / LOGS_DIR / EVAL_LOCK):
        return _run(target_dir, plan)


def _run(target_dir: Path, plan: EvalFile) -> bool:
    todo = plan.todo(target_dir)
    if not todo:
        return True
    record(target_dir, Ledger.RUNNING, details={"scores": [s.score_id for s in todo]})
    started = time.monotonic()
    try:
        paths = include_paths(plan, todo)
        failed: dict[str, str] = {}
        for group in _groups(todo):
            try:
                digest = served_digest(target_dir, plan, group)
            except EvalFailed as exc:
                if group[0].step is None:  # the final model's: the stage fails as a whole, as it always did
                    raise
                # one checkpoint that cannot be scored (removed by save_total_limit, no template) fails alone
                results, failure, digest = target_dir / "no results", str(exc), None
            else:
                results, failure = _harness(target_dir, plan, group, paths)
            for score in group:
                why = _score(target_dir, plan, score, results, digest, failure)
                if why:
                    failed[score.score_id] = why
                record(
                    target_dir,
                    Ledger.FAILED if why else Ledger.COMPLETED,
                    why,
                    score_id=score.score_id,
                    task=score.task,
                )
    except Exception as exc:  # whatever stops the stage is its recorded reason, never the cell's
        why = str(exc) if isinstance(exc, EvalFailed) else f"{type(exc).__name__}: {exc}"
        for score in todo:
            if not has_score(target_dir, score.score_id):
                record(target_dir, Ledger.FAILED, why, score_id=score.score_id, task=score.task)
        record(target_dir, Ledger.FAILED, why)
        log.warning("%s: evaluation failed: %s", target_dir.name, why, exc_info=not isinstance(exc, EvalFailed))
        return False
    seconds = {"seconds": round(time.monotonic() - started, 1)}
    if failed:
        reason = "; ".join(f"{s.task}: {failed[s.score_id]}" for s in todo if s.score_id in failed)
        record(
            target_dir, Ledger.FAILED, f"{len(failed)} of {len(todo)} score(s) failed: {reason}"[:1000], details=seconds
        )
        return False
    record(target_dir, Ledger.COMPLETED, details={**seconds, "scores": len(todo)})
    return True


class Evaluation(StrEnum):
    """A target's evaluation as a whole: its state."""

    NONE = ""  # nothing to evaluate
    DONE = "done"  # every score it asks for is there
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    FAILED = "failed"


class Ledger(StrEnum):
    """What an `eval` event of the ledger says: the stage started, completed, or failed (a score, or the whole)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class EvalState:
    planned: int
    done: int
    state: Evaluation
    reason: str = ""
    job_id: str = ""

    def text(self) -> str:
        """The `eval` column of status: what the scores are, in a few words."""
        if not self.planned:
            return ""
        if self.state is Evaluation.DONE:
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


def state_of(
    target_dir: Path,
    history: Sequence[Event] | None = None,
    view: SchedulerView | None = None,
    scores: Sequence[ScoreSpec] | None = None,
) -> EvalState:
    """The evaluation's state; `scores`: those the grid asks for now (default: the target's eval.json)."""
    history = events.read(target_dir) if history is None else history
    if scores is None:
        plan = EvalFile.load(target_dir)
        scores = plan.wanted(target_dir) if plan is not None else ()
    done = sum(1 for s in scores if has_score(target_dir, s.score_id))
    if done == len(scores):
        return EvalState(len(scores), done, Evaluation.DONE if scores else Evaluation.NONE)
    job_id = eval_job_id(history)
    job = view.job(job_id) if view is not None and job_id else None
    if job is not None and job.in_flight:
        running = job.state in ("RUNNING", "COMPLETING")
        return EvalState(len(scores), done, Evaluation.RUNNING if running else Evaluation.QUEUED, job_id=job_id)
    last = stage_event(history)
    if last is not None and last.state == Ledger.RUNNING:
        if job is not None:
            return EvalState(
                len(scores),
                done,
                Evaluation.FAILED,
                f"evaluation job {job_id} ended {job.state} during the evaluation",
                job_id,
            )
        if alive(last) is False:
            return EvalState(
                len(scores),
                done,
                Evaluation.FAILED,
                f"its process {last.pid} on {last.host} ended during the evaluation",
            )
        if alive(last) is True:
            return EvalState(len(scores), done, Evaluation.RUNNING)
    if last is not None and last.state == Ledger.FAILED:
        return EvalState(len(scores), done, Evaluation.FAILED, last.reason, job_id)
    return EvalState(len(scores), done, Evaluation.PENDING)


@dataclass(frozen=True)
class EvalTodo:
    needed: bool  # an evaluation job must run
    note: str  # for the skip message


def todo(
    target_dir: Path, scores: Sequence[ScoreSpec], history: Sequence[Event], view: SchedulerView | None
) -> EvalTodo:
    """Whether this invocation must evaluate the target: some score is missing and nothing evaluates it now."""
    st = state_of(target_dir, history, view, scores)
    if st.state in (Evaluation.NONE, Evaluation.DONE):
        return EvalTodo(False, "")
    if st.state is Evaluation.QUEUED or (st.state is Evaluation.RUNNING and st.job_id):
        return EvalTodo(False, f"evaluation waiting in Slurm (job {st.job_id})")
    if st.state is Evaluation.RUNNING:
        return EvalTodo(False, "evaluation running")
    missing = st.planned - st.done
    again = " again" if st.state is Evaluation.FAILED else ""
    return EvalTodo(True, f"evaluation to run{again}: {missing} score(s)")
