"""The report's figures: loss curves in panels, and scaling plots with their fits, as plotly figure specs (plain
dicts: data, layout, config) that the page hands to plotly.js, each beside the HTML that holds it.

What plotly gives every figure: the cell's name and value under the pointer (a hovertemplate per trace), a legend
whose entries hide and show their series (a model size in the curves; a recipe with its fit and band in the
scaling plots), zoom and pan (double-click resets), log x axes in the scaling plots, and an SVG download from the
modebar. The specs are built here as JSON, never through plotly's Python graph objects (their import and
validation alone would cost the report its time budget); the hover templates are constant strings, and text from
the data reaches plotly HTML-escaped (plotly reads a few tags, <a href> among them, in its labels).

Grouping rule (one for both kinds of figure, so a colour means the same thing everywhere it can):
  * when the cells span >= 2 model sizes, size is the colour (a sequential ramp, small = dark) in the curve
    panels, and the panels are the recipes (cell["recipe"]); without recipe labels, the panels are the
    swept axes that do not determine the size (an axis determines it when each of its values has one size);
  * otherwise the first swept axis that varies is the colour and the others that vary make the panels.
  * scaling plots have one series per recipe (categorical colours), and exist only when >= 2 sizes (or >= 2
    compute budgets) are present: a single-size grid gets no scaling plot rather than an empty one.
Cells are marked by state: a completed cell is a solid line (a dot), a running one a dashed line and a ring at
its latest loss, a failed one a cross at its last logged step, and a cell with no value for a scaling plot a
mark on its x axis (a cross failed, a tick planned or running); what a figure cannot show is listed under it,
so no cell silently disappears.
"""

from __future__ import annotations

import math
import re
from html import escape
from itertools import pairwise
from typing import Any

from sft_grid.core.human import count

STATE_COLOURS = {"completed": "#2e7d32", "running": "#1565c0", "failed": "#c62828", "planned": "#757575"}
CATEGORICAL = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
# A viridis-like ramp, stopped short of its pale yellow end, which vanishes on white.
_RAMP = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)), (1.0, (190, 208, 30)))
WIDTH = 540  # pixels; a curve figure is 340 high (its legend at the right), a scaling one 430 (its legend below)
CURVE_POINTS = 240  # per line, after decimation: enough for a line 500 pixels wide
# the modebar: no plotly logo (a link), no box or lasso select (nothing in the page reads a selection); the wheel
# scrolls the page, not the figure; Canvas adds the SVG export
CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"], "scrollZoom": False}


def categorical(i: int) -> str:
    return CATEGORICAL[i % len(CATEGORICAL)]


def ramp(t: float) -> str:
    """Colour at t in [0, 1] on the sequential ramp (small models dark, large ones light)."""
    t = min(1.0, max(0.0, t))
    for (t0, c0), (t1, c1) in pairwise(_RAMP):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True))
    return "#bed01e"


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def cell_state(cell: dict[str, Any]) -> str:
    return str(cell.get("state") or "unknown")


def state_colour(state: str) -> str:
    return STATE_COLOURS.get(state, "#8d6e63")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def pos(v: Any) -> float | None:
    f = _num(v)
    return f if f is not None and f > 0 else None


def _curve(cell: dict[str, Any]) -> Any:
    """The cell's curve as an (n, 3) float array (step, tokens seen, loss; nan where missing), rows with a
    finite loss only; None when there is none. One numpy conversion per curve: curves are long."""
    import numpy as np

    raw = cell.get("curve") or []
    if not isinstance(raw, (list, tuple)) or not raw:
        return None
    try:
        a = np.array(raw, dtype=float)
        if a.ndim != 2 or a.shape[1] < 3:
            raise ValueError("not rows of three")
    except (TypeError, ValueError):
        rows = [r for r in raw if isinstance(r, (list, tuple)) and len(r) >= 3]
        a = np.array(
            [[_num(v) if _num(v) is not None else math.nan for v in r[:3]] for r in rows], dtype=float
        ).reshape(-1, 3)
    a = a[:, :3]
    a = a[np.isfinite(a[:, 2])]
    return a if len(a) else None


