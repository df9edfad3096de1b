"""python -m sft_grid.requeue CELL_DIR: submit a cell again when its failure's policy requeues it.

A job runs this when its training failed with a transient fault (a collective timeout, a GPU fault, a failed
rendezvous) and the policy's budget for that class is not spent; it does nothing for any other cell.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from sft_grid.core.layout import not_a_cell_dir
    from sft_grid.grid.requeue import requeue

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sft_grid.requeue <cell_dir>", file=sys.stderr)
        return 2
    why = not_a_cell_dir(Path(args[0]))
    if why:
        print(why, file=sys.stderr)
        return 2
    print(requeue(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
