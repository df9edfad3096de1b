"""sft-grid status [GRID] [--runs-root DIR] [--watch [--interval S]] [--format table|json]: every cell of a grid, its
state and progress.

State comes from each cell's own output and ledger, never from a cache: completed means final weights and
trainer state are there. Slurm's view of every job comes from one sacct call (plus one squeue) for the grid.

--watch reads the grid again every S seconds, with that one query each time, until nothing of it is under way (no
cell queued or training, no post-training stage or evaluation queued or running), then prints the final table;
Ctrl-C leaves at once (the grid goes on). On a terminal the table is redrawn in place; elsewhere (a pipe, a log) a
table is printed, with the time, each time something other than the elapsed times changed.

--format json prints the same lines once, as one JSON object (`as_json`): what a grid across remote sites reads of
each site (sites/merged.py), and what a script reads.

A cell whose files are damaged (analysis/view.py, read leniently) is a row like the others: `damaged` in its state
column where the cell itself cannot be read (its cell.yaml, its ledger, its trainer's state), else its state with
what the damage changes beside it ("completed, log ends at step 10 of 100"), or `damaged` in the post or eval column;
the reason says which file and where, and a line per damaged file follows the table. Nothing is written to a damaged
cell (no triage, no notification). The exit status is 0 whatever the cells' states, damaged ones included: status
reports, it is no verdict.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from sft_grid.analysis.view import GridView
    from sft_grid.core.cellfiles import Damage
    from sft_grid.core.state import CellState

# post: the post-training chain: "done", or its first unfinished stage and that stage's state; eval: the evaluation,
# "done (N)" when every score its suites ask for is there, else its state and how many of them are
# class: a failure's class (core/failures); reason: what its policy did, then the evidence that decided it
# site: where the cell's latest submission went, in a grid across sites; the column is left out of the
# table when no cell has one
HEADERS = ("cell", "state", "job", "elapsed", "progress", "post", "eval", "class", "reason", "site")
ELAPSED = HEADERS.index("elapsed")
REASON = HEADERS.index("reason")
BASE_ROW = "base model"  # the state column of a base model's row
DAMAGED = "damaged"  # the state column of a cell that cannot be read as what it is (and a column a file of it feeds)
DEFAULT_INTERVAL_S = 10.0
FORMATS = ("table", "json")
# the terminal's alternate screen (left on exit, so the final table stays in the scrollback), cursor home, clear
ALT_ON, ALT_OFF, HOME, CLEAR_EOL, CLEAR_BELOW = "\x1b[?1049h", "\x1b[?1049l", "\x1b[H", "\x1b[K", "\x1b[J"


@dataclass(frozen=True)
class Line:
    """A row of the table, the cell's state (None: a base model's row) and what of it is still under way."""

    row: tuple[str, ...]
    state: CellState | None
    # "train" (its job queued or training), "post" (post-training stages), "eval" (its evaluation), "job" (the
    # local job, which runs all three, still alive)
    under_way: frozenset[str] = frozenset()
    updated: str = ""  # the time of the cell's last ledger event ("" for a base model's row)
    damage: tuple[Damage, ...] = ()  # its damaged files (analysis/view.py)


def rows(cell_dirs: Iterable[Path], base_dirs: Iterable[Path] = ()) -> list[tuple[str, ...]]:
    """One row a cell, then one a base model its cells' suites evaluate (`eval` column only)."""
    return [line.row for line in read(cell_dirs, base_dirs)]


def read(cell_dirs: Iterable[Path], base_dirs: Iterable[Path] = ()) -> list[Line]:
    """Each cell's line, then each base model's: one scheduler query (sacct + squeue) for all of them."""
    from sft_grid.analysis.view import read_view
    from sft_grid.core.cellfiles import READ_ERRORS, damage_of
    from sft_grid.grid.triage import settle

    dirs, bases = list(cell_dirs), list(base_dirs)
    view = read_view(dirs, base_dirs=bases, lenient=True)
    # records the class of failures the scheduler ended, once; notifies ends: never in a cell that cannot be read
    fine = [d for d in dirs if not view.whole_damage(d)]
    try:
        view = settle(view, fine)
    except READ_ERRORS:  # a file a triage reads is damaged: each cell on its own, that one's damage said
        view = read_view(dirs, base_dirs=bases, lenient=True)  # what was recorded before it
        for d in fine:
            try:
                view = settle(view, [d])
            except READ_ERRORS as exc:
                view = view.with_damage({d: [damage_of(d, exc, whole=False)]})
    return lines_of(view, dirs, bases)


