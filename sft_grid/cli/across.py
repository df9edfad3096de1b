"""One view of a grid across remote sites: `status`, `logs`, `cancel`, `results` and `report` of a grid whose record
here (sites/remote.py, `.site.json`) names several sites, each its own filesystem and Slurm.

Each site is asked over its own transport (`Site.transport()`: one ssh control connection a site, opened by the
first command, reused by each refresh, closed at the end), all sites at once (a thread a site), one command a site
a refresh. A site that does not answer (`SiteUnreachable`) is named on stderr and the others still answer; the
merged answer is printed and the exit status is 1.

A cell may have a copy on more than one site (queued on A, moved to B when A stopped answering: A's copy keeps its
submitted, failed or cancelled state and a move journal, `move.json`; or A's old job started later and ended at its
gate). The copy shown is chosen per cell name (`rank`): a completed copy first, then one in flight (running, then
submitted), then a copy of a site that did not answer (`unknown`), then the latest of the others; a copy with a
move journal comes after every other unless it completed.

- status: each site runs `status <its grid dir> --format json`; the rows are merged by that rule, the site column
  set to the site each row came from, and printed as `status` prints a grid (`--format json`: the merged rows as
  JSON). `--watch` refreshes the merged table every --interval seconds (one command a site each time) until nothing
  is under way; a site that does not answer keeps its cells `unknown`, and under way.
- results, report: each site's grid directory, small files only, is pulled here as one tar stream (`PULL`: no
  checkpoint-* directory; a weight file, an optimizer state or any file over PULL_LIMIT comes as an empty file of
  its name, so a cell with final weights still reads as completed) into `<grid here>/.sites/<site>/`; the chosen
  copies are linked into `<grid here>/.merged/<grid>/` and the local results and report code reads that directory,
  so a spread grid's results are those of the same grid on one site, the site column aside (a cell's site: its
  `submitted` event's, else the site its copy came from). The report's page and data are written here.
- logs: on the site that holds the cell's chosen copy (a merged status read first); cancel: on every site.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tarfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sft_grid.cli.cmd_status import BASE_ROW, HEADERS, Line
from sft_grid.core.state import CellState, State, parse_time
from sft_grid.sites.remote import Placed, Site, command_there, recorded_cells, site_args, there
from sft_grid.sites.transport import SiteUnreachable, Transport

Connect = Callable[[Site], Transport]
UNKNOWN = "unknown"  # the state of a cell whose site did not answer
SITES_DIR, MERGED_DIR = ".sites", ".merged"
PULL_LIMIT = 64 << 20  # bytes: a larger file is pulled as an empty file of its name
# the site's side of a pull: a tar stream (gzip) of the grid directory's small files, on stdout; stdlib only, so it
# runs on any python of the site. argv: the grid directory there, the size limit. A file that changes while it is
# read is read whole first, so the stream is never cut; symlinks, dot-entries of the grid directory (its lock,
# submitit's folders, a pull's own directories) and checkpoint-* directories are left out.
PULL = r"""
import os, sys, tarfile, io
root, limit = sys.argv[1], int(sys.argv[2])
heavy = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npy", ".npz", ".arrow")
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        dirs[:] = sorted(
            d for d in dirs
            if not d.startswith("checkpoint-") and not (rel == "." and d.startswith("."))
            and not os.path.islink(os.path.join(top, d))
        )
        for name in sorted(files):
            path, arc = os.path.join(top, name), os.path.normpath(os.path.join(rel, name))
            if os.path.islink(path) or (rel == "." and name.startswith(".")):
                continue
            try:
                info = tar.gettarinfo(path, arc)
                light = info.size <= limit and not name.endswith(heavy) and not name.startswith("optimizer")
                data = open(path, "rb").read() if light else b""
            except OSError:
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
"""


def _connect(site: Site) -> Transport:
    return site.transport()


@dataclass(frozen=True)
class Answer:
    """One site's answer to one command: its exit status and output, or why it did not answer."""

    site: str
    returncode: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    unreachable: str = ""  # why the site did not answer ("" when it did)


