"""The overrides a cell was composed from, as its cell.yaml's first lines keep them (the rerun command), and the
values they set: what a grid's cells differ in (its swept values), for W&B's tags and config, the results table
and the report."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

RERUN_PREFIX = "# Rerun this cell: "
COMMAND = ("python", "-m", "sft_grid")
# overrides that say where or how a grid runs, never which cell of it this is
_NOT_SWEPT = ("runs_root", "sweep", "sweep_name", "dry_run", "force", "rerun_failed", "report_to", "concurrency")


def swept_values(overrides: Sequence[str]) -> dict[str, str]:
    """The values a cell's overrides set (its grid's axes and the command line's), key -> value as written."""
    out = {}
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        if value and key.split(".", 1)[0] not in _NOT_SWEPT:
            out[key] = value.strip("'\"")
    return out


def rerun_line(overrides: Sequence[str], conf_dirs: Sequence[str] = ()) -> str:
    """The command that composes this cell again: its overrides, and the team's config folders it was composed
    with ($SFT_GRID_CONF, sft_grid/core/project.py), so that it composes the same from any directory."""
    env = [f"SFT_GRID_CONF={shlex.quote(':'.join(conf_dirs))}"] if conf_dirs else []
    return " ".join([*env, *COMMAND, *(shlex.quote(o) for o in overrides)])


def rerun_words(cell_yaml: str) -> list[str]:
    """The words of the rerun command in a cell.yaml's header ([] when it has none), its environment included."""
    for line in cell_yaml.splitlines()[:6]:
        if line.startswith(RERUN_PREFIX):
            try:
                return shlex.split(line[len(RERUN_PREFIX) :])
            except ValueError:
                return line[len(RERUN_PREFIX) :].split()
    return []


def overrides_of(cell_yaml: str) -> list[str]:
    """The overrides of the rerun command in a cell.yaml's header: the words after `python -m sft_grid`."""
    words = rerun_words(cell_yaml)
    for i in range(len(words) - 2):
        if tuple(words[i : i + 3]) == COMMAND:
            return words[i + 3 :]
    return []
