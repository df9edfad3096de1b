"""What a submitit job pickles and calls: a job-side function named by "module:function", with its target.

The scheduler never imports the job side: the plan names what a job runs (core/submission.py ENTRIES), and the
job imports it on its node. A checkpointable entry (a cell's training) answers submitit's USR2 (time limit
near, or preemption) by asking to be requeued as itself: the requeued job resumes from the cell's last
checkpoint, with the same cell directory and W&B run id; submitit bounds the requeues after time limits. When
the last two legs each ended before saving a newer checkpoint, it is not requeued: the cell fails as a time limit
with no progress, with the fix (core/failures/cell.py `stalled`), instead of spending the whole budget the same way.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import submitit

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.cell import stalled


class Entry:
    def __init__(self, entry: str, target: str) -> None:
        self.entry = entry
        self.target = target

    def __call__(self) -> Any:
        module, _, function = self.entry.partition(":")
        return getattr(importlib.import_module(module), function)(self.target)


class CheckpointableEntry(Entry, submitit.helpers.Checkpointable):
    # submitit annotates DelayedSubmission, but reads None as "do not requeue" (core/job_environment.py _checkpoint)
    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission | None:  # type: ignore[override]
        env = submitit.JobEnvironment()
        if env.global_rank == 0:
            cell_dir = Path(self.target)
            futile = stalled(cell_dir, events.read(cell_dir), env.job_id)
            if futile is not None:  # legs too short to reach the next checkpoint: stop (submitit: None = no requeue)
                events.append(cell_dir, futile)
                return None
            events.append(cell_dir, Event(Kind.REQUEUED, job_id=env.job_id))
        return submitit.helpers.DelayedSubmission(CheckpointableEntry(self.entry, self.target))
