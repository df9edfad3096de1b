"""A grid across sites in the plan (issue 25, item 3): each decision's cell given its site's cluster. Pure.

A cell to be queued is placed (sites/placement.py) over the sites `observe` saw; a cell queued before keeps the site
its ledger records (its `submitted` event's `site`). The placement's problems (a cell no site can take) are raised
before anything is queued. What each submission records of its site (`site`, `slurm_env`: the client environment
status uses to ask that site's scheduler) is returned per cell directory.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from sft_grid.core.events import Event, submitted_site
from sft_grid.core.problems import GridError, Problem
from sft_grid.grid.decide import Action, Decision
from sft_grid.sites.placement import SiteFacts, need_of, place


def spread(
    decisions: Sequence[Decision],
    facts: Sequence[SiteFacts],
    histories: Mapping[Path, Sequence[Event]],
    hub_cells: Collection[str] = (),
    avoid: Mapping[Path, str] = {},
) -> tuple[list[Decision], dict[Path, dict[str, object]]]:
    """The decisions with each cell on its site, and what each cell to be queued records of its site. `avoid`: cell
    dir -> a site it is moving away from (sites/moves.py), never chosen for it."""
    if not facts:
        return list(decisions), {}
    to_place = [d for d in decisions if d.action is Action.RUN and d.cell.spec.sites]
    placed: dict[str, str] = {}
    problems: list[Problem] = []
    for away in sorted({avoid.get(d.dir, "") for d in to_place}):
        group = [d for d in to_place if avoid.get(d.dir, "") == away]
        result = place([need_of(d.cell, d.cell.name in hub_cells) for d in group], [f for f in facts if f.name != away])
        placed.update(result.sites)
        problems += result.problems
    if problems:
        raise GridError(problems, "the sites")
    clusters = {f.name: f.cluster for f in facts}
    out: list[Decision] = []
    recorded: dict[Path, dict[str, object]] = {}
    for d in decisions:
        site = placed.get(d.cell.name) if d.action is Action.RUN else submitted_site(histories.get(d.dir, ()))[0]
        cluster = clusters.get(site or "") if d.cell.spec.sites else None
        if cluster is None:
            out.append(d)
            continue
        out.append(replace(d, cell=replace(d.cell, spec=replace(d.cell.spec, cluster=cluster))))
        if d.action is Action.RUN:
            recorded[d.dir] = {"site": site, "slurm_env": dict(cluster.client_env)}
    return out, recorded
