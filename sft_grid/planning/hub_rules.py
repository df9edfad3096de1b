"""The Hub's rules over a cell: every id it stages from or uploads to held to the Hub client's own rule, a
revision that names a commit of a Hub repository, a model's sizes that agree, and an upload (and the database
registration that names it) that can happen."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import urlsplit, urlunsplit

from sft_grid.core import project
from sft_grid.core.hubcache import repo_id_problem, revision_problem
from sft_grid.core.problems import Problem
from sft_grid.core.secrets import carries_secret, shown_source
from sft_grid.planning.cells import LOCAL_PREFIXES, Cell
from sft_grid.planning.inputs import hub_repos, pin_of
from sft_grid.planning.readable import locate

PLACEHOLDERS = "{key}, {name}, {model} and {data}"


def hub_ids(cell: Cell) -> Iterator[Problem]:
    """Each Hub input of the cell (its model without a local path, each dataset whose source is not a path); a
    dataset source that is empty (an unset shell variable, `source=`) names neither."""
    for name, ds in cell.spec.dataset.items():
        if not ds.source:
            yield Problem(
                cell=cell.name,
                key=f"dataset.{name}.source",
                value=ds.source,
                rule="dataset-source",
                message="is empty: a dataset's source is a Hub id or a local path",
                fix=f"dataset.{name}.source=<org>/<name> on the Hub, or a local path (starting with /, ./, ../ or ~)",
            )
    for key, repo in hub_repos(cell):
        local = _local_here(repo.repo_id)
        if local is not None:
            yield _local_not_hub(cell, key, repo.repo_id, repo.kind, local)
            continue
        page = hub_page(repo.repo_id)
        if page is not None:
            yield _hub_url(cell, key, repo.repo_id, repo.kind, *page)
            continue
        why = repo_id_problem(repo.repo_id)
        if why:
            what = "model" if repo.kind == "model" else "dataset source"
            yield Problem(
                cell=cell.name,
                key=key,
                value=shown_source(repo.repo_id),
                rule="hub-repo-id",
                message=f"not a Hub repository id: {why}",
                fix=f"name the {what} as <org>/<name> on the Hub, or give a local path (starting with /, ./,"
                " ../ or ~)" + (" in model.path" if repo.kind == "model" else ""),
            )


# the Hub's web hosts, and the pages of a repository past its id (/tree/main, /blob/main/config.json, ...)
HUB_HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")
_HUB_KINDS = {"datasets": "dataset", "spaces": "space"}
_HUB_PAGES = ("tree", "blob", "resolve", "commit", "commits", "discussions", "raw", "viewer", "edit")


def hub_page(value: str) -> tuple[str, str] | None:
    """(the repository id, its kind: model, dataset or space) of a Hub web address (https://huggingface.co/Qwen/Qwen3-8B,
    https://huggingface.co/datasets/org/name/tree/main), or None for anything else."""
    try:
        parts = urlsplit(value)
        host = (parts.hostname or "").lower()
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or host not in HUB_HOSTS:
        return None
    segments = [seg for seg in parts.path.split("/") if seg]
    kind = _HUB_KINDS.get(segments[0], "model") if segments else "model"
    segments = segments[1:] if segments and segments[0] in _HUB_KINDS else segments
    cut = next((i for i, seg in enumerate(segments) if seg in _HUB_PAGES), len(segments))
    repo_id = "/".join(segments[: min(cut, 2)])
    return (repo_id, kind) if repo_id and not repo_id_problem(repo_id) else None


def _hub_url(cell: Cell, key: str, url: str, wanted: str, repo_id: str, kind: str) -> Problem:
    # the id is shown as it is: a repository's id is public; what a URL may carry besides (user:token@, ?token=) is not
    secret = carries_secret(urlunsplit(urlsplit(url)._replace(path="")))
    what = "model" if wanted == "model" else "dataset source"
    mismatch = f", and it is a {kind}'s page, not a {wanted}'s" if kind != wanted else ""
    return Problem(
        cell=cell.name,
        key=key,
        value=shown_source(url) if secret else url,
        rule="hub-url",
        message=f"is the web address of the Hub repository {repo_id}{mismatch}: a {what} is named by its id"
        " <org>/<name>",
        fix=f"{key}={repo_id}" if not mismatch else f"a {wanted} repository's id, <org>/<name> ({repo_id} is a {kind})",
    )


# what a data file's name ends in: a Hub repository's id never does (it names a repository, not a file)
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".arrow", ".jsonl.gz", ".json.gz")


