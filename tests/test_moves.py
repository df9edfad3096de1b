"""The move journal of a grid across sites (sft_grid/sites/moves.py): its state machine, pure, and its driver against
a fake site (a scheduler queue and the cell's real files: the journal and the job's gate), killed after every step
and run again; the job may start at any point. A move off a down site is undone when the site answers again before
the cell is queued elsewhere (also killed at every step), and a site let go gates its queued cells. Fast."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sft_grid.core import events, gate
from sft_grid.core.events import Event, Kind
from sft_grid.core.state import CellState, State, state_of
from sft_grid.sites import moves
from sft_grid.sites.moves import Do, Move, Seen, Step, next_step


class Killed(Exception):
    pass


# the gate of job 7_0 of site a, as the job names it (its sbatch's SFT_GRID_SITE) and as a move off site a names it
A_GATE = gate.key("a", "7_0")


@dataclass
class FakeSite:
    """Site A's queue, its controller up or down, and the job that may start at the n-th operation."""

    cell: Path
    reachable: bool = True
    queue: set[str] = field(default_factory=lambda: {"7_0"})
    held: set[str] = field(default_factory=set)  # held jobs: pending, and they cannot start
    start_at: int | None = None  # the job starts (claims its gate) before this operation
    kill_at: int | None = None  # the orchestrator dies before this operation
    ops: int = 0
    trained: bool = False  # the job on A trained (it found the gate its own)

    def tick(self) -> None:
        if self.start_at is not None and self.ops >= self.start_at and "7_0" in self.queue and "7_0" not in self.held:
            self.trained = gate.claim(self.cell, A_GATE, gate.STARTED) == gate.STARTED
            self.queue.discard("7_0")  # started: out of the pending queue (running or ended)
        if self.kill_at is not None and self.ops == self.kill_at:
            raise Killed
        self.ops += 1

    def claim(self, cell_dir: Path, gate_key: str) -> str:
        self.tick()
        return gate.claim(cell_dir, gate_key, gate.MOVED)

    def cancel(self, site: str, job: str) -> None:
        self.tick()
        if self.reachable:
            self.queue.discard(job)

    def in_queue(self, site: str, job: str) -> bool:
        self.tick()
        return job in self.queue

    def hold(self, site: str, job: str) -> bool:
        self.tick()
        if self.reachable and job in self.queue:
            self.held.add(job)
            return True
        return False

    def release(self, site: str, job: str) -> None:
        self.tick()
        self.held.discard(job)


def test_two_sites_jobs_with_one_id_have_gates_of_their_own(tmp_path: Path) -> None:
    """Two clusters on one file system may give one cell's jobs the same id: a move off one never stops the other."""
    assert gate.claim(tmp_path, gate.key("a", "7_0"), gate.MOVED) == gate.MOVED
    assert gate.claim(tmp_path, gate.key("b", "7_0"), gate.STARTED) == gate.STARTED
    assert gate.claim(tmp_path, gate.key("a", "7_0"), gate.STARTED) == gate.MOVED


def seen(site: FakeSite, on: str = "a", waited: float = 100.0) -> Seen:
    return Seen(
        site=on,
        job="7_0" if on == "a" else "3_0",
        queued="7_0" in site.queue and not site.trained if on == "a" else True,
        reachable=site.reachable if on == "a" else True,
        down=not site.reachable if on == "a" else False,
        waited_s=waited if on == "a" else 0.0,
        bound_s=60.0,
        in_queue="7_0" in site.queue,
    )


def test_the_state_machine_step_by_step() -> None:
    s = Seen(site="a", job="7_0", queued=True, reachable=True, waited_s=10.0, bound_s=60.0)
    assert next_step(None, s, None) is Do.NOTHING  # within the bound
    assert next_step(None, Seen(**{**s.__dict__, "waited_s": 61.0}), None) is Do.INTEND
    # one look without an answer is not a site down: nothing moves until it has been silent for site_down_after_s
    assert next_step(None, Seen(**{**s.__dict__, "reachable": False}), None) is Do.NOTHING
    assert next_step(None, Seen(**{**s.__dict__, "reachable": False, "down": True}), None) is Do.INTEND
    assert (
        next_step(None, Seen(**{**s.__dict__, "queued": False, "reachable": False, "down": True}), None) is Do.NOTHING
    )
    m = Move(site="a", job="7_0", step=Step.INTENT, why="")
    assert next_step(m, s, None) is Do.CLAIM and next_step(m, s, gate.MOVED) is Do.CLAIM
    assert next_step(m, s, gate.STARTED) is Do.DROP  # a started cell never moves
    gated = Move(site="a", job="7_0", step=Step.GATED, why="")
    assert next_step(gated, s, gate.MOVED) is Do.CANCEL
    assert next_step(gated, Seen(**{**s.__dict__, "reachable": False}), gate.MOVED) is Do.CONFIRM
    cancelled = Move(site="a", job="7_0", step=Step.CANCELLED, why="")
    assert next_step(cancelled, s, gate.MOVED) is Do.NOTHING  # still in A's queue: not confirmed yet
    assert next_step(cancelled, Seen(**{**s.__dict__, "in_queue": False}), gate.MOVED) is Do.CONFIRM
    confirmed = Move(site="a", job="7_0", step=Step.CONFIRMED, why="")
    assert next_step(confirmed, s, gate.MOVED) is Do.NOTHING
    assert next_step(confirmed, Seen(**{**s.__dict__, "site": "b"}), gate.MOVED) is Do.DROP  # queued on b: done


