"""python -m sft_grid.status [SWEEP] [--runs-root DIR]: every cell of a grid, its state and progress.

State comes from each cell's own output and ledger, never from a cache: completed means final weights and
trainer state are there. Slurm's view of every job comes from one sacct call (plus one squeue) for the grid.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable

# post: the post-training chain: "done", or its first unfinished stage and that stage's state
# class: a failure's class (core/failures.py); reason: what its policy did, then the evidence that decided it
HEADERS = ("cell", "state", "job", "elapsed", "progress", "post", "class", "reason")


def rows(cell_dirs: Iterable[Path]) -> list[tuple[str, ...]]:
    """One row a cell."""
    return [row for row, _ in read(cell_dirs)]


def read(cell_dirs: Iterable[Path]) -> list[tuple[tuple[str, ...], Any]]:
    """(row, CellState) of each cell."""
    from sft_grid.core.state import State
    from sft_grid.grid.triage import settle
    from sft_grid.grid.view import read_view
    from sft_grid.present import progress_text
    from sft_grid.stages.post import summary

    dirs = list(cell_dirs)
    view = read_view(dirs)
    settle(view, dirs)  # records the class of failures the scheduler ended, once; notifies ends
    out = []
    for cell_dir in dirs:
        st = view.state(cell_dir)
        chain, why = (summary(cell_dir, view.histories[cell_dir], view.scheduler) if st.state is State.COMPLETED
                      else ("", ""))
        reason = st.reason or why
        if st.evidence and st.evidence not in reason:
            reason += f" | evidence: {st.evidence}"
        out.append(((cell_dir.name, st.state.value, st.job_id, st.elapsed, progress_text(st), chain,
                     st.failure_class, reason), st))
    return out


def main(argv: list[str] | None = None) -> int:
    from sft_grid.core.layout import iter_cell_dirs
    from sft_grid.present import failure_lines, table

    parser = argparse.ArgumentParser(prog="python -m sft_grid.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", default="default", help="the grid's sweep_name (default: default)")
    parser.add_argument("--runs-root", default=os.environ.get("SFT_GRID_RUNS", "runs"),
                        help="runs_root of the grid (default: $SFT_GRID_RUNS or ./runs)")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.runs_root).expanduser().resolve() / args.sweep
    read_back = read(iter_cell_dirs(sweep_dir))
    found = [row for row, _ in read_back]
    if not found:
        print(f"no cells under {sweep_dir}", file=sys.stderr)
        return 1
    print(table(HEADERS, [r[:-1] + (r[-1][:160],) for r in found]))
    counts: dict[str, int] = {}
    for r in found:
        counts[r[1]] = counts.get(r[1], 0) + 1
    print(f"\n{len(found)} cell(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    failed = failure_lines([(row[0], st) for row, st in read_back], per_class=len(found))
    if failed:
        print("\nfailed or cancelled, by class:\n" + "\n".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
