"""python -m sft_grid.report GRID [--runs-root DIR]: the grid report, one self-contained HTML page and its data.

Writes <runs root>/<grid>/report.html (opens in any browser with no network: styles, data and plotly.js inline)
and report.json (every number the page shows). It holds the grid at a glance (cells by state, GPU-hours used and
estimated, the sweep file and its git revision), a sortable table of the cells, the loss curves by step and by
tokens seen, the scaling plots (log axes) with a fit of L(N) = E + A N^-alpha per recipe and its 90% bootstrap
band, and each completed cell's estimate beside what it took; the plots show the cell and value under the
pointer, toggle series from their legends, zoom, and export as SVG. It works on a partial grid:
running, failed and planned cells are shown as such; run it again to refresh it. Read from the cells' files only
(sft_grid/analysis/).

    python -m sft_grid.report delphi_scaling             # runs/delphi_scaling/report.html (+ report.json)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from sft_grid.core.layout import iter_cell_dirs
    from sft_grid.results import sweep_dir_of

    parser = argparse.ArgumentParser(prog="python -m sft_grid.report", description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="the grid's sweep_name (a directory under the runs root), or its directory")
    parser.add_argument("--runs-root", default=os.environ.get("SFT_GRID_RUNS", "runs"),
                        help="runs_root of the grid (default: $SFT_GRID_RUNS or ./runs)")
    parser.add_argument("--resamples", type=int, default=300, help="bootstrap resamples of each fit's band")
    args = parser.parse_args(argv)
    if args.resamples < 0:
        parser.error("--resamples must be >= 0")
    sweep_dir = sweep_dir_of(args.grid, args.runs_root)
    if not any(True for _ in iter_cell_dirs(sweep_dir)):
        print(f"no cells under {sweep_dir}: is {args.grid!r} the grid's sweep_name, and --runs-root its runs_root?"
              " Nothing was written.", file=sys.stderr)
        return 1
    from sft_grid.analysis.page import write

    html, data = write(sweep_dir, args.resamples)
    print(f"{html}\n{data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
