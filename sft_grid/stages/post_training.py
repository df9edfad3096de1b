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
`sft-grid post`, run from the login node.

What each stage does (`STAGE_RUNNERS`: consolidate, the preprocessor copy, the tokenizer repair, the upload, the
database hook, the cleanup) and the chain's runner (`run`, what the job and `sft-grid post` call) follow the plan.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import LOGS_DIR, OUTPUT_DIR, WEIGHT_FILES, checkpoints, output_complete
from sft_grid.core.paths import IN_VENV_DIR, torch_extensions
from sft_grid.core.schema import CellConf
from sft_grid.core.state import JobState, SchedulerView, alive, post_job_id
from sft_grid.planning.cells import layout_for

STAGES = ("consolidate", "preprocessor_config", "tokenizer", "upload", "register", "cleanup")
# stages that reach the Hub: they run in a job only where its nodes have internet
HUB_STAGES = ("upload", "register")
# where a stage runs
IN_JOB, LOGIN = "job", "login"
# the chain's log, in the cell's logs/: each run's stages, their states and the output of what they ran
POST_LOG = "post.log"


class Step(StrEnum):
    """A post-training stage's state, as its last `stage` event records it."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"  # an upload that waits for the login node (`sft-grid post`)
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class StageState:
    state: Step
    reason: str = ""


# -- planning (pure) ------------------------------------------------------------------------------------------


def stages_for(spec: CellConf) -> list[str]:
    """The stages of a cell (spec: its CellConf), in chain order."""
    needs = set(spec.model.needs)
    upload = bool(spec.push_to_hub and spec.hub_model_id)
    cleanup = upload if spec.cleanup_checkpoints is None else bool(spec.cleanup_checkpoints)
    return [
        s
        for s, on in (
            # ZeRO-3 saves shards (backends/zero.py); a model may also say it needs it
            ("consolidate", "consolidate" in needs or layout_for(spec).sharding == "zero3"),
            ("preprocessor_config", "preprocessor_config" in needs),
            ("tokenizer", True),
            ("upload", upload),
            ("register", bool(spec.register_db)),
            ("cleanup", cleanup),
        )
        if on
    ]


def upload_in_job(spec: CellConf) -> bool:
    """Whether a job may upload: its nodes reach the Hub."""
    c = spec.cluster
    return bool(c.internet_on_compute or (c.executor == "slurm" and c.post_partition))


def post_file(cell: Cell) -> PostFile:
    """post.json: what the job (or the login-node command) needs to run the chain without conf/."""
    from sft_grid.planning.environments import bin_dir

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
    return (
        f"the cluster's compute nodes have no internet (cluster.internet_on_compute false, no"
        f" cluster.post_partition): run `sft-grid post {cell_dir} --stage upload` from the login node"
    )


# -- state, from the ledger -----------------------------------------------------------------------------------


def states(
    cell_dir: Path, history: Sequence[Event] | None = None, planned: Sequence[str] | None = None
) -> dict[str, StageState]:
    """Each planned stage's state: its last stage event (a `running` whose process is gone is failed).
    Events before the last training run belong to an older output and do not count."""
    history = events.read(cell_dir) if history is None else history
    if planned is None:
        post = PostFile.load(cell_dir)
        planned = post.stages if post is not None else ()
    start = max((i for i, e in enumerate(history) if e.kind is Kind.RUNNING), default=-1)
    last: dict[str, Event] = {}
    for e in history[start + 1 :]:
        if e.kind is Kind.STAGE:
            last[e.stage] = e
    out = {}
    for name in planned:
        seen = last.get(name)
        if seen is None:
            out[name] = StageState(Step.PENDING)
        elif seen.state == Step.RUNNING and alive(seen) is False:
            out[name] = StageState(Step.FAILED, f"its process {seen.pid} on {seen.host} ended during the stage")
        else:
            out[name] = StageState(_step(seen.state), seen.reason)
    return out


def _step(value: str) -> Step:
    """A stage's state as the ledger spells it; one this version does not know reads as pending (run again)."""
    try:
        return Step(value)
    except ValueError:
        return Step.PENDING


def post_job(history: Sequence[Event], view: SchedulerView | None) -> JobState | None:
    """The scheduler's record of the cell's latest post job, if any."""
    return view.job(post_job_id(history)) if view is not None else None


def busy(cell_dir: Path, history: Sequence[Event], view: SchedulerView | None) -> bool:
    """Whether the chain is under way: its post job queued or running (the job's word decides where there is
    one: a stage it left `running` on another host is not), else a stage running."""
    left = [s for s in states(cell_dir, history).values() if s.state != "completed"]
    if not left:
        return False
    job = post_job(history, view)
    if job is not None:
        return job.in_flight
    return any(s.state == "running" for s in left)


