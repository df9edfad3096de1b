"""One view of a grid across remote sites, read: each site of a grid whose record here (sites/remote.py,
`.site.json`) names several sites, each its own filesystem and Slurm, asked over its own transport, and the answers
merged per cell. cli/across.py prints what this reads.

Each site is asked over its own transport (`Site.transport()`: one ssh control connection a site, opened by the
first command, reused by each refresh, closed at the end), all sites at once (a thread a site), one command a site
a refresh. Each command is bounded in time (the site's `remote.timeout_s`; the connection's keepalive and connect
limits besides, sites/transport.py). A site that does not answer within them (`SiteUnreachable`, `SiteTimeout`) is
a `Reply` that says why and how long it was waited for; the others still answer.

A cell may have a copy on more than one site (queued on A, moved to B when A stopped answering: A's copy keeps its
submitted, failed or cancelled state and a move journal, `move.json`; or A's old job started later and ended at its
gate). The copy shown is chosen per cell name (`rank`): a completed copy first, then one in flight (running, then
submitted), then a copy of a site that did not answer (`unknown`), then the latest of the others; a copy with a
move journal comes after every other unless it completed.

- `read_status`: each site's `status <its grid dir> --format json`, merged by that rule: each chosen row as the
  site printed it, its site column the site it came from; the cells the record puts on a site that did not answer
  are `unknown`, and under way.
- `pull`, `merge_dirs`: of each site's grid directory, the files `results` and `report` read (`pull_spec`: no logs,
  no evaluation samples, no checkpoints; weight files by name only, empty, so a cell with final weights still reads
  as completed; a file over PULL_LIMIT empty, the trainer's log as its end, each a `Cut`) come here as one tar
  stream, written to a file, into `<grid here>/.sites/<site>/`; the chosen copies are linked into
  `<grid here>/.merged/<grid>/`, which the local results and report code reads (a cell's site: its `submitted`
  event's, else the site its copy came from). `missed`: what that directory lacks of a site that did not answer.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sft_grid.core.state import State, parse_time
from sft_grid.sites.remote import Placed, Site, command_there, recorded_cells, there
from sft_grid.sites.transport import SiteTimeout, SiteUnreachable, Transport, one_line

Connect = Callable[[Site], Transport]
UNKNOWN = "unknown"  # the state of a cell whose site did not answer
SITES_DIR, MERGED_DIR = ".sites", ".merged"
PULL_LIMIT = 64 << 20  # bytes: a larger file comes as an empty file of its name (a trainer log: its last bytes)
MANIFEST = ".pull.json"  # the pull's own note, in the stream: what it cut or left empty (path -> [size, kept])
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


def pull_spec(grid_files: Sequence[str] = ()) -> dict[str, Any]:
    """What a pull brings of a grid: the files `results` and `report` read (analysis/table.py, report_data.py and
    along.py, and the state rules of core/state.py), nothing else: no logs (the training's, the evaluation's results
    and samples), no checkpoints, no data. Per cell: its cell.yaml, ledger, estimate and move journal, the trainer's
    state, per-step log and results, the score files; the weight files and a ZeRO run's shard folder (`latest`
    names it) by name only, empty, so a completed cell reads as completed. Per grid: the base models' score files
    and `grid_files` (patterns under the grid's directory: the adaptive round's file, which the caller names, as
    sites/ imports no analysis). A file over PULL_LIMIT comes empty, the trainer's log as its last PULL_LIMIT bytes
    (the final loss and the progress read its end; the report's curve then starts later), each noted in the
    manifest."""
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
        "grid": [*grid_files, f"{at.BASE_DIR}/*/{at.EVAL_DIR}/*.json"],
        "manifest": MANIFEST,
    }


def _connect(site: Site) -> Transport:
    return site.transport(check=False)  # the grid runs its launch's snapshot there, whose dependencies may differ


@dataclass(frozen=True)
class Reply:
    """What one site's command printed (its exit status and output), or why the site did not answer."""

    site: str
    returncode: int = 0
    stdout: bytes = b""
    stderr: bytes = b""
    unreachable: str = ""  # why the site did not answer ("" when it did)
    seconds: float = 0.0  # how long it was waited for


class Sites:
    """The grid's remote sites, each over its own transport (`connect`; None: the site's own, `Site.transport`):
    opened at the first command, kept for the next (a refresh of --watch), closed by `close` (the `with` block's
    end)."""

    def __init__(self, placed: Sequence[Placed], connect: Connect | None = None) -> None:
        self.placed = list(placed)
        self.transports = {p.site.name: (connect or _connect)(p.site) for p in self.placed}

    def __enter__(self) -> Sites:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def ask(self, command: str, args_of: Callable[[Placed], Sequence[str] | None]) -> dict[str, Reply]:
        """`sft-grid <command> <args_of(site)>` on every site (None: that site is not asked), all at once; each
        site's reply by its name, in the record's order."""
        asked = [(p, args) for p in self.placed if (args := args_of(p)) is not None]

        def one(p: Placed, args: Sequence[str]) -> Reply:
            return self.run(p.site.name, there(p.site, p.code_dir, command_there(command, args)))

        with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
            replies = list(pool.map(lambda pa: one(*pa), asked))
        return {r.site: r for r in replies}

    def run(self, name: str, argv: Sequence[str], out: IO[bytes] | None = None) -> Reply:
        """A raw argv on one site (a pull: its output written to `out`), as `ask` reports it. The transport bounds
        its time (the site's `remote.timeout_s`); a site that does not answer within it, or whose connection fails
        or goes silent (sites/transport.py), is a Reply with `unreachable` set: one line, how long it was waited
        for included."""
        start = time.monotonic()
        try:
            done = self.transports[name].run(argv, check=False, out=out)
        except SiteUnreachable as exc:
            waited = time.monotonic() - start
            why = str(exc) or "no answer"
            if not isinstance(exc, SiteTimeout):
                why += f" (after {waited:.0f} s)"
            return Reply(name, unreachable=why, seconds=waited)
        return Reply(name, done.returncode, done.stdout, done.stderr, seconds=time.monotonic() - start)


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
    """One merged reading of the sites' status: the chosen rows by cell name (each a row of a site's `status
    --format json`, cli/cmd_status.as_json, with "site" the site it came from), the site each cell's row came from,
    and the sites that did not answer (name -> why)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _rows(reply: Reply) -> list[Mapping[str, Any]] | None:
    """The rows of a site's `status --format json`; None when it did not answer or printed no such object."""
    if reply.unreachable:
        return None
    try:
        rows: list[Mapping[str, Any]] = json.loads(reply.stdout)["rows"]
    except (ValueError, KeyError, TypeError):
        return None
    return rows


def read_status(sites: Sites, grid_here: Path) -> Merged:
    """Every site's `status --format json` (one command a site), merged per cell by `choose`; the cells the record
    puts on a site that did not answer are `unknown` (and under way: nothing says they ended)."""
    replies = sites.ask("status", lambda p: [str(Path(p.site.runs_root) / grid_here.name), "--format", "json"])
    merged = Merged()
    copies: dict[str, list[tuple[Copy, dict[str, Any]]]] = {}
    order = {p.site.name: i for i, p in enumerate(sites.placed)}
    for name, reply in replies.items():
        rows = _rows(reply)
        if rows is None:
            merged.failed[name] = reply.unreachable or (
                f"its status failed (exit status {reply.returncode}): "
                + one_line(reply.stderr.decode(errors="replace"))
            )
            continue
        for row in rows:
            mine = {**row, "site": name}
            state, updated = str(row.get("state") or ""), str(row.get("updated") or "")
            copy = Copy(name, state, updated, bool(row.get("moved")), order[name])
            copies.setdefault(str(row.get("cell") or ""), []).append((copy, mine))
    for cell, site in recorded_cells(grid_here).items():
        if site in merged.failed:
            reason = f"site {site} did not answer"
            unknown = {"cell": cell, "state": UNKNOWN, "reason": reason, "site": site, "under_way": ["site"]}
            copies.setdefault(cell, []).append((Copy(site, UNKNOWN, order=order.get(site, len(order))), unknown))
    for cell in sorted(copies):
        best, shown = min(copies[cell], key=lambda cr: rank(cr[0]))
        merged.rows.append(shown)
        merged.chosen[cell] = best.site
    return merged


# -- results and report: the sites' files, pulled ---------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """A file of a site's pull over the pull's limit: `kept` bytes of its `size` came here (its end; 0: an empty
    file of its name)."""

    site: str
    path: str  # under the grid's directory
    size: int
    kept: int
    limit: int


@dataclass
class Pulled:
    """What a pull of every site left: the sites that did not answer (name -> why, one line) and the files it cut."""

    failed: dict[str, str] = field(default_factory=dict)
    cut: list[Cut] = field(default_factory=list)


def _cuts(site: str, manifest: Path, limit: int) -> list[Cut]:
    """The files of a site's pull over `limit`, as its manifest notes them."""
    try:
        noted: dict[str, list[int]] = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return []
    return [Cut(site, rel, size, kept, limit) for rel, (size, kept) in sorted(noted.items())]


