"""The post-training chain of a cell: stages that run after its training completed, each with its own state.

The team's cleanup after SFT was a list of manual steps: consolidate ZeRO-3 shards, copy Qwen3.5's
preprocessor_config.json, check the tokenizer config, upload, register. Here each is a declared stage of the
cell, planned at render time from what the model needs and what the grid asks for, written to the cell's
post.json, and recorded in its ledger as `stage` events. A stage that completed never runs again; a failed one
is retried by running the chain again, and training is never rerun for it.

Stages, in order (only those that apply to the cell are planned):

- consolidate (model needs `consolidate`): ZeRO shards -> safetensors, with DeepSpeed's zero_to_fp32;
- preprocessor_config (model needs `preprocessor_config`): the base model's file into output/ and each
  checkpoint (LLaMA-Factory does not write it and vLLM needs it for Qwen3.5);
- tokenizer (always): repairs what transformers 5 writes and transformers 4.57 loaders crash on;
- upload (push_to_hub and a hub id): output/ to the Hub, without checkpoints and ZeRO shards, then verified:
  every uploaded file is in the Hub's commit with its size;
- register (register_db, off unless a grid turns it on): the grid's own register_command;
- cleanup (cleanup_checkpoints, on by default where the cell uploads): the intermediate output/checkpoint-*
  removed once the final model is uploaded and verified (a 9.7B cell with Adam state keeps ~150 GB per
  checkpoint); the final model stays.

Where they run: locally, in the job right after training. On Slurm, as a post job array that depends on the
training array, task by task. The upload runs in a job only where it can reach the Hub: the compute nodes
have internet, or the cluster names a `post_partition` whose nodes have. Elsewhere it waits for
`python -m sft_grid.post`, run from the login node. The runners are stages/post_run.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.state import JobState, SchedulerView, alive, post_job_id
from sft_grid.planning.cells import Cell
from sft_grid.planning.venvs import bin_dir

STAGES = ("consolidate", "preprocessor_config", "tokenizer", "upload", "register", "cleanup")
# stages that reach the Hub: they run in a job only where its nodes have internet
HUB_STAGES = ("upload", "register")
# where a stage runs
IN_JOB, LOGIN = "job", "login"


@dataclass(frozen=True)
class StageState:
    state: str  # pending, running, waiting, completed, failed
    reason: str = ""


# -- planning (pure) ------------------------------------------------------------------------------------------


def stages_for(spec: Any) -> list[str]:
    """The stages of a cell (spec: its CellConf), in chain order."""
    needs = set(spec.model.needs)
    upload = bool(spec.push_to_hub and spec.hub_model_id)
    cleanup = upload if spec.cleanup_checkpoints is None else bool(spec.cleanup_checkpoints)
    return [s for s, on in (
        ("consolidate", "consolidate" in needs),
        ("preprocessor_config", "preprocessor_config" in needs),
        ("tokenizer", True),
        ("upload", upload),
        ("register", bool(spec.register_db)),
        ("cleanup", cleanup),
    ) if on]


def upload_in_job(spec: Any) -> bool:
    """Whether a job may upload: its nodes reach the Hub."""
    c = spec.cluster
    return bool(c.internet_on_compute or (c.executor == "slurm" and c.post_partition))


def post_file(cell: Cell) -> PostFile:
    """post.json: what the job (or the login-node command) needs to run the chain without conf/."""
    s = cell.spec
    return PostFile(
        cell=cell.name,
        stages=tuple(stages_for(s)),
        python=str(bin_dir(s) / "python"),
        variables=dict(s.cluster.env),
        base_model=s.model.path or s.model.hub_id or "",
        hub_model_id=s.hub_model_id or "",
        upload_in_job=upload_in_job(s),
        in_train_job=s.cluster.executor == "local",
        datasets=tuple(s.dataset),
        register_command=tuple(s.register_command),
    )


def gated(stage: str, where: str, upload_in_job: bool) -> bool:
    """Whether a stage must wait for the login node: it reaches the Hub, and a job's nodes cannot."""
    return stage in HUB_STAGES and where == IN_JOB and not upload_in_job


def waiting_note(cell_dir: Path) -> str:
    return (f"the cluster's compute nodes have no internet (cluster.internet_on_compute false, no"
            f" cluster.post_partition): run `python -m sft_grid.post {cell_dir} --stage upload` from the login node")


# -- state, from the ledger -----------------------------------------------------------------------------------


def states(cell_dir: Path, history: Sequence[Event] | None = None,
           planned: Sequence[str] | None = None) -> dict[str, StageState]:
    """Each planned stage's state: its last stage event (a `running` whose process is gone is failed).
    Events before the last training run belong to an older output and do not count."""
    history = events.read(cell_dir) if history is None else history
    if planned is None:
        post = PostFile.load(cell_dir)
        planned = post.stages if post is not None else ()
    start = max((i for i, e in enumerate(history) if e.kind is Kind.RUNNING), default=-1)
    last: dict[str, Event] = {}
    for e in history[start + 1:]:
        if e.kind is Kind.STAGE:
            last[e.stage] = e
    out = {}
    for name in planned:
        e = last.get(name)
        if e is None:
            out[name] = StageState("pending")
        elif e.state == "running" and alive(e) is False:
            out[name] = StageState("failed", f"its process {e.pid} on {e.host} ended during the stage")
        else:
            out[name] = StageState(e.state, e.reason)
    return out


def post_job(history: Sequence[Event], view: SchedulerView | None) -> JobState | None:
    """The scheduler's record of the cell's latest post job, if any."""
    return view.job(post_job_id(history)) if view is not None else None


def summary(cell_dir: Path, history: Sequence[Event] | None = None,
            view: SchedulerView | None = None) -> tuple[str, str]:
    """(the chain's state in a few words, the reason of a failed or waiting stage) for status tables; `view`:
    the scheduler's, in which the cell's post job may be waiting."""
    history = events.read(cell_dir) if history is None else history
    st = states(cell_dir, history)
    if not st:
        return "", ""
    if all(s.state == "completed" for s in st.values()):
        return "done", ""
    for name, s in st.items():
        if s.state != "completed":
            job = post_job(history, view)
            if s.state == "pending" and job is not None and job.in_flight:
                return f"{name} in post job {job.job_id} ({job.state.lower()})", ""
            return f"{name} {s.state}", s.reason
    return "", ""


@dataclass(frozen=True)
class Todo:
    """What a completed cell's post-training chain still needs from this invocation."""

    stages: tuple[str, ...]  # stages a job can run now
    note: str  # for the skip message: what happens (or what the user must do)


def todo(cell: Cell, cell_dir: Path, history: Sequence[Event], view: SchedulerView | None) -> Todo:
    """The stages a completed cell still needs that a job can run (an upload that must wait for the login
    node is not one); nothing while its post job is still queued or its stages are running."""
    planned = stages_for(cell.spec)
    current = states(cell_dir, history, planned)
    left = [n for n in planned if current[n].state != "completed"]
    if not left:
        return Todo((), "")
    job = post_job(history, view)
    if job is not None and job.in_flight:
        return Todo((), f"post stages waiting in Slurm (job {job.job_id})")
    # a stage left `running` by a post job that has ended did not finish: it runs again
    if job is None and any(current[n].state == "running" for n in left):
        return Todo((), "post stages running")
    runnable = []
    for name in left:
        if gated(name, IN_JOB, upload_in_job(cell.spec)):
            break
        runnable.append(name)
    if runnable:
        return Todo(tuple(runnable), f"post stages to run: {', '.join(runnable)}")
    return Todo((), f"{left[0]} waits: python -m sft_grid.post {cell_dir}")