def _invocations(site: FakeSite, waited: float = 100.0) -> tuple[int, bool]:
    """Invocations of the orchestrator until the cell is settled: each advances the journal, then (the plan and
    the execution) queues a confirmed move on site b. Returns (submissions on b, whether A's job trained)."""
    on_b = 0
    for _ in range(6):
        try:
            now = moves.advance(site.cell, seen(site, "b" if on_b else "a", waited), site)
        except Killed:
            site.kill_at = None  # the next invocation runs to its end
            continue
        if now is not None and now.step is Step.CONFIRMED and not on_b:
            on_b += 1  # execute: the cell's submitted event names site b; the next observe ends the move
    return on_b, site.trained


@pytest.mark.parametrize("reachable", [True, False])
@pytest.mark.parametrize("start_at", [None, 0, 1, 2, 3])
@pytest.mark.parametrize("kill_at", [None, 0, 1, 2, 3])
def test_killed_at_any_step_no_cell_on_two_sites_and_none_lost(
    tmp_path: Path, reachable: bool, start_at: int | None, kill_at: int | None
) -> None:
    site = FakeSite(cell=tmp_path, reachable=reachable, start_at=start_at, kill_at=kill_at)
    # also killed between the journal's writes: a kill before the n-th write of move.json
    on_b, trained = _invocations(site)
    assert on_b + trained == 1, (on_b, trained)  # exactly one site runs it: never both, never neither
    assert moves.read(tmp_path) is None  # the journal is settled
    if trained:
        assert gate.read(tmp_path, A_GATE) == gate.STARTED


@pytest.mark.parametrize("kill_write", [0, 1, 2, 3])
def test_killed_between_journal_writes_the_next_invocation_finishes_the_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill_write: int
) -> None:
    site = FakeSite(cell=tmp_path, reachable=False)
    real, writes = moves.write, list[str]()

    def dying(cell_dir: Path, move: Move | None) -> None:
        if len(writes) == kill_write:
            writes.append("killed")
            raise Killed
        writes.append(move.step.value if move else "done")
        real(cell_dir, move)

    monkeypatch.setattr(moves, "write", dying)
    on_b, trained = _invocations(site)
    assert (on_b, trained) == (1, False) and moves.read(tmp_path) is None
    # the job on the stopped site, started later, trains nothing: its gate says the cell moved
    assert gate.claim(tmp_path, A_GATE, gate.STARTED) == gate.MOVED


def test_a_move_off_a_down_site_is_undone_while_the_cell_is_not_queued_elsewhere() -> None:
    """The state machine of a move off a down site (cause DOWN) when the site answers again: released at intent,
    reverted when gated or confirmed (unless the job is no longer pending there), never once queued elsewhere."""
    back = Seen(site="a", job="7_0", queued=True, reachable=True)
    silent = Seen(site="a", job="7_0", queued=True, reachable=False, down=True)
    m = Move(site="a", job="7_0", step=Step.INTENT, why="", cause=moves.Cause.DOWN)
    assert next_step(m, silent, None) is Do.CLAIM and next_step(m, back, None) is Do.DROP
    gated, confirmed = replace(m, step=Step.GATED), replace(m, step=Step.CONFIRMED)
    assert next_step(gated, silent, gate.MOVED) is Do.CONFIRM
    assert next_step(gated, back, gate.MOVED) is Do.REVERT and next_step(confirmed, back, gate.MOVED) is Do.REVERT
    assert next_step(confirmed, silent, gate.MOVED) is Do.NOTHING  # the plan places it elsewhere, or it waits
    # no longer pending there (it ended at its gate): the move goes on
    assert next_step(replace(gated, revertible=False), back, gate.MOVED) is Do.CANCEL
    assert next_step(replace(confirmed, revertible=False), back, gate.MOVED) is Do.NOTHING
    # a revert killed after removing the gate: claimed again before anything else; the job started since: it stays
    assert next_step(confirmed, silent, None) is Do.CLAIM and next_step(gated, back, gate.STARTED) is Do.DROP
    # queued elsewhere: done, whatever the site says now
    assert next_step(confirmed, replace(back, site="b"), gate.MOVED) is Do.DROP
    # a move of a cell that waited past move_after is not undone: its job was cancelled on a site that answered
    waited = Move(site="a", job="7_0", step=Step.GATED, why="")
    assert next_step(waited, back, gate.MOVED) is Do.CANCEL


