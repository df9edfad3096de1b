"""A site's answer for a grid across remote sites (sites/coordinate.py places the cells with it).

Run by the site's own invocation asked for its answer (sites/call.py), from the grid's snapshot there: the grid's cells
composed as everywhere, then what the coordinator needs of this site, and nothing else is done (no render, no staging,
no submission).
"""

from __future__ import annotations

from collections.abc import Sequence

from sft_grid.analysis.view import read_view
from sft_grid.core.layout import LEDGER_FILE
from sft_grid.core.problems import GridError
from sft_grid.grid.flow import plan_cells
from sft_grid.grid.triage import settle
from sft_grid.planning.cells import dirs_of
from sft_grid.planning.compose import Composed, CompositionError
from sft_grid.planning.inputs import hub_repos
from sft_grid.sites import facts as site_facts
from sft_grid.sites import placement
from sft_grid.sites.coordinate import Answer
from sft_grid.sites.moves import observe_moves
from sft_grid.stages.staging import StagingFailed, plan_staging


def answer(site: str, composed: Sequence[Composed], errors: Sequence[CompositionError]) -> Answer:
    """This site's answer for a grid across remote sites (its own invocation: `sites` is this site alone): its
    Slurm's facts, each cell with a ledger here and its state, the moves off this site confirmed here, and the cells
    whose Hub inputs are not staged here. Reads the ledgers and asks the site's Slurm once (sinfo, sbatch
    --test-only); unless a dry run it also records what observe records: the triage of ended failures, and the steps
    of the moves off this site it can take now. Renders, stages and queues nothing."""
    cells, problems = plan_cells(composed, errors)
    sites, site_problems = placement.profiles(cells)
    if problems or site_problems:
        raise GridError([*problems, *site_problems])
    dirs = dirs_of(cells)
    record = not any(c.spec.dry_run for c in cells)
    view = read_view(dirs)
    if record:
        view = settle(view, dirs)
    facts = site_facts.observe(sites, [placement.need_of(c) for c in cells]) if sites else ()
    moving = observe_moves(cells, dirs, view.histories, view.state, facts, record) if facts else {}
    try:
        hub = {cell for i in plan_staging(cells, dirs, True).pending for cell, _ in i.users}
    except (OSError, GridError, StagingFailed):  # the site's Hub cache cannot tell: every cell with a Hub input
        hub = {c.name for c in cells if hub_repos(c)}
    return Answer(
        site=site,
        facts=facts[0] if facts else None,
        states={
            c.name: view.state(d).state.value for c, d in zip(cells, dirs, strict=True) if (d / LEDGER_FILE).is_file()
        },
        moving=frozenset(c.name for c, d in zip(cells, dirs, strict=True) if d in moving),
        hub=frozenset(hub),
    )
