"""The post-training chain of a cell: stages that run after its training completed, each with its own state.

    python -m sft_grid.post <cell dir | sweep dir> [--stage NAME ...]    # run what is pending or failed

The team's cleanup after SFT was a list of manual steps (research/seed_system.md sections 6-7): consolidate
ZeRO-3 shards, copy Qwen3.5's preprocessor_config.json, check the tokenizer config, upload, register. Here
each is a declared stage of the cell, planned at render time from what the model needs and what the grid
asks for, written to the cell's post.json, and recorded in its ledger as `stage` events
({"event": "stage", "stage": "upload", "state": "failed", "reason": ...}). A stage that completed never
runs again; a failed one is retried by running the chain again, and training is never rerun for it.

Stages, in order (only those that apply to the cell are planned):

- consolidate (model needs `consolidate`): ZeRO shards -> safetensors, with DeepSpeed's zero_to_fp32;
- preprocessor_config (model needs `preprocessor_config`): the base model's file into output/ and each
  checkpoint (LLaMA-Factory does not write it and vLLM needs it for Qwen3.5);
- tokenizer (always): repairs what transformers 5 writes and transformers 4.57 loaders crash on;
- upload (push_to_hub and a hub id): output/ to the Hub, without checkpoints and ZeRO shards;
- register (register_db, off unless a grid turns it on): the grid's own register_command.

Where they run: locally, in the job right after training. On Slurm, as a post job array that depends on
the training array, task by task (aftercorr; afterok for a single job: sft_grid/grid.py). The upload runs in
a job only where it can reach the Hub: the compute nodes have internet, or the cluster names a
`post_partition` whose nodes have. Elsewhere it waits, and this command, run from the login node, does it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sft_grid import ledger
from sft_grid.paths import cache_root

log = logging.getLogger(__name__)

POST_FILE = "post.json"
PROBE = Path(__file__).resolve().parent / "probes" / "post_stage.py"
STAGES = ("consolidate", "preprocessor_config", "tokenizer", "upload", "register")
PREPROCESSOR = "preprocessor_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# never uploaded: resumable training state, ZeRO shards (consolidated into model*.safetensors first)
UPLOAD_IGNORE = ("checkpoint-*", "global_step*", "latest", "zero_to_fp32.py", "optimizer.pt", "scheduler.pt",
                 "rng_state*.pth", "*.lock")
# where the upload stage runs
IN_JOB, LOGIN = "job", "login"


class StageFailed(RuntimeError):
    """A stage did not do its work; the message is the reason recorded in the ledger."""


@dataclass(frozen=True)
class StageState:
    state: str  # pending, running, waiting, completed, failed
    reason: str = ""


# -- planning (pure: called by render) --------------------------------------------------------------------


def stages_for(spec: Any) -> list[str]:
    """The stages of a cell (spec: its CellConf), in chain order."""
    needs = set(spec.model.needs)
    planned = [s for s, on in (
        ("consolidate", "consolidate" in needs),
        ("preprocessor_config", "preprocessor_config" in needs),
        ("tokenizer", True),
        ("upload", bool(spec.push_to_hub and spec.hub_model_id)),
        ("register", bool(spec.register_db)),
    ) if on]
    return planned


def upload_in_job(spec: Any) -> bool:
    """Whether a job may upload: its nodes reach the Hub."""
    c = spec.cluster
    return bool(c.internet_on_compute or (c.executor == "slurm" and c.post_partition))


def post_file(cell: Any, python: Path) -> dict[str, Any]:
    """post.json: what the job (or the login-node command) needs to run the chain without conf/."""
    s = cell.spec
    return {
        "cell": cell.name,
        "stages": stages_for(s),
        "python": str(python),
        "env": dict(s.cluster.env),
        "base_model": s.model.path or s.model.hub_id,
        "hub_model_id": s.hub_model_id,
        "upload_in_job": upload_in_job(s),
        # local cells run the chain in their training job; Slurm cells in a dependent post job
        "in_train_job": s.cluster.executor == "local",
        "datasets": list(s.dataset),
        "register_command": list(s.register_command),
    }


def describe(cells: Sequence[Any]) -> list[str]:
    """Dry-run lines: which stages follow the training of how many cells, and where the upload runs."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for cell in cells:
        groups.setdefault(tuple(stages_for(cell.spec)), []).append(cell)
    lines = []
    for stages, members in groups.items():
        line = f"  post-training stages of {len(members)} cell(s): {', '.join(stages)}"
        if "upload" in stages:
            spec = members[0].spec
            line += ("; the upload runs in the post job" if upload_in_job(spec) else
                     f"; the upload waits for the login node: python -m sft_grid.post {members[0].sweep_dir}")
        lines.append(line)
    return lines


