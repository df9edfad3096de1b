"""A grid-level job run once: the model preps and the tokenizations, shared by cells and grids.

Two grids that need the same one take turns through a lock in its directory; whoever comes second finds it done.
So do the Slurm jobs of one: a grid spread over sites that share a file system queues it on each site that has a
cell waiting for it (a cell can only wait for a job of its own cluster), and every such job but the first finds
it built. Each site's job runs the script written for its own site (`script_for`): its cluster's variables and
setup lines and its backend environment, which another site sharing the file system may not have.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sft_grid.core import events, gate
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


def run_in_job(directory: Path, lock_name: str, complete: Callable[[Path], bool], run: Callable[[Path], str]) -> str:
    """What a Slurm job of it runs: `run(directory)` unless `complete(directory)`, under the same lock as
    `run_here` (a job of another site, or a grid here, may be building it now); its result, or "completed" when it
    was built already. `run`'s failure is raised."""
    directory.mkdir(parents=True, exist_ok=True)
    with Lock(directory / lock_name):
        if complete(directory):
            return "completed"
        return run(directory)


def site_script(name: str, site: str) -> str:
    """The name of a script written for one site of a grid across sites (`tokenize.sh` -> `tokenize.siteb.sh`)."""
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}.{site}.{suffix}" if dot else f"{name}.{site}"


def script_for(directory: Path, name: str) -> Path:
    """The script a job of `directory` runs: its own site's (`site_script`) where the job runs on a site of a grid
    across sites and one was written for it, else `name`."""
    here = os.environ.get(gate.SITE_ENV, "")
    own = directory / site_script(name, here) if here else None
    return own if own is not None and own.is_file() else directory / name


def site() -> dict[str, str]:
    """What the `running` event of a job of a grid across sites records of where it runs: its site, as its sbatch's
    environment names it (core/gate.py); nothing elsewhere."""
    name = os.environ.get(gate.SITE_ENV, "")
    return {"site": name} if name else {}