def decimate_index(y: Any, max_points: int) -> Any:
    """Indices of at most ~max_points of a curve's points (numpy array y), in order: the ends, and each bucket's
    lowest and highest y, so spikes survive. Vectorised: a 72-cell grid of 2000-step curves is 72 calls."""
    import numpy as np

    n = len(y)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    inner = y[1:-1]
    size = -(-len(inner) // buckets)
    padded = np.concatenate([inner, np.full(size * buckets - len(inner), inner[-1])]).reshape(buckets, size)
    base = np.arange(buckets) * size + 1
    keep = np.unique(np.clip(np.concatenate([base + padded.argmin(axis=1), base + padded.argmax(axis=1)]), 1, n - 2))
    return np.concatenate([[0], keep, [n - 1]])


def _names(cells: list[dict[str, Any]], limit: int = 8) -> str:
    names = [str(c.get("name", "?")) for c in cells]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def missing_note(cells: list[dict[str, Any]], what: str) -> str:
    by_state: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        by_state.setdefault(cell_state(c), []).append(c)
    parts = [f"{len(cs)} {escape(s)} ({escape(_names(cs))})" for s, cs in sorted(by_state.items())]
    return f'<p class="note">{escape(what)}: {"; ".join(parts)}</p>' if parts else ""


class Layout:
    """The colour and panel assignment of the module docstring, computed once per report."""

    def __init__(self, data: dict[str, Any]):
        self.cells: list[dict[str, Any]] = list(data.get("cells") or [])
        self.axes: list[str] = [str(a) for a in data.get("axes") or []]
        self.sizes = sorted({p for c in self.cells if (p := pos(c.get("params"))) is not None})
        self.recipes = sorted({str(c.get("recipe") or "") for c in self.cells})
        varying = [a for a in self.axes if len({repr(self.value(c, a)) for c in self.cells}) > 1]
        if len(self.sizes) >= 2:
            self.colour_axis = None
            self.use_recipe = any(self.recipes)
            self.panel_axes = [] if self.use_recipe else [a for a in varying if not self._sets_size(a)]
        else:
            self.colour_axis = varying[0] if varying else None
            self.use_recipe = False
            self.panel_axes = varying[1:]
        self._curves = {id(c): _curve(c) for c in self.cells}
        values = [] if self.colour_axis is None else sorted({str(self.value(c, self.colour_axis)) for c in self.cells})
        self.categories = {v: categorical(i) for i, v in enumerate(values)}

    def curve(self, cell: dict[str, Any]) -> Any:
        """The cell's parsed curve (see _curve), or None."""
        return self._curves.get(id(cell))

    @staticmethod
    def value(cell: dict[str, Any], axis: str) -> Any:
        return (cell.get("values") or {}).get(axis)

    def _sets_size(self, axis: str) -> bool:
        seen: dict[str, set[float | None]] = {}
        for c in self.cells:
            seen.setdefault(repr(self.value(c, axis)), set()).add(pos(c.get("params")))
        return all(len(s) == 1 for s in seen.values())

    def panel(self, cell: dict[str, Any]) -> str:
        if self.use_recipe:
            return str(cell.get("recipe") or "")
        return ", ".join(f"{a}={self.value(cell, a)}" for a in self.panel_axes)

    def group(self, cell: dict[str, Any]) -> tuple[float, str, str]:
        """(sort key, legend label, colour) of the cell's colour group: its size, or its colour axis' value."""
        if self.colour_axis is None:
            p = pos(cell.get("params"))
            if p is None or len(self.sizes) < 2:
                return 0.0, "all cells" if p is None else count(p), categorical(0)
            lo, hi = math.log(self.sizes[0]), math.log(self.sizes[-1])
            return p, count(p), ramp((math.log(p) - lo) / (hi - lo))
        v = str(self.value(cell, self.colour_axis))
        return float(list(self.categories).index(v)), f"{self.colour_axis}={v}", self.categories.get(v, categorical(0))


class Canvas:
    """The page's figures, collected as its sections are drawn: id -> {data, layout, config}."""

    def __init__(self) -> None:
        self.specs: dict[str, dict[str, Any]] = {}

    def add(self, title: str, data: list[dict[str, Any]], layout: dict[str, Any], file: str = "") -> str:
        """Keeps the figure and returns the element plotly draws it in (the figure's size, before it is drawn).
        `file`: what its SVG export is named after (default: its title)."""
        ident = f"fig{len(self.specs)}"
        filename = re.sub(r"[^A-Za-z0-9._-]+", "_", file or title).strip("_") or ident
        # a long title goes on two lines: on one it would run under the modebar, at the figure's top right
        text = escape(title).replace(" vs ", "<br>vs ", 1) if len(title) > 40 else escape(title)
        top = 52 if "<br>" in text else 34
        self.specs[ident] = {
            "data": data,
            "layout": {
                "title": {"text": text, "x": 0.02, "y": 0.99, "yanchor": "top", "font": {"size": 13}},
                **layout,
                "margin": {**layout["margin"], "t": top},
            },
            "config": {**CONFIG, "toImageButtonOptions": {"format": "svg", "filename": filename}},
        }
        return (
            f'<div class="plot" id="{ident}" role="img" aria-label="{escape(title)}" '
            f'style="width:{layout["width"]}px;height:{layout["height"]}px"></div>'
        )


def _layout(x_title: str, y_title: str, height: int, **x_axis: Any) -> dict[str, Any]:
    return {
        "width": WIDTH,
        "height": height,
        "margin": {"l": 58, "r": 10, "t": 34, "b": 44},
        "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 11},
        "hovermode": "closest",
        "paper_bgcolor": "#fff",
        "plot_bgcolor": "#fff",
        "xaxis": {
            "title": {"text": escape(x_title)},
            "gridcolor": "#eee",
            "linecolor": "#999",
            "mirror": True,
            "zeroline": False,
            **x_axis,
        },
        "yaxis": {
            "title": {"text": escape(y_title)},
            "gridcolor": "#eee",
            "linecolor": "#999",
            "mirror": True,
            "zeroline": False,
        },
        "legend": {"font": {"size": 10}, "tracegroupgap": 2},
    }


def _legend_only(name: str, group: str, colour: str) -> dict[str, Any]:
    """A trace with no points: the legend entry of a group of traces (clicking it hides or shows them all)."""
    return {
        "type": "scatter",
        "mode": "lines",
        "x": [None],
        "y": [None],
        "name": escape(name),
        "legendgroup": group,
        "line": {"color": colour, "width": 3},
        "hoverinfo": "skip",
    }


def loss_curves(layout: Layout, canvas: Canvas) -> str:
    """The panels of loss against step and tokens seen (HTML holding their figures)."""
    import numpy as np

    with_curve = [c for c in layout.cells if layout.curve(c) is not None]
    if not with_curve:
        return '<p class="note">No logged steps yet.</p>' + missing_note(layout.cells, "cells")
    panels: dict[str, list[dict[str, Any]]] = {}
    for c in with_curve:
        panels.setdefault(layout.panel(c), []).append(c)
    ys = np.concatenate([layout.curve(c)[:, 2] for c in with_curve])
    lo, p99, hi = float(ys.min()), float(np.quantile(ys, 0.99)), float(ys.max())
    # a few early spikes would flatten every curve: above the 99th percentile they leave the initial view (a
    # double-click on the figure shows them); one range for every panel, so panels compare
    top = hi if hi <= p99 + (p99 - lo) else p99 + 0.15 * (p99 - lo)
    pad = 0.05 * (top - lo) or 0.5
    y_range = [lo - pad, top + pad]
    out = []
    for name in sorted(panels):
        cells = panels[name]
        figs = [_curve_figure(name, cells, layout, canvas, 0, y_range)]
        if any(np.isfinite(layout.curve(c)[:, 1]).any() for c in cells):
            figs.append(_curve_figure(name, cells, layout, canvas, 1, y_range))
        title = escape(name) if name else "all cells"
        out.append(
            f'<figure class="panel"><figcaption>{title} <span class="muted">({len(cells)} cells)'
            f'</span></figcaption><div class="plots">{"".join(figs)}</div></figure>'
        )
    styles = (
        '<p class="note">Solid: completed; dashed: running (ring: its latest loss); cross: a failed cell\'s last'
        " logged step. Click a legend entry to hide or show its cells, drag to zoom, double-click to reset.</p>"
    )
    without = [c for c in layout.cells if layout.curve(c) is None]
    return "".join(out) + styles + missing_note(without, "no logged steps")


# constant templates: the text that comes from the data (names, states, reasons) is in the trace's name and meta
_CURVE_HOVER = "%{fullData.name} (%{meta[0]})<br>%{meta[1]} %{x:,}<br>loss %{y:.4g}<extra></extra>"
_LAST_HOVER = "%{fullData.name} (%{meta[0]})<br>latest loss %{y:.4g}<br>%{meta[2]}<extra></extra>"


def _curve_figure(
    panel: str, cells: list[dict[str, Any]], layout: Layout, canvas: Canvas, xi: int, y_range: list[float]
) -> str:
    import numpy as np

    what = "step" if xi == 0 else "tokens seen"
    traces: list[dict[str, Any]] = []
    groups: dict[str, tuple[float, str]] = {}
    for c in sorted(cells, key=lambda c: (pos(c.get("params")) or 0.0, str(c.get("name")))):
        a = layout.curve(c)
        a = a[np.isfinite(a[:, xi])]
        if not len(a):
            continue
        a = a[decimate_index(a[:, 2], CURVE_POINTS)]  # report_data decimated them already; other data may not be
        state, name = cell_state(c), escape(str(c.get("name")))
        order, label, colour = layout.group(c)
        groups[label] = (order, colour)
        common = {
            "type": "scatter",
            "name": name,
            "legendgroup": label,
            "showlegend": False,
            "meta": [escape(state), what, escape(str(c.get("reason") or ""))],
        }
        traces.append(
            {
                **common,
                "mode": "lines",
                "x": a[:, xi].tolist(),
                "y": a[:, 2].tolist(),
                "line": {"color": colour, "width": 1.4, "dash": "dash" if state == "running" else "solid"},
                "opacity": 0.65 if state == "failed" else 1.0,
                "hovertemplate": _CURVE_HOVER,
            }
        )
        if state in ("running", "failed"):
            mark = (
                {"symbol": "circle-open", "size": 9, "color": colour, "line": {"width": 2}}
                if state == "running"
                else {"symbol": "x", "size": 9, "color": state_colour("failed")}
            )
            traces.append(
                {
                    **common,
                    "mode": "markers",
                    "x": [float(a[-1, xi])],
                    "y": [float(a[-1, 2])],
                    "marker": mark,
                    "hovertemplate": _LAST_HOVER,
                }
            )
    legend = [_legend_only(label, label, colour) for label, (_, colour) in sorted(groups.items(), key=lambda g: g[1])]
    fig = _layout(what, "loss", 340, type="linear")
    fig["yaxis"]["range"] = y_range
    return canvas.add(f"loss vs {what}", legend + traces, fig, file=f"{panel or 'all cells'} loss vs {what}")


def _metric_value(cell: dict[str, Any], metric: str) -> float | None:
    if metric == "final_loss":
        return _num(cell.get("final_loss"))
    s = (cell.get("scores") or {}).get(metric)
    return _num(s.get("value")) if isinstance(s, dict) else None


# x of the scaling plots: the cell field, its axis title, the hover's number format, the axis' exponent format
_SCALING_X = (("params", "parameters", ".3s", "B"), ("compute_budget", "compute budget (FLOPs)", ".2e", "power"))


def scaling(data: dict[str, Any], layout: Layout, canvas: Canvas) -> str:
    """The scaling figures (HTML holding them, with each fit said in words and the cells they cannot show)."""
    cells, bases = layout.cells, list(data.get("base_models") or [])
    fits = [f for f in data.get("fits") or [] if isinstance(f, dict)]
    metrics = ["final_loss", *sorted({k for c in cells + bases for k in (c.get("scores") or {})})]
    series = {r: categorical(i) for i, r in enumerate(layout.recipes)}
    return "".join(
        _scaling_figure(layout, bases if x[0] == "params" else [], fits, series, metric, x, canvas)
        for x in _SCALING_X
        if len({v for c in cells if (v := pos(c.get(x[0]))) is not None}) >= 2
        for metric in metrics
    )


def _scaling_figure(
    layout: Layout,
    bases: list[dict[str, Any]],
    fits: list[dict[str, Any]],
    series: dict[str, str],
    metric: str,
    axis: tuple[str, str, str, str],
    canvas: Canvas,
) -> str:
    field, label, fmt, exponent = axis
    cells = layout.cells
    done = [
        (c, x, y)
        for c in cells
        if (x := pos(c.get(field))) is not None
        and c.get("state") == "completed"
        and (y := _metric_value(c, metric)) is not None
    ]
    ref = [
        (b, x, y)
        for b in bases
        if (x := pos(b.get("params"))) is not None and (y := _metric_value(b, metric)) is not None
    ]
    if not done and not ref:
        return ""
    latest = []
    if metric == "final_loss":
        latest = [
            (c, x, float(layout.curve(c)[-1, 2]))
            for c in cells
            if c.get("state") == "running" and (x := pos(c.get(field))) is not None and layout.curve(c) is not None
        ]
    shown = {id(c) for c, _, _ in done + latest}
    rest = [c for c in cells if id(c) not in shown]
    my_fits = [f for f in fits if f.get("metric") == metric and f.get("x") == field]
    name = "final loss" if metric == "final_loss" else metric
    meta = [escape(name), escape(label)]
    hover = f"%{{customdata}}<br>%{{meta[1]}} %{{x:{fmt}}}<br>%{{meta[0]}} %{{y:.4g}}<extra></extra>"
    traces: list[dict[str, Any]] = []
    for f in my_fits:
        band = f.get("band") or {}
        if not (f.get("ok") and band.get("n")):
            continue
        n, e, a, alpha = band["n"], f["E"], f["A"], f["alpha"]
        mid = [e + a * v**-alpha for v in n]
        lo, hi = list(band.get("lo") or []), list(band.get("hi") or [])
        if f.get("flip"):  # an accuracy-like score: its error 1 - score was fitted
            mid, lo, hi = [1.0 - v for v in mid], [1.0 - v for v in hi], [1.0 - v for v in lo]
        recipe = str(f.get("recipe") or "")
        colour = series.get(recipe, categorical(0))
        level = round(100 * (band.get("level") or 0.9))
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [*n, *n[::-1]],
                "y": [*hi, *lo[::-1]],
                "fill": "toself",
                "fillcolor": _rgba(colour, 0.18),
                "line": {"width": 0},
                "name": escape(f"{recipe or 'all cells'}: {level}% band"),
                "legendgroup": recipe,
                "showlegend": False,
                "hoverinfo": "skip",
            }
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": n,
                "y": mid,
                "line": {"color": colour, "width": 1.6},
                "name": escape(f"{recipe or 'all cells'}: fit"),
                "legendgroup": recipe,
                "showlegend": False,
                "meta": meta,
                "hovertemplate": f"%{{fullData.name}}<br>%{{meta[1]}} %{{x:{fmt}}}<br>"
                "%{meta[0]} %{y:.4g}<extra></extra>",
            }
        )
    for recipe in sorted(series):
        pts = [(c, x, y) for c, x, y in done if str(c.get("recipe") or "") == recipe]
        running = [(c, x, y) for c, x, y in latest if str(c.get("recipe") or "") == recipe]
        colour = series[recipe]
        if pts:
            dot = {"symbol": "circle", "size": 7, "color": colour, "line": {"color": "#fff", "width": 1}}
            traces.append(_points(pts, escape(recipe or "all cells"), recipe, meta, hover, dot))
        if running:
            traces.append(
                _points(
                    running,
                    escape(f"{recipe or 'all cells'}: running"),
                    recipe,
                    meta,
                    hover.replace("<br>%{meta[0]}", " (running)<br>latest %{meta[0]}"),
                    {"symbol": "circle-open", "size": 9, "color": colour, "line": {"width": 2}},
                    legend=not pts,
                )
            )
    if ref:
        traces.append(
            _points(
                ref,
                "base model",
                "base models",
                meta,
                hover,
                {"symbol": "diamond", "size": 9, "color": "#222", "line": {"color": "#fff", "width": 1}},
                legend=True,
            )
        )
    for state in sorted({cell_state(c) for c in rest}):
        marks = [(c, x, 0.04) for c in rest if cell_state(c) == state and (x := pos(c.get(field))) is not None]
        if marks:  # on a hidden second y axis, so they sit on the x axis whatever the zoom of y
            symbol = "x" if state == "failed" else "line-ns-open"
            traces.append(
                {
                    **_points(
                        marks,
                        escape(f"{state}: no value (on the x axis)"),
                        f"state {state}",
                        meta,
                        f"%{{customdata}} ({escape(state)})<br>%{{meta[1]}} %{{x:{fmt}}}<extra></extra>",
                        {
                            "symbol": symbol,
                            "size": 10,
                            "color": state_colour(state),
                            "line": {"color": state_colour(state), "width": 2},
                        },
                        legend=True,
                    ),
                    "yaxis": "y2",
                }
            )
    fig = _layout(label, name, 430, type="log", exponentformat=exponent)
    # below the plot: recipe names are long, and a legend at the right would take half the figure's width
    fig["legend"].update(orientation="h", x=0, xanchor="left", y=-0.18, yanchor="top")
    fig["yaxis2"] = {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True}
    div = canvas.add(f"{name} vs {label}", traces, fig)
    var = "N" if field == "params" else "C"
    notes = "".join(f'<p class="note">{escape(fit_text(f, var))}</p>' for f in my_fits)
    return (
        f'<figure class="scaling">{div}{notes}'
        f"{missing_note(rest, 'not on the plot (marks on the x axis: tick planned/running, cross failed)')}"
        "</figure>"
    )


def _points(
    pts: list[tuple[dict[str, Any], float, float]],
    name: str,
    group: str,
    meta: list[str],
    hover: str,
    marker: dict[str, Any],
    legend: bool = True,
) -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "markers",
        "x": [x for _, x, _ in pts],
        "y": [y for _, _, y in pts],
        "customdata": [escape(str(c.get("name"))) for c, _, _ in pts],
        "name": name,
        "legendgroup": group,
        "showlegend": legend,
        "marker": marker,
        "meta": meta,
        "hovertemplate": hover,
    }


def fit_text(f: dict[str, Any], var: str) -> str:
    who = f.get("recipe") or "all cells"
    if not f.get("ok"):
        return f"{who}: no fit ({f.get('reason')})"
    flags = "" if f.get("converged") else ", NOT converged"
    flags += f", at bound: {', '.join(f['at_bounds'])}" if f.get("at_bounds") else ""
    lhs = f"1 - {f.get('metric')}" if f.get("flip") else "L"
    return (
        f"{who}: {lhs}({var}) = {f['E']:.4g} + {f['A']:.4g} {var}^-{f['alpha']:.3g} ({f.get('loss')}, "
        f"{len(f.get('keys') or [])} cells{flags})"
    )
