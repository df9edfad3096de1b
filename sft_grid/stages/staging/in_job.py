"""Staging as a Slurm job, where a site's internet is on a transfer partition (`cluster.staging.where: job`).

The grid resolves and pins every input on the machine running it (a few small requests), then queues one job
on `cluster.staging.partition` that fetches what is missing, with the cluster's `staging.setup` lines first (a
module load, a proxy or tunnel to the Hub). The grid's model preps and training arrays wait for it to end
(`afterany`); each cell's first step checks that its own inputs are staged (the `staged` preflight check) and
fails with the staging's reason otherwise, so one missing repository fails only the cells that need it.

The job's directory, `<runs_root>/_staging/<hash of the pins>/`, keeps its ledger (events.jsonl), its list of
pins (stage.json) and nothing else; its log is submitit's. A failure is also recorded beside the commit in the
cache (core/hubcache.record_failure), where the cells' checks read it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.hubcache import SHA_RE, Pin, record_failure
from sft_grid.stages.staging.download import download
from sft_grid.stages.staging.values import HubError

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"
STAGE_FILE = "stage.json"


@dataclass(frozen=True)
class StageWork:
    """The staging job of a grid invocation: its directory, the pins it fetches, the cells that wait for it, and
    the cluster section it runs on (of the first cell that needs it)."""

    dir: Path
    pins: tuple[Pin, ...]
    cells: frozenset[Path]
    cluster: Any

    def file(self) -> str:
        return json.dumps({"pins": [{**p.to_json(), "cache": str(p.cache)} for p in self.pins]}, indent=2) + "\n"


def stage_dir(runs_root: Path, pins: Sequence[Pin]) -> Path:
    blob = json.dumps(sorted([p.kind, p.repo_id, p.sha, str(p.cache)] for p in pins))
    return runs_root / STAGING_DIR / hashlib.sha256(blob.encode()).hexdigest()[:12]


class StagingJobFailed(RuntimeError):
    """Some repositories could not be staged; the message names each and why."""


def run(target: Path) -> str:
    """What the staging job runs on its node: fetch every pin of stage.json, recording each failure beside its
    commit in the cache (and clearing an old one on success)."""
    events.append(target, Event.here(Kind.RUNNING))
    pins = json.loads((target / STAGE_FILE).read_text())["pins"]
    failed = []
    for p in pins:
        try:
            staged = download(
                p["repo"], p["kind"], p["sha"], p["cache"], ref=None if SHA_RE.match(p["revision"]) else p["revision"]
            )
            reason = None if staged.complete else staged.stopped or "stopped before it completed"
        except HubError as exc:
            reason = str(exc)
        record_failure(p["cache"], p["repo"], p["kind"], p["sha"], reason)
        if reason:
            failed.append(f"{p['kind']} {p['repo']}@{p['sha'][:12]}: {reason}")
            log.error("staging %s %s failed: %s", p["kind"], p["repo"], reason)
    if failed:
        events.append(target, Event(Kind.FAILED, reason="; ".join(failed)[:2000]))
        raise StagingJobFailed("; ".join(failed))
    events.append(target, Event(Kind.COMPLETED))
    return "completed"
