"""The report page as headless Chromium (Debian's package) draws it, driven over the DevTools pipe
(tests/report_cdp.py): no console error, no request but the file itself (and data: URLs), every plot drawn (its
screenshot has coloured pixels), the table sortable by a real mouse click; and plotly's figures used with the
mouse: the pointer over a point shows the cell's name and value, a click on a legend entry hides its series, a
drag zooms, the scaling plots' x axes are logarithmic, each figure's modebar downloads it as SVG. On synthetic
data, and on grids written as their cells leave them: complete with scores, partial, over one axis. (The report
of a grid really trained here is tests/test_report_tiny_grid.py.)

Marked `backend`: each test starts a browser (make setup installs Chromium; without it these fail and say so)."""

from __future__ import annotations

import json
import re
import urllib.parse
from pathlib import Path

import pytest

from sft_grid.analysis.page import render, write
from sft_grid.analysis.scaling import report_fits
from tests.report_cdp import click, drag, errors, hover, legend_click, names, opened, plot_pixels, requests
from tests.report_synthetic import grid

from .test_report import make_grid
from .test_report_html import PARTIAL

pytestmark = pytest.mark.backend
# a blank plot has no coloured pixel; the sparsest here (three dots of ~40 pixels, no fit) has some 400
DRAWN = 60


def assert_clean(browser: object, page: Path) -> None:
    assert not errors(browser), errors(browser)  # type: ignore[arg-type]
    urls = requests(browser)  # type: ignore[arg-type]
    assert urls and all(u == page.as_uri() or u.startswith("data:") for u in urls), urls


def test_synthetic_report_sorts_and_draws(tmp_path: Path) -> None:
    data = grid(sizes=4, mixes=1, recipes=2, steps=300, states=PARTIAL)
    data["fits"] = report_fits(data, metrics=["final_loss"], resamples=100)
    report = tmp_path / "report.html"
    report.write_text(render(data), encoding="utf-8")
    with opened(report, tmp_path / "profile") as (browser, s):
        pixels = plot_pixels(browser, s)
        # (step, tokens) x 2 recipes; (final loss, 2 scores) x (params, compute budget)
        assert len(pixels) == 2 * 2 + 3 * 2 and min(pixels.values()) >= DRAWN, pixels
        all_names = [c["name"] for c in data["cells"]]
        assert names(browser, s) == all_names
        loss = {c["name"]: c["final_loss"] for c in data["cells"]}
        by_loss = sorted((n for n in all_names if loss[n] is not None), key=lambda n: loss[n])
        missing = [n for n in all_names if loss[n] is None]  # empty cells stay last, in table order
        click(browser, s, "final loss")
        assert names(browser, s) == by_loss + missing
        click(browser, s, "final loss")
        assert names(browser, s) == by_loss[::-1] + missing
        # estimates 0.125, 0.25, 0.375, ... shuffled over the cells: with digit runs compared as numbers (the
        # "natural" order of the text sort: 5 < 25 < 125), 0.5 would come before 0.25; they must sort as numbers
        est = {c["name"]: ((5 * i) % len(all_names) + 1) / 8 for i, c in enumerate(data["cells"])}
        for c in data["cells"]:
            c["estimate_gpu_hours"] = est[c["name"]]
        report.write_text(render(data), encoding="utf-8")
        mark = len(browser.events)
        browser.call("Page.reload", {}, s)
        browser.wait_event("Page.loadEventFired", s, since=mark)
        numeric = sorted(all_names, key=lambda n: est[n])
        natural = sorted(
            all_names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", repr(est[n]))]
        )
        assert numeric not in (all_names, natural)
        click(browser, s, "est. GPU-h")
        assert names(browser, s) == numeric
        assert browser.evaluate(
            s,
            "[...document.querySelectorAll('#cells th')].filter(h => "
            "h.getAttribute('aria-sort')).map(h => h.textContent + ':' + "
            "h.getAttribute('aria-sort'))",
        ) == ["est. GPU-h:ascending"]
        click(browser, s, "cell")
        assert names(browser, s) == sorted(all_names)
        assert_clean(browser, report)
        # the check itself: a plot whose marks are gone counts as blank
        browser.evaluate(s, "document.querySelectorAll('div.plot').forEach(d => Plotly.react(d, [], d.layout))")
        assert max(plot_pixels(browser, s).values()) < DRAWN / 4


