"""A grid across sites in the plan: each decision's cell given its site's cluster. Pure.

A cell to be queued is placed (sites/placement.py) over the sites `observe` saw; a cell queued before keeps the site
its ledger records (its `submitted` event's `site`). A cell no site can take now (its sites silent, its only other
site the one it leaves, an allocation spent) waits: its decision is a skip that names every site's reason, and the
rest of the grid goes on (a cell no site could ever take was refused by the checks, before anything was written).
A cell moving off a site (sites/moves.py), or let go from one (`sft-grid release`), is never placed on that site.
A cell in flight on a site that did not answer says so, and how long the grid has heard nothing (`<grid>/sites.json`,
read here, written by observe). What each submission records of its site (`site`, `slurm_env`: the client
environment status uses to ask that site's scheduler; `expected_start_s`: the scheduler's estimate, or "unknown")
is returned per cell directory.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from sft_grid.core.events import Event, submitted_site
from sft_grid.core.problems import Problem
from sft_grid.grid.decide import Action, Decision
from sft_grid.sites import facts as site_facts
from sft_grid.sites.moves import let_go_from
from sft_grid.sites.placement import SiteFacts, need_of, place

WAITING = "waiting"  # the first word of a waiting cell's reason (the launch's summary counts them by it)


def spread(
    decisions: Sequence[Decision],
    facts: Sequence[SiteFacts],
    histories: Mapping[Path, Sequence[Event]],
    hub_cells: Collection[str] = (),
    avoid: Mapping[Path, str] = {},
) -> tuple[list[Decision], dict[Path, dict[str, object]]]:
    """The decisions with each cell on its site (or waiting), and what each cell to be queued records of its site.
    `avoid`: cell dir -> a site it is moving away from (sites/moves.py), never chosen for it; a cell let go from a
    site (its ledger says so) avoids that one."""
    if not facts:
        return list(decisions), {}
    to_place = [d for d in decisions if d.action is Action.RUN and d.cell.spec.sites]
    away_of = {d.dir: avoid.get(d.dir) or let_go_from(histories.get(d.dir, ())) for d in to_place}
    placed: dict[str, str] = {}
    starts: dict[str, float | None] = {}
    unplaced: dict[str, Problem] = {}
    for away in sorted(set(away_of.values())):
        group = [d for d in to_place if away_of[d.dir] == away]
        result = place([need_of(d.cell, d.cell.name in hub_cells) for d in group], [f for f in facts if f.name != away])
        placed.update(result.sites)
        starts.update(result.starts)
        unplaced.update({p.cell: p for p in result.problems})
    clusters = {f.name: f.cluster for f in facts}
    silent = _silent(decisions, facts)
    out: list[Decision] = []
    recorded: dict[Path, dict[str, object]] = {}
    for d in decisions:
        if d.cell.name in unplaced and d.action is Action.RUN:
            out.append(_waiting(d, unplaced[d.cell.name], away_of.get(d.dir, "")))
            continue
        site = placed.get(d.cell.name) if d.action is Action.RUN else submitted_site(histories.get(d.dir, ()))[0]
        cluster = clusters.get(site or "") if d.cell.spec.sites else None
        if cluster is None:
            out.append(d)
            continue
        why = (
            f"{d.why}; {silent[site]}"
            if d.action is not Action.RUN and d.state.state.in_flight and site in silent
            else d.why
        )
        out.append(replace(d, why=why, cell=replace(d.cell, spec=replace(d.cell.spec, cluster=cluster))))
        if d.action is Action.RUN:
            start = starts.get(d.cell.name)
            recorded[d.dir] = {
                "site": site,
                "slurm_env": dict(cluster.client_env),
                "expected_start_s": "unknown" if start is None else round(start),
            }
    return out, recorded


def _waiting(d: Decision, problem: Problem, away: str) -> Decision:
    """A cell to be queued that no site can take now: skipped this run, with every site's reason."""
    reasons = problem.message.split(": ", 1)[-1]
    left = f" (it leaves {away})" if away else ""
    why = f"{WAITING}{left}: no site of the grid can take it now: {reasons}; the next run places it once one can"
    return replace(d, action=Action.SKIP, why=why, post=False, evaluate=False, archive=False)


def _silent(decisions: Sequence[Decision], facts: Sequence[SiteFacts]) -> dict[str, str]:
    """Each site that did not answer this look -> what a person reads of its silence (the grid's record of it)."""
    now = time.time()
    grids = sorted({d.dir.parent for d in decisions if d.cell.spec.sites})
    out: dict[str, str] = {}
    for f in facts:
        if f.reachable:
            continue
        entry = next((r[f.name] for r in map(site_facts.read_record, grids) if f.name in r), {})
        silence = site_facts.silence_of(entry) or site_facts.Silence(since=now, looks=1, error=f.error)
        out[f.name] = site_facts.silence_text(f.name, silence, f.cluster.site_down_after_s, now)
    return out
