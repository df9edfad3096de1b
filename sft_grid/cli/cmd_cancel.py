"""sft-grid cancel GRID [CELL ...] [--runs-root DIR]: stop a grid's queued and running cells.

Without CELL names every in-flight cell of the grid is cancelled; a CELL is a cell name or a part of one
(`tiny_llama` cancels every cell whose name contains it). Slurm jobs get one scancel; local jobs SIGTERM.
Each cancelled cell records `cancelled` in its ledger, and a later run of the grid skips it unless
rerun_failed=true. A cell whose ledger cannot be read whole is left, named with its damage and the fix, and the
others are cancelled (exit status 1).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sft_grid.core.events import Event


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid

    add_grid(parser)
    # a default: argparse then says only GRID is required (without one it names CELL too, which may be left out)
    parser.add_argument(
        "cells", nargs="*", default=[], metavar="CELL", help="cell names or parts of names (default: every cell)"
    )


def run(args: argparse.Namespace) -> int:
    from sft_grid.analysis.view import read_view
    from sft_grid.cli.options import grid_dir
    from sft_grid.core import events
    from sft_grid.core.cellfiles import DamagedFile
    from sft_grid.core.events import Event, Kind
    from sft_grid.core.layout import iter_cell_dirs
    from sft_grid.core.state import slurm_ref
    from sft_grid.schedulers import slurm

    if any(not c.strip() for c in args.cells):
        print(
            "sft-grid cancel: an empty CELL is a part of every cell's name, so it would cancel the whole grid; name a"
            " cell (or a part of its name), or give no CELL to cancel every cell on purpose",
            file=sys.stderr,
        )
        return 2
    sweep_dir = grid_dir(args.grid, args.runs_root)
    every = list(iter_cell_dirs(sweep_dir))
    dirs = [d for d in every if not args.cells or any(c in d.name for c in args.cells)]
    if not dirs:
        print(
            f"no cells under {sweep_dir}"
            if not every
            else f"no cell under {sweep_dir} has {' or '.join(map(repr, args.cells))} in its name",
            file=sys.stderr,
        )
        return 1
    # a cell whose ledger cannot be read whole (events.read refuses it) is left, named with the fix: whether it is in
    # flight cannot be told from part of it; the others are cancelled (one damaged file does not keep a grid running)
    cancelled, left = [], []
    readable = []
    for cell_dir in dirs:
        try:
            events.read(cell_dir)
        except (DamagedFile, OSError) as exc:
            job = next((e.job_id for e in reversed(events.scan(cell_dir).events) if e.job_id), None)
            left.append(
                f"not cancelled {cell_dir.name}: its ledger is damaged ({exc}), and whether it is in flight cannot be"
                " told from part of it: mend or move that file, then cancel it again"
                + (f" (or scancel its last recorded job, {job}, yourself)" if job else "")
            )
            continue
        readable.append(cell_dir)
    view = read_view(readable)
    # each site's job ids (a grid across sites: the client environment each cell's submission recorded)
    slurm_ids: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for cell_dir in readable:
        st = view.state(cell_dir)
        if not st.state.in_flight:
            continue
        history = view.histories[cell_dir]
        if slurm_ref(history) is not None and st.job_id:
            env = tuple(sorted(events.submitted_site(history)[1].items()))
            slurm_ids.setdefault(env, []).append(st.job_id)
        else:
            last = next((e for e in reversed(history) if e.pid), None)
            why = _not_ours(last)
            if why:
                left.append(f"not cancelled {cell_dir.name}: {why}")
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(last.pid or 0) if last else 0, signal.SIGTERM)
        events.append(cell_dir, Event(Kind.CANCELLED, reason="cancelled by sft-grid cancel", job_id=st.job_id))
        cancelled.append(cell_dir.name)
    for env, ids in slurm_ids.items():
        slurm.cancel(ids, dict(env) or None)
    for name in cancelled:
        print(f"cancelled {name}")
    for line in left:
        print(line, file=sys.stderr)
    print(f"{len(cancelled)} cell(s) cancelled" + ("" if cancelled or left else f" (none in flight under {sweep_dir})"))
    return 1 if left else 0


def _not_ours(last: Event | None) -> str:
    """Why the process a local cell's ledger names must not be signalled from here ("" when it may): none named, one
    on another host (a grid on a shared file system: the same number here is another process), or a number this
    host has given to a process started after the cell's (its start time, /proc's, later than the event)."""
    from sft_grid.core.state import parse_time, started_at

    if last is None or not last.pid:
        return "its ledger names no process to stop"
    if last.host and last.host != socket.gethostname():
        return (
            f"it runs on {last.host} (pid {last.pid}), not on this host: run the cancel there, or kill {last.pid} there"
        )
    started, written = started_at(last.pid), parse_time(last.time)
    if started is not None and written is not None and started > written + 2:
        return f"pid {last.pid} is now another process (started after the cell's ledger named it); the cell's has ended"
    return ""
