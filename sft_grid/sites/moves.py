"""A site that fails: a queued cell moves to another site of its grid, exactly once, and only when the site is down.

A cell moves when its site is down (its controller has not answered for the profile's `site_down_after_s`, over
several looks, each of several tries: sites/facts.py), or when the cell has waited in its queue longer than the
sweep's `move_after`. Each move is a crash-safe journal, `<cell>/move.json` (written whole, by rename), and each of
its steps is taken only after the one before is on disk:

    intent      the move is decided: the cell, the site it leaves, its job there, and why (`cause`: the site is down,
                or the cell waited past move_after)
    gated       the job's gate (core/gate.py) is claimed "moved": from now on that job trains nothing, even if it
                starts (it reads the gate first); had the job claimed it first ("started"), the move is dropped:
                a started cell never moves
    cancelled   scancel was sent to the site (a move of a cell that waited too long: the site answers)
    confirmed   the site's queue no longer holds the job, or the site is down (its job, if it ever starts, ends at
                the gate): the cell is free to be queued elsewhere. The plan (pure) places it on another site than
                the one it leaves, and the execution queues it as any cell (its `submitted` event, with the new site,
                written before sbatch; a crash during sbatch is recovered by the array's name); where no other site
                can take it, it waits
    (done)      the cell's latest `submitted` event names another site: the journal is removed

A move off a down site is undone while the cell is not queued elsewhere yet (intent, gated or confirmed), once the
site answers again (`revert`): the job is held in the site's queue (a held pending job cannot start), its gate is
removed, the hold lifted and the journal removed; the cell stays where it was queued. A job that is no longer pending
there (it started, and ended at its gate) cannot be held: the move goes on (cancelled, then confirmed).

The orchestrator killed at any point leaves the journal at its last step; the next invocation goes on from there
(a revert killed halfway claims the gate again before anything else). No cell is on two sites (the gate) and none
is lost (the journal stays until the new submission is recorded). `next_step` is the state machine, pure
(tests/test_moves.py kills it after every step); `advance` takes the steps against a `World` (Slurm and the cell's
files here; a fake in the tests).

A site the grid lets go (`sft-grid release`, `let_go`): each of its cells whose job there has not started is gated
("moved") there and recorded in its ledger as planned again (placed on another site by the next run) or cancelled;
if the site comes back, those jobs end at their gates.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from sft_grid.core import events, gate
from sft_grid.core.events import Event, Kind, submitted_site
from sft_grid.core.state import CellState, State, parse_time
from sft_grid.core.timefmt import parse_minutes
from sft_grid.sites import call
from sft_grid.sites import facts as site_facts
from sft_grid.sites.placement import SiteFacts

MOVE_FILE = "move.json"


class Step(str, Enum):
    INTENT = "intent"
    GATED = "gated"
    CANCELLED = "cancelled"
    CONFIRMED = "confirmed"


class Cause(str, Enum):
    DOWN = "down"  # the site is down: undone if it answers again before the cell is queued elsewhere
    WAITED = "waited"  # queued longer than move_after: the site answers, its job is cancelled there


class Do(str, Enum):
    NOTHING = "nothing"
    INTEND = "intend"  # write the journal's intent
    CLAIM = "claim"  # claim the job's gate for the move
    CANCEL = "cancel"  # scancel on the site
    CONFIRM = "confirm"  # the job is out of the site's queue (or the site is down): the cell may be queued again
    REVERT = "revert"  # the down site answers again: hold the job, remove its gate, release it, remove the journal
    DROP = "drop"  # remove the journal: the move is done, the cell started first, or the site answered in time


@dataclass(frozen=True, kw_only=True)
class Move:
    site: str  # the site the cell leaves
    job: str  # its job there
    step: Step
    why: str
    cause: Cause = Cause.WAITED
    # False once a revert found the job no longer pending there: the move can only go on
    revertible: bool = True


@dataclass(frozen=True, kw_only=True)
class Seen:
    """What observe sees of one cell of a grid across sites, for its move."""

    site: str  # the site of its latest submission
    job: str  # its job there ("" before sbatch returned)
    queued: bool  # in flight and not started (no `running` event of that job)
    reachable: bool  # the site's controller answered this look
    down: bool = False  # the site is down: it has not answered for its site_down_after_s (sites/facts.py)
    waited_s: float | None = None  # since its latest submission, while queued
    bound_s: float | None = None  # the sweep's move_after
    in_queue: bool = True  # the site's queue still holds the job (False: it ended, e.g. cancelled)


def next_step(move: Move | None, seen: Seen, gate_word: str | None) -> Do:
    """The next step of a cell's move (see the module's docstring). Pure."""
    if move is None:
        if not seen.queued or not seen.job:
            return Do.NOTHING
        waited = seen.waited_s is not None and seen.bound_s is not None and seen.waited_s > seen.bound_s
        return Do.INTEND if (seen.down or waited) else Do.NOTHING
    if seen.site != move.site:  # its latest submission names another site: the move is done
        return Do.DROP
    if gate_word == gate.STARTED:  # the job started first (or after a revert removed the gate): it stays there
        return Do.DROP
    back = move.cause is Cause.DOWN and seen.reachable  # the down site answers again
    if move.step is Step.INTENT:
        return Do.DROP if back else Do.CLAIM
    if gate_word != gate.MOVED:  # a revert stopped after removing the gate: claimed again before anything else
        return Do.CLAIM
    if move.step is Step.GATED:
        if not seen.reachable:
            return Do.CONFIRM
        return Do.REVERT if back and move.revertible else Do.CANCEL
    if move.step is Step.CANCELLED:
        return Do.CONFIRM if (not seen.reachable or not seen.in_queue) else Do.NOTHING
    # confirmed: the plan queues it elsewhere; until it does, a down site that answers again keeps it
    return Do.REVERT if back and move.revertible else Do.NOTHING


class World(Protocol):
    """What a move acts on: the cell's files and the site's scheduler."""

    def claim(self, cell_dir: Path, gate_key: str) -> str: ...

    def cancel(self, site: str, job: str) -> None: ...

    def in_queue(self, site: str, job: str) -> bool: ...

    def hold(self, site: str, job: str) -> bool:
        """Hold the job in the site's queue; whether it is held while still pending (it cannot start)."""
        ...

    def release(self, site: str, job: str) -> None: ...