class Sites:
    """The grid's remote sites, each over its own transport: opened at the first command, kept for the next
    (a refresh of --watch), closed by `close` (the `with` block's end)."""

    def __init__(self, placed: Sequence[Placed], connect: Connect = _connect) -> None:
        self.placed = list(placed)
        self.transports = {p.site.name: connect(p.site) for p in self.placed}

    def __enter__(self) -> Sites:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def ask(self, command: str, args_of: Callable[[Placed], Sequence[str] | None]) -> dict[str, Answer]:
        """`sft-grid <command> <args_of(site)>` on every site (None: that site is not asked), all at once; each
        site's answer by its name, in the record's order."""
        asked = [(p, args) for p in self.placed if (args := args_of(p)) is not None]

        def one(p: Placed, args: Sequence[str]) -> Answer:
            return self.run(p.site.name, there(p.site, p.code_dir, command_there(command, args)))

        with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
            answers = list(pool.map(lambda pa: one(*pa), asked))
        return {a.site: a for a in answers}

    def run(self, name: str, argv: Sequence[str]) -> Answer:
        """A raw argv on one site (a pull), as `ask` reports it."""
        try:
            done = self.transports[name].run(argv, check=False)
        except SiteUnreachable as exc:
            return Answer(name, unreachable=str(exc) or "no answer")
        return Answer(name, done.returncode, done.stdout, done.stderr)


def _say_unreachable(answer: Answer) -> None:
    print(f"site {answer.site} did not answer: {answer.unreachable}", file=sys.stderr, flush=True)


# -- the merge rule -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """One site's copy of a cell, as the merge weighs it."""

    site: str
    state: str
    updated: str = ""  # the time of its last ledger event
    moved: bool = False  # its directory holds a move journal: the cell left that site
    order: int = 0  # its site's place in the grid's record (the last tie-break)


_RANKS = {State.COMPLETED.value: 0, State.RUNNING.value: 1, State.SUBMITTED.value: 2, UNKNOWN: 3}


def rank(copy: Copy) -> tuple[int, float, int]:
    """The merge's order, best first: completed, running, submitted, unknown (its site did not answer), the others;
    a moved copy after all of those unless it completed; within a rank the latest, then the record's order."""
    level = _RANKS.get(copy.state, 4)
    if copy.moved and level != 0:
        level = 5
    return level, -(parse_time(copy.updated) or 0.0), copy.order


def choose(copies: Sequence[Copy]) -> Copy:
    """The copy of a cell that the grid's one view shows."""
    return min(copies, key=rank)


# -- status ---------------------------------------------------------------------------------------------------


@dataclass
class Merged:
    """One merged reading of the sites' status: the lines (cells by name, then base models), the site each cell's
    line came from, and the sites that did not answer (name -> why)."""

    lines: list[Line] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _line(row: Mapping[str, Any], site: str) -> Line:
    """A site's JSON row as a line of the table, its site column the site's name."""
    values = (*(str(row.get(h) or "") for h in HEADERS[:-1]), site)
    if values[1] == BASE_ROW:
        return Line(row=values, state=None, under_way=frozenset(row.get("under_way") or ()))
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
    return Line(row=values, state=st, under_way=frozenset(row.get("under_way") or ()))


