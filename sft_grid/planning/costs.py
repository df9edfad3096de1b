"""A grid's cost before launch: each cell's estimate (planning/estimate.py) from what can be read here.

Per cell it gathers: each data source's token sample (the loss-mask probe's rows, tokenised by the backend's
own preprocessing: `Preflight.lengths`) and its row count (a local file or the Hugging Face cache, counted
once per file), scaled through the cell's mix; the model's depth and attention width from its config.json
(else a guess from its size, said so); the cluster's GPU type and GPUs; the cell's wall time and requeues; the
throughput of planning/estimate.py, calibrated from what the completed cells under the cell's runs root
took (below) or a default. A cell whose tokens cannot be counted here (hub data not in the cache)
gets no estimate, with the reason.

What it gives the flow: the estimates (printed by a dry run, written to each queued cell's estimate.json), a
problem for each cell to run whose estimate exceeds its wall time x (1 + requeues), and the free space of each
runs root to compare the disk estimate with.

The calibration (below) is what completed cells took: their run seconds (CPU seconds on CPU-only nodes) against
their tokens and FLOPs, read from each cell's ledger, trainer state and estimate.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import (
    CELL_FILE,
    ESTIMATE_FILE,
    OUTPUT_DIR,
    TRAIN_RESULTS,
    TRAINER_STATE,
    output_complete,
    tail_lines,
)
from sft_grid.core.problems import Problem
from sft_grid.core.schema import exact_params, weights_bytes
from sft_grid.core.state import parse_time
from sft_grid.core.submission import CellFiles
from sft_grid.core.timefmt import parse_minutes
from sft_grid.planning.cells import Cell
from sft_grid.planning.estimate import (
    Calibration,
    CellPlan,
    Estimate,
    Layout,
    Measured,
    Model,
    Source,
    calibrate,
    disk_bound,
    estimate_cell,
    mixed_rows,
    throughput,
)
from sft_grid.planning.inputs import pin_of, preps
from sft_grid.planning.readable import data_files, locate, model_config

# d_model / n_layers of Llama- and Qwen-shaped models (4096/32, 2048/16, 5120/40): the shape guessed from the
# size alone, N ~ 12 L d^2, when no config.json is readable here
_ASPECT = 128


@dataclass(frozen=True, kw_only=True)
class GridCosts:
    """What the grid's cells cost, before launch: part of the frozen plan."""

    estimates: Mapping[str, Estimate] = field(default_factory=dict)  # cell name -> estimate
    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # cell name -> what estimate.json records
    unknown: Mapping[str, str] = field(default_factory=dict)  # cell name -> why it has no estimate
    # cell name -> the most it keeps on disk, for cells without an estimate (save_total_limit checkpoints)
    disk_bounds: Mapping[str, float] = field(default_factory=dict)
    calibrations: Mapping[str, Calibration] = field(default_factory=dict)
    free_bytes: Mapping[Path, int] = field(default_factory=dict)  # runs root -> free space there
    # each model prep still to run -> what its prepared copy weighs: the checkpoint rewritten in the dtype it is
    # stored in (a Delphi checkpoint: float32, 4 bytes a parameter), under the runs root
    prepared_bytes: Mapping[Path, float] = field(default_factory=dict)

    def file_text(self, name: str) -> str | None:
        """estimate.json of a cell: the estimate and what it was made from (the calibration reads it back)."""
        est = self.estimates.get(name)
        if est is None:
            return None
        return _indented({**self.inputs[name], **est.to_json()})


# estimate.json names no cell, so the cells of one shape (a sweep of seeds) write the same text: each distinct
# content (keyed by its compact JSON, from the C encoder) is indented once by the pure-Python encoder
_TEXTS: dict[str, str] = {}


def _indented(data: dict[str, Any]) -> str:
    key = json.dumps(data, default=str)
    text = _TEXTS.get(key)
    if text is None:
        if len(_TEXTS) > 16384:
            _TEXTS.clear()
        text = _TEXTS[key] = json.dumps(data, indent=1, default=str) + "\n"
    return text