def figure_of(browser: object, s: str, title: str) -> str:
    """The element id of the first figure with this title."""
    return browser.evaluate(s, f"document.querySelector('div.plot[aria-label={json.dumps(title)}]').id")  # type: ignore[attr-defined]


def trace_of(browser: object, s: str, figure: str, name: str, mode: str) -> int:
    return browser.evaluate(  # type: ignore[attr-defined]
        s,
        f"document.getElementById('{figure}')._fullData.findIndex(t => "
        f"t.name === {json.dumps(name)} && t.mode === '{mode}')",
    )


def test_the_plots_answer_the_mouse(tmp_path: Path) -> None:
    data = grid(sizes=4, mixes=1, recipes=2, steps=300, states=PARTIAL)
    data["fits"] = report_fits(data, metrics=["final_loss"], resamples=100)
    report = tmp_path / "report.html"
    report.write_text(render(data), encoding="utf-8")
    cells = {c["name"]: c for c in data["cells"]}
    with opened(report, tmp_path / "profile") as (browser, s):
        scaling = figure_of(browser, s, "final loss vs parameters")
        # the pointer over a point: the cell's name and its value
        wildchat = trace_of(browser, s, scaling, "wildchat_386k", "markers")
        first = browser.evaluate(s, f"document.getElementById('{scaling}')._fullData[{wildchat}].customdata[0]")
        label = hover(browser, s, scaling, wildchat, 0)
        assert first in label and f"final loss {cells[first]['final_loss']:.4g}" in label, label
        assert "parameters 550M" in label or "parameters 447M" in label, label
        # ... and over a loss curve: the cell, its state, the step, the loss there
        curves = figure_of(browser, s, "loss vs step")
        line = trace_of(browser, s, curves, "delphi-3e19-base__magpie", "lines")
        label = hover(browser, s, curves, line, 150)  # the 150th point drawn (a 300-step curve is decimated)
        target = browser.evaluate(s, f"document.getElementById('{curves}')._fullData[{line}].x[150]")
        assert label.startswith("delphi-3e19-base__magpie (completed)"), label
        # the point under the pointer (points lie a pixel or two apart: it may be a neighbour), and its loss
        shown = re.fullmatch(r".*step (\d+)loss ([0-9.]+)", label)
        assert shown and abs(int(shown[1]) - target) <= 3, (label, target)
        loss = {s: v for s, _, v in cells["delphi-3e19-base__magpie"]["curve"]}[int(shown[1])]
        assert shown[2] == f"{loss:.4g}", (label, loss)
        # the scaling plots' x axes are logarithmic, the curves' linear
        types = browser.evaluate(
            s,
            "Object.fromEntries([...document.querySelectorAll('div.plot')].map(d => "
            "[d.getAttribute('aria-label'), d._fullLayout.xaxis.type]))",
        )
        assert types == {
            "loss vs step": "linear",
            "loss vs tokens seen": "linear",
            "final loss vs parameters": "log",
            "final loss vs compute budget (FLOPs)": "log",
            "gsm8k/exact_match vs parameters": "log",
            "ifeval/prompt_strict vs parameters": "log",
            "gsm8k/exact_match vs compute budget (FLOPs)": "log",
            "ifeval/prompt_strict vs compute budget (FLOPs)": "log",
        }
        # a click on a legend entry hides its series: the recipe's points, its fit and its band, off the screen too
        before = plot_pixels(browser, s)
        key = next(k for k in before if k.endswith(": final loss vs parameters"))
        assert legend_click(browser, s, scaling, "wildchat_386k") == ["legendonly"] * 3
        assert plot_pixels(browser, s)[key] < before[key] - DRAWN
        assert legend_click(browser, s, scaling, "wildchat_386k") == [True] * 3  # a second click brings it back
        # ... and in the curves, a model size's entry hides that size's cells
        assert set(legend_click(browser, s, curves, "998M")) == {"legendonly"}
        # each figure's modebar downloads it as SVG, and the export is the figure: its title, its points (5 completed
        # cells, a running one, a failed and a planned one on the x axis)
        buttons = browser.evaluate(
            s,
            "[...document.querySelectorAll('div.plot')].map(d => [d._context"
            ".toImageButtonOptions.format, !!d.querySelector('.modebar-btn[data-title="
            '"Download plot"]\')])',
        )
        assert buttons == [["svg", True]] * len(buttons) and len(buttons) == 10
        svg = browser.evaluate(s, f"Plotly.toImage(document.getElementById('{scaling}'), {{format: 'svg'}})", wait=True)
        assert svg.startswith("data:image/svg+xml,")
        text = urllib.parse.unquote(svg.split(",", 1)[1])
        points = sum(g.count("<path") for g in re.findall(r'<g class="points">(.*?)</g>', text))
        assert text.startswith("<svg") and "final loss vs parameters" in text and points == 5 + 1 + 2, points
        assert ">magpie<" in text and ">wildchat_386k<" in text  # the legend too
        # a drag zooms into the box dragged over
        full = browser.evaluate(s, f"document.getElementById('{scaling}')._fullLayout.xaxis.range.slice()")
        drag(browser, s, scaling, (0.25, 0.2), (0.6, 0.8))
        zoomed = browser.evaluate(s, f"document.getElementById('{scaling}')._fullLayout.xaxis.range.slice()")
        width = full[1] - full[0]
        assert zoomed[0] == pytest.approx(full[0] + 0.25 * width, abs=0.02 * width), (full, zoomed)
        assert zoomed[1] == pytest.approx(full[0] + 0.6 * width, abs=0.02 * width), (full, zoomed)
        assert_clean(browser, report)  # nothing asked of the network, the export included


