"""The report's loss curves: training loss against step and against tokens seen, one line per cell, in panels
(grouping and marks as plots.py's docstring says). HTML + inline SVG strings."""

from __future__ import annotations

from html import escape
from typing import Any, Iterator

from sft_grid.analysis.plots import (
    CURVE_POINTS,
    DASH,
    Layout,
    cell_state,
    legend,
    missing_note,
    pos,
    state_colour,
    swatch,
)
from sft_grid.analysis.svg import Axis, Plot, axis_for, decimate


def loss_curves(data: dict[str, Any], layout: Layout, ids: Iterator[int]) -> str:
    import numpy as np

    with_curve = [c for c in layout.cells if layout.curve(c) is not None]
    if not with_curve:
        return '<p class="note">No logged steps yet.</p>' + missing_note(layout.cells, "cells")
    panels: dict[str, list[dict[str, Any]]] = {}
    for c in with_curve:
        panels.setdefault(layout.panel(c), []).append(c)
    curves = {id(c): layout.curve(c) for c in with_curve}
    ys = np.concatenate([a[:, 2] for a in curves.values()])
    lo, p99, hi = float(ys.min()), float(np.quantile(ys, 0.99)), float(ys.max())
    # a few early spikes would flatten every curve: above the 99th percentile they are clipped at the frame
    top = hi if hi <= p99 + (p99 - lo) else p99 + 0.15 * (p99 - lo)
    y_axis = axis_for([lo, top], label="loss")
    steps = _range([a[:, 0] for a in curves.values()])
    toks = _range([a[:, 1] for a in curves.values()])
    out = []
    for name in sorted(panels):
        cells = panels[name]
        plots = [_curve_plot(cells, curves, layout, next(ids), 0, axis_for(steps, label="step"), y_axis)]
        if any(np.isfinite(curves[id(c)][:, 1]).any() for c in cells):
            plots.append(_curve_plot(cells, curves, layout, next(ids), 1,
                                     axis_for(toks, label="tokens seen"), y_axis))
        title = escape(name) if name else "all cells"
        out.append(f'<figure class="panel"><figcaption>{title} <span class="muted">({len(cells)} cells)'
                   f'</span></figcaption><div class="plots">{"".join(plots)}</div>'
                   f"{legend(layout.colour_legend(cells))}</figure>")
    styles = legend([(swatch("#444"), "completed"), (swatch("#444", "dash"), "running (ring: latest)"),
                      (swatch("#444", "cross"), "failed (cross: last logged step)")])
    without = [c for c in layout.cells if layout.curve(c) is None]
    return "".join(out) + styles + missing_note(without, "no logged steps")


def _curve_plot(cells: list[dict[str, Any]], curves: dict[int, Any], layout: Layout, ident: int, xi: int,
                x_axis: Axis, y_axis: Axis) -> str:
    what = "step" if xi == 0 else "tokens seen"
    plot = Plot(f"p{ident}", x_axis, y_axis, title=f"loss vs {what}")
    import numpy as np

    for c in sorted(cells, key=lambda c: (pos(c.get("params")) or 0.0, str(c.get("name")))):
        a = curves[id(c)]
        a = a[np.isfinite(a[:, xi])]
        if not len(a):
            continue
        last = (float(a[-1, xi]), float(a[-1, 2]))
        state, colour, name = cell_state(c), layout.colour(c), str(c.get("name"))
        tip = f"{name} ({state})"
        plot.line(decimate(a[:, xi], a[:, 2], CURVE_POINTS), colour, dash=DASH.get(state, "2 2"), title=tip,
                  opacity=0.65 if state == "failed" else 1.0)
        if state == "running":
            plot.point(*last, colour, shape="ring", title=f"{tip}: latest loss {last[1]:.4g}")
        elif state == "failed":
            plot.point(*last, state_colour("failed"), shape="cross", title=f"{tip}: {c.get('reason') or ''}")
    return plot.svg()


def _range(arrays: list[Any]) -> list[float]:
    """[min, max] of the finite values in the arrays (empty when none): all an axis needs."""
    import numpy as np

    vals = np.concatenate(arrays) if arrays else np.array([])
    vals = vals[np.isfinite(vals)]
    return [float(vals.min()), float(vals.max())] if len(vals) else []
