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

    def render(self, values: str = "") -> str:
        """The problem as told; `values`: the values of the cells that share it, where they differ."""
        value = values or repr(self.value)
        head = f"{self.key}={value}: {self.message} [{self.rule}]" if self.key else f"{self.message} [{self.rule}]"
        return f"{head}\n      fix: {self.fix}"


# how many cells a problem shared by many names before "and N more"
NAMED = 3
# the `cell` of a problem of the grid as a whole (a sweep's block, the sites it names, a rule between cells)
GRID = "(grid)"


def _some(items: Sequence[str]) -> str:
    """The first NAMED of the items, and how many more."""
    shown = ", ".join(items[:NAMED])
    return shown + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")


def _same(p: Problem) -> tuple[str, str, str, str]:
    """What makes two cells' problems one mistake: the key, the rule, and the message and fix with the value's own
    spelling taken out (an unknown key swept over an axis, `lrr=1e-5,2e-5`, is one mistake told with each value)."""
    said = str(p.value) if p.value is not None else ""
    if not p.key or len(said) < 2:  # a value too short to find in the words (or none): the same value only
        return (p.key, f"{p.rule}\0{p.value!r}", p.message, p.fix)
    return (p.key, p.rule, p.message.replace(said, "\0"), p.fix.replace(said, "\0"))


class GridError(Exception):
    """Raised once with every problem of every cell; nothing has been written or submitted.

    The same problem in many cells (the same key, rule, message and fix, the value aside: one mistake on a swept grid)
    is told once, with the number of cells and the first few names (and values, where they differ); a cell's own
    problems are listed under it."""

    def __init__(self, problems: Sequence[Problem], what: str = "validation") -> None:
        self.problems = list(problems)
        shared: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
        values: dict[tuple[str, str, str, str], list[object]] = defaultdict(list)
        for p in self.problems:
            same = _same(p)
            names, seen = shared[same], values[same]
            if p.cell not in names:
                names.append(p.cell)
            if p.value not in seen:
                seen.append(p.value)
        by_cell: dict[str, list[Problem]] = defaultdict(list)
        told: set[tuple[str, str, str, str]] = set()
        cells = len({p.cell for p in self.problems} - {GRID})
        where = " and ".join(
            [*([f"{cells} cell(s)"] if cells else []), *(["the grid"] if any(p.cell == GRID for p in problems) else [])]
        )
        lines = [f"{len(self.problems)} problem(s) in {where} found by {what}; nothing was submitted."]
        for p in self.problems:
            key = _same(p)
            if len(shared[key]) == 1:
                by_cell[p.cell].append(p)
            elif key not in told:
                told.add(key)
                lines.append(f"  {len(shared[key])} cells: {_some(shared[key])}")
                told_values = values[key]
                lines.append(f"    {p.render(_some([repr(v) for v in told_values]) if len(told_values) > 1 else '')}")
        for cell, own in by_cell.items():
            lines.append("  the grid" if cell == GRID else f"  cell {cell}")
            lines.extend(f"    {p.render()}" for p in own)
        super().__init__("\n".join(lines))