def pull(sites: Sites, grid_here: Path, grid_files: Sequence[str] = ()) -> Pulled:
    """Each site's files that `results` and `report` read (`pull_spec(grid_files)`), as one tar stream a site written
    to a file (never held in memory), extracted into `<grid here>/.sites/<site>/` (replaced whole once the stream is
    read). A site that did not answer keeps its earlier copy, if any, as it was."""
    spec = pull_spec(grid_files)
    spec_json = json.dumps(spec, separators=(",", ":"))
    top = grid_here / SITES_DIR
    top.mkdir(parents=True, exist_ok=True)

    def one(p: Placed) -> tuple[str, str, list[Cut]]:
        name, grid_there = p.site.name, str(Path(p.site.runs_root) / grid_here.name)
        stream = top / f".{name}.tar.gz"
        try:
            with stream.open("wb") as out:
                reply = sites.run(name, there(p.site, p.code_dir, ["-c", PULL, grid_there, spec_json]), out=out)
            if reply.unreachable:
                return name, reply.unreachable, []
            if reply.returncode != 0:
                why = one_line(reply.stderr.decode(errors="replace"))
                return name, f"its pull failed (exit status {reply.returncode}): {why}", []
            dest = top / name
            partial = top / f".{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            with tarfile.open(stream, mode="r:gz") as tar:
                tar.extractall(partial, filter="data")
            cut = _cuts(name, partial / MANIFEST, spec["limit"])
            shutil.rmtree(dest, ignore_errors=True)
            partial.rename(dest)
            return name, "", cut
        except (OSError, EOFError, tarfile.TarError, zlib.error) as exc:
            return name, f"its files came cut ({type(exc).__name__}: {exc})", []
        finally:
            stream.unlink(missing_ok=True)

    pulled = Pulled()
    with ThreadPoolExecutor(max_workers=max(1, len(sites.placed))) as pool:
        for name, why, cut in pool.map(one, sites.placed):
            if why:
                pulled.failed[name] = why
            pulled.cut += cut
    return pulled


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


