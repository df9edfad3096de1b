"""Submit one cell again from its directory alone: what a job runs when its failure's policy requeues it.

The cell is rebuilt from its cell.yaml (the resolved config it was rendered from; conf/ is never re-read, so
the requeue trains exactly what the first submission did) and goes through the grid's own decide, plan and
execute steps, under the grid's lock: the same arrays, names, ledger events and --exclude as the grid command
would produce, and nothing when the cell is no longer a requeue (completed meanwhile, or already queued).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sft_grid.core.failures.cell import cell_config, rerun_argv
from sft_grid.core.layout import LOCK_FILE
from sft_grid.core.lock import Lock
from sft_grid.grid.decide import Action, decide
from sft_grid.grid.execute import apply
from sft_grid.grid.submission import build
from sft_grid.grid.view import read_view
from sft_grid.planning.cells import Cell, plan_cell
from sft_grid.schedulers import slurm


def cell_from_dir(cell_dir: Path) -> Cell:
    config = cell_config(cell_dir)
    if not config:
        raise FileNotFoundError(f"{cell_dir} holds no readable cell.yaml")
    overrides = [a for a in rerun_argv(cell_dir)[3:] if a != "rerun_failed=true"]  # after `python -m sft_grid`
    cell = plan_cell(overrides, config)
    return dataclasses.replace(cell, slug=cell_dir.name.rsplit("-", 1)[0], runs_root=cell_dir.parent.parent)


def requeue(cell_dir: Path) -> str:
    """What was done, in one line."""
    cell_dir = cell_dir.resolve()
    cell = cell_from_dir(cell_dir)
    with Lock(cell_dir.parent / LOCK_FILE):  # one invocation decides and submits for a sweep at a time
        view = read_view([cell_dir])
        d = decide(cell, cell_dir, view.state(cell_dir), view.histories[cell_dir], view.scheduler)
        if d.action is not Action.RUN or not d.note:
            return f"{cell_dir.name}: not requeued ({d.why or d.state.state.value})"
        on_slurm = cell.spec.cluster.executor == "slurm"
        plan = build([d], view.histories, view.scheduler,
                     slurm.max_array_size() if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE)
        if not on_slurm:
            return f"{cell_dir.name}: a local cell runs again with the next invocation of the grid"
        executed = apply(plan)
    ids = [i for job_ids in executed.ids.values() for i in job_ids]
    avoid = f", avoiding {','.join(d.exclude)}" if d.exclude else ""
    return f"{cell_dir.name}: {d.why}: queued as job {ids[0] if ids else '?'}{avoid}"
