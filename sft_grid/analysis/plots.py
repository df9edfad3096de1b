"""The report's figures: loss curves in panels, and scaling plots with their fits. HTML + inline SVG strings.

Grouping rule (one for both kinds of figure, so a colour means the same thing everywhere it can):
  * when the cells span >= 2 model sizes, size is the colour (a sequential ramp, small = dark) in the curve
    panels, and the panels are the recipes (cell["recipe"]); without recipe labels, the panels are the
    swept axes that do not determine the size (an axis determines it when each of its values has one size);
  * otherwise the first swept axis that varies is the colour and the others that vary make the panels.
  * scaling plots have one series per recipe (categorical colours), and exist only when >= 2 sizes (or >= 2
    compute budgets) are present: a single-size grid gets no scaling plot rather than an empty one.
Cells are marked by state: a completed cell is a dot (a solid line), a running one a ring at its latest
loss (a dashed line), a failed one a cross, a planned one a tick on the x axis; what a figure cannot show
is listed under it, so no cell silently disappears. Long curves are decimated (svg.decimate).
"""

from __future__ import annotations

import math
from html import escape
from itertools import count
from typing import Any, Iterator

from sft_grid.analysis.svg import Plot, axis_for, categorical, ramp, sci, si

STATE_COLOURS = {"completed": "#2e7d32", "running": "#1565c0", "failed": "#c62828", "planned": "#757575"}
CURVE_POINTS = 240  # per line per plot, after decimation
DASH = {"completed": "", "running": "5 3", "failed": ""}


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
        a = np.array([[_num(v) if _num(v) is not None else math.nan for v in r[:3]] for r in rows],
                     dtype=float).reshape(-1, 3)
    a = a[:, :3]
    a = a[np.isfinite(a[:, 2])]
    return a if len(a) else None


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


def legend(items: list[tuple[str, str]]) -> str:
    """items: (swatch html, label)."""
    return '<ul class="legend">' + "".join(f"<li>{sw}{escape(label)}</li>" for sw, label in items) + "</ul>"


def swatch(colour: str, kind: str = "line") -> str:
    style = f"background:{colour}" if kind != "ring" else f"border-color:{colour}"
    return f'<span class="sw {kind}" style="{style}"></span>'


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

    def colour(self, cell: dict[str, Any]) -> str:
        if self.colour_axis is None:
            p = pos(cell.get("params"))
            if p is None or len(self.sizes) < 2:
                return categorical(0)
            lo, hi = math.log(self.sizes[0]), math.log(self.sizes[-1])
            return ramp((math.log(p) - lo) / (hi - lo))
        return self.categories.get(str(self.value(cell, self.colour_axis)), categorical(0))

    def colour_legend(self, cells: list[dict[str, Any]]) -> list[tuple[str, str]]:
        if self.colour_axis is None:
            sizes = sorted({p for c in cells if (p := pos(c.get("params"))) is not None})
            return [(swatch(self.colour({"params": p})), si(p)) for p in sizes]
        vals = sorted({str(self.value(c, self.colour_axis)) for c in cells})
        return [(swatch(self.categories[v]), f"{self.colour_axis}={v}") for v in vals]


def _metric_value(cell: dict[str, Any], metric: str) -> float | None:
    if metric == "final_loss":
        return _num(cell.get("final_loss"))
    s = (cell.get("scores") or {}).get(metric)
    return _num(s.get("value")) if isinstance(s, dict) else None


def scaling(data: dict[str, Any], layout: Layout, ids: Iterator[int]) -> str:
    cells, bases = layout.cells, list(data.get("base_models") or [])
    fits = [f for f in data.get("fits") or [] if isinstance(f, dict)]
    metrics = ["final_loss"] + sorted({k for c in cells + bases for k in (c.get("scores") or {})})
    series = {r: categorical(i) for i, r in enumerate(layout.recipes)}
    out = []
    for field, label, fmt in (("params", "parameters", si), ("compute_budget", "compute budget (FLOPs)", sci)):
        if len({v for c in cells if (v := pos(c.get(field))) is not None}) < 2:
            continue
        for metric in metrics:
            fig = _scaling_plot(layout, bases if field == "params" else [], fits, series, metric, field, label,
                                fmt, next(ids))
            if fig:
                out.append(fig)
    return "".join(out)


