"""A site that fails (issue 25, item 4): a queued cell moves to another site of its grid, exactly once.

When a cell's site does not answer, or the cell has waited in its queue longer than the sweep's `move_after`, the
cell moves. Each move is a crash-safe journal, `<cell>/move.json` (written whole, by rename), and each of its steps
is taken only after the one before is on disk:

    intent      the move is decided: the cell, the site it leaves and its job there
    gated       the job's gate (core/gate.py) is claimed "moved": from now on that job trains nothing, even if it
                starts (it reads the gate first); had the job claimed it first ("started"), the move is dropped:
                a started cell never moves
    cancelled   scancel was sent to the site (skipped while the site does not answer: the gate stands for it)
    confirmed   the site's queue no longer holds the job, or the site does not answer (its job, if it ever starts,
                ends at the gate): the cell is free to be queued elsewhere. The plan (pure) places it on another
                site than the one it leaves, and the execution queues it as any cell (its `submitted` event, with
                the new site, written before sbatch; a crash during sbatch is recovered by the array's name)
    (done)      the cell's latest `submitted` event names another site: the journal is removed

The orchestrator killed at any point leaves the journal at its last step; the next invocation goes on from there.
No cell is on two sites (the gate) and none is lost (the journal stays until the new submission is recorded).
`next_step` is the state machine, pure (tests/test_moves.py kills it after every step); `advance` takes the steps
against a `World` (Slurm and the cell's files here; a fake in the tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from sft_grid.core import gate
from sft_grid.core.events import Event, Kind, submitted_site
from sft_grid.core.state import CellState, State, parse_time
from sft_grid.core.timefmt import parse_minutes
from sft_grid.sites.placement import SiteFacts

MOVE_FILE = "move.json"


class Step(str, Enum):
    INTENT = "intent"
    GATED = "gated"
    CANCELLED = "cancelled"
    CONFIRMED = "confirmed"


class Do(str, Enum):
    NOTHING = "nothing"
    INTEND = "intend"  # write the journal's intent
    CLAIM = "claim"  # claim the job's gate for the move
    CANCEL = "cancel"  # scancel on the site
    CONFIRM = "confirm"  # the job is out of the site's queue (or the site is down): the cell may be queued again
    DROP = "drop"  # remove the journal: the move is done, or the cell started first


@dataclass(frozen=True, kw_only=True)
class Move:
    site: str  # the site the cell leaves
    job: str  # its job there
    step: Step
    why: str


@dataclass(frozen=True, kw_only=True)
class Seen:
    """What observe sees of one cell of a grid across sites, for its move."""

    site: str  # the site of its latest submission
    job: str  # its job there ("" before sbatch returned)
    queued: bool  # in flight and not started (no `running` event of that job)
    reachable: bool  # the site's controller answered
    waited_s: float | None = None  # since its latest submission, while queued
    bound_s: float | None = None  # the sweep's move_after
    in_queue: bool = True  # the site's queue still holds the job (False: it ended, e.g. cancelled)


def next_step(move: Move | None, seen: Seen, gate_word: str | None) -> Do:
    """The next step of a cell's move (see the module's docstring). Pure."""
    if move is None:
        if not seen.queued or not seen.job:
            return Do.NOTHING
        waited = seen.waited_s is not None and seen.bound_s is not None and seen.waited_s > seen.bound_s
        return Do.INTEND if (not seen.reachable or waited) else Do.NOTHING
    if seen.site != move.site:  # its latest submission names another site: the move is done
        return Do.DROP
    if move.step is Step.INTENT:
        return Do.DROP if gate_word == gate.STARTED else Do.CLAIM
    if move.step is Step.GATED:
        return Do.CANCEL if seen.reachable else Do.CONFIRM
    if move.step is Step.CANCELLED:
        return Do.CONFIRM if (not seen.reachable or not seen.in_queue) else Do.NOTHING
    return Do.NOTHING  # confirmed: the plan queues it elsewhere


class World(Protocol):
    """What a move acts on: the cell's files and the site's scheduler."""

    def claim(self, cell_dir: Path, gate_key: str) -> str: ...

    def cancel(self, site: str, job: str) -> None: ...

    def in_queue(self, site: str, job: str) -> bool: ...


def read(cell_dir: Path) -> Move | None:
    path = Path(cell_dir) / MOVE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Move(site=data["site"], job=data["job"], step=Step(data["step"]), why=data.get("why", ""))


def write(cell_dir: Path, move: Move | None) -> None:
    path = Path(cell_dir) / MOVE_FILE
    if move is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{MOVE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({**asdict(move), "step": move.step.value}) + "\n")
    tmp.replace(path)


def advance(cell_dir: Path, seen: Seen, world: World) -> Move | None:
    """Take every step the cell's move can take now, each written before the next; the journal as it stands."""
    move = read(cell_dir)
    for _ in range(8):  # at most the five steps
        do = next_step(move, seen, gate.read(cell_dir, gate.key(move.site, move.job)) if move else None)
        if do is Do.NOTHING:
            break
        if do is Do.INTEND:
            why = "its site did not answer" if not seen.reachable else f"queued over {seen.bound_s:.0f} s"
            move = Move(site=seen.site, job=seen.job, step=Step.INTENT, why=why)
        elif do is Do.CLAIM and move is not None:
            if world.claim(cell_dir, gate.key(move.site, move.job)) == gate.STARTED:
                move = None  # it started first: it stays where it runs
            else:
                move = replace(move, step=Step.GATED)
        elif do is Do.CANCEL and move is not None:
            world.cancel(move.site, move.job)
            move = replace(move, step=Step.CANCELLED)
            seen = replace(seen, in_queue=world.in_queue(move.site, move.job))
        elif do is Do.CONFIRM and move is not None:
            move = replace(move, step=Step.CONFIRMED)
        elif do is Do.DROP:
            write(cell_dir, None)
            return None  # a new move of the cell waits for the next observation
        write(cell_dir, move)
    return move