def _count_rows(path: Path) -> int | None:
    """Rows of a data file: lines of JSON lines, items of a JSON list, a parquet file's metadata."""
    if path.suffix == ".jsonl":  # line by line: a file of many GB is never held whole (and it is faster)
        with path.open("rb") as fh:
            return sum(1 for line in fh if line.strip())
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return len(data) if isinstance(data, list) else 1
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return int(pq.ParquetFile(path).metadata.num_rows)


_ROWS: dict[tuple[str, int, int], int | None] = {}


def source_rows(source: str) -> int | None:
    """Rows of a dataset readable here, cached per file (path, size, mtime); None when not readable."""
    where = locate(source, "datasets")
    if where is None:
        return None
    total = 0
    try:
        for f in data_files(where):
            st = f.stat()
            key = (str(f), st.st_size, st.st_mtime_ns)
            if key not in _ROWS:
                _ROWS[key] = _count_rows(f)
            if _ROWS[key] is None:
                return None
            total += _ROWS[key] or 0
    except (OSError, ValueError):
        return None
    return total


def model_shape(cell: Cell) -> tuple[int, int] | None:
    """(layers, attention width) from the model's config.json readable here (readable.model_config: the file the
    shape rule compares with, read the same way), or None."""
    found = model_config(cell)
    if found is None:
        return None
    cfg = found[1]
    try:
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        return int(cfg["num_hidden_layers"]), heads * head_dim
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _model(cell: Cell) -> tuple[Model, str]:
    m = cell.spec.model
    params = float(exact_params(m))
    shape = model_shape(cell)
    if shape is not None:
        return Model(params, *shape), "config.json"
    if m.num_layers and m.hidden_size:
        # the publisher's shape (every model the tables name has heads x head_dim = hidden size)
        return Model(params, m.num_layers, m.hidden_size), "the model's stated shape"
    d = (params * _ASPECT / 12) ** (1 / 3)
    return Model(params, max(1, round(d / _ASPECT)), round(d)), f"shape guessed from its size (d = {_ASPECT} layers)"


def gpu_of(cell: Cell) -> str:
    c = cell.spec.cluster
    return c.gpu_type or ("CPU" if not c.gpus_per_node else "")


class _Reads:
    """What `plan_of` reads here, once per distinct input of a grid (its cells share a few models and sources:
    locating a source, listing its files and stating them, or resolving a model's path, per cell adds up over
    1000 cells). One per `estimate` call: a later call sees the files as they are then."""

    def __init__(self) -> None:
        self._rows: dict[str, int | None] = {}
        self._models: dict[tuple[Any, ...], tuple[Model, str]] = {}

    def rows(self, source: str) -> int | None:
        if source not in self._rows:
            self._rows[source] = source_rows(source)
        return self._rows[source]

    def model(self, cell: Cell) -> tuple[Model, str]:
        m = cell.spec.model
        # what _model reads of the cell: the model's size, path or hub id, its revision, the cache and its pin
        key = (
            m.params_b,
            m.params,
            m.num_layers,
            m.hidden_size,
            m.path,
            m.hub_id,
            m.revision,
            cell.spec.cluster.hf_cache,
            pin_of(cell, "model", m.hub_id or ""),
        )
        if key not in self._models:
            self._models[key] = _model(cell)
        return self._models[key]


def layout_of(cell: Cell, model: Model) -> Layout | None:
    """What the estimate's time reads of a GPU cell's layout (planning/gpus.py); None on a CPU-only node."""
    lay, c = cell.layout, cell.spec.cluster
    if not c.gpus_per_node:
        return None
    return Layout(
        gpus_per_node=c.gpus_per_node,
        nodes=lay.nodes,
        micro_batch_size=cell.spec.micro_batch_size,
        layers=model.n_layers,
        checkpointing=lay.checkpointing,
        sharding=lay.sharding,
        offload=lay.offload,
        liger=lay.liger,
        fp32_gradients=lay.sharding == "none" and cell.spec.backend.name != "axolotl",
        internode_gbps=c.internode_gbps,
    )