def lines_of(view: GridView, dirs: Sequence[Path], bases: Sequence[Path] = ()) -> list[Line]:
    from sft_grid.cli.present import progress_text
    from sft_grid.core import events
    from sft_grid.core.events import Kind
    from sft_grid.core.failures.cell import describe_data_step, open_data_step
    from sft_grid.core.state import State, alive, slurm_ref
    from sft_grid.stages.evaluate import state_of as eval_state
    from sft_grid.stages.post_training import busy, summary

    out: list[Line] = []
    for cell_dir in dirs:
        history = view.histories[cell_dir]
        st = view.state(cell_dir)
        damage = list(view.damaged(cell_dir))
        whole = view.whole_damage(cell_dir)
        read = _Guard(cell_dir, damage)
        done = st.state is State.COMPLETED and not whole
        chain, why, ev, eval_text = "", "", None, ""
        if done:
            chain, why = read((DAMAGED, ""), summary, cell_dir, history, view.scheduler)
            ev = read(None, eval_state, cell_dir, history, view.scheduler)
            eval_text = ev.text() if ev is not None else DAMAGED
        reason = st.reason or why or (f"eval: {ev.reason}" if ev is not None and ev.reason else "")
        if st.evidence and st.evidence not in reason:
            reason += f" | evidence: {st.evidence}"
        progress = progress_text(st)
        if st.state is State.RUNNING and not progress:  # no step yet: tokenizing or loading its data, maybe
            step = read(None, open_data_step, cell_dir, history)
            progress = f"data step: {describe_data_step(step)}" if step else ""
        under_way = set()
        if st.state.in_flight:
            under_way.add("train")
        if done and read(False, busy, cell_dir, history, view.scheduler):
            under_way.add("post")
        if ev is not None and ev.state in ("queued", "running"):
            under_way.add("eval")
        # a local job records `completed`, then runs the post stages and the evaluation: under way while it lives
        running = events.last(history, Kind.RUNNING)
        if slurm_ref(history) is None and running is not None and alive(running) is True:
            under_way.add("job")
        shown_state = st.state.value
        if whole:
            shown_state = DAMAGED
            reason = "; ".join(d.text() for d in damage) + f" (the rest reads as {st.state.value})"
        elif damage:
            flags = [d.flag for d in damage if d.flag]
            shown_state += "".join(f", {f}" for f in flags)
            reason = "; ".join([*(d.text() for d in damage), *([reason] if reason else [])])
        row = (
            cell_dir.name,
            shown_state,
            st.job_id,
            st.elapsed,
            progress,
            chain,
            eval_text,
            st.failure_class or "",
            reason,
            events.submitted_site(history)[0],
        )
        updated = history[-1].time if history else ""
        out.append(Line(row=row, state=st, under_way=frozenset(under_way), updated=updated, damage=tuple(damage)))
    for base in bases:
        damage = list(view.damaged(base))
        ev = _Guard(base, damage)(None, eval_state, base, view.histories[base], view.scheduler)
        reason = "; ".join(d.text() for d in damage) if damage else ev.reason if ev is not None else ""
        out.append(
            Line(
                row=(
                    f"{base.parent.name}/{base.name}",
                    BASE_ROW,
                    "",
                    "",
                    "",
                    "",
                    DAMAGED if ev is None else ev.text(),
                    "",
                    reason,
                    "",
                ),
                state=None,
                under_way=frozenset({"eval"}) if ev is not None and ev.state in ("queued", "running") else frozenset(),
                damage=tuple(damage),
            )
        )
    return out


class _Guard:
    """Calls a reader of one cell's files: where a file it parses is damaged, its damage is added to the cell's
    (named: core/cellfiles.damage_of) and the default is returned, so one damaged file never stops the table. Where
    a reader returns None, its default says it failed: give one that is not None (eval_state's is, and says so)."""

    def __init__(self, cell_dir: Path, damage: list[Damage]) -> None:
        self.cell_dir, self.damage = cell_dir, damage

    def __call__(self, default: Any, reader: Callable[..., Any], *args: Any) -> Any:
        from sft_grid.core.cellfiles import READ_ERRORS, damage_of

        try:
            return reader(*args)
        except READ_ERRORS as exc:
            found = damage_of(self.cell_dir, exc, whole=False)
            if found not in self.damage:
                self.damage.append(found)
            return default