@pytest.mark.parametrize("start_at", [None, 0, 1, 2, 3])
@pytest.mark.parametrize("kill_at", [None, 0, 1, 2, 3])
def test_a_down_site_that_answers_again_keeps_its_cell_exactly_once(
    tmp_path: Path, start_at: int | None, kill_at: int | None
) -> None:
    """Site a down, no other site can take the cell: its move stops at confirmed (gate claimed). Then a answers
    again: the move is undone (the job held, its gate removed, released) and the job trains there; or, where the job
    started first and ended at its gate, the move goes on and b queues it. Killed at any point, and the job starting
    at any point: exactly one site trains it."""
    site = FakeSite(cell=tmp_path, reachable=False)
    confirmed = moves.advance(tmp_path, seen(site), site)
    assert confirmed is not None and (confirmed.step, confirmed.cause) == (Step.CONFIRMED, moves.Cause.DOWN)
    assert gate.read(tmp_path, A_GATE) == gate.MOVED
    site.reachable, site.ops, site.start_at, site.kill_at = True, 0, start_at, kill_at
    on_b, trained = _invocations(site, waited=0.0)  # within move_after: only the down site moved it
    if "7_0" in site.queue:  # still queued at a: it starts now
        site.start_at, site.kill_at = site.ops, None
        site.tick()
    assert on_b + site.trained == 1, (on_b, trained, site)
    assert moves.read(tmp_path) is None and not site.held
    if start_at is None:  # nothing started before the site answered: the move was undone, the cell stayed on a
        assert (on_b, site.trained) == (0, True)


def _ledger(cell: Path, site: str = "a", job: str = "7_0") -> list[Event]:
    events.append(cell, Event(Kind.SUBMITTED, executor="slurm", array="arr", index=0, details={"site": site}))
    events.append(cell, Event(Kind.JOB, job_id=job))
    return events.read(cell)


def test_a_site_let_go_gates_its_queued_cells_and_records_it(tmp_path: Path) -> None:
    queued, started, elsewhere = (tmp_path / n for n in ("queued", "started", "elsewhere"))
    for d in (queued, started, elsewhere):
        d.mkdir()
    submitted = CellState(State.SUBMITTED, job_id="7_0")
    done = moves.let_go(queued, _ledger(queued), submitted, "a", cancel=False)
    assert done is not None and done.done and "placed elsewhere" in done.text
    assert gate.read(queued, A_GATE) == gate.MOVED  # if a comes back, its job ends at its gate
    assert state_of(queued, history=events.read(queued)).state is State.PLANNED
    assert moves.let_go_from(events.read(queued)) == "a"  # the next placement avoids a
    # its job started first: not let go (a second copy elsewhere would write the same cell)
    history = _ledger(started)
    gate.claim(started, A_GATE, gate.STARTED)
    kept = moves.let_go(started, history, CellState(State.RUNNING, job_id="7_0"), "a", cancel=True)
    assert kept is not None and not kept.done and "started" in kept.text
    assert state_of(started, history=events.read(started)).state is not State.CANCELLED
    # a cell of another site is not touched; --cancel records cancelled
    assert moves.let_go(elsewhere, _ledger(elsewhere, "b"), submitted, "a", cancel=True) is None
    cancelled = tmp_path / "cancelled"
    cancelled.mkdir()
    moves.let_go(cancelled, _ledger(cancelled), submitted, "a", cancel=True)
    assert state_of(cancelled, history=events.read(cancelled)).state is State.CANCELLED


def test_a_remote_sites_own_invocation_lets_go_the_cells_its_coordinator_let_go(tmp_path: Path) -> None:
    """On site a's own invocation (sites/coordinate.py sends the let-go cells in its arguments, sites/call.py), those
    cells' jobs are gated there and their ledgers say so, before the site answers; the others are left alone."""
    from types import SimpleNamespace

    from sft_grid.core.schema import ClusterConf
    from sft_grid.sites.call import SiteCall, calling, take
    from sft_grid.sites.placement import SiteFacts

    grid = tmp_path / "grid"
    dirs = [grid / "x", grid / "y"]
    for d in dirs:
        d.mkdir(parents=True)
    histories = {d: _ledger(d) for d in dirs}
    cells = [SimpleNamespace(name=d.name, spec=SimpleNamespace(sites=["a", "b"], move_after=None)) for d in dirs]
    facts = [SiteFacts(name="a", cluster=ClusterConf(name="a", executor="slurm"))]
    asked = SiteCall(site="a", answer=True, let_go=("x",))
    with calling(None):  # the call as the site's program reads it from its arguments
        assert take([*asked.argv(), "-m", "sweep=x"]) == ["-m", "sweep=x"]
        submitted = CellState(State.SUBMITTED, job_id="7_0")
        assert moves.observe_moves(cells, dirs, histories, lambda d: submitted, facts, record=True) == {}
    assert gate.read(dirs[0], A_GATE) == gate.MOVED and moves.let_go_from(events.read(dirs[0])) == "a"
    assert gate.read(dirs[1], A_GATE) is None and moves.let_go_from(events.read(dirs[1])) == ""
