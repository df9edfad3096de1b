"""sft-grid status [GRID] [--runs-root DIR]: every cell of a grid, its state and progress.

State comes from each cell's own output and ledger, never from a cache: completed means final weights and
trainer state are there. Slurm's view of every job comes from one sacct call (plus one squeue) for the grid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# post: the post-training chain: "done", or its first unfinished stage and that stage's state; eval: the evaluation,
# "done (N)" when every score its suites ask for is there, else its state and how many of them are
# class: a failure's class (core/failures); reason: what its policy did, then the evidence that decided it
HEADERS = ("cell", "state", "job", "elapsed", "progress", "post", "eval", "class", "reason")
BASE_ROW = "base model"  # the state column of a base model's row


def rows(cell_dirs: Iterable[Path], base_dirs: Iterable[Path] = ()) -> list[tuple[str, ...]]:
    """One row a cell, then one a base model its cells' suites evaluate (`eval` column only)."""
    return [row for row, _ in read(cell_dirs, base_dirs)]


def read(cell_dirs: Iterable[Path], base_dirs: Iterable[Path] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(row, CellState) of each cell, then (row, None) of each base model."""
    from sft_grid.cli.present import progress_text
    from sft_grid.core.failures.cell import describe_data_step, open_data_step
    from sft_grid.core.state import State
    from sft_grid.grid.triage import settle
    from sft_grid.grid.view import read_view
    from sft_grid.stages.evaluate import state_of as eval_state
    from sft_grid.stages.post_training import summary

    dirs, bases = list(cell_dirs), list(base_dirs)
    view = read_view(dirs, base_dirs=bases)
    settle(view, dirs)  # records the class of failures the scheduler ended, once; notifies ends
    out: list[tuple[tuple[str, ...], Any]] = []
    for cell_dir in dirs:
        st = view.state(cell_dir)
        done = st.state is State.COMPLETED
        chain, why = summary(cell_dir, view.histories[cell_dir], view.scheduler) if done else ("", "")
        ev = eval_state(cell_dir, view.histories[cell_dir], view.scheduler) if done else None
        reason = st.reason or why or (f"eval: {ev.reason}" if ev is not None and ev.reason else "")
        if st.evidence and st.evidence not in reason:
            reason += f" | evidence: {st.evidence}"
        progress = progress_text(st)
        if st.state is State.RUNNING and not progress:  # no step yet: tokenizing or loading its data, maybe
            step = open_data_step(cell_dir, view.histories[cell_dir])
            progress = f"data step: {describe_data_step(step)}" if step else ""
        out.append(((cell_dir.name, st.state.value, st.job_id, st.elapsed, progress, chain,
                     ev.text() if ev is not None else "", st.failure_class or "", reason), st))
    for base in bases:
        ev = eval_state(base, view.histories[base], view.scheduler)
        out.append(((f"{base.parent.name}/{base.name}", BASE_ROW, "", "", "", "", ev.text(), "", ev.reason), None))
    return out


def base_dirs(sweep_dir: Path) -> list[Path]:
    """The grid's base models that have an evaluation (<sweep dir>/_base/<model>-<key>/eval.json)."""
    from sft_grid.core.scores import BASE_DIR, EVAL_FILE

    return sorted(p.parent for p in (sweep_dir / BASE_DIR).glob(f"*/{EVAL_FILE}"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid

    add_grid(parser, optional=True)


def run(args: argparse.Namespace) -> int:
    from sft_grid.cli.options import grid_dir
    from sft_grid.cli.present import failure_lines, table
    from sft_grid.core.layout import iter_cell_dirs

    sweep_dir = grid_dir(args.grid, args.runs_root)
    read_back = read(iter_cell_dirs(sweep_dir), base_dirs(sweep_dir))
    found = [row for row, _ in read_back]
    if not found:
        print(f"no cells under {sweep_dir}", file=sys.stderr)
        return 1
    print(table(HEADERS, [r[:-1] + (r[-1][:160],) for r in found]))
    counts: dict[str, int] = {}
    cells = [r for r in found if r[1] != BASE_ROW]
    for r in cells:
        counts[r[1]] = counts.get(r[1], 0) + 1
    print(f"\n{len(cells)} cell(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    failed = failure_lines([(row[0], st) for row, st in read_back if st is not None], per_class=len(found))
    if failed:
        print("\nfailed or cancelled, by class:\n" + "\n".join(failed))
    return 0

