"""A cell's evaluation scores, read from its score files and its ledger only (never the harness).

The evaluation stage writes one file a score, `<cell>/eval/<score_id>.json` (base models: `<sweep>/_base/<model
slug>-<key>/eval/<score_id>.json`, with "base": true):

    {"score_id", "task", "suite", "settings", "harness", "model", "model_path", "template_digest",
     "metrics": {"<metric>": v, "<metric>_stderr": v}, "time", "seconds"}

Metrics are read in that flat form, and in lm-eval's (`acc,none` / `acc_stderr,none`) and the nested one
(`{"acc": {"value", "stderr"}}`); a `,none` filter suffix is dropped. A column is `<task>/<metric>`. When one
task has several score files (its settings changed, so a new score id), the latest (`time`) is shown.

A failed evaluation is in the ledger: a `stage` event whose stage starts with `eval`, state `failed`, naming
its task (`task` or `tasks`; none named: every task of the cell without a score). A score the grid's other
cells have and this completed cell has not is `missing`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import EVAL_DIR

OK, MISSING, FAILED, PENDING = "ok", "missing", "failed", "pending"


@dataclass(frozen=True)
class Score:
    value: float | None = None
    stderr: float | None = None
    status: str = OK  # ok, missing (the cell is done, the score is not there), failed, pending (cell not done)
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "stderr": self.stderr, "status": self.status,
                **({"reason": self.reason} if self.reason else {})}


@dataclass(frozen=True)
class ScoreFile:
    task: str
    metrics: dict[str, Score]
    time: str
    model: str
    model_path: str
    base: bool


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _metric_name(key: str) -> str:
    return key[:-len(",none")] if key.endswith(",none") else key


def parse_metrics(metrics: Mapping[str, Any]) -> dict[str, Score]:
    out = {}
    for key, v in metrics.items():
        if isinstance(v, Mapping):
            out[_metric_name(key)] = Score(_number(v.get("value")), _number(v.get("stderr")))
            continue
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr") or (isinstance(v, str) and v != "N/A"):  # an alias, a name: not a metric
            continue
        err = metrics.get(f"{metric}_stderr,{filt}" if filt else f"{metric}_stderr")
        out[_metric_name(key)] = Score(_number(v), _number(err))
    return out


def read_files(eval_dir: Path) -> list[ScoreFile]:
    """The score files of a cell (or a base model), the latest per task; unreadable ones are skipped."""
    latest: dict[str, ScoreFile] = {}
    for path in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("metrics"), Mapping):
            continue
        f = ScoreFile(str(data.get("task") or path.stem), parse_metrics(data["metrics"]), str(data.get("time") or ""),
                      str(data.get("model") or ""), str(data.get("model_path") or ""), bool(data.get("base")))
        if f.task not in latest or f.time >= latest[f.task].time:
            latest[f.task] = f
    return list(latest.values())


def failed_tasks(history: Sequence[Event]) -> dict[str, str]:
    """task -> reason of the evaluations the ledger says failed ("" names every task), the latest state winning."""
    state: dict[str, tuple[str, str]] = {}
    for e in history:
        if e.kind is not Kind.STAGE or not e.stage.startswith("eval"):
            continue
        tasks = e.details.get("tasks") or [e.details.get("task") or ""]
        for task in tasks if isinstance(tasks, list) else [tasks]:
            state[str(task)] = (e.state, e.reason)
    return {t: why for t, (s, why) in state.items() if s == "failed"}


def cell_scores(cell_dir: Path, history: Sequence[Event]) -> tuple[dict[str, Score], dict[str, str]]:
    """(column -> score of what is there, task -> reason of failed evaluations)."""
    scores = {f"{f.task}/{m}": s for f in read_files(cell_dir / EVAL_DIR) for m, s in f.metrics.items()}
    return scores, failed_tasks(history)


def columns(tables: Iterable[Mapping[str, Score]]) -> list[str]:
    """Every score column of a grid, by task then metric."""
    return sorted({c for t in tables for c in t})


def mark(scores: Mapping[str, Score], failed: Mapping[str, str], all_columns: Sequence[str], done: bool,
         ) -> dict[str, Score]:
    """A cell's scores with every column of the grid: what is there, else failed (its task's evaluation failed),
    missing (the cell is done: completed, or failed and never evaluated), pending (it may still come)."""
    out = {}
    for col in all_columns:
        if col in scores:
            out[col] = scores[col]
            continue
        task = col.split("/", 1)[0]
        why = failed.get(task, failed.get("")) if failed else None
        if why is not None:
            out[col] = Score(status=FAILED, reason=why or "the evaluation failed")
        else:
            out[col] = Score(status=MISSING if done else PENDING)
    return out
