"""Scores along training: each cell's scored checkpoints as points, with the loss and tokens at each.

A suite with `along` scores a cell's checkpoints (core/scores.py): each such score file has `"step": N` in its
settings and names the checkpoint as its `model_path`. Read from the cells' own files only, one point per (cell,
checkpoint step): the step, the tokens seen by then (step x the tokens per step the cell's estimate counted, as the
report's loss curves count them), the training loss logged at that step (the last logged at or before it: what the
trainer saw there, not a mean), and each score of that checkpoint, named like the table's columns
(`<task>/<metric>`). `sft-grid results --along` prints them; the report draws score and loss against step and
tokens per cell from them.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from sft_grid.analysis.figures import Canvas, Layout, _layout, _legend_only
from sft_grid.analysis.table import LOG_LOSS, GridTable, Row, Score, parse_metrics, state_losses
from sft_grid.core.layout import EVAL_DIR, OUTPUT_DIR, TRAINER_LOG


@dataclass(frozen=True)
class Point:
    """One scored checkpoint of a cell."""

    cell: str
    step: int
    tokens: float | None
    loss: float | None
    scores: dict[str, Score] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "step": self.step,
            "tokens": self.tokens,
            "loss": self.loss,
            "scores": {c: s.to_json() for c, s in self.scores.items()},
        }


def step_scores(eval_dir: Path) -> dict[int, dict[str, Score]]:
    """step -> `<task>/<metric>` -> score, from the score files of checkpoints (the latest file per task and step)."""
    latest: dict[tuple[int, str], tuple[str, dict[str, Score]]] = {}
    for path in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        step = (data.get("settings") or {}).get("step") if isinstance(data, dict) else None
        if not isinstance(step, int) or not isinstance(data.get("metrics"), Mapping):
            continue
        task, when = str(data.get("task") or path.stem), str(data.get("time") or "")
        if (step, task) not in latest or when >= latest[(step, task)][0]:
            latest[(step, task)] = (when, parse_metrics(data["metrics"]))
    out: dict[int, dict[str, Score]] = {}
    for (step, task), (_, metrics) in sorted(latest.items()):
        out.setdefault(step, {}).update({f"{task}/{m}": s for m, s in metrics.items()})
    return out


def logged_losses(output: Path) -> list[tuple[int, float]]:
    """Every logged (step, loss) of a cell, from the trainer's per-step log, else trainer_state.json."""
    log = output / TRAINER_LOG
    if log.is_file():
        return [(int(s), float(v)) for s, v in LOG_LOSS.findall(log.read_text(errors="replace"))]
    return state_losses(output)


def loss_at(losses: Sequence[tuple[int, float]], step: int) -> float | None:
    """The last loss logged at or before `step` (None: nothing logged by then)."""
    i = bisect.bisect_right([s for s, _ in losses], step)
    return losses[i - 1][1] if i else None


def tokens_per_step(row: Row) -> float | None:
    est = row.estimate or {}
    return est["tokens"] / est["steps"] if est.get("steps") and est.get("tokens") else None


def cell_points(row: Row) -> list[Point]:
    """A cell's scored checkpoints, oldest first."""
    scored = step_scores(row.dir / EVAL_DIR)
    if not scored:
        return []
    losses = sorted(logged_losses(row.dir / OUTPUT_DIR))
    per_step = tokens_per_step(row)
    return [
        Point(row.name, step, None if per_step is None else step * per_step, loss_at(losses, step), scores)
        for step, scores in sorted(scored.items())
    ]


def read_along(table: GridTable) -> tuple[list[str], list[Point]]:
    """(the score columns of the grid's checkpoints, every cell's points in the table's order)."""
    points = [p for r in table.rows for p in cell_points(r)]
    return sorted({c for p in points for c in p.scores}), points


# -- the report's figures -------------------------------------------------------------------------------------------

_HOVER = "%{fullData.name}<br>%{meta} %{x:,}<br>score %{y:.4g}<br>loss %{customdata}<extra></extra>"


def along_figures(layout: Layout, canvas: Canvas, columns: Sequence[str]) -> str:
    """Each checkpoint score of the grid against step and against tokens seen, a line per cell (coloured as in the
    loss curves), the training loss at each point under the pointer; "" when no cell has a scored checkpoint."""
    cells = [c for c in layout.cells if c.get("along")]
    if not cells or not columns:
        return ""
    out = []
    for column in columns:
        figs = [_figure(column, cells, layout, canvas, key) for key in ("step", "tokens")]
        out.append(
            f'<figure class="panel"><figcaption>{escape(column)} <span class="muted">({len(cells)} cells)'
            f'</span></figcaption><div class="plots">{"".join(f for f in figs if f)}</div></figure>'
        )
    return "".join(out)


def _figure(column: str, cells: list[dict[str, Any]], layout: Layout, canvas: Canvas, key: str) -> str:
    what = "step" if key == "step" else "tokens seen"
    traces: list[dict[str, Any]] = []
    groups: dict[str, tuple[float, str]] = {}
    for c in cells:
        points = [
            p for p in c["along"] if p.get(key) is not None and (p["scores"].get(column) or {}).get("value") is not None
        ]
        if not points:
            continue
        order, label, colour = layout.group(c)
        groups[label] = (order, colour)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": escape(str(c.get("name"))),
                "legendgroup": label,
                "showlegend": False,
                "x": [p[key] for p in points],
                "y": [p["scores"][column]["value"] for p in points],
                "customdata": ["" if p.get("loss") is None else f"{p['loss']:.4g}" for p in points],
                "meta": what,
                "line": {"color": colour, "width": 1.4},
                "hovertemplate": _HOVER,
            }
        )
    if not traces:
        return ""
    legend = [_legend_only(label, label, colour) for label, (_, colour) in sorted(groups.items(), key=lambda g: g[1])]
    return canvas.add(f"{column} vs {what}", legend + traces, _layout(what, column, 340, type="linear"))
