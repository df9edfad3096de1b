"""sft-grid requeue CELL_DIR (what a job runs): submit a cell again when its failure's
policy requeues it.

A job runs this when its training failed with a transient fault (a collective timeout, a GPU fault, a failed
rendezvous) and the policy's budget for that class is not spent; it does nothing for any other cell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell_dir", help="the cell's directory")


def run(args: argparse.Namespace) -> int:
    from sft_grid.core.layout import not_a_cell_dir
    from sft_grid.grid.triage import requeue

    if not args.cell_dir.strip():  # an unset variable would be the working folder
        print(
            "sft-grid requeue: CELL_DIR is empty (an unset shell variable?); nothing done: name the cell's directory",
            file=sys.stderr,
        )
        return 2
    why = not_a_cell_dir(Path(args.cell_dir))
    if why:
        print(why, file=sys.stderr)
        return 2
    print(requeue(Path(args.cell_dir)))
    return 0