def summary(
    cell_dir: Path, history: Sequence[Event] | None = None, view: SchedulerView | None = None
) -> tuple[str, str]:
    """(the chain's state in a few words, the reason of a failed or waiting stage) for status tables; `view`:
    the scheduler's, in which the cell's post job may be waiting."""
    history = events.read(cell_dir) if history is None else history
    st = states(cell_dir, history)
    if not st:
        return "", ""
    if all(s.state is Step.COMPLETED for s in st.values()):
        return "done", ""
    for name, s in st.items():
        if s.state is not Step.COMPLETED:
            job = post_job(history, view)
            if s.state is Step.PENDING and job is not None and job.in_flight:
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
    left = [n for n in planned if current[n].state is not Step.COMPLETED]
    if not left:
        return Todo((), "")
    job = post_job(history, view)
    if job is not None and job.in_flight:
        return Todo((), f"post stages waiting in Slurm (job {job.job_id})")
    # a stage left `running` by a post job that has ended did not finish: it runs again
    if job is None and any(current[n].state is Step.RUNNING for n in left):
        return Todo((), "post stages running")
    runnable = []
    for name in left:
        if gated(name, IN_JOB, upload_in_job(cell.spec)):
            break
        runnable.append(name)
    if runnable:
        return Todo(tuple(runnable), f"post stages to run: {', '.join(runnable)}")
    return Todo((), f"{left[0]} waits: sft-grid post {cell_dir}")


if TYPE_CHECKING:  # status reads the chain's state without the planning layer
    from sft_grid.planning.cells import Cell

log = logging.getLogger(__name__)

SCRIPT = IN_VENV_DIR / "post_stage.py"
PREPROCESSOR = "preprocessor_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# never uploaded: resumable training state, ZeRO shards (consolidated into model*.safetensors first)
UPLOAD_IGNORE = (
    "checkpoint-*",
    "global_step*",
    "latest",
    "zero_to_fp32.py",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state*.pth",
    "*.lock",
)


class StageFailed(RuntimeError):
    """A stage did not do its work; the message is the reason recorded in the ledger."""


def record(cell_dir: Path, stage: str, state: Step, reason: str = "", **details: Any) -> None:
    events.append(cell_dir, Event.here(Kind.STAGE, stage=stage, state=state.value, reason=reason, details=details))
    said = f" {json.dumps(details, default=str)[:2000]}" if details else ""
    say(
        cell_dir,
        f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {stage}: {state.value}" + (f": {reason}" if reason else "") + said,
    )


def say(cell_dir: Path, text: str) -> None:
    """Append to the chain's own log (logs/post.log, what `sft-grid logs GRID CELL --post` shows): each stage's
    states and the output of the processes it ran. The ledger is the record; a log that cannot be written is
    not a stage's failure."""
    path = cell_dir / LOGS_DIR / POST_LOG
    try:
        path.parent.mkdir(exist_ok=True)
        with path.open("a") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
    except OSError as exc:
        log.warning("%s: cannot write %s: %s", cell_dir.name, path, exc)


def _said(cell_dir: Path | None, argv: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
    if cell_dir is not None:
        say(cell_dir, f"--- {' '.join(argv)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")


def run(cell_dir: Path | str, where: str = IN_JOB, only: Sequence[str] = ()) -> bool:
    """Run the pending and failed stages in order; True when the whole chain is completed. A stage runs
    only when every stage before it completed; `only` limits which stages this call may run."""
    cell_dir = Path(cell_dir).resolve()
    post = PostFile.load(cell_dir)
    if post is None:
        return True
    started = False
    for name, st in states(cell_dir, planned=post.stages).items():
        if st.state is Step.COMPLETED:
            continue
        if only and name not in only:
            return False
        if not started:  # one header per run that has something to do, as train.log and eval.log have
            say(
                cell_dir,
                f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} post-training stages ({where},"
                f" pid {os.getpid()} on {socket.gethostname()}): {', '.join(post.stages)}",
            )
            started = True
        if gated(name, where, post.upload_in_job):
            if st.state is not Step.WAITING:
                record(cell_dir, name, Step.WAITING, reason=waiting_note(cell_dir))
            return False
        record(cell_dir, name, Step.RUNNING)
        try:
            details = STAGE_RUNNERS[name](cell_dir, post, where) or {}
        except StageFailed as exc:
            record(cell_dir, name, Step.FAILED, reason=str(exc))
            log.warning("%s: stage %s failed: %s", cell_dir.name, name, exc)
            return False
        record(cell_dir, name, Step.COMPLETED, **details)
    return True


def _python(post: PostFile) -> str:
    """The python a stage's step runs with: the backend's environment's (this one's where post.json names none)."""
    return post.python or sys.executable


def _in_venv(
    post: PostFile,
    args: Sequence[str],
    variables: Mapping[str, str],
    what: str,
    hint: str = "",
    cell_dir: Path | None = None,
) -> dict[str, Any]:
    """Run a stage's step in the backend's python; `cell_dir`: whose post.log gets its output."""
    python = _python(post)
    try:
        proc = subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True, env=dict(variables))
    except OSError as exc:
        raise StageFailed(f"{what}: cannot run the backend's python {python}: {exc}") from None
    _said(cell_dir, [python, SCRIPT.name, *args], proc)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('{"ok"'):
            result: dict[str, Any] = json.loads(line)
            if result.pop("ok"):
                return result
            raise StageFailed(f"{what}: {result.get('error')}" + (f". {hint}" if hint else ""))
    tail = " ".join((proc.stderr or proc.stdout).split())[-600:]
    raise StageFailed(f"{what}: {SCRIPT.name} exited {proc.returncode} without a result: {tail}")