@pytest.mark.parametrize("shape", ["complete", "partial", "one_axis"])
def test_grid_reports_in_chromium(make_cells, tmp_path: Path, shape: str) -> None:
    states = {
        "partial": {
            ("tiny_llama_l", "tiny_messages"): "running",
            ("tiny_llama_m", "tiny_sharegpt"): "failed",
            ("tiny_llama_l", "tiny_sharegpt"): "planned",
        }
    }.get(shape)
    datasets = ("tiny_messages",) if shape == "one_axis" else ("tiny_messages", "tiny_sharegpt")
    make_grid(make_cells, shape, states, datasets=datasets)
    page, data_file = write(tmp_path / "runs" / shape, resamples=50)
    data = json.loads(data_file.read_text())
    with opened(page, tmp_path / "profile") as (browser, s):
        pixels = plot_pixels(browser, s)
        panels = len(datasets)
        scaling = {"complete": 2, "partial": 2, "one_axis": 2}[shape]  # final loss and tiny_mc/acc vs parameters
        assert len(pixels) == 2 * panels + scaling, pixels
        assert min(pixels.values()) >= DRAWN, pixels
        assert sorted(names(browser, s)) == sorted(c["name"] for c in data["cells"])
        states_shown = browser.evaluate(
            s, "[...document.querySelectorAll('#cells tbody tr')].map(r => r.dataset.state)"
        )
        assert sorted(states_shown) == sorted(c["state"] for c in data["cells"])
        click(browser, s, "GPU-h")
        used = [
            c["gpu_hours"] for c in sorted(data["cells"], key=lambda c: (c["gpu_hours"] is None, c["gpu_hours"] or 0))
        ]
        shown = browser.evaluate(
            s,
            "[...document.querySelectorAll('#cells tbody tr')].map(r => r.cells[[...document"
            ".querySelectorAll('#cells th')].findIndex(h => h.textContent === 'GPU-h')]"
            ".getAttribute('data-v'))",
        )
        assert [float(v) if v else None for v in shown] == pytest.approx(used)
        assert_clean(browser, page)
