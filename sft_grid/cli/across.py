"""One view of a grid across remote sites: `status`, `logs`, `cancel`, `results` and `report` of a grid whose record
here (sites/remote.py, `.site.json`) names several sites, each its own filesystem and Slurm.

Each site is asked over its own transport (`Site.transport()`: one ssh control connection a site, opened by the
first command, reused by each refresh, closed at the end), all sites at once (a thread a site), one command a site
a refresh. Each command is bounded in time (the site's `remote.timeout_s`; the connection's keepalive and connect
limits besides, sites/transport.py). A site that does not answer within them (`SiteUnreachable`, `SiteTimeout`) is
named on stderr in one line (why, how long it was waited for, what the output lacks) and the others still answer;
the merged answer is printed and the exit status is 1.

A cell may have a copy on more than one site (queued on A, moved to B when A stopped answering: A's copy keeps its
submitted, failed or cancelled state and a move journal, `move.json`; or A's old job started later and ended at its
gate). The copy shown is chosen per cell name (`rank`): a completed copy first, then one in flight (running, then
submitted), then a copy of a site that did not answer (`unknown`), then the latest of the others; a copy with a
move journal comes after every other unless it completed.

- status: each site runs `status <its grid dir> --format json`; the rows are merged by that rule, the site column
  set to the site each row came from, and printed as `status` prints a grid (`--format json`: the merged rows as
  JSON). `--watch` refreshes the merged table every --interval seconds (one command a site each time) until nothing
  is under way; a site that does not answer keeps its cells `unknown`, and under way.
- results, report: of each site's grid directory, the files those two commands read and nothing else
  (`pull_spec`: no logs, no evaluation samples, no checkpoints; weight files by name only, empty, so a cell with
  final weights still reads as completed; a file over PULL_LIMIT empty, the trainer's log as its end) come here as
  one tar stream, written to a file, into `<grid here>/.sites/<site>/`; the chosen copies are linked into
  `<grid here>/.merged/<grid>/` and the local results and report code reads that directory, so a spread grid's
  results are those of the same grid on one site, the site column aside (a cell's site: its `submitted` event's,
  else the site its copy came from). The report's page and data are written here.
- logs: on the site that holds the cell's chosen copy (a merged status read first); cancel: on every site.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from sft_grid.cli.cmd_status import BASE_ROW, HEADERS, Line
from sft_grid.core.state import CellState, State, parse_time
from sft_grid.sites.remote import Placed, Site, command_there, recorded_cells, site_args, there
from sft_grid.sites.transport import SiteTimeout, SiteUnreachable, Transport, one_line

Connect = Callable[[Site], Transport]
UNKNOWN = "unknown"  # the state of a cell whose site did not answer
SITES_DIR, MERGED_DIR = ".sites", ".merged"
PULL_LIMIT = 64 << 20  # bytes: a larger file comes as an empty file of its name (a trainer log: its last bytes)
MANIFEST = ".pull.json"  # the pull's own note, in the stream: what it cut or left empty (path -> [size, kept])
NAMED = 4  # cells named in a line before "and N more"
# the site's side of a pull: a tar stream (gzip) of the grid directory's files that `results` and `report` read
# (`pull_spec`), on stdout; stdlib only, so it runs on any python of the site. argv: the grid directory there, the
# spec (JSON). A file that changes while it is read is read whole first, so the stream is never cut; symlinks and
# dot-entries are left out (the grid's lock, submitit's folders, files being written under a temporary name).
PULL = r"""
import glob, io, json, os, sys, tarfile
root, spec = sys.argv[1], json.loads(sys.argv[2])
limit, noted = spec["limit"], {}

def found(base, patterns):
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(glob.escape(base), pattern))):
            if not os.path.islink(path):
                yield path

