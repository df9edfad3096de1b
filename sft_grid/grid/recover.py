"""Jobs an orchestrator killed mid-submit left behind: decided here (reads only), done by grid/execute.py.

sbatch ran, but the orchestrator died before it recorded the job id; the next invocation finds the job again by
its array's name (recorded before sbatch). submitit moves each task's pickle into place only after sbatch returns,
and a task that cannot find its pickle waits a minute, then fails. So: adopt the job if its pickle is there; put
the pickle left under its temporary name in place while the job is still queued or waiting; otherwise cancel
what is left of the job (it never ran the cell) and plan the cell again. A dry run decides the same and does
none of it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from sft_grid.core.events import Event
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.state import CellState, State, slurm_ref
from sft_grid.core.submission import Recovery
from sft_grid.schedulers import slurm


def plan_recovery(cell_dir: Path, state: CellState, history: Sequence[Event]) -> tuple[Recovery, CellState]:
    """What to do about a cell's job found by its array's name, and the cell's state once that is done."""
    ref = slurm_ref(history)
    assert ref is not None and state.job_id
    folder = cell_dir.parent / SUBMITIT_DIR / ref.array
    target = slurm.submission_file(folder, state.job_id)
    adopted = replace(state, recovered=False)
    if target.exists():
        return Recovery(cell_dir, state.job_id, ref.array, "adopt"), adopted
    if state.state.in_flight:
        orphan = slurm.orphan_for(folder, cell_dir)
        if orphan is not None:
            return Recovery(cell_dir, state.job_id, ref.array, "restore", orphan, target), adopted
        return Recovery(cell_dir, state.job_id, ref.array, "cancel"), CellState(State.PLANNED)
    # the job ended without ever running the cell (its pickle never arrived): nothing to cancel
    return Recovery(cell_dir, state.job_id, ref.array, "replan"), CellState(State.PLANNED)
