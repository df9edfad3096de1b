"""The Hub's rules over a cell: every id it stages from or uploads to held to the Hub client's own rule, a
revision that names a commit of a Hub repository, a model's sizes that agree, and an upload (and the database
registration that names it) that can happen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard
from urllib.parse import urlsplit, urlunsplit

from sft_grid.core import project
from sft_grid.core.hubcache import SHA_RE, repo_id_problem, revision_problem
from sft_grid.core.problems import Problem
from sft_grid.core.secrets import carries_secret, shown_source
from sft_grid.planning.cells import LOCAL_PREFIXES, Cell
from sft_grid.planning.evaluation import suites_of
from sft_grid.planning.inputs import hub_repos
from sft_grid.planning.readable import model_config

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
        if key.startswith("eval."):
            yield from _eval_dataset_id(cell, key, repo.repo_id)
            continue
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


def _eval_dataset_id(cell: Cell, key: str, value: str) -> Iterator[Problem]:
    """An evaluation task's `datasets` entry is a Hub dataset's id (what staging fetches for the offline job): a web
    address gets its id as the fix; a local file is read by the task's own YAML, not staged."""
    page = hub_page(value)
    local = value.startswith(LOCAL_PREFIXES) or _local_here(value) is not None
    why = "" if page or local else repo_id_problem(value)
    if not (page or local or why):
        return
    listed = [shown_source(v) if v != value else page[0] if page else "..." for v in _listed(cell, key)]
    yield Problem(
        cell=cell.name,
        key=key,
        value=shown_source(value),
        rule="hub-url" if page else "hub-repo-id",
        message=(
            f"holds the web address of the Hub dataset {page[0]}: a task's datasets are Hub ids <org>/<name>"
            if page
            else f"holds {shown_source(value)!r}, not a Hub dataset's id <org>/<name>{f' ({why})' if why else ''}:"
            " a task's datasets are the Hub"
            " datasets staged for the offline evaluation job (a local file is read by the task's YAML, dataset_path:"
            " json with dataset_kwargs.data_files, under eval.include_path)"
        ),
        fix=f"{key}=[{','.join(listed)}]" if page else f"list Hub ids only: drop {shown_source(value)!r} from {key}",
    )


def _listed(cell: Cell, key: str) -> list[str]:
    """The `datasets` list an eval key (eval.tasks.<label>.datasets) names, as the cell's suite holds it."""
    label = key.split(".")[2]
    return next((list(s.tasks[label].datasets) for s in suites_of(cell) if label in s.tasks), [])


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
        elif why := revision_problem(str(m.revision)) or abbreviated_sha(str(m.revision)):
            yield Problem(
                cell=cell.name,
                key="model.revision",
                value=m.revision,
                rule="revision",
                message=why,
                fix=_revision_fix(m.hub_id, str(m.revision)),
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


# a commit as git and the Hub's pages abbreviate it (a1b2c3d), or a full sha in capitals: huggingface_hub and staging
# take a commit only as its 40 lowercase hex digits (SHA_RE); anything else is a branch or tag name, looked up in the
# cache's refs/ offline. Letters and digits both: a tag of digits (20240101) or a word (deadbeef) is a name.
_ABBREVIATED = re.compile(r"(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{7,40}")


def abbreviated_sha(revision: str) -> str | None:
    """Why a revision that is a commit sha written short (or in capitals) would not resolve, or None."""
    if SHA_RE.match(revision) or not _ABBREVIATED.fullmatch(revision):
        return None
    if len(revision) == 40:
        return (
            "is a commit sha in capitals: the Hub's shas are lowercase, and huggingface_hub reads any other spelling"
            " as a branch or tag name"
        )
    return (
        f"is a commit sha cut to {len(revision)} characters: huggingface_hub reads a revision that is not the full 40"
        " as a branch or tag name, which the Hugging Face cache has no refs/ entry for: the cell could not load"
        " offline, and staging would have to ask the Hub to expand it"
    )


def _revision_fix(hub_id: str, revision: str) -> str:
    if revision_problem(revision):
        return "a 40-character commit sha from the repository's history (or a branch or tag name)"
    if len(revision) == 40:
        return f"model.revision={revision.lower()}"
    return (
        f"model.revision=<its full 40-character sha>: the Hub's commit page https://huggingface.co/{hub_id}/commit/"
        f"{revision} shows it, or python -c \"from huggingface_hub import HfApi; print(HfApi().model_info('{hub_id}',"
        f" revision='{revision}').sha)\""
    )


# a model conf's shape keys and the names its checkpoint's config.json gives them (core/schema.py ModelConf)
SHAPE_KEYS = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
}


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _shape(cell: Cell) -> Iterator[Problem]:
    """The shape a model conf declares (it feeds the GPU memory model and the layout: planning/gpus.py) agrees with
    its checkpoint's config.json where that is readable here, and otherwise holds together: the key/value heads divide
    the attention heads (grouped-query attention: each key/value head serves a whole group of them)."""
    m = cell.spec.model
    found = model_config(cell)
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
