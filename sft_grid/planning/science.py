"""Settings that train, but not as the user meant: told as warnings in the dry run and at launch, never refused.

A run with them is valid (a backend trains it without a word), which is why they are easy to miss: the schedule the
cell's keys ask for is not the one the trainer runs. Each warning names the cells (the same warning over many cells
once, with their number and a few names), the keys and what to set instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sft_grid.core.problems import NAMED
from sft_grid.planning.cells import Cell


@dataclass(frozen=True)
class Warning:
    what: str  # what goes wrong, with the keys
    fix: str


def _warmup_steps(cell: Cell) -> int:
    value = cell.spec.extra.get("warmup_steps") if isinstance(cell.spec.extra, Mapping) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def of_cell(cell: Cell, steps: int | None) -> list[Warning]:
    """The warnings of one cell; `steps`: the steps it trains (max_steps, else the estimate's), None unknown."""
    s = cell.spec
    out = []
    warmup = _warmup_steps(cell)
    if warmup and steps and warmup >= steps:
        out.append(
            Warning(
                f"extra.warmup_steps={warmup} is not shorter than the run ({steps} steps): the learning rate never"
                " reaches the cell's lr",
                f"a warmup of a few percent of the run: warmup_ratio=0.03, or extra.warmup_steps={max(1, steps // 30)}",
            )
        )
    if s.scheduler == "constant" and (s.warmup_ratio or warmup):
        given = f"warmup_ratio={s.warmup_ratio:g}" if s.warmup_ratio else f"extra.warmup_steps={warmup}"
        out.append(
            Warning(
                f"scheduler=constant with {given}: transformers' constant schedule has no warmup, so the warmup asked"
                " for is ignored",
                "scheduler=constant_with_warmup (or drop the warmup)",
            )
        )
    return out


def lines(cells: Sequence[Cell], steps: Mapping[str, int | None]) -> list[str]:
    """The warnings of a grid, each once with the cells it concerns."""
    found: dict[Warning, list[str]] = {}
    for cell in cells:
        for w in of_cell(cell, steps.get(cell.name)):
            found.setdefault(w, []).append(cell.name)
    out = []
    for w, names in found.items():
        who = names[0] if len(names) == 1 else f"{len(names)} cells ({', '.join(names[:NAMED])}"
        who += "" if len(names) == 1 else (f" and {len(names) - NAMED} more)" if len(names) > NAMED else ")")
        out.append(f"WARNING {who}: {w.what}")
        out.append(f"  fix: {w.fix}")
    return out
