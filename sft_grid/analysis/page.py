"""The grid report: one self-contained HTML page (report.html) and its data (report.json), written side by side.

    data = report_data.build(sweep_dir)          # the numbers, the fits and their bands (numpy, scipy)
    page = page.render(data)                     # or write(sweep_dir): both files

`render(data)` is pure: the same data gives the same bytes (nothing timed or random; "generated_at" is the
caller's). The page opens from disk in any browser with no network: its styles, its data and plotly.js (the copy
the plotly package ships, read as a file) are inline; the only URL is an empty `data:` favicon (which stops
browsers asking for /favicon.ico). The figures are plotly's (analysis/figures.py): hover, legend toggles, zoom,
log axes, SVG export. The table of the cells sorts by a click on its headers (a little script of its own). Every
string from the data is HTML-escaped in the page, and the figures' JSON has its `<` escaped, so no string can
close the script that holds it.

Report data (a JSON-serialisable dict; every key optional unless said; unknown keys are ignored):

    {"grid": {"name", "sweep_file", "git_revision", "git_dirty": bool, "generated_at", "runs_root",
              "counts": {state: n},          # default: counted from cells
              "gpu_hours_used", "gpu_hours_estimated", "device": "GPU" | "CPU",
              "damaged": [str]},             # a line per damaged record of the grid
     "axes": [axis, ...],                    # swept keys, in order: table columns, plot grouping
     "columns": ["<task>/<metric>", ...],    # the score columns of the table (default: every score of the cells)
     "cells": [{"name" (required), "key", "dir",
                "values": {axis: value},
                "state": "completed" | "running" | "failed" | "planned" | other,
                "step", "total_steps", "final_loss",
                "scores": {"<task>/<metric>": {"value", "stderr"}},
                "score_status": {"<task>/<metric>": {"status", "reason"}},  # why a score is not there
                "wall_seconds", "gpu_hours", "estimate_gpu_hours", "estimate_now_gpu_hours",
                "params": float,               # x of the scaling plots; its spread picks the plot layout
                "compute_budget": float | None,  # FLOPs; a second scaling x when >= 2 cells have one
                "tokens": float | None,        # fine-tuning tokens its estimate counted: the joint fits' D
                "recipe": str,                 # group label: one curve panel and one scaling series each
                "reason": str,                 # why a failed cell failed; what of a cell is damaged
                "damaged": [str],              # a line per damaged file of the cell ("damaged" state: the cell)
                "flags": [str],                # what a damaged part changes, beside its state
                "curve": [[step, tokens_seen | None, loss], ...]}],
     "base_models": [{"name", "params", "scores": {...}}],   # reference diamonds in the score plots
     "estimates": {"summary": {...}, "calibration": {cluster: detail}},
     "fits": [scaling.report_fits(...) entries: {"metric", "x", "recipe", "ok", "reason", "E", "A", "alpha",
              "loss", "converged", "at_bounds", "keys", "band": {"n", "lo", "hi", "level"},
              "selection": {"form", "params", "error", "alternatives": {form: error | None}, "heldout",
                            "heldout_x", ...}}],   # analysis/forms.py's Selection.as_dict: the form chosen on
                                                     # held-out points ("Fit forms" section)
     "joint_fits": [{"metric", "recipe", "ok", "chosen": "joint" | "per_size" | None, "reason",
                     "scores": {"joint", "per_size": error | None}, "heldout", "heldout_d", "joint": {"E", "A",
                     "alpha", "B", "beta"} | None, "formula", "sizes", "data_sizes"}]}
                                             # analysis/joint.py's JointSelection.as_dict, where a recipe's cells
                                             # vary size and fine-tuning tokens (cells' "tokens"; "Fit forms")

How the figures are laid out, and how missing, running and failed cells show, is in figures.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from html import escape
from pathlib import Path
from typing import Any

from sft_grid.analysis.along import along_figures
from sft_grid.analysis.figures import Canvas, Layout, cell_state, loss_curves, scaling, state_colour
from sft_grid.analysis.forms import formula
from sft_grid.core import human

REPORT_HTML, REPORT_JSON = "report.html", "report.json"

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:8px 0}dt{color:#666}dd{margin:0}
code{font:12px ui-monospace,Menlo,Consolas,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;margin-right:6px;font-size:12px}
.dirty{background:#b26a00}.bar{display:flex;height:10px;max-width:640px;border-radius:5px;overflow:hidden;margin:6px 0}
table{border-collapse:collapse;background:#fff;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #eee;
text-align:left;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
th{cursor:pointer;user-select:none;background:#f0f0f0;position:sticky;top:0}th:focus{outline:2px solid #4e79a7}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
.wrap{overflow-x:auto;max-height:70vh}.reason{color:#c62828;font-size:12px;white-space:normal}
figure{margin:10px 0 18px;background:#fff;border:1px solid #e4e4e4;padding:8px;display:inline-block;
vertical-align:top}figure.scaling{max-width:560px;margin-right:10px}figcaption{font-weight:600;margin-bottom:4px}
.plots{display:flex;flex-wrap:wrap;gap:8px}
.note,.muted{color:#666;font-size:12px;max-width:940px;margin:2px 0}
td.score-failed{color:#c62828}td.score-missing,td.score-pending{color:#888;font-style:italic}
"""

