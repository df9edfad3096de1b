"""The jobs a grid queues before its training arrays, and what each cell waits for (pure).

They run in a chain, each waiting for the one before to end (afterany), because a Slurm dependency names one job
here: the staging job (where the site's internet is on a transfer partition), one array of the model preps not
done, one array of the tokenizations not built. A cell's training array waits for the last of these its cell
needs; each cell's first step then checks that its own inputs, prep and tokenized dataset are there, and fails
with the reason otherwise, so one broken input fails only the cells that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import SUBMITIT_DIR
from sft_grid.core.state import SchedulerView
from sft_grid.core.submission import Dependency, PrepWait, Role, SlurmJob
from sft_grid.grid.decide import Decision
from sft_grid.grid.requests import count, job_name, minutes, prep_request, request_for, stage_request, tokenize_request
from sft_grid.planning.inputs import Prep
from sft_grid.stages.staging.in_job import StageWork
from sft_grid.stages.tokenize import Tokenization


def stage_job(work: StageWork | None, histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None,
              jobs: list[SlurmJob]) -> Dependency | None:
    """What the cells that need the staging wait for: the staging job (appended to `jobs`), or the one an earlier
    invocation queued while it is still queued or running."""
    if work is None:
        return None
    earlier = queued_job(histories.get(work.dir, ()), view)
    if earlier:
        return Dependency("afterany", earlier, planned=False)
    request = stage_request(work.cluster)
    name = job_name(Role.STAGE, [work.dir], request, None, [count(histories.get(work.dir, ()), Kind.SUBMITTED)])
    jobs.append(SlurmJob(name, Role.STAGE, (work.dir,), request, work.dir / SUBMITIT_DIR / name,
                         label=f"{len(work.pins)} Hub repositories"))
    return Dependency("afterany", name)


def prep_jobs(runs: Sequence[Decision], preps: Mapping[Path, Prep | None], histories: Mapping[Path, Sequence[Event]],
              view: SchedulerView | None, jobs: list[SlurmJob], after: Dependency | None = None) -> list[PrepWait]:
    """The model preps these cells wait for: one array of every prep not done and not already queued (a task
    per model), and the cells' dependency on it. A cell waits for the preps to end, not to succeed (afterany):
    its job's first step finds whether its own model's prep succeeded, so one broken checkpoint never cancels
    the cells of the others, and the grid needs one prep job, not one per model."""
    waits: list[PrepWait] = []
    new: dict[Path, tuple[Prep, Decision]] = {}
    queued: dict[Path, str] = {}
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        if p.dir not in new and p.dir not in queued:
            job_id = queued_job(histories.get(p.dir, ()), view)
            if job_id:
                queued[p.dir] = job_id
            else:
                new[p.dir] = (p, d)
    name = ""
    if new:
        targets = sorted(new)
        request = prep_request(request_for(new[targets[0]][1].cell.spec, minutes(new[targets[0]][1])))
        attempts = [count(histories.get(t, ()), Kind.SUBMITTED) for t in targets]
        name = job_name(Role.PREP, targets, request, None, attempts)
        jobs.append(SlurmJob(name, Role.PREP, tuple(targets), request, targets[0].parent / SUBMITIT_DIR / name,
                             dependency=after, label=", ".join(new[t][0].model for t in targets)))
    for d in runs:
        p = preps.get(d.dir)
        if p is None or p.complete:
            continue
        dependency = (Dependency("afterany", queued[p.dir], planned=False) if p.dir in queued
                      else Dependency("afterany", name))
        waits.append(PrepWait(d.dir, p.model, p.model_dir, dependency))
    return waits


def queued_job(history: Sequence[Event], view: SchedulerView | None) -> str:
    """The prep's job an earlier invocation queued, while it is still queued or running ("" if none)."""
    queued = events.last(list(history), Kind.JOB)
    if queued is None or view is None:
        return ""
    job = view.job(queued.job_id)
    return queued.job_id if job is not None and job.in_flight else ""

def tokenize_jobs(runs: Sequence[Decision], tokenized: Mapping[Path, Tokenization],
             histories: Mapping[Path, Sequence[Event]], view: SchedulerView | None, jobs: list[SlurmJob],
             after: Dependency | None) -> dict[Path, Dependency]:
    """One array of the tokenizations these cells share that are not built (a task each, unless one is queued
    already); each cell -> what it waits for."""
    new: dict[Path, Decision] = {}
    waits: dict[Path, Dependency] = {}
    for d in runs:
        tok = tokenized.get(d.dir)
        if tok is None or tok.data.complete:
            continue
        job_id = queued_job(histories.get(tok.dir, ()), view)
        if job_id:
            waits[d.dir] = Dependency("afterany", job_id, planned=False)
        else:
            new.setdefault(tok.dir, d)
    if not new:
        return waits
    targets = sorted(new)
    request = tokenize_request(new[targets[0]].cell.spec)
    name = job_name(Role.TOKENIZE, targets, request, None, [count(histories.get(t, ()), Kind.SUBMITTED) for t in targets])
    jobs.append(SlurmJob(name, Role.TOKENIZE, tuple(targets), request, targets[0].parent / SUBMITIT_DIR / name,
                         dependency=after, label=f"{len(targets)} tokenized dataset(s)"))
    for d in runs:
        tok = tokenized.get(d.dir)
        if tok is not None and tok.dir in new:
            waits[d.dir] = Dependency("afterany", name)
    return waits
