"""Each cell's append-only event ledger, and its state: ledger + the cell's own output + liveness.

events.jsonl holds one JSON object a line (time, event, and what the event knows: job id, pid, host,
reason, step). Lines are appended with O_APPEND in one write, so concurrent writers never interleave.
State is derived, never stored: a cell is completed only when its output holds final weights and the
trainer state, whatever the ledger or the scheduler says.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import datetime
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Mapping

LEDGER_FILE = "events.jsonl"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


class State(str, Enum):
    PLANNED = "planned"
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def in_flight(self) -> bool:
        return self in (State.SUBMITTED, State.RUNNING)


_STATE_EVENTS = frozenset(s.value for s in State)


@dataclass(frozen=True)
class CellState:
    state: State
    reason: str = ""
    job_id: str = ""
    # steps done / total, last logged loss: from the trainer's own files
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    # the job id was found by the array's name (the orchestrator died before recording it)
    recovered: bool = False
    # wall time of the latest run: the scheduler's, or from the ledger's running event to its end
    elapsed: str = ""


def append(cell_dir: Path, event: str, **fields: Any) -> None:
    """Append one event (one write, O_APPEND: concurrent writers never interleave within a line)."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "event": event, **fields}
    line = (json.dumps(record, sort_keys=False) + "\n").encode()
    fd = os.open(cell_dir / LEDGER_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def events(cell_dir: Path) -> list[dict[str, Any]]:
    path = cell_dir / LEDGER_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a killed writer is not an event
    return out


def output_complete(output_dir: Path) -> bool:
    """Final weights and trainer state. A ZeRO-3 run that does not gather at save (32B) writes its final
    weights as shards named by a `latest` file; its `consolidate` stage (sft_grid/post.py) makes them
    safetensors, so training is complete either way."""
    if not (output_dir / "trainer_state.json").is_file():
        return False
    return any((output_dir / w).is_file() for w in WEIGHT_FILES) or _zero_shards(output_dir)


def _zero_shards(output_dir: Path) -> bool:
    latest = output_dir / "latest"
    return latest.is_file() and (output_dir / latest.read_text().strip()).is_dir()


def checkpoints(output_dir: Path) -> list[Path]:
    """checkpoint-N directories, oldest first."""
    found = []
    for p in output_dir.glob("checkpoint-*") if output_dir.is_dir() else ():
        suffix = p.name.rsplit("-", 1)[-1]
        if suffix.isdigit() and p.is_dir():
            found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def progress(output_dir: Path) -> tuple[int | None, int | None, float | None]:
    """(step, total steps, last loss) from the trainer's own log, read from its last lines."""
    log = output_dir / "trainer_log.jsonl"
    if log.is_file():
        step = total = loss = None
        for line in reversed(_tail_lines(log)):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # the first line of the tail may be cut, the last one still being written
            if step is None and "current_steps" in rec:
                step, total = rec["current_steps"], rec.get("total_steps")
            if loss is None and "loss" in rec:
                loss = rec["loss"]
            if step is not None and loss is not None:
                break
        if step is not None:
            return step, total, loss
    state = output_dir / "trainer_state.json"
    if state.is_file():
        data = json.loads(state.read_text())
        losses = [h["loss"] for h in data.get("log_history", []) if "loss" in h]
        return data.get("global_step"), data.get("max_steps"), losses[-1] if losses else None
    return None, None, None


def _tail_lines(path: Path, size: int = 8192) -> list[str]:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - size))
        return fh.read().decode(errors="replace").splitlines()


def _alive(record: dict[str, Any]) -> bool | None:
    """Whether the process of a local event still runs; None when it is not on this machine."""
    pid, host = record.get("pid"), record.get("host")
    if not pid or host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class SlurmRef:
    """How a cell's latest submission is known to Slurm: its job id, or the array's name and index."""

    job_id: str
    name: str
    index: int

    @property
    def lookup(self) -> str:
        return self.job_id or f"{self.name}#{self.index}"


def slurm_ref(history: list[dict[str, Any]]) -> SlurmRef | None:
    """The Slurm job of the latest submission, if it went to Slurm."""
    for i in range(len(history) - 1, -1, -1):
        e = history[i]
        if e.get("event") == State.SUBMITTED.value:
            if e.get("executor") != "slurm":
                return None
            later = [x["job_id"] for x in history[i + 1:] if x.get("event") == "job" and x.get("job_id")]
            return SlurmRef(str(later[-1]) if later else "", str(e.get("name", "")), int(e.get("index", 0)))
    return None


def state_of(cell_dir: Path, output_dir: Path | None = None, jobs: Mapping[str, Any] | None = None,
             history: list[dict[str, Any]] | None = None) -> CellState:
    """The cell's state. `jobs`: the scheduler's view (sft_grid.slurm.sacct) of the grid's Slurm jobs."""
    history = events(cell_dir) if history is None else history
    state = _state(cell_dir, output_dir, jobs, history)
    if not state.elapsed:
        state = replace(state, elapsed=_elapsed(history, state.state))
    if state.state is State.CANCELLED:
        why = _prep_failure(history)
        state = replace(state, reason=why) if why else state
    return state


