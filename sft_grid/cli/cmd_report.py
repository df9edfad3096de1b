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

`--out DIR` writes them there instead (made if need be). A folder that cannot take them (no permission, a read-only
file system, a file in the way, report.html or report.json a directory) is said before the report is built, with a
folder that can (`--out /tmp/<grid>-report`), exit status 1; neither file is written unless both are.

    sft-grid report delphi_scaling             # runs/delphi_scaling/report.html (+ report.json)
    sft-grid report delphi_scaling --out /tmp/delphi-report   # a grid whose directory is not yours to write
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid, whole

    add_grid(parser)
    parser.add_argument("--resamples", type=whole(0), default=300, help="bootstrap resamples of each fit's band")
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="the folder report.html and report.json go to, made if need be (default: the grid's directory)",
    )


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
    out = Path(args.out).expanduser().resolve() if args.out else sweep_dir
    why = unwritable(out)
    if why:  # said before the report is built: nothing written, and a folder that takes it
        print(f"sft-grid report: {why}; {elsewhere(sweep_dir)}. Nothing was written.", file=sys.stderr)
        return 1
    from sft_grid.analysis.page import write_data
    from sft_grid.analysis.report_data import build
    from sft_grid.cli.present import damage_lines

    data = build(sweep_dir, args.resamples)
    out.mkdir(parents=True, exist_ok=True)
    html, written = write_data(sweep_dir, data, out)
    print(f"{html}\n{written}")
    cells = [(str(c.get("name")), c.get("damaged") or []) for c in data["cells"]]
    for line in damage_lines(cells, data["grid"].get("damaged") or []):  # what the page lists, a line each
        print(line, file=sys.stderr)
    return 0


def unwritable(out: Path) -> str:
    """Why the report cannot be written in `out` ("" when it can), found by doing it: the folder made (and the
    folders made here removed again after), a file written and removed there; no permission or file system guessed."""
    from sft_grid.analysis.page import REPORT_HTML, REPORT_JSON

    made = [p for p in (out, *out.parents) if not p.exists()]
    why = ""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".report.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        why = f"the report cannot be written in {out} ({exc.strerror or exc})"
    for p in made:  # the deepest first: nothing is left by a check
        with contextlib.suppress(OSError):
            p.rmdir()
    taken = [out / n for n in (REPORT_HTML, REPORT_JSON) if (out / n).is_dir()]
    if why or not taken:
        return why
    return f"the report cannot be written in {out} (Is a directory: {taken[0].name}, where its file goes)"


def elsewhere(sweep_dir: Path) -> str:
    """A folder that takes the report, as the command that writes it there."""
    place = Path(tempfile.gettempdir()) / f"{sweep_dir.name}-report"
    if unwritable(place):
        return "give --out a folder you can write"
    return f"write it elsewhere: sft-grid report {shlex.quote(str(sweep_dir))} --out {shlex.quote(str(place))}"
