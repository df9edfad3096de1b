"""python -m sft_grid.status [SWEEP] [--runs-root DIR]: every cell of a grid, its state and progress.

State comes from each cell's own output and ledger (sft_grid/ledger.py), never from a cache: completed
means final weights and trainer state are there.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Iterable

from sft_grid import ledger, post, report


# post: the post-training chain (sft_grid/post.py): "done", or its first unfinished stage and that stage's state
HEADERS = ("cell", "state", "job", "elapsed", "progress", "post", "reason")


def rows(cell_dirs: Iterable[Path]) -> list[tuple[str, ...]]:
    """One row a cell; Slurm's view of all their jobs comes from a single sacct call."""
    from sft_grid.grid import scheduler_view

    dirs = list(cell_dirs)
    histories, jobs = scheduler_view(dirs)
    out = []
    for cell_dir in dirs:
        st = ledger.state_of(cell_dir, jobs=jobs, history=histories[cell_dir])
        chain, why = post.summary(cell_dir, histories[cell_dir], jobs) if st.state is ledger.State.COMPLETED else ("", "")
        out.append((cell_dir.name, st.state.value, st.job_id, st.elapsed, report.progress_text(st), chain,
                    st.reason or why))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sft_grid.status", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", nargs="?", default="default", help="the grid's sweep_name (default: default)")
    parser.add_argument("--runs-root", default=os.environ.get("SFT_GRID_RUNS", "runs"),
                        help="runs_root of the grid (default: $SFT_GRID_RUNS or ./runs)")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.runs_root).expanduser().resolve() / args.sweep
    found = rows(ledger.iter_cell_dirs(sweep_dir))
    if not found:
        print(f"no cells under {sweep_dir}", file=sys.stderr)
        return 1
    print(report.table(HEADERS, found))
    counts: dict[str, int] = {}
    for r in found:
        counts[r[1]] = counts.get(r[1], 0) + 1
    print(f"\n{len(found)} cell(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
