"""sft-grid post CELL_DIR|GRID_DIR [--stage NAME ...]: run a cell's pending or failed post-training stages.

The stages (consolidate, preprocessor_config, tokenizer, upload, register) normally run by themselves after
training: locally in the cell's job, on Slurm in a post job that waits for the training. Run this from a login
node where the compute nodes cannot reach the Hub (the upload waits for it), or to retry a failed stage:
only the stages that have not completed run, and training never runs again.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_runs_root
    from sft_grid.stages.post_training import IN_JOB, LOGIN, STAGES

    parser.add_argument(
        "target", help="a cell directory, or a grid: its sweep_name (a directory under the runs root) or its directory"
    )
    add_runs_root(parser)
    parser.add_argument(
        "--stage",
        action="append",
        choices=STAGES,
        default=[],
        help="run only this stage (repeatable); the stages before it must be completed",
    )
    parser.add_argument("--where", choices=(LOGIN, IN_JOB), default=LOGIN, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from sft_grid.core.layout import CELL_FILE, OUTPUT_DIR, POST_FILE, iter_cell_dirs, output_complete
    from sft_grid.stages.post_training import Step, states
    from sft_grid.stages.post_training import run as run_stages

    logging.basicConfig(level=logging.ERROR, format="%(message)s")  # each cell's outcome is printed below
    from sft_grid.cli.options import grid_dir
    from sft_grid.cli.present import no_grid

    here = Path(args.target).expanduser()
    if here.is_file():  # a cell's file (cell.yaml, post.json): its folder is the cell, never a grid under the runs root
        print(
            f"sft-grid post: {args.target} is a file; name a cell's directory or a grid (sft-grid post {here.parent})",
            file=sys.stderr,
        )
        return 2
    # a cell's or a grid's directory, or a grid's name as the other commands take it (under the runs root)
    target = here.resolve() if here.is_dir() else grid_dir(args.target, args.runs_root)
    cells = (
        [target] if (target / POST_FILE).is_file() else [d for d in iter_cell_dirs(target) if (d / POST_FILE).is_file()]
    )
    if not cells:
        missing = "" if (target / CELL_FILE).is_file() else no_grid(target, args.target)
        print(missing or f"no cell with post-training stages under {target}", file=sys.stderr)
        return 1
    failed = 0
    for cell_dir in cells:
        if not output_complete(cell_dir / OUTPUT_DIR):
            print(f"{cell_dir.name}: training has not completed; nothing run", file=sys.stderr)
            failed += 1
            continue
        own = list(states(cell_dir))
        absent = [n for n in args.stage or () if n not in own]
        if absent:  # asked by name, and never run: said, not read as a stage pending or done
            print(
                f"{cell_dir.name}: {', '.join(absent)} is not a stage of this cell (its stages:"
                f" {', '.join(own) or 'none'}; an upload is one where push_to_hub=true); nothing run",
                file=sys.stderr,
            )
            failed += 1
            continue
        run_stages(cell_dir, args.where, args.stage)
        st = states(cell_dir)
        print(f"{cell_dir.name}: " + ", ".join(f"{n} {s.state}" for n, s in st.items()))
        for n, s in st.items():
            if s.state in (Step.FAILED, Step.WAITING):
                print(f"  {n}: {s.reason}")
        failed += any(s.state is Step.FAILED for s in st.values())
    return 1 if failed else 0
