"""The move journal of a grid across sites (sft_grid/sites/moves.py, issue 25 item 4): its state machine, pure, and
its driver against a fake site (a scheduler queue and the cell's real files: the journal and the job's gate),
killed after every step and run again; the job may start at any point. Fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sft_grid.core import gate
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
    start_at: int | None = None  # the job starts (claims its gate) before this operation
    kill_at: int | None = None  # the orchestrator dies before this operation
    ops: int = 0
    trained: bool = False  # the job on A trained (it found the gate its own)

    def tick(self) -> None:
        if self.start_at is not None and self.ops == self.start_at and "7_0" in self.queue:
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
        waited_s=waited if on == "a" else 0.0,
        bound_s=60.0,
        in_queue="7_0" in site.queue,
    )


def test_the_state_machine_step_by_step() -> None:
    s = Seen(site="a", job="7_0", queued=True, reachable=True, waited_s=10.0, bound_s=60.0)
    assert next_step(None, s, None) is Do.NOTHING  # within the bound
    assert next_step(None, Seen(**{**s.__dict__, "waited_s": 61.0}), None) is Do.INTEND
    assert next_step(None, Seen(**{**s.__dict__, "reachable": False}), None) is Do.INTEND
    assert next_step(None, Seen(**{**s.__dict__, "queued": False, "reachable": False}), None) is Do.NOTHING  # started
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


def _invocations(site: FakeSite) -> tuple[int, bool]:
    """Invocations of the orchestrator until the cell is settled: each advances the journal, then (the plan and
    the execution) queues a confirmed move on site b. Returns (submissions on b, whether A's job trained)."""
    on_b = 0
    for _ in range(6):
        try:
            now = moves.advance(site.cell, seen(site, "b" if on_b else "a"), site)
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
