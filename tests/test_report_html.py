"""The grid report page: structure, self-containment, every cell present, partial and single-axis grids (the page
as headless Chromium draws it: tests/test_report_browser.py)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

from sft_grid.analysis.html import render
from sft_grid.analysis.scaling import report_fits
from sft_grid.analysis.svg import decimate
from tests.report_synthetic import grid

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
PARTIAL = {"delphi-2e19-base__magpie": "running", "delphi-3e18-base__wildchat_386k": "failed",
           "delphi-9e18-base__magpie": "planned"}


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
        mid = [e + COEF * x ** -ALPHA for x in n]
        out.append({"metric": "final_loss", "x": "params", "recipe": recipe, "ok": True, "reason": "", "E": e,
                    "A": COEF, "alpha": ALPHA, "loss": "huber", "delta": 1e-3, "objective": 0.0, "converged": True,
                    "at_bounds": [], "keys": [c["key"] for c in data["cells"] if c["recipe"] == recipe],
                    "band": {"n": n, "lo": [m - 0.01 for m in mid], "hi": [m + 0.01 for m in mid], "level": 0.9,
                             "resamples": 300}})
    return out


def body_rows(p: Page) -> list[list[str]]:
    return [r for r in p.rows if r]  # the header row has th, not td


def test_page_is_well_formed_html_with_one_head_one_body_and_one_script() -> None:
    page = render(grid(sizes=3, mixes=2, steps=50))
    assert page.startswith("<!DOCTYPE html>")
    p = parse(page)
    names = [t for t, _ in p.tags]
    for tag in ("html", "head", "body", "style", "table", "thead", "tbody"):
        assert names.count(tag) == 1, tag
    assert names[:names.index("body")].count("title") == 1  # the others are SVG tooltips
    assert names.count("script") == 1
    assert names.count("svg") >= 4  # curve panels (step, tokens) x 2 recipes, then scaling plots


def test_nothing_outside_the_file_is_referenced() -> None:
    data = grid(sizes=3, mixes=2, steps=50)
    data["fits"] = drawn_fits(data)
    page = render(data)
    assert page.count("<polygon") == 2  # the bands are there too
    p = parse(page)
    for tag, attrs in p.tags:
        for name in ("src", "href", "xlink:href", "action", "poster", "data"):
            value = (attrs.get(name) or "").strip()
            assert not value or value.startswith(("data:", "#")), (tag, name, value)
        assert tag not in ("img", "iframe", "object", "embed", "audio", "video")
    assert "http" not in page  # not even an xmlns: inline SVG needs none
    assert all(u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", page))
    assert "@import" not in page and "@font-face" not in page


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
    assert "delphi-2e19-base__magpie (running): latest" in page
    assert "<title>delphi-3e18-base__wildchat_386k (failed)</title>" in page
    assert "no logged steps: 1 planned (delphi-9e18-base__magpie)" in page
    assert "1 failed (delphi-3e18-base__wildchat_386k)" in page


def test_a_single_axis_grid_gets_curves_but_no_scaling_plot() -> None:
    data = grid(sizes=1, mixes=1, recipes=1, steps=30)
    base = data["cells"][0]
    data["axes"] = ["lr"]
    data["cells"] = [{**base, "name": f"lr{lr}", "values": {"lr": lr}, "recipe": None} for lr in (1e-5, 2e-5, 5e-5)]
    data["fits"] = report_fits(data, resamples=10)
    page = render(data)
    p = parse(page)
    assert 'id="scaling"' not in page and "vs parameters" not in page
    assert page.count("<figure") == 1  # one panel: every cell, coloured by lr
    assert "lr=1e-05" in page and "lr=5e-05" in page
    assert [t for t, _ in p.tags].count("svg") == 2  # loss vs step, loss vs tokens
    assert all(f["ok"] is False for f in data["fits"])  # one size: nothing to fit


def test_a_grid_over_model_size_alone_gets_one_panel_and_its_scaling_plots() -> None:
    data = grid(sizes=4, mixes=1, recipes=1, steps=30, scores=False)
    for c in data["cells"]:
        c["recipe"] = None
        c["values"] = {"model": c["values"]["model"]}
    data["axes"] = ["model"]
    page = render(data)
    assert page.count('class="panel"') == 1
    assert "final loss vs parameters" in page and "final loss vs compute budget" in page
    assert "gsm8k" not in page  # no score, no score plot


def test_no_compute_plot_without_compute_budgets() -> None:
    data = grid(sizes=4, mixes=1, recipes=1, steps=20, scores=False)
    for c in data["cells"]:
        c["compute_budget"] = None
    page = render(data)
    assert "final loss vs parameters" in page and "compute budget" not in page


def test_fits_are_drawn_with_their_band_and_failures_are_explained() -> None:
    data = grid(sizes=5, mixes=1, steps=30, scores=False)
    data["cells"] = [c for c in data["cells"] if c["recipe"] == "magpie" or c["params"] < 6e8]
    data["fits"] = report_fits(data, xs=("params",), resamples=50)
    page = render(data)
    assert page.count("<polygon") == 1  # magpie's band; wildchat has 2 sizes: no fit
    assert re.search(r"magpie: L\(N\) = [0-9.]+ \+ [0-9.]+ N\^-[0-9.]+ \(huber, 5 cells\)", page)
    assert "wildchat_386k: no fit (2 usable points at 2 distinct N" in page


def test_names_and_paths_are_escaped() -> None:
    data = grid(sizes=2, mixes=1, recipes=1, steps=20, states={"delphi-3e18-base__magpie": "failed"})
    evil = '<script>alert("x")</script>&\'"'
    data["grid"]["name"] = evil
    data["cells"][0].update(name=evil, dir='/runs/<b>"a"</b>', reason="<img src=x onerror=alert(1)>", recipe=evil)
    data["cells"][0]["values"]["model"] = evil
    page = render(data)
    p = parse(page)
    assert "<script>alert" not in page and "<b>" not in page and "<img" not in page
    assert [t for t, _ in p.tags].count("script") == 1 and "img" not in [t for t, _ in p.tags]
    assert body_rows(p)[0][0] == evil  # the text survives, as text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#x27;&quot;" in page


def test_rendering_is_deterministic() -> None:
    data = grid(sizes=3, mixes=2, steps=200, states=PARTIAL)
    data["fits"] = drawn_fits(data)
    assert render(data) == render(json.loads(json.dumps(data)))


def test_long_curves_are_decimated_and_keep_their_spikes() -> None:
    import numpy as np

    x = np.arange(2000, dtype=float)
    y = 2.0 - x / 2000
    y[1234] = 9.0
    kept = decimate(x, y, 240)
    assert len(kept) <= 242 and kept[0] == (0.0, 2.0) and kept[-1] == (1999.0, y[-1])
    assert (1234.0, 9.0) in kept
    assert [k[0] for k in kept] == sorted(k[0] for k in kept)
    page = render(grid(sizes=2, mixes=1, recipes=1, steps=2000))
    longest = max(len(m.split()) for m in re.findall(r'points="([^"]*)"', page))
    assert longest <= 242


def test_no_cells_and_no_curves_render_without_empty_panels() -> None:
    assert "No cells." in render({"grid": {"name": "empty"}})
    data = grid(sizes=2, mixes=1, recipes=1, steps=10, states={c: "planned" for c in (
        "delphi-3e18-base__magpie", "delphi-9e18-base__magpie")}, scores=False)
    page = render(data)
    assert "No logged steps yet." in page and "<figure" not in page and "<svg" not in page
    assert "2 planned" in page


def test_numeric_columns_carry_numbers_to_sort_by() -> None:
    data = grid(sizes=3, mixes=1, recipes=1, steps=20)
    p = parse(render(data))
    sorts = [a["data-v"] for t, a in p.tags if t == "td" and a.get("class") == "n"]
    assert sorts and all(v == "" or float(v) == float(v) for v in sorts)
