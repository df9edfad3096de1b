"""The grid report page: structure, self-containment, every cell present, partial and single-axis grids, and the
plotly figures it hands to plotly.js (the page as headless Chromium draws it, hover, legend and zoom included:
tests/test_report_browser.py)."""

from __future__ import annotations

import json
import re
from html import escape
from html.parser import HTMLParser
from typing import Any

from sft_grid.analysis.figures import decimate_index
from sft_grid.analysis.page import plotly_js, render
from sft_grid.analysis.scaling import report_fits
from tests.report_synthetic import grid

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
PARTIAL = {
    "delphi-2e19-base__magpie": "running",
    "delphi-3e18-base__wildchat_386k": "failed",
    "delphi-9e18-base__magpie": "planned",
}


class Page(HTMLParser):
    """Checks nesting as it parses; collects tags, attributes and the text of table rows."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.data: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        if tag == "td":
            self._cell = []
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))  # <rect/> in SVG: opened and closed at once

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.data.append(data)
        if self._cell is not None:
            self._cell.append(data)


def own(page: str) -> str:
    """The page without plotly.js (held verbatim, as the plotly package ships it: the page's own text is the rest)."""
    lib = plotly_js()
    assert page.count(lib) <= 1
    return page.replace(lib, "")


def figures(page: str) -> dict[str, Any]:
    """The page's figures, as plotly.js reads them: id -> {data, layout, config}."""
    found = re.findall(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    return json.loads(found[0]) if found else {}


def titled(page: str) -> dict[str, dict[str, Any]]:
    """The figures by their title (the element's aria-label; numbered from the second of a title on)."""
    out: dict[str, dict[str, Any]] = {}
    figs = figures(page)
    for ident, title in re.findall(r'<div class="plot" id="(fig\d+)" role="img" aria-label="([^"]*)"', page):
        key = title if title not in out else f"{title} #{sum(k.startswith(title) for k in out) + 1}"
        out[key] = figs[ident]
    return out


def traces(fig: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [t for t in fig["data"] if t.get("name") == name]


def parse(page: str) -> Page:
    p = Page()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    return p


def drawn_fits(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Fit entries as scaling.report_fits writes them, made by hand from the synthetic law (no scipy import:
    these tests are about drawing; test_report_scaling tests fitting)."""
    from tests.report_synthetic import ALPHA, RECIPES
    from tests.report_synthetic import A as COEF

    sizes = sorted({c["params"] for c in data["cells"]})
    n = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 15) for i in range(16)]
    out = []
    for recipe in sorted({c["recipe"] for c in data["cells"]}):
        e = RECIPES[recipe]
        mid = [e + COEF * x**-ALPHA for x in n]
        out.append(
            {
                "metric": "final_loss",
                "x": "params",
                "recipe": recipe,
                "ok": True,
                "reason": "",
                "E": e,
                "A": COEF,
                "alpha": ALPHA,
                "loss": "huber",
                "delta": 1e-3,
                "objective": 0.0,
                "converged": True,
                "at_bounds": [],
                "keys": [c["key"] for c in data["cells"] if c["recipe"] == recipe],
                "band": {
                    "n": n,
                    "lo": [m - 0.01 for m in mid],
                    "hi": [m + 0.01 for m in mid],
                    "level": 0.9,
                    "resamples": 300,
                },
            }
        )
    return out


def body_rows(p: Page) -> list[list[str]]:
    return [r for r in p.rows if r]  # the header row has th, not td


def test_page_is_well_formed_html_with_plotly_inline_and_its_figures() -> None:
    page = render(grid(sizes=3, mixes=2, steps=50))
    assert page.startswith("<!DOCTYPE html>")
    p = parse(page)
    names = [t for t, _ in p.tags]
    for tag in ("html", "head", "body", "style", "table", "thead", "tbody", "title"):
        assert names.count(tag) == 1, tag
    # plotly.js, the figures' JSON, the script that draws them, the table's sorting
    assert names.count("script") == 4 and plotly_js() in page and "plotly.js v" in plotly_js()[:200]
    figs = titled(page)
    assert len(figs) == 2 * 2 + 3 * 2  # (step, tokens) x 2 recipes; (final loss, 2 scores) x (params, budget)
    assert set(figures(page)) == {f"fig{i}" for i in range(len(figs))}  # one element per figure, one each


def test_nothing_outside_the_file_is_referenced() -> None:
    data = grid(sizes=3, mixes=2, steps=50)
    data["fits"] = drawn_fits(data)
    page = render(data)
    figs = figures(page)
    assert sum(t.get("fill") == "toself" for f in figs.values() for t in f["data"]) == 2  # the bands are there too
    mine = own(page)
    p = parse(mine)
    for tag, attrs in p.tags:
        for name in ("src", "href", "xlink:href", "action", "poster", "data"):
            value = (attrs.get(name) or "").strip()
            assert not value or value.startswith(("data:", "#")), (tag, name, value)
        assert tag not in ("img", "iframe", "object", "embed", "audio", "video")
    # the page's own text holds no URL; plotly.js names some (map tiles, fonts of map styles, a topojson CDN) for
    # trace types this page never draws: that it asks for none of them is tests/test_report_browser.py's check
    assert "http" not in mine and "//" not in json.dumps(figs)
    assert not re.findall(r"url\(", mine)
    assert "@import" not in mine and "@font-face" not in mine


def test_the_figures_offer_what_plots_are_expected_to() -> None:
    data = grid(sizes=4, mixes=2, steps=60, states=PARTIAL)
    data["fits"] = drawn_fits(data)
    figs = titled(render(data))
    # the modebar's camera downloads an SVG, each figure's file named after it (a curve's after its panel too)
    files = [f["config"]["toImageButtonOptions"]["filename"] for f in figs.values()]
    assert {f["config"]["toImageButtonOptions"]["format"] for f in figs.values()} == {"svg"}
    assert len(set(files)) == len(files) and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)
    assert files[:2] == ["magpie_loss_vs_step", "magpie_loss_vs_tokens_seen"]
    for title, fig in figs.items():
        assert fig["config"]["displaylogo"] is False and fig["layout"]["hovermode"] == "closest"  # no link out
        assert "dragmode" not in fig["layout"]  # plotly's default: a drag zooms
        shown = [t for t in fig["data"] if t["x"] != [None]]
        # the pointer over any line or point says which cell (or fit) it is and its value: constant templates,
        # the cell's name from the trace's name or its points' customdata, never spliced into the template
        for t in shown:
            if t.get("hoverinfo") == "skip":
                assert t.get("fill") == "toself", t  # only the bands are silent: the fit line speaks for them
                continue
            assert "%{y:.4g}" in t["hovertemplate"] or "(on the x axis)" in t["name"], t
            assert "%{fullData.name}" in t["hovertemplate"] or "%{customdata}" in t["hovertemplate"]
            assert "delphi" not in t["hovertemplate"] and "magpie" not in t["hovertemplate"]
        if title.startswith("loss vs"):
            assert fig["layout"]["xaxis"]["type"] == "linear"
            # a legend entry per model size, which toggles its cells' lines (their legend group)
            entries = [t for t in fig["data"] if t["x"] == [None]]
            assert [t["name"] for t in entries] == sorted(
                {t["name"] for t in entries}, key=lambda n: float(n[:-1]) * {"M": 1e6, "B": 1e9}[n[-1]]
            )
            assert {t["legendgroup"] for t in shown} == {t["legendgroup"] for t in entries}
            assert all(t["showlegend"] is False for t in shown)
        else:
            assert fig["layout"]["xaxis"]["type"] == "log"  # parameters and compute budgets span decades
            # a recipe's legend entry (its points) toggles its fit and band with it
            for recipe in ("magpie", "wildchat_386k"):
                group = [t for t in fig["data"] if t["legendgroup"] == recipe]
                assert [t["showlegend"] for t in group].count(True) == 1
                if title == "final loss vs parameters":
                    assert {t["name"] for t in group} >= {recipe, f"{recipe}: fit", f"{recipe}: 90% band"}
    loss = figs["final loss vs parameters"]
    (magpie,) = traces(loss, "magpie")
    assert magpie["customdata"][0] == "delphi-3e18-base__magpie" and magpie["mode"] == "markers"
    (running,) = traces(loss, "magpie: running")
    assert running["customdata"] == ["delphi-2e19-base__magpie"] and running["marker"]["symbol"] == "circle-open"
    # the curves: the running cell dashed, with a ring at its latest loss; the failed one with a cross
    curves = [t for t in figs["loss vs step"]["data"] if t["name"] == "delphi-2e19-base__magpie"]
    assert [t["mode"] for t in curves] == ["lines", "markers"] and curves[0]["line"]["dash"] == "dash"
    assert curves[1]["y"] == [curves[0]["y"][-1]] and curves[1]["meta"][0] == "running"


def test_the_grid_at_a_glance() -> None:
    data = grid(sizes=3, mixes=2, steps=20, states=PARTIAL)
    data["grid"].update(counts={}, git_dirty=True, gpu_hours_used=12.345, gpu_hours_estimated=40.0)
    page = render(data)
    # counts from the cells when the data gives none: 12 cells, one each running, failed, planned
    for state, n in (("completed", 9), ("running", 1), ("failed", 1), ("planned", 1)):
        assert f"{state}: {n}</span>" in page
    assert "<dd>conf/sweep/delphi_scaling.yaml</dd>" in page
    assert '<code>6da9475 <span class="badge dirty">dirty</span></code>' in page
    assert "<dd>12.3 used, 40 estimated</dd>" in page and "<dd>GPU</dd>" in page


def test_every_cell_appears_in_the_table_with_its_values() -> None:
    data = grid(sizes=3, mixes=2, steps=50, states=PARTIAL)
    rows = body_rows(parse(render(data)))
    assert [r[0] for r in rows] == [c["name"] for c in data["cells"]]
    first = rows[0]
    cell = data["cells"][0]
    assert first[1:4] == [cell["values"]["model"], cell["values"]["dataset"], "completed"]
    assert first[4] == "50 / 50" and first[5] == f"{cell['final_loss']:.4g}"
    assert first[-1] == cell["dir"]


def test_partial_grid_shows_running_failed_and_planned_cells_as_such() -> None:
    data = grid(sizes=4, mixes=1, steps=40, states=PARTIAL)
    data["fits"] = drawn_fits(data)
    page = render(data)
    rows = {r[0]: r for r in body_rows(parse(page))}
    running, failed, planned = (rows[n] for n in PARTIAL)
    assert running[3] == "running" and running[4] == "24 / 40" and running[5] == ""
    assert failed[3].startswith("failed") and "exit code 137 (out of memory)" in failed[3]
    assert planned[3] == "planned" and planned[4] == ""
    # on the plots: the running cell's latest loss as a ring, the failed one as a cross, the planned noted
    figs = titled(page)
    (ring,) = traces(figs["final loss vs parameters"], "magpie: running")
    assert ring["customdata"] == ["delphi-2e19-base__magpie"] and ring["marker"]["symbol"] == "circle-open"
    (cross,) = [t for t in traces(figs["loss vs step #2"], "delphi-3e18-base__wildchat_386k") if t["mode"] == "markers"]
    assert cross["marker"]["symbol"] == "x" and cross["meta"] == ["failed", "step", "exit code 137 (out of memory)"]
    (on_axis,) = traces(figs["final loss vs parameters"], "failed: no value (on the x axis)")
    assert on_axis["customdata"] == ["delphi-3e18-base__wildchat_386k"] and on_axis["yaxis"] == "y2"
    assert "no logged steps: 1 planned (delphi-9e18-base__magpie)" in page
    assert "1 failed (delphi-3e18-base__wildchat_386k)" in page


def test_a_single_axis_grid_gets_curves_but_no_scaling_plot() -> None:
    data = grid(sizes=1, mixes=1, recipes=1, steps=30)
    base = data["cells"][0]
    data["axes"] = ["lr"]
    data["cells"] = [{**base, "name": f"lr{lr}", "values": {"lr": lr}, "recipe": None} for lr in (1e-5, 2e-5, 5e-5)]
    data["fits"] = report_fits(data, resamples=10)
    page = render(data)
    assert 'id="scaling"' not in page and "vs parameters" not in page
    assert own(page).count("<figure") == 1  # one panel: every cell, coloured by lr
    figs = titled(page)
    assert list(figs) == ["loss vs step", "loss vs tokens seen"]
    for fig in figs.values():
        assert [t["name"] for t in fig["data"] if t["x"] == [None]] == ["lr=1e-05", "lr=2e-05", "lr=5e-05"]
    assert all(f["ok"] is False for f in data["fits"])  # one size: nothing to fit


def test_a_grid_over_model_size_alone_gets_one_panel_and_its_scaling_plots() -> None:
    data = grid(sizes=4, mixes=1, recipes=1, steps=30, scores=False)
    for c in data["cells"]:
        c["recipe"] = None
        c["values"] = {"model": c["values"]["model"]}
    data["axes"] = ["model"]
    page = render(data)
    assert page.count('class="panel"') == 1
    assert list(titled(page)) == [
        "loss vs step",
        "loss vs tokens seen",
        "final loss vs parameters",
        "final loss vs compute budget (FLOPs)",
    ]  # no score, no score plot


def test_no_compute_plot_without_compute_budgets() -> None:
    data = grid(sizes=4, mixes=1, recipes=1, steps=20, scores=False)
    for c in data["cells"]:
        c["compute_budget"] = None
    page = render(data)
    assert "final loss vs parameters" in titled(page) and "compute budget" not in own(page)


def test_fits_are_drawn_with_their_band_and_failures_are_explained() -> None:
    data = grid(sizes=5, mixes=1, steps=30, scores=False)
    data["cells"] = [c for c in data["cells"] if c["recipe"] == "magpie" or c["params"] < 6e8]
    data["fits"] = report_fits(data, xs=("params",), resamples=50)
    page = render(data)
    fig = titled(page)["final loss vs parameters"]
    (band,) = [t for t in fig["data"] if t.get("fill") == "toself"]  # magpie's; wildchat has 2 sizes: no fit
    (fit,) = traces(fig, "magpie: fit")
    (f,) = [f for f in data["fits"] if f["recipe"] == "magpie"]
    n, lo, hi = f["band"]["n"], f["band"]["lo"], f["band"]["hi"]
    assert band["legendgroup"] == fit["legendgroup"] == "magpie"
    assert band["x"] == [*n, *n[::-1]] and band["y"] == [*hi, *lo[::-1]]
    assert fit["y"] == [f["E"] + f["A"] * x ** -f["alpha"] for x in n]
    assert re.search(r"magpie: L\(N\) = [0-9.]+ \+ [0-9.]+ N\^-[0-9.]+ \(huber, 5 cells\)", page)
    assert "wildchat_386k: no fit (2 usable points at 2 distinct N" in page


def test_names_and_paths_are_escaped() -> None:
    data = grid(sizes=2, mixes=1, recipes=1, steps=20, states={"delphi-3e18-base__magpie": "failed"})
    evil = '<script>alert("x")</script>&\'"'
    data["grid"]["name"] = evil
    data["cells"][0].update(name=evil, dir='/runs/<b>"a"</b>', reason="<img src=x onerror=alert(1)>", recipe=evil)
    data["cells"][0]["values"]["model"] = evil
    page = render(data)
    mine = own(page)
    p = parse(mine)
    assert "<script>alert" not in mine and "<b>" not in mine and "<img" not in mine
    assert [t for t, _ in p.tags].count("script") == 4 and "img" not in [t for t, _ in p.tags]
    assert body_rows(p)[0][0] == evil  # the text survives, as text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#x27;&quot;" in page
    # in the figures' JSON no `<` at all (no string can end its script), and plotly gets the names escaped (it
    # reads a few tags in its labels: <a href> would be a link)
    (held,) = re.findall(r'<script type="application/json" id="figures">(.*?)</script>', page, re.S)
    assert "<" not in held
    figs = titled(page)
    (line, cross) = traces(figs["loss vs step"], escape(evil))  # its curve, and the cross of a failed cell
    assert line["mode"] == "lines" and cross["meta"] == ["failed", "step", escape("<img src=x onerror=alert(1)>")]
    (on_axis,) = traces(figs["final loss vs parameters"], "failed: no value (on the x axis)")
    assert on_axis["customdata"] == [escape(evil)]


def test_rendering_is_deterministic() -> None:
    data = grid(sizes=3, mixes=2, steps=200, states=PARTIAL)
    data["fits"] = drawn_fits(data)
    assert render(data) == render(json.loads(json.dumps(data)))


def test_long_curves_are_decimated_and_keep_their_spikes() -> None:
    import numpy as np

    x = np.arange(2000, dtype=float)
    y = 2.0 - x / 2000
    y[1234] = 9.0
    idx = decimate_index(y, 240)
    kept = list(zip(x[idx].tolist(), y[idx].tolist(), strict=True))
    assert len(kept) <= 242 and kept[0] == (0.0, 2.0) and kept[-1] == (1999.0, y[-1])
    assert (1234.0, 9.0) in kept
    assert [k[0] for k in kept] == sorted(k[0] for k in kept)
    figs = titled(render(grid(sizes=2, mixes=1, recipes=1, steps=2000)))
    lengths = [len(t["x"]) for f in figs.values() for t in f["data"] if t["mode"] == "lines" and t["x"] != [None]]
    assert lengths and max(lengths) <= 242


def test_no_cells_and_no_curves_render_without_empty_panels() -> None:
    assert "No cells." in render({"grid": {"name": "empty"}})
    planned = dict.fromkeys(("delphi-3e18-base__magpie", "delphi-9e18-base__magpie"), "planned")
    data = grid(sizes=2, mixes=1, recipes=1, steps=10, states=planned, scores=False)
    page = render(data)
    assert "No logged steps yet." in page and "<figure" not in page and '<div class="plot"' not in page
    assert "Plotly" not in page and len(page) < 20_000  # no figure: no plotly.js either
    assert "2 planned" in page


def test_numeric_columns_carry_numbers_to_sort_by() -> None:
    data = grid(sizes=3, mixes=1, recipes=1, steps=20)
    p = parse(render(data))
    sorts = [a["data-v"] or "" for t, a in p.tags if t == "td" and a.get("class") == "n"]
    assert sorts and all(v == "" or float(v) == float(v) for v in sorts)
