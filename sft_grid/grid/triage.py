"""Failures the scheduler ended, triaged where the grid is read (`status`, the next invocation of the grid).

A job killed by its time limit, the OOM killer, a node failure or scancel leaves nothing in the cell's ledger
but its `running`: the class, the evidence and the next step come from sacct's record of every leg of the job
(one call for all such cells of the grid) and the cell's logs (core/failures/cell.py), and are written to its ledger
once. Then every cell that ended, and the grid when all have, is notified once (stages/notify.py). `requeue` is what
a job runs when its failure's policy requeues the cell: the cell submitted again from its directory alone.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sft_grid.analysis.view import GridView, read_view
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.classes import FailureClass
from sft_grid.core.failures.sacct import SacctLeg, group_legs
from sft_grid.core.layout import CELL_FILE, LOCK_FILE, iter_cell_dirs
from sft_grid.core.state import State
from sft_grid.schedulers import slurm

if TYPE_CHECKING:
    from sft_grid.planning.cells import Cell

# `status` reads a grid through `settle`: what only a failure to triage, a notification or a requeue needs (the
# logs' rules, the planning and submission layers) is imported where it is used, so status of 1000 cells stays
# well under half a second

log = logging.getLogger(__name__)


def _unrecorded(view: GridView, cell_dir: Path) -> bool:
    """Failed or cancelled by the scheduler's (or a dead process's) word, with no outcome in the ledger. A cell
    whose ledger says completed but whose output is gone is failed by its files, not by a job: nothing to triage."""
    if view.state(cell_dir).state not in (State.FAILED, State.CANCELLED):
        return False
    history = view.histories[cell_dir]
    start = max((i for i, e in enumerate(history) if e.kind is Kind.SUBMITTED), default=None)
    outcomes = (Kind.FAILED, Kind.CANCELLED, Kind.COMPLETED)
    return start is not None and not any(e.kind in outcomes for e in history[start + 1 :])


def settle(view: GridView, cell_dirs: Sequence[Path]) -> GridView:
    """Triage the failures nobody recorded (each recorded in its ledger) and notify ends: the view with the triage
    it recorded. What the grid's observe step and `status` do with a fresh view; the view given is left as it is."""
    todo = [d for d in cell_dirs if _unrecorded(view, d)]
    if todo:
        view = view.with_events(_triage(view, todo))
    _notify(view, cell_dirs)
    return view


def _triage(view: GridView, todo: Sequence[Path]) -> dict[Path, tuple[Event, ...]]:
    """Each cell's triage, recorded in its ledger (shown even where it could not be written)."""
    from sft_grid.core.failures.cell import failed_event, triage

    ids = {d: view.state(d).job_id for d in todo}
    legs: dict[str, list[SacctLeg]] = {}
    recorded: dict[Path, tuple[Event, ...]] = {}
    if any(ids.values()) and view.scheduler is not None and view.scheduler.available:
        try:
            legs = group_legs(slurm.legs(i for i in ids.values() if i))
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("sacct failed (%s): failures are triaged from their logs alone", exc)
    for cell_dir in todo:
        history = view.histories[cell_dir]
        job = view.scheduler.job(ids[cell_dir]) if view.scheduler is not None else None
        # no record of its legs (sacct failed, or the job is older than accounting keeps): its last state
        fallback = [SacctLeg(job.job_id, job.state, reason=job.reason)] if job is not None else []
        failure, remedy = triage(cell_dir, history, legs.get(ids[cell_dir]) or fallback)
        event = failed_event(failure, remedy, job_id=ids[cell_dir])
        if failure.klass is FailureClass.CANCELLED:
            event = dataclasses.replace(event, kind=Kind.CANCELLED)
        try:
            event = events.append(cell_dir, event)
        except OSError as exc:  # a full disk, say: shown now, recorded by the next reader that can write
            log.warning("%s: could not record its triage (%s)", cell_dir.name, exc)
        recorded[cell_dir] = (event,)
    return recorded


def _notify(view: GridView, cell_dirs: Sequence[Path]) -> None:
    from sft_grid.stages import notify

    by_sweep: dict[Path, list[Path]] = {}
    for d in cell_dirs:
        by_sweep.setdefault(d.parent, []).append(d)
    for sweep_dir, dirs in by_sweep.items():
        settings = notify.settings_for(dirs[0])
        if not settings.enabled:
            continue
        states = {d: view.state(d) for d in dirs}
        try:
            for d, st in states.items():
                notify.cell_ended(d, st, view.histories[d], settings)
            if set(dirs) == set(iter_cell_dirs(sweep_dir)):  # the whole grid was read, not a few of its cells
                notify.grid_ended(sweep_dir, states, view.histories)
        except OSError as exc:  # a marker or the ledger could not be written: the next reader sends it
            log.warning("notifications of %s deferred (%s)", sweep_dir.name, exc)


def cell_from_dir(cell_dir: Path) -> Cell:
    from sft_grid.core.failures.cell import cell_config
    from sft_grid.core.overrides import overrides_of
    from sft_grid.planning.cells import plan_cell

    config = cell_config(cell_dir)
    if not config:
        raise FileNotFoundError(f"{cell_dir} holds no readable cell.yaml")
    try:
        overrides = overrides_of((cell_dir / CELL_FILE).read_text())
    except (OSError, UnicodeDecodeError):
        overrides = []
    cell = plan_cell(overrides, config)
    return dataclasses.replace(cell, slug=cell_dir.name.rsplit("-", 1)[0], runs_root=cell_dir.parent.parent)


def requeue(cell_dir: Path) -> str:
    """What was done, in one line."""
    from sft_grid.core.lock import Lock
    from sft_grid.grid.decide import Action, decide
    from sft_grid.grid.execute import apply
    from sft_grid.grid.jobs import build

    cell_dir = cell_dir.resolve()
    cell = cell_from_dir(cell_dir)
    with Lock(cell_dir.parent / LOCK_FILE):  # one invocation decides and submits for a sweep at a time
        view = read_view([cell_dir])
        d = decide(cell, cell_dir, view.state(cell_dir), view.histories[cell_dir], view.scheduler)
        if d.action is not Action.RUN or not d.note:
            return f"{cell_dir.name}: not requeued ({d.why or d.state.state.value})"
        on_slurm = cell.spec.cluster.executor == "slurm"
        plan = build(
            [d], view.histories, view.scheduler, slurm.max_array_size() if on_slurm else slurm.DEFAULT_MAX_ARRAY_SIZE
        )
        if not on_slurm:
            return f"{cell_dir.name}: a local cell runs again with the next invocation of the grid"
        executed = apply(plan)
    ids = [i for job_ids in executed.ids.values() for i in job_ids]
    avoid = f", avoiding {','.join(d.exclude)}" if d.exclude else ""
    return f"{cell_dir.name}: {d.why}: queued as job {ids[0] if ids else '?'}{avoid}"
