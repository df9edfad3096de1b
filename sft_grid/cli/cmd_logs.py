"""sft-grid logs GRID CELL [--node N | --eval | --post] [-f] [--lines N]: a cell's log, printed or followed.

CELL is the cell's name or any part of it that only one cell of the grid has. The log is the training's, node 0's
(logs/train.log; `--node N`: node N's, logs/train.node<N>.log), the evaluation's (`--eval`, logs/eval.log) or
the post-training stages' (`--post`, logs/post.log). `-f` prints what is there, then what is added as it is
written, until that part of the cell is no longer under way (the training: its job queued or running; the post
stages and the evaluation: they, or what comes before them, queued or running), or Ctrl-C. A log rewritten or
truncated meanwhile is followed again from its start. A log not written yet is waited for while what writes it is
under way; otherwise (a planned, failed, cancelled or pruned cell) it is said at once, with what would write it
(exit status 1). A node past the cell's own (its cell.yaml's `nodes`) and `--eval` of a cell that evaluates nothing
(eval=none: no eval.json), whose logs never will be, are refused at once with the fix (exit status 2).

A log is printed as it is, bytes that are not UTF-8 shown as U+FFFD; a cell whose own files are damaged (its
cell.yaml, its ledger: core/cellfiles.py) is still found by its name, and its state is said as `damaged`, naming the
file. A grid or cell that is not there is said in one line, with what is (exit status 1).
"""

from __future__ import annotations

import argparse
import codecs
import glob
import os
import shlex
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

POLL_S = 0.5  # how often a followed log is read again
STATE_S = 5.0  # how often the cell's state is read again (a scheduler query for a Slurm cell)
SHOWN = 8  # names listed when CELL names no cell


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import add_grid, whole

    add_grid(parser)
    parser.add_argument("cell", metavar="CELL", help="the cell: its name, or any part of it that only it has")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--node", type=whole(0), default=0, metavar="N", help="node N's training log (default: node 0's)"
    )
    which.add_argument("--eval", action="store_true", help="the evaluation's log (logs/eval.log)")
    which.add_argument("--post", action="store_true", help="the post-training stages' log (logs/post.log)")
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="print what is added as it is written, until that part of the cell ends (or Ctrl-C)",
    )
    parser.add_argument("-n", "--lines", type=whole(1), metavar="N", help="only the last N lines (default: all)")


def run(args: argparse.Namespace) -> int:
    from sft_grid.analysis.view import cell_dirs
    from sft_grid.cli.options import grid_dir
    from sft_grid.cli.present import no_grid

    sweep_dir = grid_dir(args.grid, args.runs_root)
    cells = cell_dirs(sweep_dir)
    cell_dir, problem = find_cell(cells, args.cell, sweep_dir)
    if not cells:  # no grid there: what is (the grids under the runs root, the closest first)
        problem = no_grid(sweep_dir, args.grid) or problem
    if cell_dir is None:
        print(problem, file=sys.stderr)
        return 1
    which = "eval" if args.eval else "post" if args.post else "train"
    nodes = _nodes(cell_dir)
    if which == "train" and nodes is not None and args.node >= nodes:  # a log that will never be written: no wait
        last = "node 0" if nodes == 1 else f"nodes 0 to {nodes - 1}"
        print(
            f"{cell_dir.name} trains on {nodes} node(s), so it has no node {args.node}: --node takes {last}",
            file=sys.stderr,
        )
        return 2
    path = log_path(cell_dir, which, args.node)
    tail = Tail(path, sys.stdout, args.lines)
    if not path.is_file() and which == "eval" and not evaluates(cell_dir):  # eval=none: never written, no wait
        print(no_evaluation(cell_dir, cells), file=sys.stderr)
        return 2
    if not path.is_file():
        going, state = under_way(cell_dir, which)
        if not going:  # nothing that writes it is queued or running: said at once, never waited for
            print(never_written(cell_dir, which, args.node, path, state), file=sys.stderr)
            return 1
    if not args.follow:
        if not path.is_file():
            print(
                f"{cell_dir.name}: {describe(which, args.node)} is not written yet: it will be {path}"
                f" ({state_line(cell_dir)}); -f waits for it",
                file=sys.stderr,
            )
            return 1
        tail.read()
        return 0
    if not path.is_file():
        print(
            f"{cell_dir.name}: waiting for {describe(which, args.node)}, {path} ({state_line(cell_dir)})",
            file=sys.stderr,
        )
    try:
        outcome = follow(tail, cell_dir, which)
    except KeyboardInterrupt:
        return 0
    if outcome.note:
        print(outcome.note, file=sys.stderr)
    return 0 if path.is_file() else 1