def waiting_note(cell_dir: Path) -> str:
    return (f"the cluster's compute nodes have no internet (cluster.internet_on_compute false, no"
            f" cluster.post_partition): run `python -m sft_grid.post {cell_dir} --stage upload` from the login node")


# -- state, from the ledger -------------------------------------------------------------------------------


def load(cell_dir: Path) -> dict[str, Any]:
    path = cell_dir / POST_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def states(cell_dir: Path, history: Sequence[Mapping[str, Any]] | None = None,
           planned: Sequence[str] | None = None) -> dict[str, StageState]:
    """Each planned stage's state: its last stage event (a `running` whose process is gone is failed).
    Events before the last training run belong to an older output and do not count."""
    history = ledger.events(cell_dir) if history is None else history
    planned = load(cell_dir).get("stages", []) if planned is None else planned
    start = max((i for i, e in enumerate(history) if e.get("event") == ledger.State.RUNNING.value), default=-1)
    last: dict[str, Mapping[str, Any]] = {}
    for e in history[start + 1:]:
        if e.get("event") == "stage":
            last[e.get("stage", "")] = e
    out = {}
    for name in planned:
        e = last.get(name)
        if e is None:
            out[name] = StageState("pending")
        elif e.get("state") == "running" and ledger._alive(dict(e)) is False:
            out[name] = StageState("failed", f"its process {e.get('pid')} on {e.get('host')} ended during the stage")
        else:
            out[name] = StageState(str(e.get("state")), str(e.get("reason", "")))
    return out