def _prep_failure(history: list[dict[str, Any]]) -> str:
    """Why the model prep this cell waited for failed (Slurm then cancels the cell's job), if it did."""
    preps = [e for e in history if e.get("event") == "prep" and e.get("dir")]
    if not preps:
        return ""
    prep_events = [e for e in events(Path(preps[-1]["dir"]).parent) if e.get("event") in _STATE_EVENTS]
    if prep_events and prep_events[-1]["event"] == State.FAILED.value:
        return f"its model prep failed: {prep_events[-1].get('reason', 'no reason recorded')}"
    return ""


def _elapsed(history: list[dict[str, Any]], state: State) -> str:
    starts = [i for i, e in enumerate(history) if e.get("event") == State.RUNNING.value]
    if not starts:
        return ""
    begin = _parse_time(history[starts[-1]]["time"])
    ends = [e for e in history[starts[-1] + 1:] if e.get("event") in (State.COMPLETED.value, State.FAILED.value,
                                                                       State.CANCELLED.value, "interrupted")]
    end = _parse_time(ends[0]["time"]) if ends else (time.time() if state.in_flight else None)
    if begin is None or end is None:
        return ""
    seconds = int(max(0, end - begin))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _parse_time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, TypeError):
        return None


def _state(cell_dir: Path, output_dir: Path | None, jobs: Mapping[str, Any] | None,
           history: list[dict[str, Any]]) -> CellState:
    output_dir = output_dir or cell_dir / "output"
    # other events (archived, resumed, job) annotate; only these decide the state
    states = [e for e in history if e.get("event") in _STATE_EVENTS]
    last = states[-1] if states else {}
    job_id = str(next((e["job_id"] for e in reversed(history) if e.get("job_id")), ""))
    step, total, loss = progress(output_dir)
    if output_complete(output_dir) and last.get("event") != State.RUNNING.value:
        return CellState(State.COMPLETED, job_id=job_id, step=step, total_steps=total, loss=loss)
    event = last.get("event", State.PLANNED.value)
    if event in (State.SUBMITTED.value, State.RUNNING.value):
        ref = slurm_ref(history)
        if ref is not None:
            return _slurm_state(ref, State(event), last, jobs, (step, total, loss))
        if _alive(last) is False:
            return CellState(State.FAILED, f"its process {last.get('pid')} on {last.get('host')} ended without"
                             " recording an outcome (killed, or out of memory?)", job_id, step, total, loss)
        return CellState(State(event), job_id=job_id, step=step, total_steps=total, loss=loss)
    if event == State.COMPLETED.value:
        return CellState(State.FAILED, "the ledger says completed but the output has no final weights and"
                         " trainer_state.json (deleted or moved?)", job_id)
    if event in (State.FAILED.value, State.CANCELLED.value):
        return CellState(State(event), last.get("reason", ""), job_id, step, total, loss)
    return CellState(State.PLANNED)


def _slurm_state(ref: SlurmRef, event: State, last: dict[str, Any], jobs: Mapping[str, Any] | None,
                 progress_: tuple[Any, Any, Any]) -> CellState:
    step, total, loss = progress_
    job = (jobs or {}).get(ref.lookup)
    if job is not None and ref.name and job.name and job.name != ref.name:
        # the id now names another job (the cluster's job ids were reset): this cell's job is gone
        return CellState(State.FAILED, f"Slurm job {ref.job_id} is no longer this cell's job ({ref.name});"
                         " the cluster's job ids were reset", ref.job_id, step, total, loss)
    job_id = ref.job_id or (job.job_id if job is not None else "")
    if job is None:
        if ref.job_id or jobs is None or _alive(last) is not False:
            return CellState(event, job_id=ref.job_id, step=step, total_steps=total, loss=loss)
        # sbatch never ran (or failed): the submitting process is gone and no job carries the array's name
        return CellState(State.PLANNED)
    recovered = not ref.job_id
    if job.in_flight:
        running = job.state in ("RUNNING", "COMPLETING") or event is State.RUNNING
        return CellState(State.RUNNING if running else State.SUBMITTED, job_id=job_id, step=step,
                         total_steps=total, loss=loss, recovered=recovered, elapsed=job.elapsed)
    if job.state == "CANCELLED":
        return CellState(State.CANCELLED, "cancelled in Slurm", job_id, step, total, loss, recovered)
    why = f"Slurm job {job_id} ended {job.state}" + (f" ({job.reason})" if job.reason else "")
    if job.state == "COMPLETED":
        why += " but the output has no final weights and trainer_state.json"
    return CellState(State.FAILED, why, job_id, step, total, loss, recovered)


def iter_cell_dirs(sweep_dir: Path) -> Iterator[Path]:
    if sweep_dir.is_dir():
        for p in sorted(sweep_dir.iterdir()):
            if not p.name.startswith(".") and (p / "cell.yaml").is_file():  # .*: scratch of a cell being written
                yield p
