"""What a steering decision writes, held until the grid flow applies it.

A pruned or adaptive grid's invocation decides from the cells' files (halving.py, design.py) before the grid is
checked, and passes on only the cells that train now. What the decision writes (the rung's record, `pruned` events,
leg files, the adaptive round and its summary) is not written then: the flow applies it under the grid lock, after
every rule has passed, and never in a dry run (grid/flow.py), so a grid that validation refuses leaves no file of
it, and the dry run prints the decision without recording it. A block's own problems (adaptive/spec.py) are refused
by the flow's check, together with every other rule's, so one run names them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sft_grid.core.problems import Problem


@dataclass
class Effects:
    """The writes of one steering decision, in the order they must happen (a record before what acts on it)."""

    what: str  # "prune" or "adaptive", for the flow's messages
    writes: list[Callable[[], object]] = field(default_factory=list)
    # the block's problems (a bad value, a block the grid cannot steer by): the grid is refused with every other
    # rule's problems, and nothing is decided or written
    problems: list[Problem] = field(default_factory=list)

    def add(self, write: Callable[[], object]) -> None:
        self.writes.append(write)

    def apply(self) -> None:
        for write in self.writes:
            write()
