"""Cell states from the ledger, the cell's own output and process liveness; what a rerun does with each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid import ledger
from sft_grid.grid import decide
from sft_grid.ledger import State, state_of


def finish(output: Path, steps: int = 4) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "model.safetensors").write_bytes(b"w")
    (output / "trainer_state.json").write_text(json.dumps(
        {"global_step": steps, "max_steps": steps, "log_history": [{"loss": 2.5, "step": steps}]}))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def cell_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cell"
    d.mkdir()
    return d


def test_new_cell_is_planned(cell_dir):
    assert state_of(cell_dir).state is State.PLANNED


def test_completed_is_decided_by_the_output_not_the_ledger(cell_dir):
    ledger.append(cell_dir, "completed")
    st = state_of(cell_dir)
    assert st.state is State.FAILED and "no final weights" in st.reason
    finish(cell_dir / "output")
    st = state_of(cell_dir)
    assert (st.state, st.step, st.loss) == (State.COMPLETED, 4, 2.5)


def test_live_process_is_in_flight_and_a_dead_one_is_failed(cell_dir):
    ledger.append(cell_dir, "running", pid=os.getpid(), host=socket.gethostname())
    assert state_of(cell_dir).state is State.RUNNING
    ledger.append(cell_dir, "running", pid=dead_pid(), host=socket.gethostname())
    st = state_of(cell_dir)
    assert st.state is State.FAILED and "ended without recording an outcome" in st.reason


def test_failed_keeps_its_reason_and_annotations_do_not_change_state(cell_dir):
    ledger.append(cell_dir, "failed", reason="backend exited with 1: ValueError: boom", job_id="77")
    ledger.append(cell_dir, "archived", path="attempts/x/output")
    st = state_of(cell_dir)
    assert (st.state, st.reason, st.job_id) == (State.FAILED, "backend exited with 1: ValueError: boom", "77")


def test_torn_last_line_is_ignored(cell_dir):
    ledger.append(cell_dir, "failed", reason="x")
    with open(cell_dir / ledger.LEDGER_FILE, "a") as fh:
        fh.write('{"event": "runn')
    assert [e["event"] for e in ledger.events(cell_dir)] == ["failed"]


def test_progress_from_the_trainer_log(cell_dir):
    out = cell_dir / "output"
    out.mkdir()
    lines = [{"current_steps": 1, "total_steps": 8, "loss": 3.0}, {"current_steps": 2, "total_steps": 8, "loss": 2.0},
             {"current_steps": 2, "total_steps": 8}]
    (out / "trainer_log.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert ledger.progress(out) == (2, 8, 2.0)


def test_checkpoints_sorted_by_step(cell_dir):
    for n in (10, 2, 100):
        (cell_dir / f"checkpoint-{n}").mkdir()
    (cell_dir / "checkpoint-x").mkdir()
    assert [p.name for p in ledger.checkpoints(cell_dir)] == ["checkpoint-2", "checkpoint-10", "checkpoint-100"]


@pytest.mark.parametrize(
    "state, switches, runs",
    [
        (State.PLANNED, [], True),
        (State.COMPLETED, [], False),
        (State.COMPLETED, ["force=true"], True),
        (State.RUNNING, ["force=true", "rerun_failed=true"], False),
        (State.SUBMITTED, [], False),
        (State.FAILED, [], False),
        (State.FAILED, ["rerun_failed=true"], True),
        (State.CANCELLED, ["rerun_failed=true"], True),
    ],
)
def test_rerun_decisions(make_cells, state, switches, runs):
    (cell,) = make_cells(switches)
    why = decide(cell, ledger.CellState(state, reason="boom"))
    assert (why is None) is runs
    if state is State.FAILED and not runs:
        assert "boom" in why and "rerun_failed=true" in why


def test_elapsed_from_the_ledger(cell_dir):
    lines = [{"time": "2026-11-29T10:00:00+0000", "event": "running", "pid": 1, "host": "elsewhere"},
             {"time": "2026-11-29T11:02:03+0000", "event": "failed", "reason": "x"}]
    (cell_dir / ledger.LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert state_of(cell_dir).elapsed == "01:02:03"


def test_failure_reason_prefers_the_childs_error_over_the_launchers(tmp_path):
    from sft_grid.runner import failure_reason

    log = tmp_path / "train.log"
    log.write_text("step 1\nValueError: Output directory is not empty\n"
                   "subprocess.CalledProcessError: Command '['torchrun', ...]' returned non-zero exit status 1.\n")
    assert failure_reason(log, 1) == "backend exited with 1: ValueError: Output directory is not empty"
