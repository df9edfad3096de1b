"""Validation rules for the Hub: the ids a cell's inputs are staged from, and the repository it uploads to.

A Hub id the client would refuse (`huggingface_hub`'s own rule: core/hubcache.py `repo_id_problem`) is refused here,
with the cell, the key and the value, before anything is staged, rendered or queued.
"""

from __future__ import annotations

from typing import Iterator

from sft_grid.core.hubcache import repo_id_problem
from sft_grid.core.problems import Problem
from sft_grid.planning.cells import Cell
from sft_grid.planning.inputs import hub_repos

PLACEHOLDERS = "{key}, {name}, {model} and {data}"


def hub_ids(cell: Cell) -> Iterator[Problem]:
    """Each Hub input of the cell (its model without a local path, each dataset whose source is not a path)."""
    for key, repo in hub_repos(cell):
        why = repo_id_problem(repo.repo_id)
        if why:
            what = "model" if repo.kind == "model" else "dataset source"
            yield Problem(cell.name, key, repo.repo_id, "hub-repo-id", f"not a Hub repository id: {why}",
                          f"name the {what} as <org>/<name> on the Hub, or give a local path (starting with /, ./,"
                          " ../ or ~)" + (" in model.path" if repo.kind == "model" else ""))


def hub_upload(cell: Cell) -> Iterator[Problem]:
    """The upload is a post-training stage (sft_grid/stages/post.py), so a site without internet on its compute
    nodes is no error: the stage runs on its post_partition, or waits for the login-node command."""
    s = cell.spec
    if s.register_db and not s.push_to_hub:
        yield Problem(cell.name, "register_db", True, "register-needs-upload",
                      "database registration names the uploaded Hub repository, and this cell uploads nothing",
                      "push_to_hub=true with a hub_model_id, or register_db=false")
    if s.register_db and not s.register_command:
        yield Problem(cell.name, "register_command", [], "register-command",
                      "register_db=true but no command registers the model (sft_grid ships no database client)",
                      "register_command=[python,manual_db_push.py,--hf-model-id,'{hub_model_id}'], or register_db=false")
    if not s.push_to_hub:
        return
    if not s.hub_model_id:
        yield Problem(cell.name, "hub_model_id", s.hub_model_id, "hub-id", "push_to_hub=true needs a hub repository id",
                      "set hub_model_id=<org>/<name> (e.g. org/{model}-sft-{key}), or push_to_hub=false")
        return
    why = ("it has a placeholder sft_grid does not fill" if "{" in s.hub_model_id
           else "an upload names its organisation or user: <org>/<name>" if "/" not in s.hub_model_id
           else repo_id_problem(s.hub_model_id))
    if why:
        yield Problem(cell.name, "hub_model_id", s.hub_model_id, "hub-id",
                      f"not a Hub repository id <org>/<name>: {why} (the placeholders are {PLACEHOLDERS})",
                      "e.g. hub_model_id=laion/{model}-sft-{key}")
