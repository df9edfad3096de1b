"""What completed cells took: the measurements the throughput calibration is fitted to (planning/throughput.py),
and the device time a cell used.

A completed cell is measured from its own files: what the grid estimated when it queued it (estimate.json: its
tokens and FLOPs counted from the token sample, its GPUs, model size, cluster and GPU type) and what its
completing run took, from the ledger: the wall time from its last `running` to `completed` (start-up, checks and
training; not the post-training stages, recorded after), or on CPU-only nodes the run's CPU time, which the job
records with the outcome (`cpu_seconds`: user + system of the training's processes). A cell that resumed from a
checkpoint in its last run is left out: its run did part of the training only.

Every completed cell under a runs root counts, whatever grid it belongs to: the calibration is per cluster.
Reading is cheap (small files; trainer_state.json only from its tail), so the dry run can afford it.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import (CELL_FILE, ESTIMATE_FILE, OUTPUT_DIR, TRAIN_RESULTS, TRAINER_STATE,
                                  output_complete, tail_lines)
from sft_grid.core.state import parse_time
from sft_grid.planning.throughput import Calibration, Measured, calibrate

_RUNTIME = re.compile(r'"train_runtime":\s*([0-9.eE+-]+)')
_ENDS = (Kind.COMPLETED, Kind.FAILED, Kind.CANCELLED, Kind.INTERRUPTED)


def run_intervals(history: Sequence[Event], now: float | None = None) -> list[tuple[float, float]]:
    """(start, end) of each run of the cell: a `running` event to the outcome that follows it; a run still
    going ends `now` (None: left out). A run whose end was never recorded (its process died) is left out."""
    out = []
    for i, e in enumerate(history):
        if e.kind is not Kind.RUNNING:
            continue
        start = parse_time(e.time)
        end_event = next((x for x in history[i + 1:] if x.kind in _ENDS or x.kind is Kind.RUNNING), None)
        if end_event is not None and end_event.kind is Kind.RUNNING:
            continue
        end = parse_time(end_event.time) if end_event is not None else now
        if start is not None and end is not None and end >= start:
            out.append((start, end))
    return out


def run_seconds(history: Sequence[Event], cpu: bool, now: float | None = None) -> list[float]:
    """What each run of the cell took: its wall time, or (`cpu`, a CPU-only node) the CPU time its outcome
    recorded where it did (else its wall time)."""
    out = []
    for i, e in enumerate(history):
        if e.kind is not Kind.RUNNING:
            continue
        end = next((x for x in history[i + 1:] if x.kind in _ENDS or x.kind is Kind.RUNNING), None)
        spent = end.details.get("cpu_seconds") if cpu and end is not None and end.kind is not Kind.RUNNING else None
        if isinstance(spent, (int, float)):
            out.append(float(spent))
            continue
        runs = run_intervals(history[i:i + 1] + ([end] if end is not None else []), now)
        out += [b - a for a, b in runs]
    return out


def used_seconds(history: Sequence[Event], in_flight: bool, cpu: bool = False) -> float | None:
    """Seconds of every run of the cell (a run in flight counts until now); None when it never ran."""
    runs = run_seconds(history, cpu, time.time() if in_flight else None)
    return sum(runs) if runs else None


def train_runtime(output: Path) -> float | None:
    """The trainer's train_runtime: from its results file, else from the tail of trainer_state.json."""
    for name in TRAIN_RESULTS:
        path = output / name
        if path.is_file():
            try:
                value = json.loads(path.read_text()).get("train_runtime")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(value, (int, float)):
                return float(value)
    state = output / TRAINER_STATE
    if state.is_file():
        found = _RUNTIME.findall("\n".join(tail_lines(state, 4096)))
        if found:
            return float(found[-1])
    return None


def read_estimate(cell_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((cell_dir / ESTIMATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def measured(cell_dir: Path, history: Sequence[Event] | None = None) -> Measured | None:
    """A completed cell as the calibration wants it, or None (not completed, resumed, or not estimated)."""
    output = cell_dir / OUTPUT_DIR
    if not output_complete(output):
        return None
    est = read_estimate(cell_dir)
    if est is None:
        return None
    seconds = train_runtime(output)
    history = events.read(cell_dir) if history is None else history
    starts = [i for i, e in enumerate(history) if e.kind is Kind.RUNNING]
    if not starts or any(e.kind is Kind.RESUMED for e in history[starts[-1]:]):
        return None
    took = run_seconds(history[starts[-1]:], est.get("gpu") == "CPU")
    if not took or took[0] <= 0:
        return None
    try:
        return Measured(cell_dir.name, str(est["cluster"]), str(est["gpu"]), int(est["gpus"]), float(est["params"]),
                        took[0], float(est["tokens"]), float(est["flops"]), train_seconds=seconds)
    except (KeyError, TypeError, ValueError):
        return None


def cell_dirs_under(runs_root: Path) -> list[Path]:
    """Every cell directory of every grid under a runs root (os.scandir: one call per directory)."""
    found = []
    try:
        grids = [e.path for e in os.scandir(runs_root) if e.is_dir() and not e.name.startswith((".", "_"))]
    except OSError:
        return []
    for grid in grids:
        try:
            found += [Path(e.path) for e in os.scandir(grid) if not e.name.startswith((".", "_"))
                      and os.path.isfile(os.path.join(e.path, CELL_FILE))]
        except OSError:
            continue
    return sorted(found)


def measured_under(runs_roots: Iterable[Path]) -> list[Measured]:
    out = []
    for root in dict.fromkeys(runs_roots):
        for cell_dir in cell_dirs_under(root):
            if os.path.isfile(os.path.join(cell_dir, ESTIMATE_FILE)):
                m = measured(cell_dir)
                if m is not None:
                    out.append(m)
    return out


def calibrations(runs_roots: Iterable[Path]) -> dict[str, Calibration]:
    """Each cluster's calibration from the completed cells under these runs roots."""
    return calibrate(measured_under(runs_roots))
