"""Cell states from the ledger, the cell's own output and process liveness; what a rerun does with each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import LEDGER_FILE, Progress, checkpoints, progress
from sft_grid.core.state import CellState, State, state_of
from sft_grid.grid.decide import skip_reason


def append(cell_dir, kind: str, **fields) -> None:
    events.append(cell_dir, Event(Kind(kind), **fields))


def finish(output: Path, steps: int = 4) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "model.safetensors").write_bytes(b"w")
    (output / "trainer_state.json").write_text(
        json.dumps({"global_step": steps, "max_steps": steps, "log_history": [{"loss": 2.5, "step": steps}]})
    )


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
    append(cell_dir, "completed")
    st = state_of(cell_dir)
    assert st.state is State.FAILED and "no final weights" in st.reason
    finish(cell_dir / "output")
    st = state_of(cell_dir)
    assert (st.state, st.progress.step, st.progress.loss) == (State.COMPLETED, 4, 2.5)


def test_live_process_is_in_flight_and_a_dead_one_is_failed(cell_dir):
    append(cell_dir, "running", pid=os.getpid(), host=socket.gethostname())
    assert state_of(cell_dir).state is State.RUNNING
    append(cell_dir, "running", pid=dead_pid(), host=socket.gethostname())
    st = state_of(cell_dir)
    assert st.state is State.FAILED and "ended without recording an outcome" in st.reason


def test_failed_keeps_its_reason_and_annotations_do_not_change_state(cell_dir):
    append(cell_dir, "failed", reason="backend exited with 1: ValueError: boom", job_id="77")
    append(cell_dir, "archived", path="attempts/x/output")
    st = state_of(cell_dir)
    assert (st.state, st.reason, st.job_id) == (State.FAILED, "backend exited with 1: ValueError: boom", "77")


def test_torn_last_line_is_ignored(cell_dir):
    append(cell_dir, "failed", reason="x")
    with open(cell_dir / LEDGER_FILE, "a") as fh:
        fh.write('{"event": "runn')
    assert [e.kind for e in events.read(cell_dir)] == [Kind.FAILED]


def test_progress_from_the_trainer_log(cell_dir):
    out = cell_dir / "output"
    out.mkdir()
    lines = [
        {"current_steps": 1, "total_steps": 8, "loss": 3.0},
        {"current_steps": 2, "total_steps": 8, "loss": 2.0},
        {"current_steps": 2, "total_steps": 8},
    ]
    (out / "trainer_log.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert progress(out) == Progress(2, 8, 2.0)


def test_checkpoints_sorted_by_step(cell_dir):
    for n in (10, 2, 100):
        (cell_dir / f"checkpoint-{n}").mkdir()
    (cell_dir / "checkpoint-x").mkdir()
    assert [p.name for p in checkpoints(cell_dir)] == ["checkpoint-2", "checkpoint-10", "checkpoint-100"]


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
    why = skip_reason(cell, CellState(state=state, reason="boom"))
    assert (why is None) is runs
    if state is State.FAILED and not runs:
        assert "boom" in why and "rerun_failed=true" in why


def test_elapsed_from_the_ledger(cell_dir):
    lines = [
        {"time": "2026-11-29T10:00:00+0000", "event": "running", "pid": 1, "host": "elsewhere"},
        {"time": "2026-11-29T11:02:03+0000", "event": "failed", "reason": "x"},
    ]
    (cell_dir / LEDGER_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert state_of(cell_dir).elapsed == "01:02:03"


def test_a_failed_cell_is_triaged_from_its_log_the_childs_error_not_the_launchers(tmp_path):
    from sft_grid.core.events import Event, Kind
    from sft_grid.core.failures import FailureClass, RemedyKind
    from sft_grid.core.failures.cell import failed_event, triage

    cell_dir = tmp_path / "cell"
    (cell_dir / "logs").mkdir(parents=True)
    (cell_dir / "cell.yaml").write_text(
        "# Rerun this cell: python -m sft_grid model=tiny_llama lr=1e-05\n"
        "lr: 1.0e-05\nmicro_batch_size: 2\ncluster:\n  max_requeues: 3\n"
    )
    launcher = "subprocess.CalledProcessError: Command '['torchrun', ...]' returned non-zero exit status 1.\n"
    (cell_dir / "logs" / "train.log").write_text(
        "step 1\nTraceback (most recent call last):\n"
        '  File "/envs/lf/lib/python3.11/site-packages/llamafactory/hparams/parser.py", line 301, in get_train_args\n'
        '    raise ValueError("Output directory already exists and is not empty.")\n'
        "ValueError: Output directory already exists and is not empty.\n" + launcher
    )
    history = [Event(Kind.SUBMITTED, executor="local"), Event(Kind.RUNNING)]
    failure, remedy = triage(cell_dir, history)
    assert failure.klass is FailureClass.BACKEND_ERROR  # raised by the backend's argument parsing: its config
    assert failure.evidence == "ValueError: Output directory already exists and is not empty."
    assert remedy.kind is RemedyKind.STOP
    assert "python -m sft_grid model=tiny_llama lr=1e-05 rerun_failed=true" in remedy.message
    event = failed_event(failure, remedy, rc=1)
    assert event.to_json()["class"] == "backend_error" and event.to_json()["action"] == "stop"
    assert Event.from_json(event.to_json()) == event  # typed in memory, the same values in the file

    # the same exception from the user's own code once training ran (a loss logged): nothing says whose fault it is
    (cell_dir / "logs" / "train.log").write_text(
        "step 1\n{'loss': 1.93, 'epoch': 0.5}\nValueError: Output directory is not empty\n" + launcher
    )
    failure, remedy = triage(cell_dir, history)
    assert failure.klass is FailureClass.UNKNOWN and failure.evidence == "ValueError: Output directory is not empty"
    assert "read logs/train.log around the line quoted above" in remedy.message


def test_the_ledger_keeps_a_class_this_version_does_not_know():
    from sft_grid.core.events import Event

    data = {"time": "t", "event": "failed", "class": "gremlins", "action": "pray", "reason": "x"}
    event = Event.from_json(data)
    assert event.failure_class is None and event.action is None
    assert event.to_json() == data


# -- ledgers written by sft_grid 0.1.0 still load (tests/fixtures/ledgers_0.1) -------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "ledgers_0.1"


@pytest.mark.parametrize("name", ["local_forced_rerun", "local_failed", "slurm_with_post_job", "annotations"])
def test_a_010_ledger_loads_as_typed_events_and_writes_back_the_same(name, tmp_path):
    lines = [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    (tmp_path / LEDGER_FILE).write_text((FIXTURES / f"{name}.jsonl").read_text())
    read = events.read(tmp_path)
    assert len(read) == len(lines) and Kind.OTHER not in {e.kind for e in read}
    # every key of every line is a typed field or kept in details: written back, the line is the same
    assert [e.to_json() for e in read] == lines


def test_what_a_010_ledger_says_is_read_into_its_fields(tmp_path):
    from sft_grid.core.state import slurm_ref

    (tmp_path / LEDGER_FILE).write_text((FIXTURES / "slurm_with_post_job.jsonl").read_text())
    history = events.read(tmp_path)
    ref = slurm_ref(history)
    assert ref is not None and ref.array.startswith("sft_grid-") and ref.index == 0 and ref.job_id
    post_job = events.last(history, Kind.POST_JOB)
    assert post_job.post_job_id and post_job.after == ref.job_id and post_job.array.startswith("sft_grid-")
    stage = events.last(history, Kind.STAGE)
    assert (stage.stage, stage.state) == ("tokenizer", "completed") and stage.details["checked"] == 2
    (tmp_path / LEDGER_FILE).write_text((FIXTURES / "annotations.jsonl").read_text())
    history = events.read(tmp_path)
    prep = events.last(history, Kind.PREP)
    assert prep.prepared.endswith("/model") and prep.prep_job_id == "41" and prep.model == "tiny_delphi"
    assert events.last(history, Kind.RESUMED).checkpoint == "checkpoint-20"
    assert events.last(history, Kind.INTERRUPTED).signal == 15
    st = state_of(tmp_path)
    assert st.state is State.CANCELLED and st.reason == "cancelled by python -m sft_grid.cancel"


def test_a_010_failed_cell_keeps_its_state_and_reason(tmp_path):
    (tmp_path / LEDGER_FILE).write_text((FIXTURES / "local_failed.jsonl").read_text())
    st = state_of(tmp_path)
    assert st.state is State.FAILED and "bogus_key" in st.reason and st.job_id


def test_a_cancel_wins_over_the_running_its_job_writes_after_it(cell_dir):
    """`sft-grid cancel` and the job's own start can cross: the cancel names the job, and wins."""
    append(cell_dir, "submitted", executor="local", pid=os.getpid(), host=socket.gethostname())
    append(cell_dir, "cancelled", reason="cancelled by sft-grid cancel", job_id="7")
    append(cell_dir, "running", pid=os.getpid(), host=socket.gethostname(), job_id="7")
    assert state_of(cell_dir).state is State.CANCELLED
    # a later submission's running is that submission's: the old cancel does not apply to it
    append(cell_dir, "submitted", executor="local", pid=os.getpid(), host=socket.gethostname())
    append(cell_dir, "running", pid=os.getpid(), host=socket.gethostname(), job_id="8")
    assert state_of(cell_dir).state is State.RUNNING