# Sorts the clicked column: numerically when every non-empty value (data-v, else the text) is a number,
# else as text; empty cells always last; stable, so a second key can be sorted first.
_JS = """
(function(){document.querySelectorAll("table.sortable").forEach(function(t){
var hs=t.tHead.rows[0].cells;Array.prototype.forEach.call(hs,function(th,i){
function go(){var asc=th.getAttribute("aria-sort")!=="ascending";
Array.prototype.forEach.call(hs,function(h){h.removeAttribute("aria-sort");});
th.setAttribute("aria-sort",asc?"ascending":"descending");
var b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows),vals=rows.map(function(r){var c=r.cells[i];
return c.hasAttribute("data-v")?c.getAttribute("data-v"):c.textContent.trim();});
var num=vals.every(function(v){return v===""||isFinite(Number(v));});
var ix=rows.map(function(r,k){return k;});ix.sort(function(a,c){var x=vals[a],y=vals[c];
if(x===""||y==="")return x===y?a-c:(x===""?1:-1);
var d=num?Number(x)-Number(y):x.localeCompare(y,undefined,{numeric:true});return (asc?d:-d)||a-c;});
ix.forEach(function(k){b.appendChild(rows[k]);});}
th.addEventListener("click",go);th.addEventListener("keydown",function(e){
if(e.key==="Enter"||e.key===" "){e.preventDefault();go();}});});});})();
"""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _g(v: Any, digits: int = 4) -> str:
    f = _num(v)
    return "" if f is None else f"{f:.{digits}g}"


def _hours(v: Any) -> str:
    f = _num(v)
    return "" if f is None else human.hours(f)


def _count(v: float) -> str:
    return str(int(v)) if v.is_integer() else f"{v:g}"


def _duration(seconds: Any) -> str:
    s = _num(seconds)
    return "" if s is None else human.duration(s)


