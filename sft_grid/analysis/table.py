"""A grid's cells x values table: what `python -m sft_grid.results` prints and the report shows, one module for both.

Read from each cell's own files only (no harness, no backend, no numpy): cell.yaml (its rerun command names its
swept values; the config gives model, size, GPUs), the ledger and the trainer's output (state, steps, final
loss: the shared rules of core/state.py and grid/view.py, one sacct for a Slurm grid), the score files
(analysis/scores.py), estimate.json (what the grid estimated when it queued the cell) and the ledger's run times
(GPU-hours used: every run's wall time x the cell's GPUs; on a CPU-only node the runs' CPU time, one device).

Columns: the swept values (the keys whose values differ between the grid's cells), state, steps, final loss
(the mean training loss logged over the last 10% of the steps, at least the last logged one: a single step's
loss is noisy), each score, GPU-hours used and estimated. Base models (the evaluation's `_base/`) are rows too, marked `base`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from sft_grid.analysis import scores as sc
from sft_grid.core.layout import BASE_DIR, CELL_FILE, OUTPUT_DIR, TRAINER_LOG, TRAINER_STATE, iter_cell_dirs
from sft_grid.core.overrides import overrides_of, swept_values
from sft_grid.grid.costs import read_estimate, used_seconds
from sft_grid.grid.view import read_view

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# a pretraining compute budget in a model's name: delphi-3e18-base -> 3e18 FLOPs
_BUDGET = re.compile(r"(?<![\w.])(\d(?:\.\d+)?e\+?(1[5-9]|2\d))(?![\w.])")
# the (step, loss) and total steps of LLaMA-Factory's trainer_log.jsonl lines (the axolotl plugin writes the same)
LOG_LOSS = re.compile(r'"current_steps": (\d+)[^\n]*?"loss": ([-0-9.eE+]+)')
_LOG_TOTAL = re.compile(r'"total_steps": (\d+)')
FINAL_SHARE = 0.1


@dataclass
class Row:
    name: str
    dir: Path
    key: str = ""
    values: dict[str, str] = field(default_factory=dict)
    state: str = ""
    reason: str = ""
    step: int | None = None
    total: int | None = None
    final_loss: float | None = None
    latest_loss: float | None = None
    scores: dict[str, sc.Score] = field(default_factory=dict)
    wall_seconds: float | None = None
    gpus: int = 1
    cpu: bool = False  # a CPU-only node: its runs are counted in CPU time (CPU-hours stand in for GPU-hours)
    gpu_hours: float | None = None
    model: str = ""
    model_source: str = ""
    params: float | None = None
    compute_budget: float | None = None
    cluster: str = ""
    recipe: str = ""
    estimate: dict[str, Any] | None = None
    overrides: list[str] = field(default_factory=list)  # its rerun command's
    base: bool = False

    @property
    def estimate_gpu_hours(self) -> float | None:
        v = (self.estimate or {}).get("gpu_hours")
        return float(v) if isinstance(v, (int, float)) else None


@dataclass
class GridTable:
    name: str
    sweep_dir: Path
    axes: list[str]
    rows: list[Row]
    bases: list[Row]
    columns: list[str]  # score columns, <task>/<metric>


def budget_of(model: str) -> float | None:
    m = _BUDGET.search(model)
    return float(m.group(1)) if m else None


def state_losses(output: Path) -> list[tuple[int, float]]:
    """Every logged (step, loss) of trainer_state.json (where the trainer's per-step log is missing)."""
    try:
        data = json.loads((output / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return []
    return [(int(h.get("step") or 0), float(h["loss"])) for h in data.get("log_history") or ()
            if isinstance(h.get("loss"), (int, float))]


def final_losses(output: Path) -> list[tuple[int, float]]:
    """The logged (step, loss) of the last 10% of the steps, read from the tail of the trainer's per-step log
    (grown until it reaches back that far), else from trainer_state.json."""
    log = output / TRAINER_LOG
    if not log.is_file():
        return last_share(state_losses(output))
    size, want = log.stat().st_size, 0
    while True:
        want = max(2 * want, int(size * FINAL_SHARE * 1.2) + 8192)
        with log.open("rb") as fh:
            fh.seek(max(0, size - want))
            text = fh.read().decode(errors="replace")
        pairs = [(int(s), float(v)) for s, v in LOG_LOSS.findall(text)]
        totals = _LOG_TOTAL.findall(text)
        total = int(totals[-1]) if totals else (pairs[-1][0] if pairs else 0)
        if want >= size or not pairs or pairs[0][0] <= (1 - FINAL_SHARE) * total:
            return [p for p in pairs if p[0] > (1 - FINAL_SHARE) * total] or pairs[-1:]


def last_share(losses: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    if not losses:
        return []
    edge = (1 - FINAL_SHARE) * max(s for s, _ in losses)
    return [p for p in losses if p[0] > edge] or list(losses[-1:])


def final_loss(losses: Sequence[tuple[int, float]]) -> float | None:
    return sum(v for _, v in losses) / len(losses) if losses else None


def config_scalars(text: str, sections: Sequence[str] = ("model", "cluster")) -> dict[str, Any]:
    """The scalar keys of a cell.yaml's top level and of these sections, read from its lines: a sweep's own
    tables (`vars`) can be most of the file, and the table reads a few scalars of it. cell.yaml is written by
    grid/render.py with yaml.dump's block style, so each is `key: value` on its line; a value that is not a
    plain scalar is read by yaml."""
    out: dict[str, Any] = {s: {} for s in sections}
    section = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] != " ":
            key, _, value = line.partition(":")
            section = key if key in out and not value.strip() else None
            if section is None and value.strip():
                out.setdefault(key, _scalar(value.strip()))
        elif section is not None and line.startswith("  ") and line[2] != " ":
            key, _, value = line[2:].partition(":")
            if value.strip():
                out[section][key] = _scalar(value.strip())
    return out


def _scalar(text: str) -> Any:
    if text in ("null", "~"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text in ("true", "false"):
        return text == "true"
    if text[0] in "'\"[{":
        return yaml.load(text, Loader=_Loader)
    return text


def _cell_row(cell_dir: Path) -> Row:
    text = (cell_dir / CELL_FILE).read_text()
    cfg = config_scalars(text)
    model, cluster = cfg.get("model") or {}, cfg.get("cluster") or {}
    gpus = int(cfg.get("nodes") or 1) * max(1, int(cluster.get("gpus_per_node") or 0))
    cpu = cluster.get("gpu_type") == "CPU" or (not cluster.get("gpus_per_node") and not cluster.get("gpu_type"))
    params = model.get("params_b")
    overrides = overrides_of(text)
    return Row(cell_dir.name, cell_dir, key=cell_dir.name.rsplit("-", 1)[-1], overrides=overrides,
               values=swept_values(overrides), gpus=gpus, cpu=cpu, model=str(model.get("name") or ""),
               model_source=str(model.get("path") or model.get("hub_id") or ""),
               params=float(params) * 1e9 if isinstance(params, (int, float)) else None,
               compute_budget=budget_of(str(model.get("name") or "")), cluster=str(cluster.get("name") or ""),
               estimate=read_estimate(cell_dir))


def axes_of(rows: Sequence[Row]) -> list[str]:
    """Swept keys whose values differ between cells (a single cell: all of its own)."""
    keys = list(dict.fromkeys(k for r in rows for k in r.values))
    if len(rows) == 1:
        return keys
    return [k for k in keys if len({r.values.get(k) for r in rows}) > 1]


def _sets_size(rows: Sequence[Row], axis: str) -> bool:
    seen: dict[str | None, set[float | None]] = {}
    for r in rows:
        seen.setdefault(r.values.get(axis), set()).add(r.params)
    return all(len(s) == 1 for s in seen.values())


def _recipes(rows: list[Row], axes: Sequence[str]) -> None:
    """A cell's recipe: its values on the axes that do not set the model's size (the Delphi grid: its data)."""
    if len({r.params for r in rows}) < 2:
        return
    others = [a for a in axes if not _sets_size(rows, a)]
    for r in rows:
        r.recipe = ", ".join(str(r.values.get(a, "")).strip("[]") for a in others)


def _base_rows(sweep_dir: Path, cells: Sequence[Row]) -> list[Row]:
    out = []
    base_root = sweep_dir / BASE_DIR
    for d in sorted(base_root.iterdir()) if base_root.is_dir() else ():
        files = sc.read_files(d / "eval")
        if not files:
            continue
        model, path = files[0].model, files[0].model_path
        like = next((c for c in cells if c.model == model or (path and c.model_source == path)
                     or (model and c.model_source == model)), None)
        row = Row(d.name, d, state="base", base=True, model=model or (like.model if like else ""),
                  params=like.params if like else None, compute_budget=like.compute_budget if like else None,
                  values={a: v for a, v in (like.values.items() if like else ()) if _sets_size(cells, a)})
        row.scores = {f"{f.task}/{m}": s for f in files for m, s in f.metrics.items()}
        out.append(row)
    return out


def read_table(sweep_dir: Path) -> GridTable:
    """The table of the grid in `sweep_dir`."""
    dirs = list(iter_cell_dirs(sweep_dir))
    view = read_view(dirs)
    rows, raw, failed = [], [], []
    for d in dirs:
        row = _cell_row(d)
        st = view.state(d)
        history = view.histories[d]
        row.state, row.reason = st.state.value, st.reason
        row.step, row.total, row.latest_loss = st.progress.step, st.progress.total, st.progress.loss
        if st.state.value == "completed":
            row.final_loss = final_loss(final_losses(d / OUTPUT_DIR))
        row.wall_seconds = used_seconds(history, st.state.in_flight, row.cpu)
        row.gpu_hours = None if row.wall_seconds is None else row.wall_seconds * row.gpus / 3600
        got, bad = sc.cell_scores(d, history)
        raw.append(got)
        failed.append(bad)
        rows.append(row)
    bases = _base_rows(sweep_dir, rows)
    columns = sc.columns([*raw, *(b.scores for b in bases)])
    for row, got, bad in zip(rows, raw, failed):
        row.scores = sc.mark(got, bad, columns, row.state not in ("planned", "submitted", "running"))
    for b in bases:
        b.scores = sc.mark(b.scores, {}, columns, True)
    axes = axes_of(rows)
    _recipes(rows, axes)
    return GridTable(sweep_dir.name, sweep_dir, axes, rows, bases, columns)
