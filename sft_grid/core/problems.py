"""Bad input, reported once: every problem of every cell, each with where, what, which rule and the fix."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One problem of one cell, built by keyword: Problem(cell=..., key=..., value=..., rule=..., message=...,"
    " fix=...)."""

    cell: str  # the cell's name, or its overrides when it could not be composed, or GRID: the grid's as a whole
    key: str  # the dotted key, or the override, or "" when the problem is the cell's as a whole
    value: object
    rule: str
    message: str
    fix: str

    def render(self) -> str:
        head = (
            f"{self.key}={self.value!r}: {self.message} [{self.rule}]" if self.key else f"{self.message} [{self.rule}]"
        )
        return f"{head}\n      fix: {self.fix}"


# how many cells a problem shared by many names before "and N more"
NAMED = 3
# the `cell` of a problem of the grid as a whole (a sweep's block, the sites it names, a rule between cells)
GRID = "(grid)"


def _cells(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED])
    return f"{len(names)} cells: {shown}" + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")


class GridError(Exception):
    """Raised once with every problem of every cell; nothing has been written or submitted.

    The same problem in many cells (the same key, value, rule, message and fix: one mistake on a swept grid) is told
    once, with the number of cells and the first few names; a cell's own problems are listed under it."""

    def __init__(self, problems: Sequence[Problem], what: str = "validation") -> None:
        self.problems = list(problems)
        shared: dict[tuple[str, str, str, str, str], list[str]] = defaultdict(list)
        for p in self.problems:
            names = shared[(p.key, repr(p.value), p.rule, p.message, p.fix)]
            if p.cell not in names:
                names.append(p.cell)
        by_cell: dict[str, list[Problem]] = defaultdict(list)
        told: set[tuple[str, str, str, str, str]] = set()
        cells = len({p.cell for p in self.problems} - {GRID})
        where = " and ".join(
            [*([f"{cells} cell(s)"] if cells else []), *(["the grid"] if any(p.cell == GRID for p in problems) else [])]
        )
        lines = [f"{len(self.problems)} problem(s) in {where} found by {what}; nothing was submitted."]
        for p in self.problems:
            key = (p.key, repr(p.value), p.rule, p.message, p.fix)
            if len(shared[key]) == 1:
                by_cell[p.cell].append(p)
            elif key not in told:
                told.add(key)
                lines.append(f"  {_cells(shared[key])}")
                lines.append(f"    {p.render()}")
        for cell, found in by_cell.items():
            lines.append("  the grid" if cell == GRID else f"  cell {cell}")
            lines.extend(f"    {p.render()}" for p in found)
        super().__init__("\n".join(lines))
