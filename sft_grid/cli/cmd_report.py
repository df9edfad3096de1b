"""sft-grid report GRID [--runs-root DIR]: the grid report, one self-contained HTML page and its data.

Writes <runs root>/<grid>/report.html (opens in any browser with no network: styles, data and plotly.js inline)
and report.json (every number the page shows). It holds the grid at a glance (cells by state, GPU-hours used and
estimated, the sweep file and its git revision), a sortable table of the cells, the loss curves by step and by
tokens seen, the scaling plots (log axes) with a fit of L(N) = E + A N^-alpha per recipe and its 90% bootstrap
band, and each completed cell's estimate beside what it took; the plots show the cell and value under the
pointer, toggle series from their legends, zoom, and export as SVG. It works on a partial grid:
running, failed and planned cells are shown as such; run it again to refresh it. Read from the cells' files only
(sft_grid/analysis/). A damaged file is read around (analysis/table.py): its cell is shown as damaged, or flagged
beside its state, the page lists every damaged file, and so does stderr, a line each; the exit status stays 0 (the
report is written), 1 only when there is no grid, or no cell, to read.

    sft-grid report delphi_scaling             # runs/delphi_scaling/report.html (+ report.json)
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid, whole

    add_grid(parser)
    parser.add_argument("--resamples", type=whole(0), default=300, help="bootstrap resamples of each fit's band")


def run(args: argparse.Namespace) -> int:
    from sft_grid.analysis.view import cell_dirs
    from sft_grid.cli.options import grid_dir
    from sft_grid.cli.present import no_grid

    sweep_dir = grid_dir(args.grid, args.runs_root)
    if not cell_dirs(sweep_dir):  # no grid there: what is (the grids under the runs root, the closest first)
        hint = f"is {args.grid!r} the grid's sweep_name, and --runs-root its runs_root?"
        print(
            f"{no_grid(sweep_dir, args.grid) or f'no cells under {sweep_dir}: {hint}'}. Nothing was written.",
            file=sys.stderr,
        )
        return 1
    from sft_grid.analysis.page import write_data
    from sft_grid.analysis.report_data import build
    from sft_grid.cli.present import damage_lines

    data = build(sweep_dir, args.resamples)
    html, written = write_data(sweep_dir, data)
    print(f"{html}\n{written}")
    cells = [(str(c.get("name")), c.get("damaged") or []) for c in data["cells"]]
    for line in damage_lines(cells, data["grid"].get("damaged") or []):  # what the page lists, a line each
        print(line, file=sys.stderr)
    return 0
