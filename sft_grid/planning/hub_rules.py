"""The Hub's rules over a cell: every id it stages from or uploads to held to the Hub client's own rule, a
revision that names a commit of a Hub repository, a model's sizes that agree, and an upload (and the database
registration that names it) that can happen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from sft_grid.core import project
from sft_grid.core.hubcache import repo_id_problem, revision_problem
from sft_grid.core.problems import Problem
from sft_grid.core.secrets import shown_source
from sft_grid.planning.cells import LOCAL_PREFIXES, Cell
from sft_grid.planning.inputs import hub_repos

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
