"""sft-grid release GRID --site NAME [--cancel] [--runs-root DIR]: let a site of a grid across sites go.

For a site that is gone (or will be, long enough not to wait for): each cell of the grid queued there is let go at
once, without waiting for the site to be called down (sft_grid/sites/moves.py, `let_go`). Its job's gate there is
claimed "moved", so if the site comes back that job starts and ends at its gate, training nothing; its ledger
records `planned` again, and the next run of the grid places it on another of its sites (never this one), or, with
`--cancel`, records `cancelled` (a later run skips it unless rerun_failed=true). A cell whose job started there (its
gate says so) is not let go: it may still run on the site's nodes, and a second copy elsewhere would write the same
cell directory. Each cell is named with what was done, and the grid's record of its sites (`<grid>/sites.json`)
notes the let-go. The grid's lock is held throughout, so no launch of the grid decides meanwhile.

The site is not removed from the grid's `sites=[...]`: if it answers again later, a later run may place new cells
there.

A grid across remote sites (its record here, `.site.json`, names each cell's site; the cells are on the sites): the
let-go is recorded here, with the cells the record sent to that site. The next invocation places them on another
site (or, with `--cancel`, nowhere), and whenever that site answers again, its own invocation gates their jobs there
and records the let-go in their ledgers before it answers (sites/coordinate.py).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid

    add_grid(parser)
    parser.add_argument("--site", required=True, metavar="NAME", help="the site to let go (a name of sites=[...])")
    parser.add_argument(
        "--cancel", action="store_true", help="cancel its cells instead of placing them elsewhere on the next run"
    )


def run(args: argparse.Namespace) -> int:
    from sft_grid.analysis.view import read_view
    from sft_grid.cli.options import grid_dir
    from sft_grid.core import events
    from sft_grid.core.layout import LOCK_FILE, iter_cell_dirs
    from sft_grid.core.lock import hold_all
    from sft_grid.schedulers import slurm
    from sft_grid.sites import facts, moves, remote

    sweep_dir = grid_dir(args.grid, args.runs_root)
    every = list(iter_cell_dirs(sweep_dir))
    if not every and remote.recorded_cells(sweep_dir):  # a grid across remote sites: its cells are there
        return _release_remote(sweep_dir, args.site, args.cancel)
    if not every:
        from sft_grid.cli.present import no_grid

        print(no_grid(sweep_dir, args.grid) or f"no cells under {sweep_dir}", file=sys.stderr)
        return 1
    with hold_all([sweep_dir / LOCK_FILE]):
        view = read_view(every, ask=False)  # the ledgers alone: the site is not asked (it may be gone)
        sites = {events.submitted_site(view.histories[d])[0] for d in every} - {""}
        if args.site not in sites:
            named = ", ".join(sorted(sites)) or "none (not a grid across sites)"
            print(
                f"no cell of {sweep_dir.name} was queued on site {args.site}; the sites its cells name: {named}",
                file=sys.stderr,
            )
            return 1
        outcomes = []
        env: dict[str, str] = {}
        for d in every:
            history = view.histories[d]
            done = moves.let_go(d, history, view.state(d), args.site, args.cancel)
            if done is not None:
                outcomes.append(done)
                env = events.submitted_site(history)[1] or env
        record = facts.read_record(sweep_dir)
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        let = [o for o in outcomes if o.done]
        cells = [o.cell for o in let]
        record.setdefault(args.site, {})["let_go"] = {"time": when, "cancel": args.cancel, "cells": cells}
        facts.write_record(sweep_dir, record)
    jobs = [o.job for o in let]
    if jobs:  # the site may answer still: its jobs cancelled there too (their gates stand for it if it does not)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            slurm.cancel(jobs, env or None)
    for o in outcomes:
        print(f"  {o.cell}: {'let go' if o.done else 'not let go'}: {o.text}")
    kept = len(outcomes) - len(let)
    what = "cancelled" if args.cancel else "placed on another site by the next run (sft-grid run, the same command)"
    print(
        f"site {args.site} let go: {len(let)} cell(s) {what}"
        + (f"; {kept} not let go (above)" if kept else "")
        + ("" if outcomes else f" (no cell of {sweep_dir.name} is in flight there)")
    )
    return 1 if kept else 0


def _release_remote(sweep_dir: Path, site: str, cancel: bool) -> int:
    """A grid across remote sites: the let-go recorded here, with the cells the grid's record sent to the site."""
    from sft_grid.core.layout import LOCK_FILE
    from sft_grid.core.lock import hold_all
    from sft_grid.sites import facts, remote

    with hold_all([sweep_dir / LOCK_FILE]):
        recorded = remote.recorded_cells(sweep_dir)
        cells = sorted(n for n, s in recorded.items() if s == site)
        if not cells:
            named = ", ".join(sorted(set(recorded.values())))
            print(
                f"the record of {sweep_dir.name} sent no cell to site {site}; the sites it names: {named}",
                file=sys.stderr,
            )
            return 1
        record = facts.read_record(sweep_dir)
        before = (record.get(site) or {}).get("let_go") or {}
        every = sorted({*before.get("cells", ()), *cells})
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record.setdefault(site, {})["let_go"] = {"time": when, "cancel": cancel, "cells": every}
        facts.write_record(sweep_dir, record)
    then = "cancelled: placed nowhere" if cancel else "placed on another site by the next run"
    for name in cells:
        print(f"  {name}: let go: {then}; its job on {site}, if the site answers again, is gated there first")
    print(f"site {site} let go: {len(cells)} cell(s) {'cancelled' if cancel else 'to place elsewhere'}")
    return 0
