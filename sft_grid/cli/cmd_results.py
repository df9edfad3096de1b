"""sft-grid results GRID [--runs-root DIR] [--format table|csv|json|markdown]: the grid's results table.

One row per cell: its swept values, state, steps, final train loss, each evaluation metric with its standard
error, GPU-hours used and estimated; then the base models' rows. A score that is not there says why: `failed`
(its evaluation failed; the reason is in the JSON), `missing` (the cell completed, the score is not there),
`pending` (the cell has not completed). Read from ledgers, trainer logs and score files only
(sft_grid/analysis/table.py): no harness, no backend.

With `--along`: the scores along training instead (a suite's `along`, analysis/along.py), one row per scored
checkpoint of each cell: its step, the tokens seen by then, the training loss logged there, each score.

A damaged file (core/cellfiles.py) never stops the table: a cell that cannot be read as what it is (its cell.yaml,
its ledger, its trainer's state) is a row in state `damaged`; a completed cell whose per-step log ends before its
last step says so beside its state ("completed, log ends at step 10 of 100"), its final loss taken from
trainer_state.json or left blank; a score file or estimate that cannot be read is `damaged` in its column. A line per
damaged file follows the table (on stderr for csv, json and markdown, whose rows carry it: json's `damaged`, csv's
`damaged` column where some cell has one). The exit status is 0 with damaged cells too: results is a table, not a
verdict; 1 only when there is no grid, or no cell, to read.

    sft-grid results delphi_scaling
    sft-grid results delphi_scaling --format csv > scores.csv
    sft-grid results delphi_scaling --along
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sft_grid.analysis.along import Point
    from sft_grid.analysis.table import GridTable, Row, Score

FORMATS = ("table", "csv", "json", "markdown")


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None else f"{v:.{digits}g}"


def _steps(row: Row) -> str:
    if row.step is None:
        return ""
    return f"{row.step}/{row.total}" if row.total else str(row.step)


def score_text(s: Score) -> str:
    if s.status != "ok":
        return s.status
    if s.value is None:
        return ""
    return f"{s.value:.4g}" + (f" ± {s.stderr:.2g}" if s.stderr is not None else "")


def _sites(table: GridTable) -> bool:
    """Whether the grid is spread over sites: then every table has a site column after the state."""
    return any(r.site for r in table.rows)


def headers(table: GridTable) -> list[str]:
    site = ["site"] if _sites(table) else []
    return ["cell", *table.axes, "state", *site, "steps", "final loss", *table.columns, "GPU-h", "est. GPU-h"]


def state_text(row: Row) -> str:
    """The state, with what a damaged part of the cell changes beside it ("completed, log ends at step 10 of 100")."""
    return ", ".join([row.state, *row.flags])


def _estimated(row: Row) -> str:
    from sft_grid.core.layout import ESTIMATE_FILE

    return "damaged" if row.damaged_file(ESTIMATE_FILE) is not None else _num(row.estimate_gpu_hours, 3)


def text_rows(table: GridTable) -> list[list[str]]:
    return [
        [
            r.name,
            *(r.values.get(a, "") for a in table.axes),
            state_text(r),
            *([r.site] if _sites(table) else []),
            _steps(r),
            _num(r.final_loss),
            *(score_text(r.scores[c]) for c in table.columns),
            _num(r.gpu_hours, 3),
            _estimated(r),
        ]
        for r in [*table.rows, *table.bases]
    ]


def as_json(table: GridTable) -> dict[str, Any]:
    def row(r: Row) -> dict[str, Any]:
        return {**r.to_json(), "base": r.base, "scores": {c: s.to_json() for c, s in r.scores.items()}}

    return {
        "grid": table.name,
        "dir": str(table.sweep_dir),
        "axes": table.axes,
        "columns": table.columns,
        "cells": [row(r) for r in table.rows],
        "base_models": [row(r) for r in table.bases],
        "damaged": [d.text() for d in table.damaged],
    }


def _damaged(table: GridTable) -> bool:
    return any(r.damaged for r in [*table.rows, *table.bases])


def as_csv(table: GridTable) -> str:
    """One column per value and one per standard error; a score that is not there has its status as value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "cell",
            *table.axes,
            "state",
            *(["site"] if _sites(table) else []),
            "step",
            "total_steps",
            "final_loss",
            *(h for c in table.columns for h in (c, f"{c}_stderr")),
            "gpu_hours",
            "estimate_gpu_hours",
            *(["damaged"] if _damaged(table) else []),
        ]
    )
    for r in [*table.rows, *table.bases]:
        scores = []
        for c in table.columns:
            s = r.scores[c]
            scores += [s.value if s.status == "ok" else s.status, "" if s.stderr is None else s.stderr]
        w.writerow(
            [
                r.name,
                *(r.values.get(a, "") for a in table.axes),
                r.state,
                *([r.site] if _sites(table) else []),
                r.step,
                r.total,
                r.final_loss,
                *scores,
                r.gpu_hours,
                r.estimate_gpu_hours,
                *(["; ".join(d.text() for d in r.damaged)] if _damaged(table) else []),
            ]
        )
    return buf.getvalue()


def as_markdown(table: GridTable) -> str:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    heads = headers(table)
    lines = ["| " + " | ".join(map(cell, heads)) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in text_rows(table)]
    return "\n".join(lines) + "\n"