def pending(cell_dir: Path, history: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """Planned stages not completed yet."""
    return [n for n, st in states(cell_dir, history).items() if st.state != "completed"]


def summary(cell_dir: Path, history: Sequence[Mapping[str, Any]] | None = None,
            jobs: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(the chain's state in a few words, the reason of a failed or waiting stage) for status tables; `jobs`:
    the scheduler's view, in which the cell's post job may be waiting."""
    history = ledger.events(cell_dir) if history is None else history
    st = states(cell_dir, history)
    if not st:
        return "", ""
    if all(s.state == "completed" for s in st.values()):
        return "done", ""
    for name, s in st.items():
        if s.state != "completed":
            job = post_job(history, jobs)
            if s.state == "pending" and job is not None and job.in_flight:
                return f"{name} in post job {job.job_id} ({job.state.lower()})", ""
            return f"{name} {s.state}", s.reason
    return "", ""


def post_job_id(history: Sequence[Mapping[str, Any]]) -> str:
    """The Slurm id of the cell's latest post job ("" when it has none)."""
    queued = [e for e in history if e.get("event") == "post_job"]
    return str(queued[-1].get("post_job_id") or "") if queued else ""


def post_job(history: Sequence[Mapping[str, Any]], jobs: Mapping[str, Any] | None) -> Any:
    """The scheduler's record of the cell's latest post job (sft_grid.slurm.JobState), if any."""
    job_id = post_job_id(history)
    return (jobs or {}).get(job_id) if job_id else None


# -- running ----------------------------------------------------------------------------------------------


def record(cell_dir: Path, stage: str, state: str, **fields: Any) -> None:
    ledger.append(cell_dir, "stage", stage=stage, state=state, pid=os.getpid(), host=socket.gethostname(),
                  **fields)


def run(cell_dir: Path | str, where: str = IN_JOB, only: Sequence[str] = ()) -> bool:
    """Run the pending and failed stages in order; True when the whole chain is completed. A stage runs
    only when every stage before it completed; `only` limits which stages this call may run."""
    cell_dir = Path(cell_dir).resolve()
    post = load(cell_dir)
    current = states(cell_dir, planned=post.get("stages", []))
    for name, st in current.items():
        if st.state == "completed":
            continue
        if only and name not in only:
            return False
        if name == "upload" and where == IN_JOB and not post.get("upload_in_job"):
            if st.state != "waiting":
                record(cell_dir, name, "waiting", reason=waiting_note(cell_dir))
            return False
        record(cell_dir, name, "running")
        try:
            details = STAGE_RUNNERS[name](cell_dir, post, where) or {}
        except StageFailed as exc:
            record(cell_dir, name, "failed", reason=str(exc))
            log.warning("%s: stage %s failed: %s", cell_dir.name, name, exc)
            return False
        record(cell_dir, name, "completed", **details)
    return True


def _probe(post: Mapping[str, Any], args: Sequence[str], env: Mapping[str, str], what: str,
           hint: str = "") -> dict[str, Any]:
    python = post.get("python") or sys.executable
    try:
        proc = subprocess.run([python, str(PROBE), *args], capture_output=True, text=True, env=dict(env))
    except OSError as exc:
        raise StageFailed(f"{what}: cannot run the backend's python {python}: {exc}") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('{"ok"'):
            result = json.loads(line)
            if result.pop("ok"):
                return result
            raise StageFailed(f"{what}: {result.get('error')}" + (f". {hint}" if hint else ""))
    tail = " ".join((proc.stderr or proc.stdout).split())[-600:]
    raise StageFailed(f"{what}: {PROBE.name} exited {proc.returncode} without a result: {tail}")


def _job_env(post: Mapping[str, Any], hub: bool = False) -> dict[str, str]:
    """The cluster's job environment; a stage that must reach the Hub does not inherit its HF_HUB_OFFLINE
    (the user's own environment still applies)."""
    env = {**os.environ, **{k: str(v) for k, v in (post.get("env") or {}).items()}}
    if hub:
        env.pop("HF_HUB_OFFLINE", None)
        if "HF_HUB_OFFLINE" in os.environ:
            env["HF_HUB_OFFLINE"] = os.environ["HF_HUB_OFFLINE"]
    return env


def _model_dirs(output: Path) -> list[Path]:
    return [output, *ledger.checkpoints(output)]


def consolidate(cell_dir: Path, post: Mapping[str, Any], where: str) -> dict[str, Any]:
    output = cell_dir / "output"
    sources = [d for d in [output, *reversed(ledger.checkpoints(output))] if (d / "latest").is_file()]
    if not sources:
        if any((output / w).is_file() for w in ledger.WEIGHT_FILES):
            return {"note": "output/ already holds final weights; nothing to consolidate"}
        raise StageFailed(f"no ZeRO checkpoint (a `latest` file naming global_stepN/) in {output} or its"
                          " checkpoints: was the cell trained with DeepSpeed ZeRO-3?")
    source = sources[0]
    # DeepSpeed builds its ops once, with g++: under the cache root, not in each job's home
    env = {**_job_env(post), "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        cache_root() / "torch_extensions")}
    result = _probe(post, ["consolidate", str(source), str(output)], env,
                    f"consolidating the ZeRO checkpoint {source}")
    if not result.get("files"):
        raise StageFailed(f"consolidating {source} wrote no model*.safetensors into {output}")
    return {"source": str(source.relative_to(cell_dir)), "files": result["files"]}


def preprocessor_config(cell_dir: Path, post: Mapping[str, Any], where: str) -> dict[str, Any]:
    output = cell_dir / "output"
    base = str(post.get("base_model") or "")
    _probe(post, ["fetch", base, PREPROCESSOR, str(output)], _job_env(post),
           f"copying {PREPROCESSOR} from the base model {base} failed",
           f"Offline nodes read it from the Hugging Face cache: download it on the login node first"
           f" (hf download {base} {PREPROCESSOR}), then rerun: python -m sft_grid.post {cell_dir}")
    ckpts = ledger.checkpoints(output)
    for ckpt in ckpts:
        shutil.copyfile(output / PREPROCESSOR, ckpt / PREPROCESSOR)
    return {"copied_to": len(ckpts) + 1}


def tokenizer_problems(config: dict[str, Any], model_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """A tokenizer_config.json made loadable by transformers 4.57 and 5, and what was changed.

    transformers 5 writes `extra_special_tokens` as a list (4.57 reads a dict of named tokens and crashes
    on a list), the class `TokenizersBackend` (unknown to 4.57) and the chat template only as
    chat_template.jinja. These are format conversions with nothing lost, so they are repaired: the list moves
    to `additional_special_tokens` (which both versions read), the class becomes PreTrainedTokenizerFast and
    the template is inlined (research/feas_axolotl.md section 2 measured that this form loads). A missing
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
        raise StageFailed(f"{model_dir / TOKENIZER_CONFIG}: extra_special_tokens is a {type(extra).__name__},"
                          " neither a dict nor a list")
    if fixed.get("tokenizer_class") == "TokenizersBackend" and (model_dir / "tokenizer.json").is_file():
        fixed["tokenizer_class"] = "PreTrainedTokenizerFast"
        changes.append("tokenizer_class TokenizersBackend -> PreTrainedTokenizerFast")
    if not fixed.get("chat_template"):
        jinja = model_dir / CHAT_TEMPLATE_FILE
        if not jinja.is_file() or not jinja.read_text().strip():
            raise StageFailed(f"{model_dir / TOKENIZER_CONFIG} has no chat template (no `chat_template` key and"
                              f" no {CHAT_TEMPLATE_FILE}): a served model would format prompts unlike training."
                              " Save the training template into the tokenizer (the backend's template setting) and"
                              " run the stage again")
        fixed["chat_template"] = jinja.read_text()
        changes.append(f"chat template from {CHAT_TEMPLATE_FILE} inlined")
    return fixed, changes


def tokenizer(cell_dir: Path, post: Mapping[str, Any], where: str) -> dict[str, Any]:
    output = cell_dir / "output"
    repaired: dict[str, list[str]] = {}
    model_dirs = _model_dirs(output)
    for model_dir in model_dirs:
        path = model_dir / TOKENIZER_CONFIG
        if not path.is_file():
            raise StageFailed(f"{path} is missing: every saved model (output/ and each checkpoint-*) needs its"
                              " tokenizer")
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


def upload(cell_dir: Path, post: Mapping[str, Any], where: str) -> dict[str, Any]:
    repo = post.get("hub_model_id")
    if not repo:
        raise StageFailed("upload: the cell has no hub_model_id")
    output = cell_dir / "output"
    result = _probe(
        post, ["upload", str(output), str(repo), f"sft_grid cell {post.get('cell', cell_dir.name)}", *UPLOAD_IGNORE],
        _job_env(post, hub=True), f"upload of {output} to https://huggingface.co/{repo} failed",
        f"Fix the cause (network, HF_TOKEN, rights on the repository) and retry, training is not rerun:"
        f" python -m sft_grid.post {cell_dir} --stage upload")
    return {"url": result.get("url"), "commit": result.get("commit")}


def register(cell_dir: Path, post: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The database hook: sft_grid ships no database client. A grid that turns register_db on names the
    command that registers a model (e.g. the team's manual_db_push.py); it runs after the upload."""
    command = list(post.get("register_command") or [])
    if not command:
        raise StageFailed("register_db is on but register_command is empty: name the command that registers a"
                          " model, e.g. register_command=[python,manual_db_push.py,--hf-model-id,{hub_model_id}]")
    fields = {"hub_model_id": post.get("hub_model_id") or "", "base_model": post.get("base_model") or "",
              "datasets": ",".join(post.get("datasets") or ()), "cell": post.get("cell", cell_dir.name)}
    argv = [arg.format_map(fields) for arg in command]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cell_dir, env=_job_env(post, hub=True))
    except OSError as exc:
        raise StageFailed(f"register: cannot run {argv[0]}: {exc}") from None
    if proc.returncode:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise StageFailed(f"register: {' '.join(argv)} exited {proc.returncode}: {tail}")
    return {"command": argv}


STAGE_RUNNERS: dict[str, Callable[[Path, Mapping[str, Any], str], dict[str, Any] | None]] = {
    "consolidate": consolidate,
    "preprocessor_config": preprocessor_config,
    "tokenizer": tokenizer,
    "upload": upload,
    "register": register,
}
assert tuple(STAGE_RUNNERS) == STAGES


# -- the command ------------------------------------------------------------------------------------------


def _cells(target: Path) -> list[Path]:
    if (target / POST_FILE).is_file():
        return [target]
    return [d for d in ledger.iter_cell_dirs(target) if (d / POST_FILE).is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sft_grid.post", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a cell directory, or a grid's directory (<runs_root>/<sweep>)")
    parser.add_argument("--stage", action="append", choices=STAGES, default=[],
                        help="run only this stage (repeatable); the stages before it must be completed")
    parser.add_argument("--where", choices=(LOGIN, IN_JOB), default=LOGIN, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(message)s")  # each cell's outcome is printed below
    target = Path(args.target).expanduser().resolve()
    cells = _cells(target)
    if not cells:
        print(f"no cell with post-training stages under {target}", file=sys.stderr)
        return 1
    failed = 0
    for cell_dir in cells:
        if not ledger.output_complete(cell_dir / "output"):
            print(f"{cell_dir.name}: training has not completed; nothing run", file=sys.stderr)
            failed += 1
            continue
        run(cell_dir, args.where, args.stage)
        st = states(cell_dir)
        print(f"{cell_dir.name}: " + ", ".join(f"{n} {s.state}" for n, s in st.items()))
        for n, s in st.items():
            if s.state in ("failed", "waiting"):
                print(f"  {n}: {s.reason}")
        failed += any(s.state == "failed" for s in st.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