def read(cell_dir: Path) -> Move | None:
    path = Path(cell_dir) / MOVE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    why = data.get("why", "")
    # a journal written before moves had a cause: a move off a silent site was the one that said so
    cause = Cause(data.get("cause") or (Cause.DOWN if "did not answer" in why else Cause.WAITED))
    return Move(
        site=data["site"],
        job=data["job"],
        step=Step(data["step"]),
        why=why,
        cause=cause,
        revertible=bool(data.get("revertible", True)),
    )


def write(cell_dir: Path, move: Move | None) -> None:
    path = Path(cell_dir) / MOVE_FILE
    if move is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{MOVE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({**asdict(move), "step": move.step.value, "cause": move.cause.value}) + "\n")
    tmp.replace(path)


def advance(cell_dir: Path, seen: Seen, world: World) -> Move | None:
    """Take every step the cell's move can take now, each written before the next; the journal as it stands."""
    move = read(cell_dir)
    for _ in range(10):  # at most the five steps, a revert, and a claim again
        do = next_step(move, seen, gate.read(cell_dir, gate.key(move.site, move.job)) if move else None)
        if do is Do.NOTHING:
            break
        if do is Do.INTEND:
            if seen.down:
                why, cause = f"its site {seen.site} is down (no answer for its site_down_after_s)", Cause.DOWN
            else:
                why, cause = f"queued over {seen.bound_s:.0f} s (move_after)", Cause.WAITED
            move = Move(site=seen.site, job=seen.job, step=Step.INTENT, why=why, cause=cause)
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
        elif do is Do.REVERT and move is not None:
            if world.hold(move.site, move.job):  # held while pending: it cannot start until released
                gate.gate_path(cell_dir, gate.key(move.site, move.job)).unlink(missing_ok=True)
                world.release(move.site, move.job)
                write(cell_dir, None)
                return None  # the cell stays where it was queued
            move = replace(move, revertible=False)  # no longer pending there: it ended at its gate, or will
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

    def hold(self, site: str, job: str) -> bool:
        from sft_grid.schedulers import slurm

        return slurm.hold_pending(job, dict(self.envs.get(site, {})))

    def release(self, site: str, job: str) -> None:
        from sft_grid.schedulers import slurm

        slurm.release(job, dict(self.envs.get(site, {})))