def _nodes(cell_dir: Path) -> int | None:
    """The nodes the cell trains on, as its cell.yaml says (None where it cannot be read: nothing is refused)."""
    from sft_grid.core.cellfiles import CellYaml

    try:
        nodes = CellYaml.load(cell_dir, keys=["nodes"]).config.get("nodes")
    except (OSError, ValueError):
        return None
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1 else None


def find_cell(cells: Sequence[Path], part: str, sweep_dir: Path) -> tuple[Path | None, str]:
    """The one cell whose name is `part`, or has it; else None and what to say."""
    if not cells:
        return None, f"no cells under {sweep_dir}"
    from sft_grid.cli.present import relative
    from sft_grid.core.layout import CELL_FILE

    if os.sep in part.rstrip(os.sep):  # a cell's directory: its grid's own, or another grid's (named with the fix)
        given = Path(part).expanduser()
        mine = [d for d in cells if given.is_dir() and d.resolve() == given.resolve()]
        if mine:
            return mine[0], ""
        if (given / CELL_FILE).is_file():
            grid = relative(given.resolve().parent)
            return None, f"{part} is a cell of {grid}, not of {sweep_dir}: sft-grid logs {grid} {given.name}"
    part = Path(part).name if part.endswith(os.sep) or os.sep in part else part
    exact = [d for d in cells if d.name == part]
    matches = exact or [d for d in cells if part in d.name]
    if len(matches) == 1:
        return matches[0], ""
    if not matches:
        names = ", ".join(d.name for d in cells[:SHOWN]) + (
            f", ... ({len(cells)} in all)" if len(cells) > SHOWN else ""
        )
        elsewhere = sorted(g for g in sweep_dir.parent.glob(f"*/{glob.escape(part)}") if (g / CELL_FILE).is_file())
        if elsewhere:  # a cell of another grid under the same runs root
            grid = relative(elsewhere[0].parent)
            return None, f"{part!r} is a cell of {grid}, not of {sweep_dir}: sft-grid logs {grid} {part}"
        return None, f"no cell of {sweep_dir} has {part!r} in its name; its cells: {names}"
    return None, (
        f"{part!r} is in the names of {len(matches)} cells of {sweep_dir}; give more of one:\n"
        + "\n".join(f"  {d.name}" for d in matches)
    )


def log_path(cell_dir: Path, which: str, node: int = 0) -> Path:
    """Where the cell's job writes that log (job/runner.py, stages/evaluate.py, stages/post_training.py)."""
    from sft_grid.core.layout import LOGS_DIR, train_log
    from sft_grid.stages.evaluate import EVAL_LOG
    from sft_grid.stages.post_training import POST_LOG

    return cell_dir / LOGS_DIR / {"eval": EVAL_LOG, "post": POST_LOG}.get(which, train_log(node))


def evaluates(cell_dir: Path) -> bool:
    """Whether the cell has an evaluation: its eval.json, rendered with its cell.yaml when its grid names a suite
    (a cell without its cell.yaml is damaged, and said as such: not read as one that evaluates nothing)."""
    from sft_grid.core.layout import CELL_FILE
    from sft_grid.core.scores import EVAL_FILE

    return (cell_dir / EVAL_FILE).exists() or not (cell_dir / CELL_FILE).is_file()


