"""What a cell's backend loads: the model's local path or hub id, or the prepared copy of a model that needs one.

A model whose conf/model/<name>.yaml lists `needs: [delphi_tokenizer_prep]` is trained from a prepared copy (the
Delphi think/tool tokens renamed into Llama-3's reserved slots; sft_grid/stages/prep.py makes it). The copy lives
in a deterministic directory, `<runs_root>/_prepared/<model>-<hash of its source and the prep's version>/model`,
so every cell of every grid that trains the model renders the same path, and a prep that is done (its marker is
there) never runs again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

PREP_NEED = "delphi_tokenizer_prep"
# Bump when the prep changes what it writes: every model is then prepared again, in a new directory
PREP_VERSION = "1"
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
        return json.loads((prep_dir / MODEL_DIR / MARKER).read_text()).get("version") == PREP_VERSION
    except (OSError, ValueError):
        return False


def source_of(cell: Any) -> str:
    """The model as the user names it: its local directory (absolute) or its hub id."""
    model = cell.spec.model
    return str(Path(model.path).expanduser().resolve()) if model.path else str(model.hub_id or "")


def prep_for(cell: Any) -> Prep | None:
    """The cell's model prep, or None when its model needs none."""
    if PREP_NEED not in cell.spec.model.needs:
        return None
    source = source_of(cell)
    digest = hashlib.sha256(f"{source}\n{PREP_VERSION}".encode()).hexdigest()[:8]
    return Prep(cell.spec.model.name, source, cell.runs_root / PREPARED / f"{cell.spec.model.name}-{digest}")


def model_source(cell: Any) -> str:
    """What a backend loads: the prepared copy for a model that needs prep, else its path or hub id."""
    prep = prep_for(cell)
    if prep is not None:
        return str(prep.model_dir)
    return cell.spec.model.path or cell.spec.model.hub_id or ""


def preps(cells: Sequence[Any]) -> dict[Prep, list[Any]]:
    """Each model prep the cells need, with the cells that need it."""
    out: dict[Prep, list[Any]] = {}
    for cell in cells:
        prep = prep_for(cell)
        if prep is not None:
            out.setdefault(prep, []).append(cell)
    return out
