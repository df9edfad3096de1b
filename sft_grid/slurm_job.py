"""What a Slurm job runs: one cell, requeued and resumed when it hits its time limit or is preempted.

submitit pickles a CellJob and calls it on every node of the allocation (one task per node). On USR2
(time limit near, or preemption with preempt_send_user_signal) submitit calls `checkpoint()`, which asks
for the same CellJob to be requeued; the requeued job resumes from the cell's last checkpoint
(sft_grid/runner.py), with the same cell directory and run name. submitit bounds the requeues after a
time limit by the cluster's `max_requeues`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import submitit

from sft_grid import ledger
from sft_grid.runner import run_cell


class CellJob(submitit.helpers.Checkpointable):
    def __init__(self, cell_dir: str) -> None:
        self.cell_dir = cell_dir

    def __call__(self) -> str:
        return run_cell(self.cell_dir)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if submitit.JobEnvironment().global_rank == 0:
            ledger.append(Path(self.cell_dir), "requeued",
                          job_id=submitit.JobEnvironment().job_id)
        return submitit.helpers.DelayedSubmission(CellJob(self.cell_dir))


class PostJob:
    """A cell's post-training chain (sft_grid/post.py), as a Slurm job that waits for the cell's training."""

    def __init__(self, cell_dir: str) -> None:
        self.cell_dir = cell_dir

    def __call__(self) -> bool:
        from sft_grid import post

        return post.run(self.cell_dir, post.IN_JOB)
