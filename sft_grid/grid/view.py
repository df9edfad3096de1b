"""What the grid knows of its cells before deciding anything: each ledger, and the scheduler's view of every job
they name (one sacct and one squeue call for the whole grid, however many cells and preps)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.state import UNAVAILABLE, CellState, SchedulerView, post_job_id, slurm_ref, state_of
from sft_grid.schedulers import slurm
from sft_grid.stages.evaluate import eval_job_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GridView:
    """One reading of the grid: its ledgers and the scheduler's jobs. Each cell's state is derived once from them
    (again only when its history grew, as `settle` appends the triage it records)."""

    histories: dict[Path, list[Event]]
    # None: nothing of these cells went to Slurm
    scheduler: SchedulerView | None
    _states: dict[Path, tuple[int, CellState]] = field(default_factory=dict, repr=False, compare=False)

    def state(self, cell_dir: Path) -> CellState:
        history = self.histories[cell_dir]
        known = self._states.get(cell_dir)
        if known is None or known[0] != len(history):
            known = self._states[cell_dir] = (len(history), state_of(cell_dir, self.scheduler, history))
        return known[1]


def read_view(cell_dirs: Sequence[Path], prep_dirs: Iterable[Path] = (), base_dirs: Sequence[Path] = ()) -> GridView:
    """Each ledger (cells, model preps, base models), and the scheduler's jobs of all of them."""
    histories = {d: events.read(d) for d in [*cell_dirs, *prep_dirs, *base_dirs]}
    refs = [r for r in (slurm_ref(histories[d]) for d in cell_dirs) if r is not None]
    ids = [r.job_id for r in refs if r.job_id]
    ids += [i for i in (post_job_id(histories[d]) for d in cell_dirs) if i]
    ids += [i for i in (eval_job_id(histories[d]) for d in [*cell_dirs, *base_dirs]) if i]
    ids += [job.job_id for d in prep_dirs if (job := events.last(histories[d], Kind.JOB)) is not None and job.job_id]
    names = [r.array for r in refs if not r.job_id and r.array]
    if not ids and not names:
        return GridView(histories, None)
    try:
        return GridView(histories, SchedulerView.of(slurm.query(ids, names)))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sacct failed (%s): Slurm cells keep their last recorded state", exc)
        return GridView(histories, UNAVAILABLE)
