"""A grid-level job run on this machine once: the model preps and the tokenizations, shared by cells and grids.

Two grids that need the same one take turns through a lock in its directory; whoever comes second finds it done.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.lock import Lock


def run_here(
    directory: Path,
    lock_name: str,
    complete: Callable[[Path], bool],
    run: Callable[[Path], object],
    failed: type[Exception],
) -> str | None:
    """Run `run(directory)` unless `complete(directory)`; None, or why it failed (the message of `failed`)."""
    directory.mkdir(parents=True, exist_ok=True)
    with Lock(directory / lock_name):
        if complete(directory):
            return None
        events.append(directory, Event.here(Kind.SUBMITTED, executor="local"))
        try:
            run(directory)
        except failed as exc:
            return str(exc)
    return None