def _local_here(value: str) -> Path | None:
    """The local file or folder a Hub-id-shaped value (`data/tiny.jsonl`, no `./`) names, or None: one that exists
    taken from the team repository's root (or the working directory outside one, as a local path is: planning/cells.py),
    or, missing, a data file's name (a Hub id never ends in .jsonl)."""
    if not value or value.startswith(LOCAL_PREFIXES) or "$" in value or "://" in value:
        return None
    path = project.runs_base() / value
    if path.exists() or value.lower().endswith(DATA_SUFFIXES):
        return path
    return None


def _local_not_hub(cell: Cell, key: str, value: str, kind: str, local: Path) -> Problem:
    here = f"is a local {'folder' if local.is_dir() else 'file'} here ({local})" if local.exists() else None
    written = f"./{value}"
    if kind == "model":
        return Problem(
            cell=cell.name,
            key=key,
            value=value,
            rule="local-not-hub",
            message=f"{here or 'names a local folder, not a Hub repository'}, and a model's hub_id is read as"
            " <org>/<name> on the Hub",
            fix=f"model.path={written} model.hub_id=null (a local checkpoint is named by its path: model.path in"
            f" conf/model/{cell.spec.model.name}.yaml)",
        )
    return Problem(
        cell=cell.name,
        key=key,
        value=value,
        rule="local-not-hub",
        message=(here or f"names a data file ({local.name}), not a Hub repository, and there is none at {local}")
        + ": a source without ./ is read as a Hub id <org>/<name>",
        fix=f"write a local file as a path: {key}={written} (a path starting with /, ./, ../ or ~)",
    )


def model_facts(cell: Cell) -> Iterator[Problem]:
    """What a model's conf says of its checkpoint agrees with itself: a revision names a Hub commit of a hub id,
    and the exact parameter count and the size in billions are the same size (both feed the estimates)."""
    m = cell.spec.model
    if m.revision is not None:
        if m.path or not m.hub_id:
            yield Problem(
                cell=cell.name,
                key="model.revision",
                value=m.revision,
                rule="revision-needs-hub-id",
                message="a revision names a commit of a Hub repository, and this model is "
                + (f"the local directory {m.path}" if m.path else "no hub id"),
                fix="drop model.revision (a local checkpoint is what its directory holds), or name model.hub_id",
            )
        elif why := revision_problem(str(m.revision)):
            yield Problem(
                cell=cell.name,
                key="model.revision",
                value=m.revision,
                rule="revision",
                message=why,
                fix="a 40-character commit sha from the repository's history (or a branch or tag name)",
            )
    given = isinstance(m.params_b, int | float) and m.params_b  # unset (the required rule's): nothing to compare
    if m.params and given and abs(m.params_b * 1e9 - m.params) > 0.01 * m.params:
        yield Problem(
            cell=cell.name,
            key="model.params_b",
            value=m.params_b,
            rule="params-agree",
            message=f"disagrees with model.params={m.params} (the exact count is {m.params / 1e9:.3f} billion): node"
            " sizing"
            " and the estimates read params_b, the FLOPs and the scaling fit the exact count",
            fix=f"model.params_b={m.params / 1e9:.3f}",
        )
    yield from _shape(cell)


# a model conf's shape keys and the names its checkpoint's config.json gives them (core/schema.py ModelConf)
SHAPE_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
}
_CONFIGS: dict[tuple[str, int], tuple[Path, dict[str, Any]] | None] = {}