def _scaling_plot(layout: Layout, bases: list[dict[str, Any]], fits: list[dict[str, Any]],
                  series: dict[str, str], metric: str, field: str, label: str, fmt: Any, ident: int) -> str:
    cells = layout.cells
    done = [(c, x, y) for c in cells if (x := pos(c.get(field))) is not None
            and c.get("state") == "completed" and (y := _metric_value(c, metric)) is not None]
    ref = [(b, x, y) for b in bases if (x := pos(b.get("params"))) is not None
           and (y := _metric_value(b, metric)) is not None]
    if not done and not ref:
        return ""
    latest = []
    if metric == "final_loss":
        latest = [(c, x, float(layout.curve(c)[-1, 2])) for c in cells if c.get("state") == "running"
                  and (x := pos(c.get(field))) is not None and layout.curve(c) is not None]
    shown = {id(c) for c, _, _ in done + latest}
    rest = [c for c in cells if id(c) not in shown]
    my_fits = [f for f in fits if f.get("metric") == metric and f.get("x") == field]
    curves = []
    for f in my_fits:
        band = f.get("band") or {}
        if f.get("ok") and band.get("n"):
            e, a, alpha = f["E"], f["A"], f["alpha"]
            if f.get("flip"):  # an accuracy-like score: its error 1 - score was fitted
                band = {**band, "lo": [1.0 - v for v in band.get("hi") or []],
                        "hi": [1.0 - v for v in band.get("lo") or []]}
                curves.append((f, [(n, 1.0 - (e + a * n ** -alpha)) for n in band["n"]], band))
            else:
                curves.append((f, [(n, e + a * n ** -alpha) for n in band["n"]], band))
    xs = [x for _, x, _ in done + ref + latest] + [pos(c.get(field)) or math.nan for c in rest]
    ys = [y for _, _, y in done + ref + latest] + [y for _, pts, _ in curves for _, y in pts]
    name = "final loss" if metric == "final_loss" else metric
    plot = Plot(f"p{ident}", axis_for(xs, log=True, label=label, fmt=fmt), axis_for(ys, label=name),
                title=f"{name} vs {label}")
    for f, pts, band in curves:
        colour = series.get(str(f.get("recipe") or ""), categorical(0))
        plot.band(band["n"], band.get("lo") or [], band.get("hi") or [], colour,
                  title=f"{f.get('recipe') or 'all'}: {round(100 * (band.get('level') or 0.9))}% band")
        plot.line(pts, colour, width=1.6, title=_fit_text(f, "N" if field == "params" else "C"))
    for c, x, y in done:
        plot.point(x, y, series.get(str(c.get("recipe") or ""), categorical(0)),
                   title=f"{c.get('name')}: {y:.4g}")
    for c, x, y in latest:
        plot.point(x, y, series.get(str(c.get("recipe") or ""), categorical(0)), shape="ring",
                   title=f"{c.get('name')} (running): latest {y:.4g}")
    for b, x, y in ref:
        plot.point(x, y, "#222", shape="diamond", title=f"{b.get('name')} (base model): {y:.4g}")
    for c in rest:
        x, state = pos(c.get(field)), cell_state(c)
        if x is not None:
            plot.rug(x, state_colour(state), shape="cross" if state == "failed" else "tick",
                     title=f"{c.get('name')} ({state})")
    items = [(swatch(series[r]), r or "all cells") for r in sorted(series)
             if any(str(c.get("recipe") or "") == r for c, _, _ in done + latest)]
    items += [(swatch("#222", "diamond"), "base model")] if ref else []
    items += [(swatch("#444", "ring"), "running: latest loss")] if latest else []
    level = next((round(100 * (b.get("level") or 0.9)) for _, _, b in curves), 90)
    items += [(swatch("#888", "band"), f"fit, {level}% bootstrap band")] if curves else []
    var = "N" if field == "params" else "C"
    notes = "".join(f'<p class="note">{escape(_fit_text(f, var))}</p>' for f in my_fits)
    return (f'<figure class="scaling"><div class="plots">{plot.svg()}</div>{legend(items)}{notes}'
            f"{missing_note(rest, 'not on the plot (x axis marks: tick planned/running, cross failed)')}</figure>")


def _fit_text(f: dict[str, Any], var: str) -> str:
    who = f.get("recipe") or "all cells"
    if not f.get("ok"):
        return f"{who}: no fit ({f.get('reason')})"
    flags = "" if f.get("converged") else ", NOT converged"
    flags += f", at bound: {', '.join(f['at_bounds'])}" if f.get("at_bounds") else ""
    lhs = f"1 - {f.get('metric')}" if f.get("flip") else "L"
    return (f"{who}: {lhs}({var}) = {f['E']:.4g} + {f['A']:.4g} {var}^-{f['alpha']:.3g} ({f.get('loss')}, "
            f"{len(f.get('keys') or [])} cells{flags})")


def id_source() -> Iterator[int]:
    return count()
