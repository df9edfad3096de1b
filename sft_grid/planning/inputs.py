"""What a cell's backend loads: a local path, the staged snapshot of a Hub repository, or the prepared copy of a
model that needs one.

A hub id the grid staged (sft_grid/stages/staging/) is loaded from its snapshot in the site's Hugging Face
cache, at the commit staging pinned (`cell.pins`): `<cache>/models--org--name/snapshots/<sha>`, so a job never
asks the Hub (compute nodes of several sites have none) and every cell that names the repository trains on the
same files. A hub id that is not pinned (a dry run where the Hub cannot be reached) stays a hub id.

A model whose conf/model/<name>.yaml lists `needs: [delphi_tokenizer_prep]` is trained from a prepared copy (the
Delphi think/tool tokens renamed into Llama-3's reserved slots; sft_grid/stages/prep.py makes it). The copy lives
in a deterministic directory, `<runs_root>/_prepared/<model>-<hash of its source and the prep's version>/model`,
so every cell of every grid that trains the model renders the same path, and a prep that is done (its marker is
there) never runs again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sft_grid.core.hubcache import MAIN, HubRepo, Pin, default_cache
from sft_grid.core.schema import CellConf
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.evaluation import suites_of

PREP_NEED = "delphi_tokenizer_prep"
# Bump when the prep changes what it writes: every model is then prepared again, in a new directory
# (2: the prepared tokenizer names Llama-3.1's padding token as its pad)
PREP_VERSION = "2"
PREPARED = "_prepared"
MODEL_DIR = "model"
MARKER = "prepared.json"


@dataclass(frozen=True)
class Prep:
    """The prep of one model: where its prepared copy lives and what it is made from."""

    model: str
    source: str
    dir: Path

    @property
    def model_dir(self) -> Path:
        return self.dir / MODEL_DIR

    @property
    def complete(self) -> bool:
        return prep_complete(self.dir)


def prep_complete(prep_dir: Path) -> bool:
    """Whether a prep directory holds a finished prepared model of this prep version (its marker is written last)."""
    try:
        return bool(json.loads((prep_dir / MODEL_DIR / MARKER).read_text()).get("version") == PREP_VERSION)
    except (OSError, ValueError):
        return False


# -- Hub repositories and their pins ----------------------------------------------------------------------------


def hub_repos(cell: Cell) -> list[tuple[str, HubRepo]]:
    """(the key that names it, the repository) for each Hub input of the cell: what its training reads
    (`train_repos`) and what its evaluation reads (`eval_repos`). Each is staged, pinned, and checked as a Hub id."""
    return train_repos(cell) + eval_repos(cell)


def train_repos(cell: Cell) -> list[tuple[str, HubRepo]]:
    """The Hub inputs of the cell's training: its model when it has no local path, and each dataset whose source
    is a hub id."""
    s = cell.spec
    out = []
    if s.model.hub_id and not s.model.path:
        out.append(("model.hub_id", HubRepo("model", s.model.hub_id, s.model.revision or MAIN)))
    for name, ds in s.dataset.items():
        if ds.source and not is_local(ds.source):
            out.append((f"dataset.{name}.source", HubRepo("dataset", ds.source)))
    return out


def eval_repos(cell: Cell) -> list[tuple[str, HubRepo]]:
    """The Hub datasets the cell's evaluation reads: each task's `datasets` in each of its suites, keyed
    `eval.tasks.<label>.datasets` (the evaluation job runs offline where compute nodes have no internet, and loads
    each from its staged snapshot: planning/evaluation.py `dataset_snapshots`)."""
    out: dict[tuple[str, str], HubRepo] = {}
    for suite in suites_of(cell):
        for label, task in suite.tasks.items():
            for repo_id in task.datasets:
                if repo_id and not is_local(repo_id):
                    out.setdefault((f"eval.tasks.{label}.datasets", repo_id), HubRepo("dataset", repo_id))
    return [(key, repo) for (key, _), repo in out.items()]


def hf_cache(spec: CellConf) -> Path:
    """The Hugging Face hub cache a cell's inputs are staged into and its jobs read: the cluster's `hf_cache`,
    else this environment's (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    return Path(spec.cluster.hf_cache).expanduser() if spec.cluster.hf_cache else default_cache()


