"""A Hub repository a cell needs, and its pin: the commit staging resolved it to, in a Hugging Face cache.

A cell names its model and datasets by hub id and (implicitly) the branch `main`. Staging resolves that to a
commit sha, once per grid invocation, and the sha is the pin: the cell's rendered configs point at
`<cache>/<models|datasets>--org--name/snapshots/<sha>`, its ledger records it when it is submitted, and a rerun
of the cell trains on the same sha (staged again from the cache, or from the Hub while it still has it) instead
of whatever `main` has become. The pin is never part of the cell's identity: the same cell rerun later is the
same cell, trained on the revision it was first trained on.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from sft_grid.core.hubcache import SHA_RE, snapshot_path

MAIN = "main"

# the Hub client's own rule for a repository id (huggingface_hub's validate_repo_id, which tests/test_hub_ids.py holds
# this to): an id it refuses is refused with its cell and key before anything is staged or queued
_REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")


def repo_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` is not a Hub repository id, or None."""
    if repo_id.count("/") > 1:
        return "more than one '/': a repository id is <name> or <org>/<name>"
    if not _REPO_ID.match(repo_id):
        return ("letters, digits, '-', '_' and '.' only, neither starting nor ending with '-' or '.', and a name of at"
                " most 96 characters")
    if "--" in repo_id or ".." in repo_id:
        return "'--' and '..' are not allowed in it"
    if repo_id.endswith(".git"):
        return "it cannot end with '.git'"
    return None


@dataclass(frozen=True)
class HubRepo:
    """A model or dataset repository at a revision as asked (a branch, tag or sha)."""

    kind: str  # "model" | "dataset"
    repo_id: str
    revision: str = MAIN

    def text(self) -> str:
        return f"{self.kind} {self.repo_id}" + (f"@{self.revision[:12]}" if self.revision != MAIN else "")


@dataclass(frozen=True)
class Pin:
    """A repository pinned to a commit, staged (or to be staged) into `cache`."""

    kind: str
    repo_id: str
    revision: str  # what was asked: a branch name, or the sha itself on a rerun
    sha: str
    cache: Path

    @property
    def path(self) -> Path:
        """The snapshot directory a backend loads, offline."""
        return snapshot_path(self.cache, self.repo_id, self.kind, self.sha)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "repo": self.repo_id, "revision": self.revision, "sha": self.sha}


def recorded_pins(details: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(kind, repo id) -> sha, from the `inputs` a cell's submission recorded in its ledger."""
    out: dict[tuple[str, str], str] = {}
    for item in details.get("inputs") or ():
        if isinstance(item, Mapping) and SHA_RE.match(str(item.get("sha", ""))):
            out[(str(item.get("kind")), str(item.get("repo")))] = str(item["sha"])
    return out


def default_cache() -> Path:
    """The Hugging Face hub cache of this environment: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"