def read_status(sites: Sites, grid_here: Path) -> Merged:
    """Every site's `status --format json` (one command a site), merged per cell by `choose`; the cells the record
    puts on a site that did not answer are `unknown` (and under way: nothing says they ended)."""
    answers = sites.ask("status", lambda p: [str(Path(p.site.runs_root) / grid_here.name), "--format", "json"])
    merged = Merged()
    copies: dict[str, list[tuple[Copy, Line]]] = {}
    order = {p.site.name: i for i, p in enumerate(sites.placed)}
    for name, answer in answers.items():
        rows = None
        if not answer.unreachable:
            try:
                rows = json.loads(answer.stdout)["rows"]
            except (ValueError, KeyError, TypeError):
                rows = None
        if rows is None:
            why = answer.unreachable or (
                f"its status failed (exit status {answer.returncode}): "
                + answer.stderr.decode(errors="replace").strip()[-300:]
            )
            merged.failed[name] = why
            continue
        for row in rows:
            line = _line(row, name)
            copy = Copy(name, line.row[1], str(row.get("updated") or ""), bool(row.get("moved")), order[name])
            copies.setdefault(line.row[0], []).append((copy, line))
    for cell, site in recorded_cells(grid_here).items():
        if site in merged.failed:
            reason = f"site {site} did not answer"
            line = Line(
                row=(cell, UNKNOWN, "", "", "", "", "", "", reason, site),
                state=CellState(State.PLANNED, reason=reason),
                under_way=frozenset({"site"}),
            )
            copies.setdefault(cell, []).append((Copy(site, UNKNOWN, order=order.get(site, len(order))), line))
    for cell in sorted(copies, key=lambda c: (copies[c][0][1].state is None, c)):
        best = min(copies[cell], key=lambda cl: rank(cl[0]))
        merged.lines.append(best[1])
        merged.chosen[cell] = best[0].site
    return merged


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
        return merged.lines

    if args.format == "json":
        print(json.dumps(cmd_status.as_json(read()), indent=1))
    elif args.watch:
        if args.interval <= 0:
            print("--interval must be more than 0 seconds", file=sys.stderr)
            return 2
        title = f"sft-grid status {args.grid} ({len(sites.placed)} sites)"
        cmd_status.Watch(
            grid_here, interval=args.interval, out=sys.stdout, tty=sys.stdout.isatty(), title=title, reader=read
        ).run()
    else:
        print("\n".join(cmd_status.report(read())))
    return 1 if said else 0


# -- results and report: the sites' files, pulled ---------------------------------------------------------------


