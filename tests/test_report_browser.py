"""The report page as headless Chromium (Debian's package) draws it, driven over the DevTools pipe
(tests/report_cdp.py): no console error, no request but the file itself (and data: URLs), every plot drawn (its
screenshot has coloured pixels), the table sortable by a real mouse click. On synthetic data, and on grids written
as their cells leave them: complete with scores, partial, over one axis. (The report of a grid really trained
here is tests/test_report_tiny_grid.py.)

Marked `backend`: each test starts a browser (make setup installs Chromium; without it these fail and say so)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sft_grid.analysis.html import render
from sft_grid.analysis.report import write
from sft_grid.analysis.scaling import report_fits
from tests.report_cdp import click, errors, names, opened, plot_pixels, requests
from tests.report_synthetic import grid

from .test_report import make_grid
from .test_report_html import PARTIAL

pytestmark = pytest.mark.backend
# a blank plot has no coloured pixel; the sparsest here (three dots of ~40 pixels, no fit) has some 120
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
        natural = sorted(all_names, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", repr(est[n]))])
        assert numeric not in (all_names, natural)
        click(browser, s, "est. GPU-h")
        assert names(browser, s) == numeric
        assert browser.evaluate(s, "[...document.querySelectorAll('#cells th')].filter(h => "
                                   "h.getAttribute('aria-sort')).map(h => h.textContent + ':' + "
                                   "h.getAttribute('aria-sort'))") == ["est. GPU-h:ascending"]
        click(browser, s, "cell")
        assert names(browser, s) == sorted(all_names)
        assert_clean(browser, report)
        # the check itself: a plot whose marks are gone counts as blank
        browser.evaluate(s, "document.querySelectorAll('svg.plot g').forEach(g => g.innerHTML = '')")
        assert max(plot_pixels(browser, s).values()) < DRAWN / 4


@pytest.mark.parametrize("shape", ["complete", "partial", "one_axis"])
def test_grid_reports_in_chromium(make_cells, tmp_path: Path, shape: str) -> None:
    states = {"partial": {("tiny_llama_l", "tiny_messages"): "running", ("tiny_llama_m", "tiny_sharegpt"): "failed",
                          ("tiny_llama_l", "tiny_sharegpt"): "planned"}}.get(shape)
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
        states_shown = browser.evaluate(s, "[...document.querySelectorAll('#cells tbody tr')].map(r => r.dataset.state)")
        assert sorted(states_shown) == sorted(c["state"] for c in data["cells"])
        click(browser, s, "GPU-h")
        used = [c["gpu_hours"] for c in sorted(data["cells"], key=lambda c: (c["gpu_hours"] is None, c["gpu_hours"] or 0))]
        shown = browser.evaluate(s, "[...document.querySelectorAll('#cells tbody tr')].map(r => r.cells[[...document"
                                    ".querySelectorAll('#cells th')].findIndex(h => h.textContent === 'GPU-h')]"
                                    ".getAttribute('data-v'))")
        assert [float(v) if v else None for v in shown] == pytest.approx(used)
        assert_clean(browser, page)
