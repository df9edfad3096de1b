"""What `observe` asks each site of a grid across sites, and what the grid remembers of their silences.

Each look (one invocation's observe) asks a site's controller for its nodes (`sinfo`, up to the profile's
`site_answer_tries` times, 2 s, 4 s, ... apart: a controller that misses one answer is not silent), then, for each
shape of cell the grid has (nodes, wall time), when its scheduler expects such a job to start: `sbatch --test-only`
with the request the cell's training job would be submitted with on that site (`request_at`: partition, account,
qos, GPUs, CPUs, memory, constraint and the profile's own sbatch options; nothing is queued). A request the
scheduler refuses or does not answer has no estimate: it is unknown, never "at once" (placement ranks it after every
known one).

A site that does not answer one look is not down yet. The grid's record of its sites, `<grid>/sites.json`, keeps
when each site's silence began (the first look without an answer since its last answer) and how many looks it
lasted; a site is down once the silence has lasted the profile's `site_down_after_s` (sites/moves.py moves its
queued cells only then); an answer ends the silence. The same file records a site the grid let go (`sft-grid
let-go`, sft_grid/cli/cmd_release.py). It is written whole (by rename), under the grid's lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sft_grid.core.schema import ClusterConf
from sft_grid.core.submission import SlurmRequest
from sft_grid.schedulers import slurm
from sft_grid.sites.placement import Need, SiteFacts

SITES_FILE = "sites.json"


def request_at(cluster: ClusterConf, nodes: int, minutes: int, site: str = "") -> SlurmRequest:
    """The sbatch request of a cell's training job of `nodes` x `minutes` on this site: what grid/jobs.py queues for
    a cell placed there (`request_for`), and what `sbatch --test-only` is asked for its expected start."""
    c = cluster
    params: dict[str, Any] = {
        "time": minutes,
        "nodes": nodes,
        "ntasks_per_node": 1,  # one launcher per node: torchrun/accelerate start the ranks
        "cpus_per_task": c.cpus_per_node,
        # USR2 this long before the limit: the job checkpoints, requeues itself and resumes
        "signal_delay_s": min(120, max(30, minutes * 60 // 10)),
        "additional_parameters": tuple(sorted({"requeue": True, **c.sbatch_extra}.items())),
        # a node whose launcher fails ends the whole step: the others would wait at the rendezvous forever
        "srun_args": ("--kill-on-bad-exit=1",),
    }
    for key in ("partition", "account", "qos", "constraint", "exclude"):
        if getattr(c, key):
            params[key] = getattr(c, key)
    if c.mem_gb:
        params["mem"] = f"{c.mem_gb}GB"
    if c.gpus_per_node and c.gpu_directive == "gpus_per_node":
        params["gpus_per_node"] = c.gpus_per_node
    elif c.gpus_per_node and c.gpu_directive == "gres":
        params["gres"] = f"gpu:{c.gpus_per_node}"
    return SlurmRequest(tuple(sorted(params.items())), c.max_requeues, tuple(sorted(c.client_env.items())), site)


def observe(
    sites: Mapping[str, ClusterConf], needs: Sequence[Need], sleep: Callable[[float], None] = time.sleep
) -> tuple[SiteFacts, ...]:
    """Each site's facts for a placement: whether its controller answered this look (after its tries), its nodes,
    and the expected start of each shape of the needs (only the known ones)."""
    out = []
    shapes = sorted({n.shape for n in needs})
    for name, cluster in sites.items():
        env = dict(cluster.client_env)
        t0 = time.monotonic()
        try:
            nodes = slurm.node_count(env, tries=cluster.site_answer_tries, sleep=sleep)
        except (OSError, subprocess.SubprocessError) as exc:
            tries = cluster.site_answer_tries
            why = _first_line(exc)
            error = f"no answer to sinfo in {tries} tr{'y' if tries == 1 else 'ies'} over {time.monotonic() - t0:.0f} s"
            out.append(SiteFacts(name=name, cluster=cluster, reachable=False, error=f"{error}: {why}"))
            continue
        starts: dict[tuple[int, int], float] = {}
        for n_nodes, minutes in shapes:
            start = slurm.test_only(request_at(cluster, n_nodes, minutes, name), env)
            if start is not None:
                starts[(n_nodes, minutes)] = start
        out.append(SiteFacts(name=name, cluster=cluster, nodes=max(1, nodes), starts=starts))
    return tuple(out)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "stderr", "") or "").strip() or str(exc).strip() or type(exc).__name__
    return text.splitlines()[-1][:200]


# -- the grid's record of its sites ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Silence:
    """A site's silence, as the grid recorded it: since when (the first look without an answer), over how many
    looks, and what its last look said."""

    since: float
    looks: int
    error: str = ""

    def lasted(self, now: float) -> float:
        return max(0.0, now - self.since)


def read_record(grid_dir: Path) -> dict[str, dict[str, Any]]:
    """The grid's record of its sites: site name -> {"silent_since", "looks", "error", "let_go"} (what it has)."""
    path = Path(grid_dir) / SITES_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    sites = data.get("sites") if isinstance(data, dict) else None
    return {str(k): dict(v) for k, v in sites.items() if isinstance(v, dict)} if isinstance(sites, dict) else {}