def pull(sites: Sites, grid_here: Path) -> dict[str, str]:
    """Each site's grid directory, small files only, as one tar stream a site into `<grid here>/.sites/<site>/`
    (replaced whole once the stream is read); the sites that did not answer (name -> why), whose earlier copy, if
    any, is left as it was."""

    def one(p: Placed) -> tuple[str, str]:
        grid_there = str(Path(p.site.runs_root) / grid_here.name)
        answer = sites.run(p.site.name, there(p.site, p.code_dir, ["-c", PULL, grid_there, str(PULL_LIMIT)]))
        if answer.unreachable:
            return p.site.name, answer.unreachable
        if answer.returncode != 0:
            return p.site.name, f"the pull failed (exit status {answer.returncode}): " + answer.stderr.decode(
                errors="replace"
            ).strip()[-300:]
        dest = grid_here / SITES_DIR / p.site.name
        partial = dest.with_name(f".{p.site.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(answer.stdout), mode="r:gz") as tar:
            tar.extractall(partial, filter="data")
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
        return p.site.name, ""

    with ThreadPoolExecutor(max_workers=max(1, len(sites.placed))) as pool:
        return {name: why for name, why in pool.map(one, sites.placed) if why}


def merge_dirs(grid_here: Path, order: Sequence[str]) -> tuple[Path, dict[str, str]]:
    """`<grid here>/.merged/<grid>/`, made again: each cell a link to its chosen copy among the pulled ones (`choose`,
    on each copy's state read here from its files, no scheduler asked), each base model and each other file of the
    grid's directory a link to the first site's (in `order`) that has it. Returns it and each cell's site."""
    from sft_grid.core import events
    from sft_grid.core.layout import BASE_DIR, iter_cell_dirs
    from sft_grid.core.state import state_of
    from sft_grid.sites.moves import MOVE_FILE

    root = grid_here / SITES_DIR
    copies: dict[str, list[tuple[Copy, Path]]] = {}
    for i, site in enumerate(order):
        for d in iter_cell_dirs(root / site):
            history = events.read(d)
            copy = Copy(
                site,
                state_of(d, None, history).state.value,
                history[-1].time if history else "",
                (d / MOVE_FILE).is_file(),
                i,
            )
            copies.setdefault(d.name, []).append((copy, d))
    merged = grid_here / MERGED_DIR / grid_here.name
    shutil.rmtree(merged.parent, ignore_errors=True)
    (merged / BASE_DIR).mkdir(parents=True)
    chosen: dict[str, str] = {}
    for cell, found in copies.items():
        best, path = min(found, key=lambda cp: rank(cp[0]))
        (merged / cell).symlink_to(path.resolve())
        chosen[cell] = best.site
    for site in order:
        top = root / site
        others = [p for p in top.iterdir() if p.name not in copies and p.name != BASE_DIR] if top.is_dir() else []
        for p in [*others, *((top / BASE_DIR).iterdir() if (top / BASE_DIR).is_dir() else ())]:
            link = merged / p.relative_to(top)
            if not link.exists():
                link.symlink_to(p.resolve())
    return merged, chosen


def _pulled(sites: Sites, grid_here: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The merged directory of the pulled copies, each cell's site, and the sites that did not answer (each named on
    stderr with the cells the record puts there)."""
    failed = pull(sites, grid_here)
    recorded = recorded_cells(grid_here)
    for name, why in failed.items():
        cells = sorted(c for c, s in recorded.items() if s == name)
        print(
            f"site {name} did not answer: {why}" + (f"; its cells {', '.join(cells)} may be missing" if cells else ""),
            file=sys.stderr,
            flush=True,
        )
    merged, chosen = merge_dirs(grid_here, [p.site.name for p in sites.placed])
    return merged, chosen, failed


def _results(sites: Sites, args: argparse.Namespace, grid_here: Path) -> int:
    from sft_grid.cli import cmd_results

    merged, chosen, failed = _pulled(sites, grid_here)
    status = cmd_results.show(merged, args.grid, args.format, args.along, chosen)
    return 1 if failed else status


def _report(sites: Sites, args: argparse.Namespace, grid_here: Path) -> int:
    from sft_grid.analysis.page import write
    from sft_grid.core.layout import iter_cell_dirs

    merged, chosen, failed = _pulled(sites, grid_here)
    if not any(True for _ in iter_cell_dirs(merged)):
        print(f"no cells on any site of {args.grid}: nothing was written", file=sys.stderr)
        return 1
    for path in write(merged, args.resamples, chosen):  # written in the merged directory, then moved here
        print(path.replace(grid_here / path.name))
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
    try:
        return sites.transports[site].stream(argv)
    except SiteUnreachable as exc:
        print(f"site {site} did not answer: {exc}", file=sys.stderr)
        return 1


def _cancel(sites: Sites, raw: Sequence[str], grid: str, grid_here: Path) -> int:
    """`cancel` on every site, each site's answer printed under its name."""
    answers = sites.ask("cancel", lambda p: site_args(raw, grid, grid_here, p.site))
    for answer in answers.values():
        if answer.unreachable:
            _say_unreachable(answer)
            continue
        print(f"== site {answer.site}")
        sys.stdout.write(answer.stdout.decode(errors="replace"))
        sys.stderr.write(answer.stderr.decode(errors="replace"))
    sys.stdout.flush()
    failed = any(a.unreachable for a in answers.values())
    return 1 if failed or all(a.returncode != 0 for a in answers.values()) else 0


# -- the entry --------------------------------------------------------------------------------------------------


def _parsed(module: ModuleType, args: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(args))


def forward(
    command: str, args: Sequence[str], grid: str, grid_here: Path, placed: Sequence[Placed], connect: Connect = _connect
) -> int:
    """`sft-grid <command> <args>` (status, logs, cancel, results, report) of a grid across the remote sites
    `placed` (its record here): each site asked over its own transport (`connect`; the tests' is a local one), the
    answers merged (the module's docstring says how). `grid`: GRID as given; `grid_here`: its directory here."""
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