def _td(text: str, sort: Any = None, cls: str = "", extra: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if sort is not None:
        attrs += f' data-v="{escape(str(sort))}"'
    return f"<td{attrs}>{escape(text)}{extra}</td>"


def _header(data: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    g = data.get("grid") or {}
    counts = dict(g.get("counts") or {})
    if not counts:
        for c in cells:
            counts[cell_state(c)] = counts.get(cell_state(c), 0) + 1
    rows = [
        ("sweep file", g.get("sweep_file")),
        ("generated", g.get("generated_at")),
        ("runs root", g.get("runs_root")),
        ("device", g.get("device")),
    ]
    rev = escape(str(g.get("git_revision") or "unknown"))
    rev += ' <span class="badge dirty">dirty</span>' if g.get("git_dirty") else ""
    used, est = _hours(g.get("gpu_hours_used")), _hours(g.get("gpu_hours_estimated"))
    hours = f"{used or '?'} used, {est or '?'} estimated"
    meta = "".join(f"<dt>{k}</dt><dd>{escape(str(v))}</dd>" for k, v in rows if v not in (None, ""))
    meta += f"<dt>git revision</dt><dd><code>{rev}</code></dd><dt>GPU-hours</dt><dd>{escape(hours)}</dd>"
    total = sum(n for n in counts.values() if isinstance(n, int)) or 1
    badges = "".join(
        f'<span class="badge" style="background:{state_colour(s)}">{escape(str(s))}: {n}</span>'
        for s, n in counts.items()
    )
    bar = "".join(
        f'<span title="{escape(str(s))}: {n}" style="flex:{n / total:.4f};background:{state_colour(s)}"></span>'
        for s, n in counts.items()
        if isinstance(n, int) and n > 0
    )
    return (
        f"<header><h1>{escape(str(g.get('name') or 'grid'))}</h1><div>{badges}</div>"
        f'<div class="bar" id="state-bar">{bar}</div><dl class="meta">{meta}</dl></header>'
    )


def _table(axes: list[str], cells: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    scores = columns if columns is not None else sorted({k for c in cells for k in (c.get("scores") or {})})
    spread = any(c.get("site") for c in cells)  # a grid across sites: each cell's site
    heads = [
        "cell",
        *axes,
        "state",
        *(["site"] if spread else []),
        "step",
        "final loss",
        *scores,
        "wall",
        "GPU-h",
        "est. GPU-h",
        "est. now",
        "directory",
    ]
    out = [
        '<div class="wrap"><table class="sortable" id="cells"><thead><tr>',
        "".join(f'<th tabindex="0" scope="col">{escape(h)}</th>' for h in heads),
        "</tr></thead><tbody>",
    ]
    for c in cells:
        state = cell_state(c)
        step, total = _num(c.get("step")), _num(c.get("total_steps"))
        steps = "" if step is None else _count(step) + (f" / {_count(total)}" if total is not None else "")
        reason = f'<div class="reason">{escape(str(c["reason"]))}</div>' if c.get("reason") else ""
        label = ", ".join([state, *(str(f) for f in c.get("flags") or [])])  # "completed, log ends at step 10 of 100"
        row = [_td(str(c.get("name", "")), cls="name")]
        row += [_td("" if (v := (c.get("values") or {}).get(a)) is None else str(v)) for a in axes]
        row.append(
            f'<td data-v="{escape(state)}"><span class="badge" style="background:{state_colour(state)}">'
            f"{escape(label)}</span>{reason}</td>"
        )
        if spread:
            row.append(_td(str(c.get("site") or "")))
        row.append(_td(steps, "" if step is None else step, "n"))
        row.append(_td(_g(c.get("final_loss")), _g(c.get("final_loss"), 17), "n"))
        for k in scores:
            s = (c.get("scores") or {}).get(k) or {}
            v, se = _num(s.get("value")), _num(s.get("stderr"))
            text = "" if v is None else f"{v:.4g}" + (f" ± {se:.2g}" if se is not None else "")
            mark = (c.get("score_status") or {}).get(k) or {}
            if v is None and mark.get("status"):  # failed, missing or pending: said, with the reason on hover
                tip = f' title="{escape(str(mark.get("reason") or ""))}"' if mark.get("reason") else ""
                row.append(f'<td class="score-{escape(str(mark["status"]))}"{tip}>{escape(str(mark["status"]))}</td>')
                continue
            row.append(_td(text, "" if v is None else repr(v), "n"))
        row.append(_td(_duration(c.get("wall_seconds")), _g(c.get("wall_seconds"), 17), "n"))
        row.append(_td(_hours(c.get("gpu_hours")), _g(c.get("gpu_hours"), 17), "n"))
        row.append(_td(_hours(c.get("estimate_gpu_hours")), _g(c.get("estimate_gpu_hours"), 17), "n"))
        row.append(_td(_hours(c.get("estimate_now_gpu_hours")), _g(c.get("estimate_now_gpu_hours"), 17), "n"))
        row.append(f"<td><code>{escape(str(c.get('dir') or ''))}</code></td>")
        out.append(f'<tr data-state="{escape(state)}">{"".join(row)}</tr>')
    out.append("</tbody></table></div>")
    return "".join(out)


def _damaged(data: dict[str, Any], cells: list[dict[str, Any]]) -> str:
    """A line per damaged file: the grid's records, then each cell's; "" when nothing is damaged."""
    lines = [str(t) for t in (data.get("grid") or {}).get("damaged") or []]
    lines += [f"{c.get('name')}: {t}" for c in cells for t in c.get("damaged") or []]
    if not lines:
        return ""
    items = "".join(f"<li><code>{escape(line)}</code></li>" for line in lines)
    return (
        f'<h2>Damaged files ({len(lines)})</h2><section id="damaged"><p class="note">Read around: a cell that cannot'
        " be read as what it is is shown as damaged, a damaged part of one beside its state.</p>"
        f'<ul class="note">{items}</ul></section>'
    )


def _estimates(data: dict[str, Any]) -> str:
    """The estimates against what the completed cells took, and where today's calibration comes from."""
    est = data.get("estimates") or {}
    summary, cal = est.get("summary") or {}, est.get("calibration") or {}
    if not summary.get("cells") and not cal:
        return ""

    def pct(v: Any) -> str:
        f = _num(v)
        return "?" if f is None else f"{100 * f:.0f}%"

    text = (
        f"{summary.get('cells', 0)} completed cell(s) measured: median |estimate / measured - 1| "
        f"{pct(summary.get('median_abs_error_at_launch'))} for the estimate made when each was queued (est. GPU-h),"
        f" {pct(summary.get('median_abs_error_now'))} for today's calibration without the cell (est. now)."
    )
    items = "".join(f"<li>{escape(str(k))}: {escape(str(v))}</li>" for k, v in sorted(cal.items()))
    return f'<p class="note" id="estimates">{escape(text)}</p>' + (f'<ul class="note">{items}</ul>' if items else "")


def _adaptive(data: dict[str, Any]) -> str:
    """An adaptive grid: each pre-registered holdout's forecast and band beside its realised value, and
    the latest round's choice with its reasons."""
    ad = data.get("adaptive")
    if not isinstance(ad, dict):
        return ""
    rows = []
    for h in ad.get("holdouts") or []:
        f, lo, hi, real = (_num(h.get(k)) for k in ("forecast", "lo", "hi", "realised"))
        inside = "" if None in (lo, hi, real) else ("yes" if lo <= real <= hi else "no")  # type: ignore[operator]
        err = "" if f is None or not real else f"{100 * (f - real) / real:+.2f}%"
        band = "" if lo is None or hi is None else f"[{_g(lo)}, {_g(hi)}]"
        cells = (h.get("cell"), h.get("recipe"), _g(f) if f is not None else "no fit", band, _g(real) if real else "")
        rows.append("<tr>" + "".join(_td(escape(str(c or ""))) for c in (*cells, err, inside)) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("holdout", "recipe", "forecast", "band", "realised", "error", "in band"))
    level = (ad.get("question") or {}).get("level")
    why = "".join(f"<li>{escape(str(w))}</li>" for w in ad.get("why") or [])
    stop = f'<p class="note">stop: {escape(str(ad["stop"]))}</p>' if ad.get("stop") else ""
    return (
        f'<h2>Adaptive grid</h2><section id="adaptive"><p class="note">The fit of the cells the loop chose, its'
        f" {_g(level) if level else ''} band at each pre-registered holdout (never fitted, never chosen), and what"
        f" the holdout realised.</p><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        + (f'<ul class="note">{why}</ul>' if why else "")
        + stop
        + "</section>"
    )


# a fit's x: its words and its letter in the formula
_FIT_X = {"params": ("parameters", "N"), "compute_budget": ("compute budget (FLOPs)", "C")}


def _fit_forms(data: dict[str, Any]) -> str:
    """Each fit's form chosen on held-out points (analysis/forms.py, report.json's fits[].selection): the form with
    its parameters, the held-out error that chose it, and the other forms' held-out errors; "" when no fit has one.
    A list, an item per fit (the page's one table is the cells')."""
    items = []
    for f in data.get("fits") or []:
        sel = f.get("selection") if isinstance(f, dict) else None
        if not isinstance(sel, dict) or not sel.get("form"):
            continue
        form = str(sel["form"])
        scores: dict[str, Any] = sel["scores"] if isinstance(sel.get("scores"), dict) else {}
        others: dict[str, Any] = sel["alternatives"] if isinstance(sel.get("alternatives"), dict) else {}
        others = others or {k: v for k, v in scores.items() if k != form}
        label, var = _FIT_X.get(str(f.get("x")), (str(f.get("x") or ""), "x"))
        metric = "final loss" if f.get("metric") == "final_loss" else str(f.get("metric") or "")
        params: dict[str, float] = sel["params"] if isinstance(sel.get("params"), dict) else {}
        lhs = f"1 - {metric}" if f.get("flip") else ("L" if metric == "final loss" else metric)
        err = _num(sel.get("error") if "error" in sel else scores.get(form))
        held = [_g(x, 3) for x in sel.get("heldout_x") or [] if _num(x) is not None]
        where = f"{sel.get('heldout') or 0} held-out point(s)" + (f" at {var} = {', '.join(held)}" if held else "")
        alts = "; ".join(
            f"{k} {_pct(v)}" if _num(v) is not None else f"{k} not fittable on the folds" for k, v in others.items()
        )
        chose = f"held-out error {_pct(err)}" if err is not None else "not validated (too few sizes): no held-out error"
        who = f"{metric} vs {label}, {f.get('recipe') or 'all cells'}:"
        fitted = f"{lhs}({var}) = {formula(form, params, var)}"
        items.append(
            f'<li data-form="{escape(form)}">{escape(who)} <b class="form">{escape(form)}</b>'
            f' <code>{escape(fitted)}</code>, <span class="chose">{escape(chose)}</span> ({escape(where)});'
            f" the other forms: {escape(alts or 'none')}</li>"
        )
    joint = _joint_fits(data)
    if not items and not joint:
        return ""
    per_curve = (
        '<p class="note">Each fit\'s form chosen on held-out points: every'
        " form (power_e: E + A x^-alpha, the scaling plots' own; power: A x^-alpha; loglinear: a - b log x;"
        " rectified: E + B / (D_l + x^beta), flat below D_l; tail: A x^-alpha through the largest three sizes"
        " only) fitted on the points below each of the largest"
        " sizes and scored there; the smallest root-mean-square held-out log error (about the relative error)"
        " chooses, and the chosen form is refitted on every point.</p>"
        f'<ul class="note">{"".join(items)}</ul>'
        if items
        else ""
    )
    over_both = (
        '<p class="note">Where a recipe\'s cells vary both the size N and the fine-tuning tokens D: the joint form'
        " L(N, D) = E + A N^-alpha + B D^-beta (one data exponent shared by the sizes) against each size's own"
        " curve over D (its form chosen on its own held-out points), each fitted on the points below each of the"
        " largest D and scored there; the smaller root-mean-square held-out log error chooses (ties: each size's"
        f' own curve).</p><ul class="note" id="joint-fits">{"".join(joint)}</ul>'
        if joint
        else ""
    )
    return f'<h2>Fit forms</h2><section id="fit-forms">{per_curve}{over_both}</section>'


# the joint selection's candidates in words (analysis/joint.py)
_JOINT_NAMES = {"joint": "the joint form", "per_size": "each size's own curve"}


def _joint_fits(data: dict[str, Any]) -> list[str]:
    """A line per joint selection (report.json's joint_fits, analysis/joint.py's JointSelection.as_dict): the
    candidate chosen, its held-out error beside the other's, and the joint surface's formula; or why none was."""
    items = []
    for j in data.get("joint_fits") or []:
        if not isinstance(j, dict):
            continue
        metric = "final loss" if j.get("metric") == "final_loss" else str(j.get("metric") or "")
        who = f"{metric} vs parameters and fine-tuning tokens, {j.get('recipe') or 'all cells'}:"
        chosen = str(j.get("chosen") or "")
        fitted = f"L(N, D) = {j.get('formula') or 'E + A N^-alpha + B D^-beta'}"
        if chosen not in _JOINT_NAMES:
            why = str(j.get("reason") or "not chosen")
            items.append(f'<li data-joint="">{escape(who)} neither chosen: {escape(why)}</li>')
            continue
        scores: dict[str, Any] = j["scores"] if isinstance(j.get("scores"), dict) else {}
        other = "per_size" if chosen == "joint" else "joint"
        err, alt = _pct(scores.get(chosen)), _pct(scores.get(other))
        held = [_g(x, 3) for x in j.get("heldout_d") or [] if _num(x) is not None]
        where = f"{j.get('heldout') or 0} held-out point(s)" + (f" at D = {', '.join(held)}" if held else "")
        against = f"{alt} for {_JOINT_NAMES[other]}" if alt else f"{_JOINT_NAMES[other]}, not scorable on the folds"
        items.append(
            f'<li data-joint="{escape(chosen)}">{escape(who)} <b class="form">{escape(chosen)}</b>'
            f' ({escape(_JOINT_NAMES[chosen])}), <span class="chose">held-out error {escape(err)}</span> against'
            f" {escape(against)} ({escape(where)}); the joint form <code>{escape(fitted)}</code></li>"
        )
    return items


def _pct(v: Any) -> str:
    f = _num(v)
    return "" if f is None else f"{100 * f:.2f}%"


# Draws each figure of the JSON in script#figures into its element (figures.py's Canvas).
_DRAW = """
(function(){var f=JSON.parse(document.getElementById("figures").textContent);
Object.keys(f).forEach(function(id){Plotly.newPlot(id,f[id].data,f[id].layout,f[id].config);});})();
"""


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as the plotly package ships it, read as a file: importing plotly would cost time for nothing."""
    spec = importlib.util.find_spec("plotly")  # finds the package without running its __init__
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise RuntimeError(
        "the report embeds plotly.js from the plotly package, which is not installed here: "
        "pip install plotly (a dependency of sft_grid)"
    )


def _script_json(value: Any) -> str:
    """JSON to hold in a <script>: `<` escaped, so that no string in it can end the element."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def render(data: dict[str, Any]) -> str:
    """The whole page for `data` (schema in the module docstring)."""
    layout = Layout(data)
    canvas = Canvas()
    title = escape(str((data.get("grid") or {}).get("name") or "grid"))
    body = [
        _header(data, layout.cells),
        f"<h2>Cells ({len(layout.cells)})</h2>",
        _table(layout.axes, layout.cells, data.get("columns")) if layout.cells else '<p class="note">No cells.</p>',
        _damaged(data, layout.cells),
        _estimates(data),
        _adaptive(data),
    ]
    if layout.cells:
        body += ['<h2>Loss curves</h2><section id="curves">', loss_curves(layout, canvas), "</section>"]
        along = along_figures(layout, canvas, data.get("along_columns") or [])
        if along:
            body += ['<h2>Scores along training</h2><section id="along">', along, "</section>"]
    plots = scaling(data, layout, canvas)
    if plots:
        body += ['<h2>Scaling</h2><section id="scaling">', plots, "</section>"]
    body.append(_fit_forms(data))
    scripts = f"<script>{_JS}</script>"
    if canvas.specs:
        scripts = (
            f"<script>{plotly_js()}</script>"
            f'<script type="application/json" id="figures">{_script_json(canvas.specs)}</script>'
            f"<script>{_DRAW}</script>{scripts}"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        # an empty data: icon, so that no browser goes looking for /favicon.ico
        f'<link rel="icon" href="data:,"><title>{title} report</title><style>{_CSS}</style></head>'
        f"<body>{''.join(body)}{scripts}</body></html>\n"
    )


def write(sweep_dir: Path, resamples: int = 300, sites: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    """report.html and report.json in the grid's directory (each written whole, then renamed into place). `sites`:
    as analysis/table.read_table's."""
    from sft_grid.analysis.report_data import build

    return write_data(sweep_dir, build(sweep_dir, resamples, sites))


def write_data(sweep_dir: Path, data: dict[str, Any], out: Path | None = None) -> tuple[Path, Path]:
    """report.html and report.json of this data, in `out` (default: the grid's directory): both written whole
    beside their places first, then renamed into them, so that a folder that cannot take them keeps neither."""
    page = render(data)
    paths = (out or sweep_dir) / REPORT_HTML, (out or sweep_dir) / REPORT_JSON
    texts = (page, json.dumps(data, separators=(",", ":"), default=str) + "\n")
    tmps = [path.with_name(f".{path.name}.tmp") for path in paths]
    try:
        for tmp, text in zip(tmps, texts, strict=True):
            tmp.write_text(text, encoding="utf-8")
        for tmp, path in zip(tmps, paths, strict=True):
            tmp.replace(path)
    except OSError:  # report.html a directory, say: said by the command in one line, and no stray copy left
        for tmp in tmps:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise
    return paths
