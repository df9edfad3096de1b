"""The local executor: a plan's local jobs run on this machine through submitit, at most N at once.

Each job runs in its own process (submitit's LocalExecutor), its logs under its target's logs/submitit/.
With `wait` the call returns once every job has ended; without it, once each has started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sft_grid.core.layout import LOGS_DIR
from sft_grid.core.submission import ENTRIES, LocalJob

log = logging.getLogger(__name__)

POLL_S = 0.5


def run(
    jobs: Sequence[LocalJob],
    max_parallel: int,
    wait: bool,
    on_start: Callable[[LocalJob, str], None] = lambda job, job_id: None,
    on_done: Callable[[LocalJob], None] = lambda job: None,
    on_poll: Callable[[Sequence[LocalJob]], None] = lambda running: None,
) -> None:
    """Run the jobs, at most `max_parallel` at once; `on_poll` hears the jobs that run, each time it looks (every
    POLL_S), so a caller can show their progress."""
    import submitit

    from sft_grid.schedulers.entry import Entry

    queue = list(jobs)
    running: list[tuple[LocalJob, Any]] = []
    limit = max(1, max_parallel) if wait else len(queue) or 1
    while queue or running:
        while queue and len(running) < limit:
            job = queue.pop(0)
            executor = submitit.LocalExecutor(folder=job.target / LOGS_DIR / "submitit")
            executor.update_parameters(timeout_min=job.timeout_min)
            handle = executor.submit(Entry(ENTRIES[job.role], str(job.target)))
            on_start(job, str(handle.job_id))
            log.debug("started %s (local job %s)", job.label, handle.job_id)
            running.append((job, handle))
        if not wait:
            break
        time.sleep(POLL_S)
        on_poll([job for job, _ in running])
        for item in list(running):
            job, handle = item
            if handle.done():
                running.remove(item)
                on_done(job)