def seen_of(
    history: Sequence[Event],
    state: CellState,
    reachable: Mapping[str, bool],
    bound_s: float | None,
    now: float,
    down: Collection[str] = (),
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
        down=site in down,
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
    """Each cell of a grid across sites whose move is confirmed -> the site it leaves. First the look at the sites is
    set against the grid's record of them (sites/facts.py: which silent site is down); recording (a real run's
    observe, under the grid's lock), the record is updated and the moves take the steps they can now (their effects:
    journals, gates, scancel, holds); otherwise the journals are only read. On a remote site's own invocation, the
    cells the coordinator let go from it (its call's `let_go`, sites/call.py) are let go first (`let_go`)."""
    reachable = {f.name: f.reachable for f in facts}
    world = SlurmWorld({f.name: dict(f.cluster.client_env) for f in facts})
    now = time.time()
    spread = [(c, d) for c, d in zip(cells, dirs, strict=True) if c.spec.sites]
    down: set[str] = set()
    for grid_dir in sorted({d.parent for _, d in spread}):
        down |= site_facts.look(grid_dir, facts, now, record)[1]
    asked = call.current()
    here = asked.site if asked is not None else ""
    gone = set(asked.let_go) if asked is not None and record else set()
    cancel = set(asked.cancel) if asked is not None else set()
    journals: dict[Path, Move | None] = {}
    for cell, d in spread:
        if cell.name in gone:
            let_go(d, histories[d], state(d), here, cell.name in cancel)
            continue
        bound = parse_minutes(cell.spec.move_after) * 60 if cell.spec.move_after else None
        seen = seen_of(histories[d], state(d), reachable, bound, now, down) if record else None
        journals[d] = advance(d, seen, world) if seen is not None else read(d)
    return moving(journals)


# -- a site the grid lets go ------------------------------------------------------------------------------------

# the key of a `planned` or `cancelled` event that names the site a cell was let go from (grid/spread.py places the
# cell on another site)
LET_GO_KEY = "let_go"


@dataclass(frozen=True, kw_only=True)
class LetGo:
    """What letting a site go did to one cell: whether it was let go, and what a person reads of it."""

    cell: str
    done: bool
    job: str = ""
    text: str = ""


def let_go(cell_dir: Path, history: Sequence[Event], state: CellState, site: str, cancel: bool) -> LetGo | None:
    """Let one cell go from `site` (the grid's lock held): None when its latest submission is not in flight there.
    Its job's gate there is claimed "moved" (if the site comes back, the job ends at its gate, training nothing), its
    move journal removed (superseded), and its ledger records it: `planned` again (the next run places it on another
    site) or, with `cancel`, `cancelled`. A job that started there first (its gate says so) is not let go: it may
    still run on the site's nodes, and a second copy elsewhere would write the same cell."""
    where, _ = submitted_site(history)
    if where != site or not state.state.in_flight:
        return None
    job = state.job_id
    if not job:
        return LetGo(
            cell=cell_dir.name,
            done=False,
            text=f"its sbatch on {site} never returned a job id: nothing there can be gated; it waits for the site",
        )
    if gate.claim(cell_dir, gate.key(site, job), gate.MOVED) == gate.STARTED:
        return LetGo(
            cell=cell_dir.name,
            done=False,
            job=job,
            text=f"its job {job} started on {site} (its gate says so): not let go, it may still run there;"
            f" once {site} answers, `sft-grid cancel` stops it and the next run places it again",
        )
    write(cell_dir, None)
    kind = Kind.CANCELLED if cancel else Kind.PLANNED
    then = "cancelled (rerun_failed=true queues it again, elsewhere)" if cancel else "placed elsewhere by the next run"
    reason = f"its site {site} was let go (sft-grid release): its job {job} there will not train (gate); {then}"
    events.append(
        cell_dir, Event(kind, reason=reason, job_id=job if cancel else "", details={LET_GO_KEY: site, "left_job": job})
    )
    return LetGo(cell=cell_dir.name, done=True, job=job, text=reason)


def let_go_from(history: Sequence[Event]) -> str:
    """The site a cell was let go from since its latest submission ("" when none): it is not placed there again."""
    for e in reversed(history):
        if e.kind is Kind.SUBMITTED:
            return ""
        if e.kind in (Kind.PLANNED, Kind.CANCELLED) and e.details.get(LET_GO_KEY):
            return str(e.details[LET_GO_KEY])
    return ""
