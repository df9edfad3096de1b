"""Bad input, reported once: every problem of every cell, each with where, what, which rule and the fix."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    cell: str  # the cell's name, or its overrides when it could not be composed
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


class GridError(Exception):
    """Raised once with every problem of every cell; nothing has been written or submitted."""

    def __init__(self, problems: Sequence[Problem], what: str = "validation") -> None:
        self.problems = list(problems)
        by_cell: dict[str, list[Problem]] = defaultdict(list)
        for p in self.problems:
            by_cell[p.cell].append(p)
        lines = [f"{len(self.problems)} problem(s) in {len(by_cell)} cell(s) found by {what}; nothing was submitted."]
        for cell, found in by_cell.items():
            lines.append(f"  cell {cell}")
            lines.extend(f"    {p.render()}" for p in found)
        super().__init__("\n".join(lines))