def _job_variables(post: PostFile, hub: bool = False) -> dict[str, str]:
    """The cluster's job variables; a stage that must reach the Hub does not inherit its HF_HUB_OFFLINE
    (the user's own environment still applies)."""
    env = {**os.environ, **{k: str(v) for k, v in post.variables.items()}}
    if hub:
        env.pop("HF_HUB_OFFLINE", None)
        if "HF_HUB_OFFLINE" in os.environ:
            env["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    return env


def _model_dirs(output: Path) -> list[Path]:
    return [output, *checkpoints(output)]


def consolidate(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    output = cell_dir / OUTPUT_DIR
    sources = [d for d in [output, *reversed(checkpoints(output))] if (d / "latest").is_file()]
    if not sources:
        if any((output / w).is_file() for w in WEIGHT_FILES):
            return {"note": "output/ already holds final weights; nothing to consolidate"}
        raise StageFailed(
            f"no ZeRO checkpoint (a `latest` file naming global_stepN/) in {output} or its"
            " checkpoints: was the cell trained with DeepSpeed ZeRO-3?"
        )
    source = sources[0]
    env = {**_job_variables(post), "TORCH_EXTENSIONS_DIR": torch_extensions(_python(post))}
    result = _in_venv(
        post,
        ["consolidate", str(source), str(output)],
        env,
        f"consolidating the ZeRO checkpoint {source}",
        cell_dir=cell_dir,
    )
    if not result.get("files"):
        raise StageFailed(f"consolidating {source} wrote no model*.safetensors into {output}")
    return {"source": str(source.relative_to(cell_dir)), "files": result["files"]}


def preprocessor_config(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    output = cell_dir / OUTPUT_DIR
    base = post.base_model
    _in_venv(
        post,
        ["fetch", base, PREPROCESSOR, str(output)],
        _job_variables(post),
        f"copying {PREPROCESSOR} from the base model {base} failed",
        f"Offline nodes read it from the Hugging Face cache: download it on the login node first"
        f" (hf download {base} {PREPROCESSOR}), then rerun: sft-grid post {cell_dir}",
        cell_dir,
    )
    ckpts = checkpoints(output)
    for ckpt in ckpts:
        shutil.copyfile(output / PREPROCESSOR, ckpt / PREPROCESSOR)
    return {"copied_to": len(ckpts) + 1}


def tokenizer_problems(config: dict[str, Any], model_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A tokenizer_config.json made loadable by transformers 4.57 and 5, and what was changed.

    transformers 5 writes `extra_special_tokens` as a list (4.57 reads a dict of named tokens and crashes
    on a list), the class `TokenizersBackend` (unknown to 4.57) and the chat template only as
    chat_template.jinja. These are format conversions with nothing lost, so they are repaired: the list moves
    to `additional_special_tokens` (which both versions read), the class becomes PreTrainedTokenizerFast and
    the template is inlined (measured: this form loads in transformers 4.57 and 5). A missing
    chat template is not repairable: sft_grid cannot know what the model was trained on, so it fails.
    """
    fixed = dict(config)
    changes: list[str] = []
    extra = fixed.get("extra_special_tokens")
    if isinstance(extra, list):
        additional = list(fixed.get("additional_special_tokens") or [])
        fixed["additional_special_tokens"] = additional + [t for t in extra if t not in additional]
        del fixed["extra_special_tokens"]
        changes.append("extra_special_tokens list -> additional_special_tokens")
    elif extra is not None and not isinstance(extra, dict):
        raise StageFailed(
            f"{model_dir / TOKENIZER_CONFIG}: extra_special_tokens is a {type(extra).__name__},"
            " neither a dict nor a list"
        )
    if fixed.get("tokenizer_class") == "TokenizersBackend" and (model_dir / "tokenizer.json").is_file():
        fixed["tokenizer_class"] = "PreTrainedTokenizerFast"
        changes.append("tokenizer_class TokenizersBackend -> PreTrainedTokenizerFast")
    if not fixed.get("chat_template"):
        jinja = model_dir / CHAT_TEMPLATE_FILE
        if not jinja.is_file() or not jinja.read_text().strip():
            raise StageFailed(
                f"{model_dir / TOKENIZER_CONFIG} has no chat template (no `chat_template` key and"
                f" no {CHAT_TEMPLATE_FILE}): a served model would format prompts unlike training."
                " Save the training template into the tokenizer (the backend's template setting) and"
                " run the stage again"
            )
        fixed["chat_template"] = jinja.read_text()
        changes.append(f"chat template from {CHAT_TEMPLATE_FILE} inlined")
    return fixed, changes


def tokenizer(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    output = cell_dir / OUTPUT_DIR
    repaired: dict[str, list[str]] = {}
    model_dirs = _model_dirs(output)
    for model_dir in model_dirs:
        path = model_dir / TOKENIZER_CONFIG
        if not path.is_file():
            raise StageFailed(
                f"{path} is missing: every saved model (output/ and each checkpoint-*) needs its tokenizer"
            )
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise StageFailed(f"{path} is not valid JSON: {exc}") from None
        fixed, changes = tokenizer_problems(config, model_dir)
        if changes:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n")
            tmp.replace(path)
            repaired[str(model_dir.relative_to(cell_dir))] = changes
    return {"checked": len(model_dirs), "repaired": repaired}


def upload(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    repo = post.hub_model_id
    if not repo:
        raise StageFailed("upload: the cell has no hub_model_id")
    output = cell_dir / OUTPUT_DIR
    result = _in_venv(
        post,
        ["upload", str(output), str(repo), f"sft_grid cell {post.cell}", *UPLOAD_IGNORE],
        _job_variables(post, hub=True),
        f"upload of {output} to https://huggingface.co/{repo} failed",
        f"Fix the cause (network, HF_TOKEN, rights on the repository) and retry, training is not rerun:"
        f" sft-grid post {cell_dir} --stage upload",
        cell_dir,
    )
    return {"url": result.get("url"), "commit": result.get("commit"), "verified": result.get("verified")}


def register(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    """The database hook: sft_grid ships no database client. A grid that turns register_db on names the
    command that registers a model (e.g. the team's manual_db_push.py); it runs after the upload."""
    command = list(post.register_command)
    if not command:
        raise StageFailed(
            "register_db is on but register_command is empty: name the command that registers a"
            " model, e.g. register_command=[python,manual_db_push.py,--hf-model-id,{hub_model_id}]"
        )
    fields = {
        "hub_model_id": post.hub_model_id,
        "base_model": post.base_model,
        "datasets": ",".join(post.datasets),
        "cell": post.cell,
    }
    argv = [arg.format_map(fields) for arg in command]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cell_dir, env=_job_variables(post, hub=True))
    except OSError as exc:
        raise StageFailed(f"register: cannot run {argv[0]}: {exc}") from None
    _said(cell_dir, argv, proc)
    if proc.returncode:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise StageFailed(f"register: {' '.join(argv)} exited {proc.returncode}: {tail}")
    return {"command": argv}


def cleanup(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    """The intermediate checkpoints go once the final model is safe: it runs after the upload (and its
    verification) in the chain, and only while output/ holds the final model."""
    output = cell_dir / OUTPUT_DIR
    if not output_complete(output):
        raise StageFailed(
            f"{output} holds no final model (weights and trainer_state.json): its checkpoints are"
            " all there is, so none is removed"
        )
    removed, freed = [], 0
    for ckpt in checkpoints(output):
        freed += sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        shutil.rmtree(ckpt)
        removed.append(ckpt.name)
    return {"removed": removed, "freed_bytes": freed}


STAGE_RUNNERS: dict[str, Callable[[Path, PostFile, str], dict[str, Any] | None]] = {
    "consolidate": consolidate,
    "preprocessor_config": preprocessor_config,
    "tokenizer": tokenizer,
    "upload": upload,
    "register": register,
    "cleanup": cleanup,
}
assert tuple(STAGE_RUNNERS) == STAGES
