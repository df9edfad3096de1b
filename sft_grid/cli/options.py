"""The options the commands share, defined once: the runs root, the grid, the output format."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

RUNS_ROOT_HELP = "the grid's runs_root (default: $SFT_GRID_RUNS, else runs/ at the project's root, else ./runs)"
# the command that runs the grid app for its own purpose (sft-grid check, sft-grid stage): its name in the app's usage
RUN_AS = "SFT_GRID_RUN_AS"


def whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least`, refused in argparse's one line with what it must be."""

    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}: a whole number from {least} up")
        return value

    return number


def default_runs_root() -> str:
    """Where grids are unless a command says otherwise: the grid command's own default (a cluster's runs_root,
    `runs`, taken from the team's repository's root: sft_grid/core/project.py)."""
    from sft_grid.core import project

    return str(project.default_runs())


def add_runs_root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-root", default=default_runs_root(), metavar="DIR", help=RUNS_ROOT_HELP)


def add_grid(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """GRID: the grid's sweep_name (a directory under the runs root), or its directory; and --runs-root."""
    what = "the grid: its sweep_name (a directory under the runs root), or its directory"
    if optional:
        parser.add_argument("grid", nargs="?", default="default", help=what + " (default: default)")
    else:
        parser.add_argument("grid", help=what)
    add_runs_root(parser)


def add_format(parser: argparse.ArgumentParser, formats: tuple[str, ...], default: str = "table") -> None:
    parser.add_argument("--format", choices=formats, default=default, help=f"output format (default: {default})")


def grid_dir(grid: str, runs_root: str) -> Path:
    """A grid's directory: GRID as a directory when it is a path (absolute, ./..., a/b), else <runs_root>/<GRID>."""
    path = Path(grid).expanduser()
    if path.is_dir() and (path.is_absolute() or grid.startswith(".") or os.sep in grid):
        return path.resolve()
    return Path(runs_root).expanduser().resolve() / grid