def checkpoint_config(cell: Cell) -> tuple[Path, dict[str, Any]] | None:
    """The model's config.json readable here (its text model's part, where it has one) and where it is: a local
    directory, or a Hub model's pinned snapshot or its copy in the Hugging Face cache (only where the model names no
    revision: the cache's newest copy may be another one). None where there is none to read."""
    m = cell.spec.model
    pin = pin_of(cell, "model", m.hub_id or "")
    if m.path:
        where = locate(m.path, "models")
    elif pin is not None:
        where = pin.path
    elif m.hub_id and m.revision is None and "://" not in m.hub_id:
        where = locate(m.hub_id, "models")
    else:
        return None
    file = where / "config.json" if where is not None else None
    try:
        key = (str(file), file.stat().st_mtime_ns) if file is not None and file.is_file() else None
    except OSError:
        key = None
    if file is None or key is None:
        return None
    if key not in _CONFIGS:
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None  # unreadable: the preflight's model check says why
        text = config.get("text_config") if isinstance(config, dict) else None
        config = text if isinstance(text, dict) else config
        _CONFIGS[key] = (file, config) if isinstance(config, dict) else None
    return _CONFIGS[key]


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _shape(cell: Cell) -> Iterator[Problem]:
    """The shape a model conf declares (it feeds the GPU memory model and the layout: planning/gpus.py) agrees with
    its checkpoint's config.json where that is readable here, and otherwise holds together: the key/value heads divide
    the attention heads (grouped-query attention: each key/value head serves a whole group of them)."""
    m = cell.spec.model
    found = checkpoint_config(cell)
    option = f"conf/model/{m.name}.yaml"
    disagree = set()
    if found is not None:
        file, config = found
        for key, theirs in SHAPE_KEYS.items():
            ours, real = getattr(m, key), config.get(theirs)
            if not _whole(ours) or not _whole(real) or ours == real:
                continue  # unset, out of range (the schema's range rule), or unstated in the config
            disagree.add(key)
            yield Problem(
                cell=cell.name,
                key=f"model.{key}",
                value=ours,
                rule="model-shape",
                message=f"disagrees with the checkpoint's config.json ({theirs}: {real} in {file}): the GPU memory"
                " model and the layout read the shape the model's conf declares",
                fix=f"{key}: {real} in {option} (the checkpoint's own), or model.{key}={real} on the command line",
            )
    # (no rule that the heads divide the hidden size: a head's width is the config's head_dim, and Qwen3.5-27B's
    # 24 heads of 256 are wider than its hidden size 5120)
    heads, kv = m.num_heads, m.num_kv_heads
    if _whole(heads) and _whole(kv) and (kv > heads or heads % kv) and not disagree & {"num_heads", "num_kv_heads"}:
        why = "is more than" if kv > heads else "does not divide"
        yield Problem(
            cell=cell.name,
            key="model.num_kv_heads",
            value=kv,
            rule="model-shape",
            message=f"{why} model.num_heads={heads}: each key/value head serves a whole group of the attention heads",
            fix=f"the publisher's num_key_value_heads from the model's config.json (a divisor of {heads}, e.g."
            f" model.num_kv_heads={max(d for d in range(1, min(kv, heads) + 1) if heads % d == 0)}), or drop it"
            " (null: num_heads)",
        )


# a Hub repository's id as the Hub creates one (the client's rule, repo_id_problem, lets any word character through)
_ASCII_ID = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def hub_upload(cell: Cell) -> Iterator[Problem]:
    """The upload is a post-training stage (sft_grid/stages/post_training.py), so a site without internet on its compute
    nodes is no error: the stage runs on its post_partition, or waits for the login-node command."""
    s = cell.spec
    if s.register_db and not s.push_to_hub:
        yield Problem(
            cell=cell.name,
            key="register_db",
            value=True,
            rule="register-needs-upload",
            message="database registration names the uploaded Hub repository, and this cell uploads nothing",
            fix="push_to_hub=true with a hub_model_id, or register_db=false",
        )
    if s.register_db and not s.register_command:
        yield Problem(
            cell=cell.name,
            key="register_command",
            value=[],
            rule="register-command",
            message="register_db=true but no command registers the model (sft_grid ships no database client)",
            fix="register_command=[python,manual_db_push.py,--hf-model-id,'{hub_model_id}'], or register_db=false",
        )
    if not s.push_to_hub:
        return
    if not s.hub_model_id:
        yield Problem(
            cell=cell.name,
            key="hub_model_id",
            value=s.hub_model_id,
            rule="hub-id",
            message="push_to_hub=true needs a hub repository id",
            fix="set hub_model_id=<org>/<name> (e.g. \"hub_model_id='org/{model}-sft-{key}'\", quoted), or"
            " push_to_hub=false",
        )
        return
    why = (
        "it has a placeholder sft_grid does not fill"
        if "{" in s.hub_model_id
        else "an upload names its organisation or user: <org>/<name>"
        if "/" not in s.hub_model_id
        else repo_id_problem(s.hub_model_id)
        # the client takes any word character; the Hub creates a repository under an ASCII name only, so an id the
        # client passes would fail at the upload, after training
        or (
            None
            if _ASCII_ID.fullmatch(s.hub_model_id)
            else "the Hub names a new repository in ASCII letters and digits"
        )
    )
    if why:
        yield Problem(
            cell=cell.name,
            key="hub_model_id",
            value=s.hub_model_id,
            rule="hub-id",
            message=f"not a Hub repository id <org>/<name>: {why} (the placeholders are {PLACEHOLDERS})",
            fix="e.g. \"hub_model_id='laion/{model}-sft-{key}'\" (quoted so: Hydra reads an unquoted { as its own)",
        )
