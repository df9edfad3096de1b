"""The first example of each source, as the backend trains on it: what a dry run shows (data; the CLI prints).

One example per (backend, template, data source) of the grid, from the probe results the preflight just cached.
A model the grid prepares first (Delphi) is shown with its tokenizer as the prep makes it (checks/tokenizers.py:
the tokenizer files alone, prepared before queueing), or, where that cannot be made here, with its source
tokenizer: the text and its mask are the template's, only the think/tool tokens are then still in pieces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sft_grid.checks import mask
from sft_grid.checks.tokenizers import check_tokenizer
from sft_grid.core.cellfiles import Check
from sft_grid.planning.cells import Cell
from sft_grid.planning.inputs import prep_for


@dataclass(frozen=True)
class Example:
    label: str  # which source of which cell, with which backend and template
    row: Mapping[str, Any]  # the probe's row: segments [text, trained, markup], token counts


@dataclass(frozen=True)
class Examples:
    shown: list[Example] = field(default_factory=list)
    # sources whose inputs are not readable here (the job's preflight checks them)
    unreadable: list[str] = field(default_factory=list)
    more: int = 0  # sources left out beyond the limit


def first_examples(cells: Sequence[Cell], limit: int = 8) -> Examples:
    firsts: dict[tuple[str, ...], Cell] = {}
    for cell in cells:
        s = cell.spec
        for name, ds in s.dataset.items():
            firsts.setdefault((s.backend.name, s.model.template, name, ds.source), cell)
    cell_of: dict[Check, Cell] = {}
    for (_, _, name, _), cell in firsts.items():
        source = prep_for(cell)
        for check in mask.checks_for(cell):
            if check.key != f"dataset.{name}":
                continue
            probed = check
            if source is not None and not source.complete and check.model == str(source.model_dir):
                # the tokenizer the prep will make (tokenizer files only), else the source's own
                prepared = check_tokenizer(cell)
                probed = replace(check, model=str(prepared) if prepared is not None else source.source)
            cell_of.setdefault(probed, cell)
    shown: list[Example] = []
    unreadable: list[str] = []
    for p in mask.probe(list(cell_of)[:limit]):
        cell = cell_of[p.check]
        label = f"{p.check.key} of {cell.name} ({cell.spec.backend.name}, template {cell.spec.model.template})"
        if p.outcome is not None or "error" in (p.result or {}) or not (p.result or {}).get("rows"):
            unreadable.append(p.check.key)
            continue
        shown.append(Example(label, p.result["rows"][0]))  # type: ignore[index]
    return Examples(shown, list(dict.fromkeys(unreadable)), max(0, len(cell_of) - limit))