def plan_of(
    cell: Cell,
    lengths: Mapping[str, Sequence[int]],
    reads: _Reads | None = None,
) -> tuple[CellPlan, str, dict[str, Any]]:
    """The estimate's input for a cell, and why it has no token count ("" when it has)."""
    s = cell.spec
    reads = reads or _Reads()
    rows, why = [], ""
    sampled: dict[str, Sequence[float]] = dict(lengths)
    for name, ds in s.dataset.items():
        n = reads.rows(ds.source)
        if not sampled.get(name) and ds.tokens and ds.rows and ds.tokens_template in (None, s.model.template):
            # not readable here, but its config states its count under this template: every row at the mean length
            sampled[name], n = (ds.tokens / ds.rows,), n or ds.rows
        if not sampled.get(name):
            why = why or f"no token sample of dataset {name} ({ds.source}): the loss-mask probe could not read it here"
        elif n is None:
            why = why or f"dataset {name} ({ds.source}) is not readable here to count its rows"
        rows.append(n or 0)
    per_epoch = mixed_rows(rows, s.mix.strategy, s.mix.probs)
    model, shape_from = reads.model(cell)
    extra = s.extra or {}
    plan = CellPlan(
        name=cell.name,
        model=model,
        sources=tuple(Source(n, r, tuple(sampled.get(n, ()))) for n, r in zip(s.dataset, per_epoch, strict=True)),
        cutoff_len=s.cutoff_len,
        global_batch_size=s.global_batch_size,
        epochs=s.epochs,
        max_steps=max(0, s.max_steps),
        packing=cell.layout.packing,
        gpus=cell.world_size,
        precision=s.cluster.precision,
        save_steps=s.save_steps,
        save_total_limit=s.save_total_limit,
        save_optimizer=not extra.get("save_only_model"),
        max_time_s=parse_minutes(s.time) * 60 if s.cluster.executor == "slurm" else None,
        requeues=s.cluster.max_requeues if s.cluster.executor == "slurm" else 0,
        layout=layout_of(cell, model),
    )
    inputs = {
        "cluster": s.cluster.name,
        "gpu": gpu_of(cell),
        "gpus": cell.world_size,
        "params": model.params,
        "n_layers": model.n_layers,
        "d_attn": model.d_attn,
        "shape_from": shape_from,
        "rows": dict(zip(s.dataset, per_epoch, strict=True)),
        "sampled_rows": {n: len(lengths.get(n, ())) for n in s.dataset},
    }
    return plan, why, inputs


def free_space(root: Path) -> int | None:
    """Free bytes of the filesystem a runs root is (or will be) on."""
    for p in (root, *root.parents):
        if p.exists():
            try:
                return shutil.disk_usage(p).free
            except OSError:
                return None
    return None


