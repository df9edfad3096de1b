"""python -m sft_grid.job CELL_DIR: run a rendered cell here, exactly as its job does."""

from __future__ import annotations

import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from pathlib import Path

    from sft_grid.core.layout import not_a_cell_dir
    from sft_grid.job.runner import CellFailed, run_cell

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sft_grid.job <cell_dir>", file=sys.stderr)
        return 2
    why = not_a_cell_dir(Path(args[0]))
    if why:
        print(why, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(run_cell(args[0]))
    except CellFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