@dataclass(frozen=True)
class Missed:
    """What the merged output lacks of the cells the record puts on a site that did not answer (`why`): those in no
    copy here, those shown from its earlier pull (made at `pulled_at`, seconds since the epoch), and those shown
    from another site's copy."""

    site: str
    why: str
    missing: tuple[str, ...] = ()
    earlier: tuple[str, ...] = ()
    other: tuple[str, ...] = ()
    pulled_at: float = 0.0


def missed(failed: Mapping[str, str], grid_here: Path, chosen: Mapping[str, str]) -> list[Missed]:
    """Each site that did not answer (`failed`: name -> why), with what the output then lacks of the record's cells
    of that site (`chosen`: each cell in the output -> the site its copy came from)."""
    recorded = recorded_cells(grid_here)
    out = []
    for name, why in failed.items():
        cells = sorted(c for c, s in recorded.items() if s == name)
        earlier = tuple(c for c in cells if chosen.get(c) == name)
        out.append(
            Missed(
                name,
                why,
                missing=tuple(c for c in cells if c not in chosen),
                earlier=earlier,
                other=tuple(c for c in cells if c in chosen and chosen[c] != name),
                pulled_at=(grid_here / SITES_DIR / name).stat().st_mtime if earlier else 0.0,
            )
        )
    return out