def write_record(grid_dir: Path, record: Mapping[str, Mapping[str, Any]]) -> None:
    """Written whole, by rename (a reader sees the old record or the new one)."""
    path = Path(grid_dir) / SITES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SITES_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"sites": {k: dict(v) for k, v in sorted(record.items())}}, indent=1) + "\n")
    tmp.replace(path)


def silence_of(entry: Mapping[str, Any]) -> Silence | None:
    since = entry.get("silent_since")
    if not isinstance(since, (int, float)):
        return None
    return Silence(since=float(since), looks=int(entry.get("looks") or 1), error=str(entry.get("error") or ""))


def look(
    grid_dir: Path, facts: Sequence[SiteFacts], now: float, record: bool
) -> tuple[dict[str, Silence], frozenset[str]]:
    """This look at the grid's sites against its record: each silent site's silence (begun now, or earlier), and the
    sites that are down (silent for their `site_down_after_s`). Recording (a real run's observe, under the grid's
    lock), the record is updated: a silence begins or goes on, an answer ends it."""
    stored = read_record(grid_dir)
    updated = {k: dict(v) for k, v in stored.items()}
    silences: dict[str, Silence] = {}
    down: set[str] = set()
    for f in facts:
        entry = updated.setdefault(f.name, {})
        if f.reachable:
            for key in ("silent_since", "looks", "error"):
                entry.pop(key, None)
            continue
        before = silence_of(entry)
        now_silence = Silence(
            since=before.since if before else now, looks=(before.looks + 1) if before else 1, error=f.error
        )
        entry.update(silent_since=now_silence.since, looks=now_silence.looks, error=f.error)
        silences[f.name] = now_silence
        if now_silence.lasted(now) >= f.cluster.site_down_after_s:
            down.add(f.name)
    updated = {k: v for k, v in updated.items() if v}
    if record and updated != stored:
        write_record(grid_dir, updated)
    return silences, frozenset(down)


def silence_text(site: str, silence: Silence, down_after_s: int, now: float) -> str:
    """What a person reads of a silent site: how long, how many looks, and when it is called down."""
    lasted = silence.lasted(now)
    looks = f"{silence.looks} look{'s' if silence.looks != 1 else ''}"
    if lasted >= down_after_s:
        return f"{site} has not answered for {lasted:.0f} s ({looks}; down after {down_after_s} s)"
    return (
        f"{site} has not answered for {lasted:.0f} s ({looks}): not down until {down_after_s} s of silence"
        f" ({silence.error or 'no answer'})"
    )