def summary(table: GridTable) -> str:
    counts: dict[str, int] = {}
    for r in table.rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    used = sum(r.gpu_hours or 0 for r in table.rows)
    est = [r.estimate_gpu_hours for r in table.rows if r.estimate_gpu_hours is not None]
    marks = {
        s: sum(1 for r in table.rows for c in table.columns if r.scores[c].status == s)
        for s in ("failed", "missing", "damaged")
    }
    text = (
        f"{len(table.rows)} cell(s): "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"; {len(table.bases)} base model(s); {used:.3g} GPU-hours used"
    )
    text += f", {sum(est):.3g} estimated for {len(est)} cell(s)" if est else ""
    text += "".join(f"; {n} score(s) {s}" for s, n in marks.items() if n)
    files = sum(len(r.damaged) for r in [*table.rows, *table.bases]) + len(table.damaged)
    text += f"; {files} damaged file(s)" if files else ""
    return text


def damage_lines(table: GridTable) -> list[str]:
    """A line per damaged file of the grid (its records, its cells', its base models')."""
    from sft_grid.cli.present import damage_lines as lines

    return lines([(r.name, r.damaged) for r in [*table.rows, *table.bases]], table.damaged)


def render(table: GridTable, fmt: str) -> str:
    from sft_grid.cli.present import table as text_table

    if fmt == "json":
        return json.dumps(as_json(table), indent=1) + "\n"
    if fmt == "csv":
        return as_csv(table)
    if fmt == "markdown":
        return as_markdown(table)
    damaged = damage_lines(table)
    return (
        text_table(headers(table), text_rows(table))
        + "\n\n"
        + summary(table)
        + "\n"
        + "".join(f"\n{line}" for line in damaged)
        + ("\n" if damaged else "")
    )


def _along_score(point: Point, column: str) -> str:
    return score_text(point.scores[column]) if column in point.scores else ""


def render_along(table: GridTable, columns: list[str], points: list[Point], fmt: str) -> str:
    """The scores along training: a row per (cell, scored checkpoint)."""
    from sft_grid.cli.present import table as text_table

    if fmt == "json":
        data = {"grid": table.name, "columns": columns, "points": [p.to_json() for p in points]}
        return json.dumps(data, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["cell", "step", "tokens", "loss", *(h for c in columns for h in (c, f"{c}_stderr"))])
        for p in points:
            scores = [(p.scores[c].value, p.scores[c].stderr) if c in p.scores else ("", "") for c in columns]
            w.writerow([p.cell, p.step, p.tokens, p.loss, *(v for pair in scores for v in pair)])
        return buf.getvalue()
    heads = ["cell", "step", "tokens", "loss", *columns]
    rows = [[p.cell, str(p.step), _num(p.tokens), _num(p.loss), *(_along_score(p, c) for c in columns)] for p in points]
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    cells = len({p.cell for p in points})
    return text_table(heads, rows) + f"\n\n{len(points)} scored checkpoint(s) of {cells} cell(s)\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_format, add_grid

    add_grid(parser)
    add_format(parser, FORMATS)
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")
    parser.add_argument(
        "--along",
        action="store_true",
        help="the scores along training: a row per scored checkpoint (step, tokens, loss, scores)",
    )


def run(args: argparse.Namespace) -> int:
    from sft_grid.cli.options import grid_dir

    return show(grid_dir(args.grid, args.runs_root), args.grid, args.format, args.along)


def show(sweep_dir: Path, grid: str, fmt: str, along: bool, sites: Mapping[str, str] | None = None) -> int:
    """Print the results of the grid in `sweep_dir` (GRID as given: `grid`) in `fmt`; `sites`: as
    analysis/table.read_table's (a grid across remote sites, read from the copies pulled here: sites/merged.py)."""
    from sft_grid.analysis.table import read_table
    from sft_grid.analysis.view import cell_dirs
    from sft_grid.cli.present import no_grid

    if not cell_dirs(sweep_dir):  # no grid there: what is (the grids under the runs root, the closest first)
        print(
            no_grid(sweep_dir, grid)
            or f"no cells under {sweep_dir}: is {grid!r} the grid's sweep_name, and --runs-root its runs_root?",
            file=sys.stderr,
        )
        return 1
    table = read_table(sweep_dir, sites)
    if along:
        columns, points = _along(table)
        for line in damage_lines(table):
            print(line, file=sys.stderr)
        if not points:
            print(
                f"no scored checkpoints under {sweep_dir}: give the grid's suite eval.along=checkpoint (or every N"
                " steps) and run it again (sft-grid run ...)",
                file=sys.stderr,
            )
            return 1
        sys.stdout.write(render_along(table, columns, points, fmt))
        return 0
    sys.stdout.write(render(table, fmt))
    if fmt != "table":  # the table says them after its summary; the data's rows carry them
        for line in damage_lines(table):
            print(line, file=sys.stderr)
    return 0


def _along(table: GridTable) -> tuple[list[str], list[Point]]:
    """analysis/along.read_along, each cell on its own: a cell whose files cannot be read has no points, and its
    damage is added to its row's."""
    from sft_grid.analysis.along import cell_points
    from sft_grid.core.cellfiles import READ_ERRORS, damage_of

    points: list[Point] = []
    for i, r in enumerate(table.rows):
        try:
            points += cell_points(r)
        except READ_ERRORS as exc:
            table.rows[i] = replace(r, damaged=(*r.damaged, damage_of(r.dir, exc, whole=False)))
    return sorted({c for p in points for c in p.scores}), points
