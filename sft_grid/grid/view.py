"""What the grid knows of its cells before deciding anything: each ledger, and the scheduler's view of every job
they name (one sacct and one squeue call for the whole grid, however many cells and preps).

A `GridView` is one reading, immutable: its histories are tuples behind read-only mappings and each cell's state
is derived once, when it is read. What adds to it (the triage `grid/triage.py settle` records) makes a new view
(`with_events`)."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.state import UNAVAILABLE, CellState, SchedulerView, post_job_id, slurm_ref, state_of
from sft_grid.schedulers import slurm
from sft_grid.stages.evaluate import eval_job_id

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GridView:
    """One reading of the grid: its ledgers, the scheduler's jobs, and each cell's state derived from them."""

    histories: Mapping[Path, tuple[Event, ...]]
    # None: nothing of these cells went to Slurm
    scheduler: SchedulerView | None
    # each cell's state (cells only: not the preps', stagings' or base models' directories)
    states: Mapping[Path, CellState]

    @classmethod
    def of(
        cls, histories: Mapping[Path, Sequence[Event]], scheduler: SchedulerView | None, cell_dirs: Iterable[Path]
    ) -> GridView:
        frozen = {d: tuple(h) for d, h in histories.items()}
        states = {d: state_of(d, scheduler, frozen[d]) for d in cell_dirs}
        return cls(histories=MappingProxyType(frozen), scheduler=scheduler, states=MappingProxyType(states))

    def state(self, cell_dir: Path) -> CellState:
        known = self.states.get(cell_dir)
        return known if known is not None else state_of(cell_dir, self.scheduler, self.histories[cell_dir])

    def with_events(self, added: Mapping[Path, Sequence[Event]]) -> GridView:
        """This view with these events after each cell's history (what was just recorded), its states again."""
        if not added:
            return self
        histories = {d: (*h, *added.get(d, ())) for d, h in self.histories.items()}
        states = {d: state_of(d, self.scheduler, histories[d]) if d in added else st for d, st in self.states.items()}
        return GridView(
            histories=MappingProxyType(histories), scheduler=self.scheduler, states=MappingProxyType(states)
        )


def read_view(
    cell_dirs: Sequence[Path], prep_dirs: Iterable[Path] = (), base_dirs: Sequence[Path] = (), ask: bool = True
) -> GridView:
    """Each ledger (cells, model preps, base models), and the scheduler's jobs of all of them: one query a site (a
    grid across sites asks each cell's site, by the client environment its submission recorded). `ask` False: no
    scheduler asked (copies of cells pulled from other sites: this machine's Slurm, if any, is not theirs); their
    states are their files' and ledgers'."""
    prep_dirs = list(prep_dirs)
    histories = {d: events.read(d) for d in [*cell_dirs, *prep_dirs, *base_dirs]}
    if not ask:
        return GridView.of(histories, None, list(cell_dirs))
    groups: dict[tuple[tuple[str, str], ...], list[Path]] = {}
    for d in cell_dirs:
        groups.setdefault(tuple(sorted(events.submitted_site(histories[d])[1].items())), []).append(d)
    if len(groups) <= 1:
        return _read_site(histories, list(cell_dirs), prep_dirs, base_dirs, dict(next(iter(groups), ())))
    views = [
        _read_site(histories, dirs, prep_dirs if not env else [], base_dirs if not env else [], dict(env))
        for env, dirs in groups.items()
    ]
    states = {d: st for v in views for d, st in v.states.items()}
    jobs = [j for v in views if v.scheduler is not None for j in (*v.scheduler.by_id.values(),)]
    tasks = {k: j for v in views if v.scheduler is not None for k, j in v.scheduler.by_task.items()}
    if all(v.scheduler is None for v in views):
        scheduler = None
    else:
        scheduler = SchedulerView(
            {j.job_id: j for j in jobs}, tasks, all(v.scheduler is None or v.scheduler.available for v in views)
        )
    frozen = {d: tuple(h) for d, h in histories.items()}
    return GridView(histories=MappingProxyType(frozen), scheduler=scheduler, states=MappingProxyType(states))


def _read_site(
    all_histories: Mapping[Path, Sequence[Event]],
    cell_dirs: Sequence[Path],
    prep_dirs: Sequence[Path],
    base_dirs: Sequence[Path],
    env: Mapping[str, str],
) -> GridView:
    histories = {d: all_histories[d] for d in [*cell_dirs, *prep_dirs, *base_dirs]}
    refs = [r for r in (slurm_ref(histories[d]) for d in cell_dirs) if r is not None]
    ids = [r.job_id for r in refs if r.job_id]
    ids += [i for i in (post_job_id(histories[d]) for d in cell_dirs) if i]
    ids += [i for i in (eval_job_id(histories[d]) for d in [*cell_dirs, *base_dirs]) if i]
    ids += [job.job_id for d in prep_dirs if (job := events.last(histories[d], Kind.JOB)) is not None and job.job_id]
    names = [r.array for r in refs if not r.job_id and r.array]
    if not ids and not names:
        return GridView.of(histories, None, cell_dirs)
    try:
        scheduler = SchedulerView.of(slurm.query(ids, names, env or None))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sacct failed (%s): Slurm cells keep their last recorded state", exc)
        scheduler = UNAVAILABLE
    return GridView.of(histories, scheduler, cell_dirs)
