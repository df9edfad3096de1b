"""Submission: the only module that imports submitit (lazily). It consumes exactly what render returned.

The local executor runs cells on this machine, at most `cluster.max_parallel` at once, and waits for
them when the cluster says so (the default for `cluster=local`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from sft_grid import ledger
from sft_grid.render import LOGS_DIR, SubmitRequest

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(frozen=True)
class Finished:
    request: SubmitRequest
    state: ledger.CellState


def mark_submitted(request: SubmitRequest) -> None:
    """Recorded before the job can start, so the job's own `running` event always comes after it. Until
    then this process stands for the cell: if it dies first, the cell reads as failed, not in flight."""
    ledger.append(request.cell_dir, "submitted", executor=request.executor, pid=os.getpid(), host=socket.gethostname())


def submit_local(
    requests: Sequence[SubmitRequest],
    max_parallel: int,
    wait: bool,
    on_done: Callable[[Finished], None] = lambda f: None,
) -> list[Finished]:
    import submitit

    from sft_grid.runner import run_cell

    queue = list(requests)
    running: list[tuple[SubmitRequest, object]] = []
    finished: list[Finished] = []
    limit = max(1, max_parallel) if wait else len(queue) or 1
    while queue or running:
        while queue and len(running) < limit:
            request = queue.pop(0)
            executor = submitit.LocalExecutor(folder=request.cell_dir / LOGS_DIR / "submitit")
            executor.update_parameters(timeout_min=request.timeout_min)
            job = executor.submit(run_cell, str(request.cell_dir))
            ledger.append(request.cell_dir, "job", job_id=job.job_id)
            log.info("started %s (local job %s)", request.cell_name, job.job_id)
            running.append((request, job))
        if not wait:
            break
        time.sleep(POLL_S)
        for item in list(running):
            request, job = item
            if job.done():  # type: ignore[attr-defined]
                running.remove(item)
                done = Finished(request, ledger.state_of(request.cell_dir))
                finished.append(done)
                on_done(done)
    return finished