def moving(journals: Mapping[Path, Move | None]) -> dict[Path, str]:
    """Cell dir -> the site it leaves, for the cells free to be queued elsewhere (their move confirmed)."""
    return {d: m.site for d, m in journals.items() if m is not None and m.step is Step.CONFIRMED}


@dataclass(frozen=True)
class SlurmWorld:
    """The world of a move for real: the cell's gate, and each site's Slurm through its client environment."""

    envs: Mapping[str, Mapping[str, str]]  # site -> cluster.client_env

    def claim(self, cell_dir: Path, gate_key: str) -> str:
        return gate.claim(cell_dir, gate_key, gate.MOVED)

    def cancel(self, site: str, job: str) -> None:
        import subprocess

        from sft_grid.schedulers import slurm

        # the site went away: the gate stands for the cancel
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            slurm.cancel([job], dict(self.envs.get(site, {})))

    def in_queue(self, site: str, job: str) -> bool:
        import subprocess

        from sft_grid.schedulers import slurm

        try:
            return any(j.in_flight for j in slurm.query([job], env=dict(self.envs.get(site, {}))))
        except (OSError, subprocess.SubprocessError):
            return True  # not known: not confirmed by the queue (the site's answer, or its silence, decides later)


def seen_of(
    history: Sequence[Event], state: CellState, reachable: Mapping[str, bool], bound_s: float | None, now: float
) -> Seen | None:
    """What a move needs of a cell of a grid across sites; None for a cell that has no site recorded."""
    site, _ = submitted_site(history)
    if not site:
        return None
    submitted = next((e for e in reversed(history) if e.kind is Kind.SUBMITTED), None)
    started = any(e.kind is Kind.RUNNING for e in history[history.index(submitted) :]) if submitted else False
    since = parse_time(submitted.time) if submitted else None
    return Seen(
        site=site,
        job=state.job_id,
        queued=state.state is State.SUBMITTED and not started,
        reachable=reachable.get(site, True),
        waited_s=None if since is None else now - since,
        bound_s=bound_s,
        in_queue=state.state.in_flight,
    )


def observe_moves(
    cells: Sequence[Any],
    dirs: Sequence[Path],
    histories: Mapping[Path, Sequence[Event]],
    state: Callable[[Path], CellState],
    facts: Sequence[SiteFacts],
    record: bool,
) -> dict[Path, str]:
    """Each cell of a grid across sites whose move is confirmed -> the site it leaves. Recording (a real run's
    observe), the moves also take the steps they can now (their effects: journals, gates, scancel); otherwise the
    journals are only read."""
    reachable = {f.name: f.reachable for f in facts}
    world = SlurmWorld({f.name: dict(f.cluster.client_env) for f in facts})
    now = time.time()
    journals: dict[Path, Move | None] = {}
    for cell, d in zip(cells, dirs, strict=True):
        if not cell.spec.sites:
            continue
        bound = parse_minutes(cell.spec.move_after) * 60 if cell.spec.move_after else None
        seen = seen_of(histories[d], state(d), reachable, bound, now) if record else None
        journals[d] = advance(d, seen, world) if seen is not None else read(d)
    return moving(journals)