def hub_variables(cell: Cell) -> dict[str, str]:
    """What a job exports for the Hub: where the staged copies are (HF_HUB_CACHE, when the cluster names its
    cache or the cell has staged inputs), and, where compute nodes have no internet, offline mode for
    huggingface_hub, datasets and transformers, so a job fails at once instead of hanging on a request."""
    s = cell.spec
    out = {}
    if s.cluster.hf_cache or cell.pins:
        out["HF_HUB_CACHE"] = str(hf_cache(s))
    if not s.cluster.internet_on_compute:
        out.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return out


def pin_of(cell: Cell, kind: str, repo_id: str) -> Pin | None:
    return next((p for p in cell.pins if p.kind == kind and p.repo_id == repo_id), None)


def source_of(cell: Cell) -> str:
    """The model as the user names it: its local directory (absolute), or its hub id (at its pinned sha)."""
    model = cell.spec.model
    if model.path:
        return str(Path(model.path).expanduser().resolve())
    pin = pin_of(cell, "model", model.hub_id or "")
    return f"{model.hub_id}@{pin.sha}" if pin else str(model.hub_id or "")


def tokenizer_source(cell: Cell) -> str:
    """The model as staged or named, before any prep: its local path, its pinned snapshot, or its hub id."""
    model = cell.spec.model
    if model.path:
        return model.path
    pin = pin_of(cell, "model", model.hub_id or "")
    return str(pin.path) if pin else str(model.hub_id or "")


def hub_revision(cell: Cell) -> str | None:
    """The revision a job asks the Hub for when it loads the model by its hub id (not staged here: a site whose
    compute nodes fetch it themselves); None when it loads a local directory or a pinned snapshot, or the model
    names no revision (`main`)."""
    model = cell.spec.model
    if model.path or not model.hub_id or pin_of(cell, "model", model.hub_id):
        return None
    return model.revision or None


def dataset_source(cell: Cell, name: str) -> str:
    """What a backend loads for one dataset: its local file, its pinned snapshot directory, or its hub id."""
    ds = cell.spec.dataset[name]
    if is_local(ds.source):
        return str(Path(ds.source).expanduser())
    pin = pin_of(cell, "dataset", ds.source)
    return str(pin.path) if pin else ds.source


def prep_for(cell: Cell) -> Prep | None:
    """The cell's model prep, or None when its model needs none. A pinned hub model is prepared from its
    snapshot, in a directory of that sha: a new commit of the model gets a new prepared copy."""
    if PREP_NEED not in cell.spec.model.needs:
        return None
    named = source_of(cell)
    digest = hashlib.sha256(f"{named}\n{PREP_VERSION}".encode()).hexdigest()[:8]
    return Prep(
        cell.spec.model.name,
        named if cell.spec.model.path else tokenizer_source(cell),
        cell.runs_root / PREPARED / f"{cell.spec.model.name}-{digest}",
    )


def model_source(cell: Cell) -> str:
    """What a backend loads: the prepared copy for a model that needs prep, else its path, pinned snapshot or hub id."""
    prep = prep_for(cell)
    if prep is not None:
        return str(prep.model_dir)
    return tokenizer_source(cell)


def preps(cells: Sequence[Any]) -> dict[Prep, list[Any]]:
    """Each model prep the cells need, with the cells that need it."""
    out: dict[Prep, list[Any]] = {}
    for cell in cells:
        prep = prep_for(cell)
        if prep is not None:
            out.setdefault(prep, []).append(cell)
    return out
