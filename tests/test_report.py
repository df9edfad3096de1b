"""`sft-grid report GRID`: report.json (every number shown) and a self-contained report.html, from a grid's
files (tests/grid_fixture.py over cells the real renderer wrote): the fits per recipe with the cells they used,
each completed cell's estimate beside what it took, a partial grid, grids with one axis, and bad input.
The page as a browser draws it is tested in tests/test_report_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sft_grid.analysis.page import render
from sft_grid.analysis.report_data import build
from sft_grid.core.paths import REPO_ROOT

from . import grid_fixture as gf
from .test_report_html import body_rows, own, parse, titled, traces

SIZES = {"tiny_llama": 2.02e5, "tiny_llama_m": 8.47e5, "tiny_llama_l": 2.874e6}
RECIPES = {"tiny_messages": (1.0, 6000.0), "tiny_sharegpt": (1.3, 3600.0)}  # dataset -> (E, tokens)
A, ALPHA = 30.0, 0.3
PER_TOKEN, PER_FLOP, STARTUP = 2e-3, 2e-9, 20  # the "machine" the fixture's cells ran on


def law(params: float, e: float) -> float:
    return e + A * params**-ALPHA


def make_grid(
    make_cells: Any,
    sweep: str,
    states: dict[tuple[str, str], str] | None = None,
    models: tuple[str, ...] = tuple(SIZES),
    datasets: tuple[str, ...] = tuple(RECIPES),
) -> list[Path]:
    """Cells of model x dataset whose final losses follow the law, whose times follow the machine, with an
    accuracy that rises with size; `states` makes some of them running, failed or planned (never run)."""
    cells = make_cells(*[[f"model={m}", f"dataset={d}", f"sweep_name={sweep}"] for m in models for d in datasets])
    dirs = gf.render_cells(cells)
    for i, (cell, d) in enumerate(zip(cells, dirs, strict=True)):
        model, data = cell.spec.model.name, next(iter(cell.spec.dataset))
        state = (states or {}).get((model, data), "completed")
        if state == "planned":
            continue
        params, (e, tokens) = SIZES[model], RECIPES[data]
        est = gf.estimate(d, params, tokens, 20)
        train = round(PER_TOKEN * tokens + PER_FLOP * est["flops"])  # whole seconds, as the ledger has them
        losses = gf.curve(20, law(params, e))
        steps = {"completed": 20, "running": 12, "failed": 5}[state]
        gf.run(
            d,
            state,
            losses[:steps],
            20,
            start=gf.T0 + 1000 * i,
            seconds=train + STARTUP,
            train_runtime=train,
            cpu_seconds=train + STARTUP,
        )
        if state == "completed":
            gf.score(d, "tiny_mc", {"acc": 0.95 - law(params, e - 0.9) / 4, "acc_stderr": 0.01})  # rises with size
    return dirs


def report(runs_root: Path, sweep: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sft_grid", "report", sweep, "--runs-root", str(runs_root), "--resamples", "60"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_report_of_a_grid_over_size_and_data(make_cells, tmp_path: Path) -> None:
    dirs = make_grid(make_cells, "scale")
    proc = report(tmp_path / "runs", "scale")
    assert proc.returncode == 0, proc.stderr
    html, data_file = (tmp_path / "runs" / "scale" / n for n in ("report.html", "report.json"))
    assert proc.stdout.split() == [str(html), str(data_file)]
    data = json.loads(data_file.read_text())
    assert data["axes"] == ["model", "dataset"] and len(data["cells"]) == 6
    assert data["grid"]["counts"] == {"completed": 6} and data["grid"]["device"].startswith("CPU")
    # one fit per recipe and metric, from the cells it names; the loss law comes back
    fits = {(f["metric"], f["recipe"]): f for f in data["fits"]}
    assert set(fits) == {(m, r) for m in ("final_loss", "tiny_mc/acc") for r in RECIPES}
    for recipe, (e, _) in RECIPES.items():
        f = fits[("final_loss", recipe)]
        assert f["ok"] and f["x"] == "params" and len(f["band"]["n"]) == 64
        assert sorted(f["keys"]) == sorted(c["key"] for c in data["cells"] if c["recipe"] == recipe)
        for n in SIZES.values():
            assert f["E"] + f["A"] * n ** -f["alpha"] == pytest.approx(law(n, e), rel=0.02)
    assert fits[("tiny_mc/acc", "tiny_messages")]["flip"] is True
    # each cell's curve (step, tokens seen, loss) and what it took against its estimates
    cell = data["cells"][0]
    assert len(cell["curve"]) == 20 and cell["curve"][-1][1] == pytest.approx(20 * 6000 / 20)
    est = data["estimates"]
    assert est["summary"]["cells"] == 6 and est["summary"]["median_abs_error_now"] < 0.05
    assert est["summary"]["median_abs_error_at_launch"] > 0.5  # the launch-time default knew nothing yet
    assert "fitted to the CPU time of 6 completed cell(s) of 3 size(s) on local" in est["calibration"]["local"]
    # the page: every cell in the table, loss curves per recipe and scaling plots, the estimates said
    page = html.read_text()
    rows = body_rows(parse(own(page)))
    assert [r[0] for r in rows] == sorted(d.name for d in dirs)
    assert page.count('class="panel"') == 2
    # the tiny models' names carry no pretraining budget: no compute-budget plot
    assert list(titled(page))[4:] == ["final loss vs parameters", "tiny_mc/acc vs parameters"]
    assert 'id="estimates"' in page and "est. now" in page


def test_a_partial_grid_shows_each_cell_as_it_is(make_cells, tmp_path: Path) -> None:
    states = {
        ("tiny_llama_l", "tiny_messages"): "running",
        ("tiny_llama_m", "tiny_sharegpt"): "failed",
        ("tiny_llama_l", "tiny_sharegpt"): "planned",
    }
    make_grid(make_cells, "part", states)
    data = build(tmp_path / "runs" / "part", resamples=20)
    assert data["grid"]["counts"] == {"completed": 3, "running": 1, "failed": 1, "planned": 1}
    by = {(c["values"]["model"], c["values"]["dataset"]): c for c in data["cells"]}
    running = by[("tiny_llama_l", "tiny_messages")]
    assert running["step"] == 12 and len(running["curve"]) == 12 and running["final_loss"] is None
    assert by[("tiny_llama_m", "tiny_sharegpt")]["reason"].startswith("backend exited with 1")
    planned = by[("tiny_llama_l", "tiny_sharegpt")]
    assert planned["curve"] == [] and planned["gpu_hours"] is None
    fits = {(f["metric"], f["recipe"]): f for f in data["fits"]}
    assert fits[("final_loss", "tiny_messages")]["ok"] is False  # 2 completed sizes: no fit, and why
    assert "2 distinct N" in fits[("final_loss", "tiny_messages")]["reason"]
    page = render(data)
    (ring,) = traces(titled(page)["final loss vs parameters"], "tiny_messages: running")
    assert ring["customdata"] == [running["name"]] and ring["y"] == [running["curve"][-1][2]]
    assert "no logged steps: 1 planned" in page


def test_a_grid_over_one_axis_gets_the_plots_that_make_sense(make_cells, tmp_path: Path) -> None:
    make_grid(make_cells, "sizes", datasets=("tiny_messages",))
    data = build(tmp_path / "runs" / "sizes", resamples=20)
    assert data["axes"] == ["model"] and {c["recipe"] for c in data["cells"]} == {None}
    page = render(data)
    assert page.count('class="panel"') == 1 and "final loss vs parameters" in titled(page)
    # one size, learning rates swept: curves coloured by lr, and no scaling plot at all
    cells = make_cells(*[["model=tiny_llama", f"lr={lr}", "sweep_name=lrs"] for lr in ("1e-5", "2e-5", "5e-5")])
    for i, d in enumerate(gf.render_cells(cells)):
        gf.run(d, "completed", gf.curve(20, 1.0 + 0.1 * i), 20)
    one = build(tmp_path / "runs" / "lrs", resamples=20)
    page = render(one)
    assert one["axes"] == ["lr"] and 'id="scaling"' not in page and "vs parameters" not in page
    assert own(page).count("<figure") == 1
    assert [t["name"] for t in titled(page)["loss vs step"]["data"] if t["x"] == [None]] == [
        "lr=1e-5",
        "lr=2e-5",
        "lr=5e-5",
    ]
    assert all(not f["ok"] for f in one["fits"])


def test_bad_input_writes_nothing(tmp_path: Path) -> None:
    proc = report(tmp_path, "nope")
    assert proc.returncode == 1 and "no cells under" in proc.stderr and "Nothing was written" in proc.stderr
    assert not (tmp_path / "nope").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "report", "x", "--resamples", "-1"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 2 and "--resamples" in proc.stderr and "a whole number from 0 up" in proc.stderr


def test_the_grids_revision_is_what_its_cells_ledgers_recorded(make_cells, tmp_path: Path) -> None:
    """A grid launched from the command line names no sweep file; its cells' submissions recorded the checkout
    they were launched from, and the report says that revision (each, when cells were launched from several)."""
    from sft_grid.analysis.report_data import grid_facts
    from sft_grid.analysis.table import read_table
    from sft_grid.core import events
    from sft_grid.core.events import Event, Kind

    dirs = gf.render_cells(make_cells(*[[f"model={m}", "sweep_name=cli"] for m in ("tiny_llama", "tiny_qwen3")]))
    assert grid_facts(read_table(tmp_path / "runs" / "cli"))["git_revision"] is None  # nothing recorded yet
    first, second = "1a2b3c4d5e6f" + "0" * 28, "99887766554433221100" * 2
    for d, rev in zip(dirs, (first, first), strict=True):
        events.append(d, Event(Kind.SUBMITTED, executor="local", details={"git": {"revision": rev, "dirty": False}}))
    facts = grid_facts(read_table(tmp_path / "runs" / "cli"))
    assert facts["git_revision"] == first[:12] and facts["git_dirty"] is False
    # the second cell launched again from another, dirty checkout: both revisions, and dirty
    events.append(
        dirs[1], Event(Kind.SUBMITTED, executor="local", details={"git": {"revision": second, "dirty": True}})
    )
    facts = grid_facts(read_table(tmp_path / "runs" / "cli"))
    assert facts["git_revision"] == f"{first[:12]}, {second[:12]}" and facts["git_dirty"] is True
