"""The batch script's step after a Slurm training step (job/after.py): the requeue a failure asks for, submitted
from outside the step that srun is ending, once. What it decides from the ledger is checked here; its real run in
a Slurm job (a rank killed, the requeue made by the script) is tests/test_triage_faults.py's two-node test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission, JobPaths

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.classes import Failure, FailureClass
from sft_grid.core.failures.policy import Remedy, RemedyKind
from sft_grid.core.layout import LOGS_DIR
from sft_grid.job import after, runner
from sft_grid.schedulers import slurm
from sft_grid.schedulers.entry import CheckpointableEntry


@pytest.fixture
def submitted(monkeypatch):
    """The cells the hook hands to `sft-grid requeue` (its real run needs a controller: the Slurm test)."""
    calls: list[Path] = []
    monkeypatch.setattr(runner, "submit_requeue", lambda cell_dir: calls.append(cell_dir) or "queued as job 9")
    return calls


def cell(tmp_path: Path, *history: Event) -> Path:
    d = tmp_path / "cell"
    d.mkdir()
    for e in history:
        events.append(d, e)
    return d


RUN = Event(Kind.RUNNING, job_id="41")
FAILED_REQUEUE = Event(
    Kind.FAILED, job_id="41", failure_class=FailureClass.COLLECTIVE_TIMEOUT, action=RemedyKind.REQUEUE
)


def test_a_failure_to_requeue_is_submitted_once_even_with_a_notification_after_it(tmp_path, submitted):
    d = cell(tmp_path, Event(Kind.SUBMITTED), RUN, FAILED_REQUEUE, Event(Kind.NOTIFIED, key="end"))
    assert after.finish(d, "41") == "queued as job 9"
    assert submitted == [d]


@pytest.mark.parametrize(
    "history, said",
    [
        # the step's own requeue went through (a job submitted by an earlier version, from inside the step)
        ((RUN, FAILED_REQUEUE, Event(Kind.SUBMITTED, note="requeue: collective_timeout")), "submitted"),
        ((RUN, Event(Kind.COMPLETED, job_id="41")), "completed"),
        ((RUN, Event(Kind.FAILED, job_id="41", failure_class=FailureClass.GPU_OOM, action=RemedyKind.STOP)), "gpu_oom"),
        ((RUN, Event(Kind.REQUEUED, job_id="41")), "requeued"),  # submitit's own requeue of this job
    ],
)
def test_nothing_is_submitted_for_any_other_end(tmp_path, submitted, history, said):
    assert said in after.finish(cell(tmp_path, *history), "41")
    assert submitted == []


def test_a_cell_this_job_never_started_is_left_alone(tmp_path, submitted):
    # another job ran it (this one found it moved to another site before it started): not even a line written
    assert after.finish(cell(tmp_path, Event(Kind.RUNNING, job_id="40"), FAILED_REQUEUE), "41") is None
    assert submitted == []


def test_a_runner_killed_before_its_triage_was_written_is_triaged_here(tmp_path, submitted, monkeypatch):
    d = cell(tmp_path, RUN, Event(Kind.INTERRUPTED, job_id="41", signal=15))
    failure = Failure(
        klass=FailureClass.COLLECTIVE_TIMEOUT, evidence="Connection reset by peer", nodes=(), summary="a collective"
    )
    monkeypatch.setattr(after, "triage", lambda *_: (failure, Remedy(RemedyKind.REQUEUE, "requeued (1 of 2)")))
    assert after.finish(d, "41") == "queued as job 9"
    recorded = events.read(d)[-1]
    assert (recorded.kind, recorded.failure_class, recorded.action, recorded.job_id) == (
        Kind.FAILED,
        FailureClass.COLLECTIVE_TIMEOUT,
        RemedyKind.REQUEUE,
        "41",
    )
    assert submitted == [d]


def test_the_trap_runs_the_hook_for_this_jobs_cell_and_keeps_the_steps_exit_status(tmp_path):
    """The rendered lines, run by bash as the batch script runs them: a folder path with a space and a quote, a
    real submitit pickle of the job's task, the step's status (srun's) kept as the script's."""
    folder = tmp_path / "sub mit's"
    d = cell(tmp_path, RUN, Event(Kind.COMPLETED, job_id="41"))
    (d / LOGS_DIR).mkdir()
    folder.mkdir()
    DelayedSubmission(CheckpointableEntry("sft_grid.job.entries:train", str(d))).dump(
        JobPaths(folder, job_id="41").submitted_pickle
    )
    script = "\n".join([*slurm.after_step_lines(folder), "exit 7"])
    env = {**os.environ, "SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "41", "PYTHONPATH": str(Path.cwd())}
    env.pop("SLURM_ARRAY_JOB_ID", None)
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 7, proc.stderr
    said = (d / LOGS_DIR / after.LOG_FILE).read_text()
    assert said.endswith(f" job 41: {d.name}: completed; nothing to do\n"), (said, proc)
    assert sys.executable in script


def test_a_checkpoint_cut_mid_save_is_set_aside_and_the_run_resumes_from_the_last_whole_one(tmp_path):
    """A job killed at its time limit while saving leaves checkpoint-N without its trainer_state.json (the trainer
    writes it last): the next leg resumes from the newest checkpoint that has it, on every node, and the lead sets
    the cut one aside (kept, out of `checkpoint-*`). Seen on the local Slurm cluster: the leg resumed from the cut
    checkpoint-790 and failed on the missing file."""
    from sft_grid.core.layout import TRAINER_STATE, checkpoints
    from sft_grid.job.runner import resume_point

    out = tmp_path / "output"
    for step in (10, 20, 30):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "model.safetensors").write_bytes(b"w")
    for step in (10, 20):
        (out / f"checkpoint-{step}" / TRAINER_STATE).write_text(json.dumps({"global_step": step}))
    assert [p.name for p in resume_point(out, lead=False)] == ["checkpoint-10", "checkpoint-20"]
    assert (out / "checkpoint-30").is_dir()  # a node that is not the lead renames nothing
    assert resume_point(out, lead=True)[-1].name == "checkpoint-20"
    assert [p.name for p in checkpoints(out)] == ["checkpoint-10", "checkpoint-20"]
    (aside,) = out.glob(".cut-checkpoint-30-*")
    assert (aside / "model.safetensors").read_bytes() == b"w"  # kept
    assert resume_point(tmp_path / "none", lead=True) == []