def add(tar, path, content, tail=False):
    rel = os.path.relpath(path, root)
    try:
        info = tar.gettarinfo(path, rel)
        if info.isdir():
            tar.addfile(info)
            return
        data = b""
        if content:
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
            if len(data) > limit and tail:
                with open(path, "rb") as fh:
                    size = fh.seek(0, 2)
                    fh.seek(size - limit)
                    data = fh.read()
                data = data[data.find(b"\n") + 1 :]
                noted[rel] = [size, len(data)]
            elif len(data) > limit:
                noted[rel], data = [os.path.getsize(path), 0], b""
    except OSError:
        return
    if info.isfile():
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
    for path in found(root, spec["grid"]):
        add(tar, path, True)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        cell = os.path.join(root, name)
        if name.startswith(".") or os.path.islink(cell) or not os.path.isfile(os.path.join(cell, spec["marker"])):
            continue
        for path in found(cell, spec["files"]):
            add(tar, path, True, os.path.relpath(path, cell) in spec["tails"])
        for path in found(cell, spec["names"]):
            add(tar, path, False)
        for pointer in found(cell, spec["pointers"]):
            try:
                target = os.path.join(os.path.dirname(pointer), open(pointer).read().strip())
            except (OSError, ValueError):
                continue
            inside = os.path.realpath(target).startswith(os.path.realpath(cell) + os.sep)
            if inside and os.path.isdir(target) and not os.path.islink(target):
                add(tar, target, False)
    note = json.dumps(noted).encode()
    info = tarfile.TarInfo(spec["manifest"])
    info.size = len(note)
    tar.addfile(info, io.BytesIO(note))