def base_dirs(sweep_dir: Path) -> list[Path]:
    """The grid's base models that have an evaluation (<sweep dir>/_base/<model>-<key>/eval.json)."""
    from sft_grid.core.scores import BASE_DIR, EVAL_FILE

    return sorted(p.parent for p in (sweep_dir / BASE_DIR).glob(f"*/{EVAL_FILE}"))


def shown(found: Sequence[Line]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The table's headers and rows: the reason cut at 160 characters, the site column only in a grid with sites."""
    with_site = any(r.row[-1] for r in found)
    keep = len(HEADERS) if with_site else len(HEADERS) - 1
    rows = [(*r.row[:REASON], r.row[REASON][:160], *r.row[REASON + 1 :])[:keep] for r in found]
    return HEADERS[:keep], rows


def report(found: Sequence[Line], grid: Sequence[Damage] = ()) -> list[str]:
    """The table, how many cells are in each state, the failed ones by class, and a line per damaged file (`grid`:
    the grid's own damaged records, grid/view.grid_damage)."""
    from sft_grid.cli.present import damage_lines, failure_lines, table

    out = [table(*shown(found))]
    counts: dict[str, int] = {}
    cells = [(r.row, r.state) for r in found if r.state is not None]
    for row, _ in cells:
        state = row[1].split(", ", 1)[0]  # a part of the cell damaged: counted as its state ("completed, log ...")
        counts[state] = counts.get(state, 0) + 1
    out += ["", f"{len(cells)} cell(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    failed = failure_lines([(row[0], state) for row, state in cells if row[1] != DAMAGED], per_class=len(found))
    if failed:
        out += ["", "failed or cancelled, by class:", *failed]
    damaged = damage_lines([(r.row[0], r.damage) for r in found], grid)
    if damaged:
        out += ["", *damaged]
    return out


def as_json(found: Sequence[Line], dirs: Sequence[Path] = (), grid: Sequence[Damage] = ()) -> dict[str, Any]:
    """The lines as one JSON object: {"headers": HEADERS, "rows": [{header: value, ..., "under_way": [...],
    "advice": the failure policy's message, "updated": the time of the cell's last ledger event (read with the
    lines), "moved": whether the cell's directory holds a move journal (sites/moves.py), "damaged": a line per
    damaged file of it}], "damaged": a line per damaged record of the grid}. The extra keys are what a merge of
    several sites' copies of a cell needs (sites/merged.py); the reason is whole (the table cuts it)."""
    from sft_grid.sites.moves import MOVE_FILE

    by_name = {d.name: d for d in dirs}
    out = []
    for line in found:
        cell_dir = by_name.get(line.row[0]) if line.state is not None else None
        out.append(
            {
                **dict(zip(HEADERS, line.row, strict=True)),
                "under_way": sorted(line.under_way),
                "advice": line.state.advice if line.state is not None else "",
                "updated": line.updated,
                "moved": cell_dir is not None and (cell_dir / MOVE_FILE).is_file(),
                "damaged": [d.text() for d in line.damage],
            }
        )
    return {"headers": list(HEADERS), "rows": out, "damaged": [d.text() for d in grid]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_format, add_grid

    add_grid(parser, optional=True)
    add_format(parser, FORMATS)
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")
    parser.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="read the grid again every --interval seconds until nothing of it is under way",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds between two reads of --watch (default {DEFAULT_INTERVAL_S:g}; one sacct and one squeue each)",
    )


def interval_problem(args: argparse.Namespace) -> str:
    """What is wrong with --interval ("" nothing): given without --watch (a pause between reads that never come),
    or not above 0."""
    if args.interval is None:
        return ""
    if not args.watch:
        return (
            f"--interval is the pause of --watch between two reads: add --watch (sft-grid status"
            f" {args.grid or 'GRID'} --watch --interval {args.interval:g}), or drop --interval"
        )
    return "" if args.interval > 0 else "--interval must be more than 0 seconds"


def interval_of(args: argparse.Namespace) -> float:
    return DEFAULT_INTERVAL_S if args.interval is None else float(args.interval)


def run(args: argparse.Namespace) -> int:
    from sft_grid.analysis.view import cell_dirs, grid_damage
    from sft_grid.cli.options import grid_dir
    from sft_grid.cli.present import no_grid

    why = interval_problem(args)
    if why:
        print(why, file=sys.stderr)
        return 2
    sweep_dir = grid_dir(args.grid, args.runs_root)
    dirs = cell_dirs(sweep_dir)
    if args.format == "json":  # once (--watch is for people); no cells: no rows, and the exit status says so
        found = read(dirs, base_dirs(sweep_dir))
        print(json.dumps(as_json(found, dirs, grid_damage(sweep_dir)), indent=1))
        if not dirs:
            print(no_grid(sweep_dir, args.grid) or f"no cells under {sweep_dir}", file=sys.stderr)
        return 0 if dirs else 1
    if not dirs:  # no grid there: what is (the grids under the runs root, the closest first)
        print(no_grid(sweep_dir, args.grid) or f"no cells under {sweep_dir}", file=sys.stderr)
        return 1
    if args.watch:
        title = f"sft-grid status {args.grid}"
        Watch(sweep_dir, interval=interval_of(args), out=sys.stdout, tty=sys.stdout.isatty(), title=title).run()
        return 0
    print("\n".join(report(read(dirs, base_dirs(sweep_dir)), grid_damage(sweep_dir))))
    return 0


class Watch:
    """`status --watch`: the grid read again every `interval` seconds (one scheduler query each time) until nothing
    of it is under way, or `stop` is set (Ctrl-C sets it: the read in progress finishes, nothing is left
    half-written in a ledger; a second Ctrl-C interrupts at once). `reader`: what one read is, when it is not this
    machine's read of `sweep_dir` (a grid across remote sites: each site asked, the answers merged)."""

    def __init__(
        self,
        sweep_dir: Path,
        *,
        interval: float,
        out: TextIO,
        tty: bool,
        title: str,
        stop: threading.Event | None = None,
        reader: Callable[[], Sequence[Line]] | None = None,
    ) -> None:
        self.sweep_dir, self.interval, self.out, self.tty, self.title = sweep_dir, interval, out, tty, title
        self.reader = reader or self._read
        self.stop = stop or threading.Event()
        self.refreshes = 0  # reads of the grid, each with one scheduler query
        self.shown: tuple[tuple[str, ...], ...] | None = None  # the rows last printed, elapsed times left out
        self.last: list[str] = []

    def _read(self) -> Sequence[Line]:
        from sft_grid.analysis.view import cell_dirs

        return read(cell_dirs(self.sweep_dir), base_dirs(self.sweep_dir))

    def run(self) -> None:
        # Ctrl-C sets `stop` (then is Python's again), where signals are this thread's to handle
        mine = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self._interrupted) if mine else None
        if self.tty:
            self.out.write(ALT_ON)
        ended = False
        try:
            while not self.stop.is_set():
                found = self.reader()
                self.refreshes += 1
                if self.stop.is_set():  # interrupted while reading: Slurm's answer may be cut short, not shown
                    break
                ended = not any(line.under_way for line in found)
                self._show(found)
                if ended:
                    break
                self.stop.wait(self.interval)
        except KeyboardInterrupt:  # the second Ctrl-C
            pass
        finally:
            if self.tty:
                self.out.write(ALT_OFF)
            if mine:
                signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        if self.tty:  # the last table, on the terminal's own screen
            self.out.write("\n".join(self.last) + "\n\n")
        self.out.write(
            f"{self.title}: the grid has ended (nothing queued, running, in post stages or evaluating)\n"
            if ended
            else f"{self.title}: left the watch; the grid goes on without it\n"
        )
        self.out.flush()

    def _interrupted(self, signum: int, frame: Any) -> None:
        self.stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def _show(self, found: Sequence[Line]) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.last = report(found)
        if self.tty:
            size = shutil.get_terminal_size()
            head = f"{self.title} --watch: every {self.interval:g} s, last read {stamp}; Ctrl-C leaves"
            # no line wraps and nothing scrolls, so the next redraw starts from the top again
            lines = [head, "", *"\n".join(self.last).splitlines()]
            if len(lines) > size.lines - 1:
                lines = [*lines[: size.lines - 2], f"... ({len(lines) - size.lines + 2} more lines)"]
            self.out.write(HOME + "".join(line[: size.columns - 1] + CLEAR_EOL + "\n" for line in lines) + CLEAR_BELOW)
            self.out.flush()
            return
        key = tuple(line.row[:ELAPSED] + line.row[ELAPSED + 1 :] for line in found)
        if key != self.shown:
            self.shown = key
            self.out.write(f"== {stamp}\n" + "\n".join(self.last) + "\n\n")
            self.out.flush()