def no_evaluation(cell_dir: Path, cells: Sequence[Path]) -> str:
    """What to say of `--eval` for a cell that evaluates nothing: why there is no log, and the command that adds one."""
    from sft_grid.core.layout import CELL_FILE
    from sft_grid.core.overrides import rerun_words

    others = sum(1 for d in cells if d != cell_dir and evaluates(d))
    grid = cell_dir.parent.name
    whose = f"; {others} other cell(s) of its grid do" if others else f"; no cell of its grid {grid!r} does"
    try:
        words = rerun_words((cell_dir / CELL_FILE).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        words = []
    words = [w for w in words if not w.lstrip("+~").startswith("eval=")]
    command = shlex.join([*words, "eval=tiny"]) if words else "sft-grid run -m <the grid's overrides> eval=tiny"
    return (
        f"{cell_dir.name} evaluates nothing (eval=none{whose}), so it has no evaluation's log. To score it, run it"
        f" again with a suite (a trained cell is not trained again; docs/evaluation.md): {command}"
    )


# what starts the part of a cell that writes a log, by the cell's state (which log: train, post, eval)
_AGAIN = {
    "planned": "the grid's next `sft-grid run` starts it",
    "failed": "why: sft-grid status {grid}; run the grid again with rerun_failed=true to train it again",
    "cancelled": "run the grid again with rerun_failed=true to train it again",
    "pruned": "it was stopped at its rung before the end of its training (docs/steering.md)",
}


def never_written(cell_dir: Path, which: str, node: int, path: Path, state: str) -> str:
    """A log that is not there while nothing that writes it is under way: why, and what would write it."""
    if state == "completed":
        again = {
            "train": "it was moved or removed since",
            "post": f"sft-grid post {cell_dir} runs its pending post-training stages",
            "eval": "the grid's next `sft-grid run` evaluates it",
        }[which]
    else:
        again = _AGAIN.get(state, "sft-grid status {grid} says why").format(grid=shlex.quote(str(cell_dir.parent)))
    said = state_line(cell_dir)  # "the cell is failed", or what of it is damaged
    why = f"{said}: {again}" if state == "planned" else f"{said}, and nothing that writes it is under way: {again}"
    return f"{cell_dir.name}: {describe(which, node)} is not written yet: it will be {path} ({why})"


def describe(which: str, node: int) -> str:
    return {"eval": "the evaluation's log", "post": "the post-training stages' log"}.get(
        which, f"node {node}'s training log"
    )


def state_line(cell_dir: Path) -> str:
    from sft_grid.analysis.view import read_view

    view = read_view([cell_dir], lenient=True)
    if view.whole_damage(cell_dir):
        return "the cell is damaged: " + "; ".join(d.text() for d in view.damaged(cell_dir))
    return f"the cell is {view.state(cell_dir).state.value}"


class Tail:
    """A log printed from where it was last read: the bytes it gained, decoded as they come (a character cut
    between two reads is completed by the next), from its start again when it was replaced or truncated."""

    def __init__(self, path: Path, out: TextIO, lines: int | None = None) -> None:
        self.path, self.out, self.lines = path, out, lines
        self.offset = 0
        self.inode: int | None = None
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self) -> bool:
        """Print what the log gained since the last read; whether there was anything."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        if self.inode is None and self.lines is not None:
            self.offset = start_of_last_lines(self.path, self.lines)
        elif self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset):
            self.out.write(f"\n--- {self.path.name} was rewritten; from its start:\n")
            self.offset = 0
            self.decoder.reset()
        self.inode = st.st_ino
        if st.st_size <= self.offset:
            return False
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read(st.st_size - self.offset)
        self.offset += len(data)
        self.out.write(self.decoder.decode(data))
        self.out.flush()
        return bool(data)


def start_of_last_lines(path: Path, n: int, block: int = 65536) -> int:
    """The offset at which the last `n` lines of the file begin (a last line without its newline counts)."""
    with path.open("rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        if n <= 0:
            return end
        pos, tail = end, b""
        while pos > 0:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
            body = tail[:-1] if tail.endswith(b"\n") else tail  # the file's last newline ends a line, starts none
            if body.count(b"\n") >= n:
                cut = len(body)
                for _ in range(n):
                    cut = body.rindex(b"\n", 0, cut)
                return pos + cut + 1
        return 0


@dataclass(frozen=True)
class Followed:
    note: str  # what to say once the log is no longer followed ("" when stopped from outside)


def follow(
    tail: Tail,
    cell_dir: Path,
    which: str,
    stop: threading.Event | None = None,
    poll_s: float = POLL_S,
    state_s: float = STATE_S,
) -> Followed:
    """Print the log as it grows until that part of the cell is no longer under way (read every `state_s` seconds,
    with one scheduler query for a Slurm cell) or `stop` is set; what it gained last is printed before leaving."""
    import time

    stop = stop or threading.Event()
    next_state = 0.0
    while not stop.is_set():
        tail.read()
        if time.monotonic() >= next_state:
            going, state = under_way(cell_dir, which)
            next_state = time.monotonic() + state_s
            if not going:
                tail.read()  # written before the end was seen
                if not tail.path.is_file():
                    return Followed(f"{cell_dir.name} is {state}, and {tail.path} was never written")
                return Followed(f"--- {cell_dir.name} is {state}; {tail.path.name} ends here")
        stop.wait(poll_s)
    return Followed("")


def under_way(cell_dir: Path, which: str) -> tuple[bool, str]:
    """Whether the part of the cell that writes this log (or what comes before it) is queued or running, and the
    cell's state."""
    from sft_grid.analysis.view import read_view
    from sft_grid.cli.cmd_status import lines_of

    (line,) = lines_of(read_view([cell_dir], lenient=True), [cell_dir])
    writers = {"train": {"train"}, "post": {"train", "post", "job"}}.get(which, {"train", "post", "eval", "job"})
    return bool(line.under_way & writers), line.row[1]
