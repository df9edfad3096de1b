"""Running a cell's post-training stages (what each stage does, and the chain's order and state: stages/post.py).

Each runner gets the cell directory and its typed post.json; a stage that needs the backend's packages
(DeepSpeed, transformers, huggingface_hub) runs in_venv/post_stage.py with the backend's python, which prints
one JSON line, so the ledger records a reason that names the cause instead of a traceback. Credentials come
from the environment only (HF_TOKEN or the user's `hf auth login`), never from an argument or a file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import OUTPUT_DIR, WEIGHT_FILES, checkpoints, output_complete
from sft_grid.core.paths import IN_VENV_DIR, cache_root
from sft_grid.stages.post import IN_JOB, STAGES, gated, states, waiting_note

log = logging.getLogger(__name__)

SCRIPT = IN_VENV_DIR / "post_stage.py"
PREPROCESSOR = "preprocessor_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
# never uploaded: resumable training state, ZeRO shards (consolidated into model*.safetensors first)
UPLOAD_IGNORE = ("checkpoint-*", "global_step*", "latest", "zero_to_fp32.py", "optimizer.pt", "scheduler.pt",
                 "rng_state*.pth", "*.lock")


class StageFailed(RuntimeError):
    """A stage did not do its work; the message is the reason recorded in the ledger."""


def record(cell_dir: Path, stage: str, state: str, reason: str = "", **details: Any) -> None:
    events.append(cell_dir, Event.here(Kind.STAGE, stage=stage, state=state, reason=reason, details=details))


def run(cell_dir: Path | str, where: str = IN_JOB, only: Sequence[str] = ()) -> bool:
    """Run the pending and failed stages in order; True when the whole chain is completed. A stage runs
    only when every stage before it completed; `only` limits which stages this call may run."""
    cell_dir = Path(cell_dir).resolve()
    post = PostFile.load(cell_dir)
    if post is None:
        return True
    for name, st in states(cell_dir, planned=post.stages).items():
        if st.state == "completed":
            continue
        if only and name not in only:
            return False
        if gated(name, where, post.upload_in_job):
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


def _in_venv(post: PostFile, args: Sequence[str], variables: Mapping[str, str], what: str,
           hint: str = "") -> dict[str, Any]:
    python = post.python or sys.executable
    try:
        proc = subprocess.run([python, str(SCRIPT), *args], capture_output=True, text=True, env=dict(variables))
    except OSError as exc:
        raise StageFailed(f"{what}: cannot run the backend's python {python}: {exc}") from None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('{"ok"'):
            result = json.loads(line)
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
        raise StageFailed(f"no ZeRO checkpoint (a `latest` file naming global_stepN/) in {output} or its"
                          " checkpoints: was the cell trained with DeepSpeed ZeRO-3?")
    source = sources[0]
    # DeepSpeed builds its ops once, with g++: under the cache root, not in each job's home
    env = {**_job_variables(post), "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or str(
        cache_root() / "torch_extensions")}
    result = _in_venv(post, ["consolidate", str(source), str(output)], env,
                    f"consolidating the ZeRO checkpoint {source}")
    if not result.get("files"):
        raise StageFailed(f"consolidating {source} wrote no model*.safetensors into {output}")
    return {"source": str(source.relative_to(cell_dir)), "files": result["files"]}


def preprocessor_config(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    output = cell_dir / OUTPUT_DIR
    base = post.base_model
    _in_venv(post, ["fetch", base, PREPROCESSOR, str(output)], _job_variables(post),
           f"copying {PREPROCESSOR} from the base model {base} failed",
           f"Offline nodes read it from the Hugging Face cache: download it on the login node first"
           f" (hf download {base} {PREPROCESSOR}), then rerun: python -m sft_grid.post {cell_dir}")
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


def tokenizer(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    output = cell_dir / OUTPUT_DIR
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


def upload(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    repo = post.hub_model_id
    if not repo:
        raise StageFailed("upload: the cell has no hub_model_id")
    output = cell_dir / OUTPUT_DIR
    result = _in_venv(
        post, ["upload", str(output), str(repo), f"sft_grid cell {post.cell}", *UPLOAD_IGNORE],
        _job_variables(post, hub=True), f"upload of {output} to https://huggingface.co/{repo} failed",
        f"Fix the cause (network, HF_TOKEN, rights on the repository) and retry, training is not rerun:"
        f" python -m sft_grid.post {cell_dir} --stage upload")
    return {"url": result.get("url"), "commit": result.get("commit"), "verified": result.get("verified")}


def register(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    """The database hook: sft_grid ships no database client. A grid that turns register_db on names the
    command that registers a model (e.g. the team's manual_db_push.py); it runs after the upload."""
    command = list(post.register_command)
    if not command:
        raise StageFailed("register_db is on but register_command is empty: name the command that registers a"
                          " model, e.g. register_command=[python,manual_db_push.py,--hf-model-id,{hub_model_id}]")
    fields = {"hub_model_id": post.hub_model_id, "base_model": post.base_model, "datasets": ",".join(post.datasets),
              "cell": post.cell}
    argv = [arg.format_map(fields) for arg in command]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cell_dir, env=_job_variables(post, hub=True))
    except OSError as exc:
        raise StageFailed(f"register: cannot run {argv[0]}: {exc}") from None
    if proc.returncode:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise StageFailed(f"register: {' '.join(argv)} exited {proc.returncode}: {tail}")
    return {"command": argv}


def cleanup(cell_dir: Path, post: PostFile, where: str) -> dict[str, Any]:
    """The intermediate checkpoints go once the final model is safe: it runs after the upload (and its
    verification) in the chain, and only while output/ holds the final model."""
    output = cell_dir / OUTPUT_DIR
    if not output_complete(output):
        raise StageFailed(f"{output} holds no final model (weights and trainer_state.json): its checkpoints are"
                          " all there is, so none is removed")
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