def estimate(cells: Sequence[Cell], lengths: Mapping[str, Mapping[str, Sequence[int]]]) -> GridCosts:
    """Every cell's estimate (module docstring)."""
    roots = list(dict.fromkeys(c.runs_root for c in cells))
    calibrated = calibrations(roots)
    free_bytes = {root: free for root in roots if (free := free_space(root)) is not None}
    prepared = {p.dir: float(weights_bytes(users[0].spec.model)) for p, users in preps(cells).items() if not p.complete}
    estimates: dict[str, Estimate] = {}
    inputs_of: dict[str, Mapping[str, Any]] = {}
    unknown: dict[str, str] = {}
    disk_bounds: dict[str, float] = {}
    throughputs: dict[tuple[str, str, float | None], Any] = {}
    reads = _Reads()
    # cells that differ only in what the estimate does not read (a seed, a learning rate) have one plan but for
    # its name: each is estimated once (counting a source's sampled lengths is the most of it)
    shapes: dict[tuple[CellPlan, Any], Estimate] = {}
    for cell in cells:
        plan, why, inputs = plan_of(cell, lengths.get(cell.name, {}), reads)
        if why:
            unknown[cell.name] = why
            bound = disk_bound(plan)
            if bound is not None:
                disk_bounds[cell.name] = bound
            continue
        c = cell.spec.cluster
        key = (c.name, gpu_of(cell), c.gpu_peak_tflops)
        if key not in throughputs:
            throughputs[key] = throughput(c.name, key[1], calibrated, c.gpu_peak_tflops)
        shape = (replace(plan, name=""), throughputs[key])
        if shape not in shapes:
            shapes[shape] = estimate_cell(plan, throughputs[key])
        estimates[cell.name] = replace(shapes[shape], cell=cell.name)
        inputs_of[cell.name] = inputs
    return GridCosts(
        estimates=MappingProxyType(estimates),
        inputs=MappingProxyType(inputs_of),
        unknown=MappingProxyType(unknown),
        disk_bounds=MappingProxyType(disk_bounds),
        calibrations=MappingProxyType(calibrated),
        free_bytes=MappingProxyType(free_bytes),
        prepared_bytes=MappingProxyType(prepared),
    )


def problems(costs: GridCosts, to_run: Sequence[Cell]) -> list[Problem]:
    """A cell to run whose estimate exceeds its wall time x (1 + requeues): it would never finish."""
    out = []
    for cell in to_run:
        est = costs.estimates.get(cell.name)
        if est is not None and est.exceeds_wall:
            assert est.throughput is not None
            out.append(
                Problem(
                    cell=cell.name,
                    key="time",
                    value=cell.spec.time,
                    rule="estimate-wall-time",
                    message=f"{est.notes[-1]} ({est.throughput.detail})",
                    fix="raise `time` (up to cluster.max_time) or cluster.max_requeues, give the cell more nodes,"
                    " or shorten it (epochs, max_steps)",
                )
            )
    return out


def with_file(files: CellFiles, costs: GridCosts | None, cell: str | None) -> CellFiles:
    """A queued cell's files with its estimate.json (what the grid expected of it when it queued it); cells
    that are not run keep the one they have."""
    text = costs.file_text(cell) if costs is not None and cell is not None else None
    return CellFiles(files.dir, {**files.files, ESTIMATE_FILE: text}) if text is not None else files


def env_disabled() -> bool:
    """SFT_GRID_ESTIMATES=0 turns estimates off (the benchmark's baseline)."""
    return os.environ.get("SFT_GRID_ESTIMATES", "1") == "0"


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
        end_event = next((x for x in history[i + 1 :] if x.kind in _ENDS or x.kind is Kind.RUNNING), None)
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
        end = next((x for x in history[i + 1 :] if x.kind in _ENDS or x.kind is Kind.RUNNING), None)
        spent = end.details.get("cpu_seconds") if cpu and end is not None and end.kind is not Kind.RUNNING else None
        if isinstance(spent, (int, float)):
            out.append(float(spent))
            continue
        runs = run_intervals([*history[i : i + 1], *([end] if end is not None else [])], now)
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
    if not starts or any(e.kind is Kind.RESUMED for e in history[starts[-1] :]):
        return None
    took = run_seconds(history[starts[-1] :], est.get("gpu") == "CPU")
    if not took or took[0] <= 0:
        return None
    try:
        return Measured(
            cell=cell_dir.name,
            cluster=str(est["cluster"]),
            gpu=str(est["gpu"]),
            gpus=int(est["gpus"]),
            params=float(est["params"]),
            seconds=took[0],
            tokens=float(est["tokens"]),
            flops=float(est["flops"]),
            train_seconds=seconds,
        )
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
            found += [
                Path(e.path)
                for e in os.scandir(grid)
                if not e.name.startswith((".", "_")) and os.path.isfile(os.path.join(e.path, CELL_FILE))
            ]
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