"""


def pull_spec() -> dict[str, Any]:
    """What a pull brings of a grid: the files `results` and `report` read (analysis/table.py, report_data.py and
    along.py, and the state rules of core/state.py), nothing else: no logs (the training's, the evaluation's results
    and samples), no checkpoints, no data. Per cell: its cell.yaml, ledger, estimate and move journal, the trainer's
    state, per-step log and results, the score files; the weight files and a ZeRO run's shard folder (`latest`
    names it) by name only, empty, so a completed cell reads as completed. Per grid: the adaptive round and the base
    models' score files. A file over PULL_LIMIT comes empty, the trainer's log as its last PULL_LIMIT bytes (the
    final loss and the progress read its end; the report's curve then starts later), each noted in the manifest."""
    from sft_grid.analysis.report_data import ADAPTIVE_FILE
    from sft_grid.core import layout as at
    from sft_grid.sites.moves import MOVE_FILE

    out = at.OUTPUT_DIR
    return {
        "limit": PULL_LIMIT,
        "marker": at.CELL_FILE,
        "files": [
            at.CELL_FILE,
            at.LEDGER_FILE,
            at.ESTIMATE_FILE,
            MOVE_FILE,
            f"{out}/{at.TRAINER_STATE}",
            f"{out}/{at.TRAINER_LOG}",
            *(f"{out}/{name}" for name in at.TRAIN_RESULTS),
            f"{out}/latest",
            f"{at.EVAL_DIR}/*.json",
        ],
        "tails": [f"{out}/{at.TRAINER_LOG}"],
        "names": [f"{out}/{name}" for name in at.WEIGHT_FILES],
        "pointers": [f"{out}/latest"],
        "grid": [ADAPTIVE_FILE, f"{at.BASE_DIR}/*/{at.EVAL_DIR}/*.json"],
        "manifest": MANIFEST,
    }


def _connect(site: Site) -> Transport:
    return site.transport(check=False)  # the grid runs its launch's snapshot there, whose dependencies may differ


@dataclass(frozen=True)
class Answer:
    """One site's answer to one command: its exit status and output, or why it did not answer."""

    site: str
    returncode: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    unreachable: str = ""  # why the site did not answer ("" when it did)
    seconds: float = 0.0  # how long it was waited for


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

    def run(self, name: str, argv: Sequence[str], out: IO[bytes] | None = None) -> Answer:
        """A raw argv on one site (a pull: its output written to `out`), as `ask` reports it. The transport bounds
        its time (the site's `remote.timeout_s`); a site that does not answer within it, or whose connection fails
        or goes silent (sites/transport.py), is an Answer with `unreachable` set: one line, how long it was waited
        for included."""
        start = time.monotonic()
        try:
            done = self.transports[name].run(argv, check=False, out=out)
        except SiteUnreachable as exc:
            waited = time.monotonic() - start
            why = str(exc) or "no answer"
            if not isinstance(exc, SiteTimeout):
                why += f" (after {waited:.0f} s)"
            return Answer(name, unreachable=why, seconds=waited)
        return Answer(name, done.returncode, done.stdout, done.stderr, seconds=time.monotonic() - start)


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
                + one_line(answer.stderr.decode(errors="replace"))
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
    """Each site's files that `results` and `report` read (`pull_spec`), as one tar stream a site written to a file
    (never held in memory), extracted into `<grid here>/.sites/<site>/` (replaced whole once the stream is read);
    the sites that did not answer (name -> why, one line), whose earlier copy, if any, is left as it was. Each file
    the pull cut or left empty (over PULL_LIMIT) is named on stderr."""
    spec = json.dumps(pull_spec(), separators=(",", ":"))
    top = grid_here / SITES_DIR
    top.mkdir(parents=True, exist_ok=True)

    def one(p: Placed) -> tuple[str, str]:
        name, grid_there = p.site.name, str(Path(p.site.runs_root) / grid_here.name)
        stream = top / f".{name}.tar.gz"
        try:
            with stream.open("wb") as out:
                answer = sites.run(name, there(p.site, p.code_dir, ["-c", PULL, grid_there, spec]), out=out)
            if answer.unreachable:
                return name, answer.unreachable
            if answer.returncode != 0:
                why = one_line(answer.stderr.decode(errors="replace"))
                return name, f"its pull failed (exit status {answer.returncode}): {why}"
            dest = top / name
            partial = top / f".{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            with tarfile.open(stream, mode="r:gz") as tar:
                tar.extractall(partial, filter="data")
            _say_cut(name, partial / MANIFEST)
            shutil.rmtree(dest, ignore_errors=True)
            partial.rename(dest)
            return name, ""
        except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
            return name, f"its files came cut ({type(exc).__name__}: {exc})"
        finally:
            stream.unlink(missing_ok=True)

    with ThreadPoolExecutor(max_workers=max(1, len(sites.placed))) as pool:
        return {name: why for name, why in pool.map(one, sites.placed) if why}


def _names(cells: Sequence[str]) -> str:
    shown = ", ".join(cells[:NAMED])
    return shown + (f" and {len(cells) - NAMED} more" if len(cells) > NAMED else "")


def _say_cut(site: str, manifest: Path) -> None:
    """The files of a site's pull over PULL_LIMIT, named on stderr: what the output lacks of them."""
    try:
        noted: dict[str, list[int]] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return
    for rel, (size, kept) in sorted(noted.items()):
        what = f"its last {kept} bytes" if kept else "an empty file of its name"
        print(
            f"site {site}: {rel} is {size} bytes, over the pull's {PULL_LIMIT} bytes: {what} came here",
            file=sys.stderr,
            flush=True,
        )


def _say_missed(failed: Mapping[str, str], grid_here: Path, chosen: Mapping[str, str]) -> None:
    """Each site that did not answer, on stderr, one line: why (how long it was waited for), and what the output
    then lacks: the record's cells of that site missing from it, shown from an earlier pull (when), or from
    another site's copy."""
    recorded = recorded_cells(grid_here)
    for name, why in failed.items():
        cells = sorted(c for c, s in recorded.items() if s == name)
        missing = [c for c in cells if c not in chosen]
        earlier = [c for c in cells if chosen.get(c) == name]
        other = [c for c in cells if c in chosen and chosen[c] != name]
        said = []
        if missing:
            said.append(f"{len(missing)} of its cells are missing from the output: {_names(missing)}")
        if earlier:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime((grid_here / SITES_DIR / name).stat().st_mtime))
            said.append(f"{len(earlier)} are shown as pulled at {when}: {_names(earlier)}")
        if other:
            said.append(f"{len(other)} are shown from another site's copy: {_names(other)}")
        print(f"site {name} did not answer: {why}" + "".join(f"; {x}" for x in said), file=sys.stderr, flush=True)


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
        others = (
            [p for p in top.iterdir() if p.name not in copies and p.name != BASE_DIR and not p.name.startswith(".")]
            if top.is_dir()
            else []
        )
        for p in [*others, *((top / BASE_DIR).iterdir() if (top / BASE_DIR).is_dir() else ())]:
            link = merged / p.relative_to(top)
            if not link.exists():
                link.symlink_to(p.resolve())
    return merged, chosen


def _pulled(sites: Sites, grid_here: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The merged directory of the pulled copies, each cell's site, and the sites that did not answer (each named on
    stderr with what the output lacks of the cells the record puts there)."""
    failed = pull(sites, grid_here)
    merged, chosen = merge_dirs(grid_here, [p.site.name for p in sites.placed])
    _say_missed(failed, grid_here, chosen)
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
    try:  # --follow runs until its part of the cell ends: the connection's keepalive is its limit
        return sites.transports[site].stream(argv, timeout=None if args.follow else placed.site.timeout_s)
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
