"""One view of a grid across remote sites, printed: `status`, `logs`, `cancel`, `results` and `report` of a grid
whose record here (sites/remote.py, `.site.json`) names several sites, each its own filesystem and Slurm. Asking the
sites and merging their replies (which site's copy of a cell is shown) is sites/merged.py's; this module prints it.

A site that does not answer is named on stderr in one line (why, how long it was waited for, what the output lacks)
and the others still answer; what they replied is printed, merged, and the exit status is 1.

- status: the merged rows printed as `status` prints a grid, the site column set to the site each row came from
  (`--format json`: the merged rows as JSON). `--watch` refreshes the merged table every --interval seconds (one
  command a site each time) until nothing is under way; a site that does not answer keeps its cells `unknown`, and
  under way.
- results, report: the files those two commands read, pulled from each site and merged into one directory here
  (sites/merged.py), which the local results and report code reads, so a spread grid's results are those of the
  same grid on one site, the site column aside. The report's page and data are written here.
- logs: on the site that holds the cell's chosen copy (a merged status read first); cancel: on every site.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from sft_grid.cli.cmd_status import BASE_ROW, HEADERS, Line
from sft_grid.core.state import CellState, State
from sft_grid.sites.merged import Connect, Reply, Sites, merge_dirs, missed, pull, read_status
from sft_grid.sites.remote import Placed, command_there, recorded_cells, site_args, there
from sft_grid.sites.transport import SiteUnreachable

NAMED = 4  # cells named in a line before "and N more"


def _say_unreachable(reply: Reply) -> None:
    print(f"site {reply.site} did not answer: {reply.unreachable}", file=sys.stderr, flush=True)


# -- status ---------------------------------------------------------------------------------------------------


def _line(row: Mapping[str, Any]) -> Line:
    """A merged row (sites/merged.py's `read_status`: its site column the site it came from) as a line of the
    table."""
    values = tuple(str(row.get(h) or "") for h in HEADERS)
    under_way = frozenset(row.get("under_way") or ())
    if values[1] == BASE_ROW:
        return Line(row=values, state=None, under_way=under_way)
    from sft_grid.core.failures.classes import FailureClass

    klass = next((c for c in FailureClass if c.value == values[HEADERS.index("class")]), None)
    state = next((s for s in State if s.value == values[1]), State.PLANNED)  # unknown: never a failure's line
    st = CellState(
        state=state,
        reason=values[HEADERS.index("reason")],
        job_id=values[HEADERS.index("job")],
        elapsed=values[HEADERS.index("elapsed")],
        failure_class=klass,
        advice=str(row.get("advice") or ""),
    )
    return Line(row=values, state=st, under_way=under_way)


def _lines(rows: Sequence[Mapping[str, Any]]) -> list[Line]:
    """The merged rows as the table's lines: the cells, then the base models."""
    return [_line(row) for row in sorted(rows, key=lambda row: row.get("state") == BASE_ROW)]


def _status(sites: Sites, args: argparse.Namespace, grid_here: Path) -> int:
    from sft_grid.cli import cmd_status

    said: dict[str, str] = {}

    def read() -> list[Line]:
        merged = read_status(sites, grid_here)
        for name, why in merged.failed.items():
            if said.get(name) != why:  # a --watch says it once, not each refresh
                print(f"site {name} did not answer: {why}", file=sys.stderr, flush=True)
        said.clear()
        said.update(merged.failed)
        return _lines(merged.rows)

    why = cmd_status.interval_problem(args)
    if why:
        print(why, file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(cmd_status.as_json(read()), indent=1))
    elif args.watch:
        title = f"sft-grid status {args.grid} ({len(sites.placed)} sites)"
        cmd_status.Watch(
            grid_here,
            interval=cmd_status.interval_of(args),
            out=sys.stdout,
            tty=sys.stdout.isatty(),
            title=title,
            reader=read,
        ).run()
    else:
        print("\n".join(cmd_status.report(read())))
    return 1 if said else 0


# -- results and report: the sites' files, pulled ---------------------------------------------------------------


def _names(cells: Sequence[str]) -> str:
    shown = ", ".join(cells[:NAMED])
    return shown + (f" and {len(cells) - NAMED} more" if len(cells) > NAMED else "")


def _pulled(sites: Sites, grid_here: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The merged directory of the pulled copies, each cell's site, and the sites that did not answer. Named on
    stderr: each file the pull cut or left empty, and each site that did not answer, in one line with what the
    output lacks of the cells the record puts there (missing, shown from an earlier pull and when, or from another
    site's copy)."""
    from sft_grid.analysis.report_data import ADAPTIVE_FILE

    pulled = pull(sites, grid_here, [ADAPTIVE_FILE])
    for cut in pulled.cut:
        what = f"its last {cut.kept} bytes" if cut.kept else "an empty file of its name"
        print(
            f"site {cut.site}: {cut.path} is {cut.size} bytes, over the pull's {cut.limit} bytes: {what} came here",
            file=sys.stderr,
            flush=True,
        )
    merged, chosen = merge_dirs(grid_here, [p.site.name for p in sites.placed])
    for miss in missed(pulled.failed, grid_here, chosen):
        said = []
        if miss.missing:
            said.append(f"{len(miss.missing)} of its cells are missing from the output: {_names(miss.missing)}")
        if miss.earlier:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(miss.pulled_at))
            said.append(f"{len(miss.earlier)} are shown as pulled at {when}: {_names(miss.earlier)}")
        if miss.other:
            said.append(f"{len(miss.other)} are shown from another site's copy: {_names(miss.other)}")
        line = f"site {miss.site} did not answer: {miss.why}" + "".join(f"; {x}" for x in said)
        print(line, file=sys.stderr, flush=True)
    return merged, chosen, pulled.failed


def _results(sites: Sites, args: argparse.Namespace, grid_here: Path) -> int:
    from sft_grid.cli import cmd_results

    merged, chosen, failed = _pulled(sites, grid_here)
    status = cmd_results.show(merged, args.grid, args.format, args.along, chosen)
    return 1 if failed else status


def _report(sites: Sites, args: argparse.Namespace, grid_here: Path) -> int:
    from sft_grid.analysis.page import write
    from sft_grid.cli.cmd_report import elsewhere, unwritable
    from sft_grid.core.layout import iter_cell_dirs

    out = Path(args.out).expanduser().resolve() if getattr(args, "out", None) else grid_here
    why = unwritable(out)
    if why:  # said before anything is pulled from the sites, as for a grid here
        print(f"sft-grid report: {why}; {elsewhere(grid_here)}. Nothing was written.", file=sys.stderr)
        return 1
    merged, chosen, failed = _pulled(sites, grid_here)
    if not any(True for _ in iter_cell_dirs(merged)):
        print(f"no cells on any site of {args.grid}: nothing was written", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for path in write(merged, args.resamples, chosen):  # written in the merged directory, then moved to `out`
        print(shutil.move(path, out / path.name))
    return 1 if failed else 0


# -- logs and cancel ------------------------------------------------------------------------------------------


def _logs(sites: Sites, args: argparse.Namespace, raw: Sequence[str], grid: str, grid_here: Path) -> int:
    """The cell's log, streamed from the site that holds its chosen copy (a merged status read to find it)."""
    merged = read_status(sites, grid_here)
    for name, why in merged.failed.items():
        print(f"site {name} did not answer: {why}", file=sys.stderr, flush=True)
    names = [c for c in merged.chosen if args.cell == c] or [c for c in merged.chosen if args.cell in c]
    recorded = recorded_cells(grid_here)
    if len(names) != 1:
        site = recorded.get(args.cell)
        if site is None:
            shown = ", ".join(sorted(names)[:8]) if names else "none"
            print(f"{args.cell!r} names {len(names)} cell(s) of {grid} across its sites: {shown}", file=sys.stderr)
            return 1
    else:
        site = merged.chosen[names[0]]
    placed = next(p for p in sites.placed if p.site.name == site)
    print(f"cell {names[0] if names else args.cell} on site {site}", file=sys.stderr, flush=True)
    argv = there(placed.site, placed.code_dir, command_there("logs", site_args(raw, grid, grid_here, placed.site)))
    try:  # --follow runs until its part of the cell ends: the connection's keepalive is its limit
        return sites.transports[site].stream(argv, timeout=None if args.follow else placed.site.timeout_s)
    except SiteUnreachable as exc:
        print(f"site {site} did not answer: {exc}", file=sys.stderr)
        return 1


def _cancel(sites: Sites, raw: Sequence[str], grid: str, grid_here: Path) -> int:
    """`cancel` on every site, each site's reply printed under its name."""
    replies = sites.ask("cancel", lambda p: site_args(raw, grid, grid_here, p.site))
    for reply in replies.values():
        if reply.unreachable:
            _say_unreachable(reply)
            continue
        print(f"== site {reply.site}")
        sys.stdout.write(reply.stdout.decode(errors="replace"))
        sys.stderr.write(reply.stderr.decode(errors="replace"))
    sys.stdout.flush()
    failed = any(r.unreachable for r in replies.values())
    return 1 if failed or all(r.returncode != 0 for r in replies.values()) else 0


# -- the entry --------------------------------------------------------------------------------------------------


def _parsed(module: ModuleType, args: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(args))


def forward(
    command: str,
    args: Sequence[str],
    grid: str,
    grid_here: Path,
    placed: Sequence[Placed],
    connect: Connect | None = None,
) -> int:
    """`sft-grid <command> <args>` (status, logs, cancel, results, report) of a grid across the remote sites
    `placed` (its record here): each site asked over its own transport (`connect`; None: the site's own; the
    tests' is a local one), the replies merged (sites/merged.py). `grid`: GRID as given; `grid_here`: its directory
    here."""
    import importlib

    parsed = _parsed(importlib.import_module(f"sft_grid.cli.cmd_{command}"), args)  # each command's own options
    names = ", ".join(p.site.name for p in placed)
    print(f"grid {grid_here.name} on {len(placed)} sites ({names})", file=sys.stderr, flush=True)
    with Sites(placed, connect) as sites:
        if command == "status":
            return _status(sites, parsed, grid_here)
        if command == "results":
            return _results(sites, parsed, grid_here)
        if command == "report":
            return _report(sites, parsed, grid_here)
        if command == "logs":
            return _logs(sites, parsed, args, grid, grid_here)
        if command == "cancel":
            return _cancel(sites, args, grid, grid_here)
    raise ValueError(f"{command} is not a command of a grid across sites")
