"""The report of a grid really trained here: three sizes of tiny Llama-3-style model (built by project code) x two
recipes, LLaMA-Factory on the CPU through `python -m sft_grid -m ...` and submitit's local executor. The recipes
are trained one after the other, so that the second recipe's cells are estimated, when they are queued, from a
calibration of the first recipe's (CPU-hours stand in for GPU-hours); the partial grid's report and the whole
grid's are opened in headless Chromium."""

from __future__ import annotations

import json
import struct
from math import prod
from pathlib import Path
from statistics import median

import pytest

from sft_grid.analysis.page import write
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.planning.costs import measured
from sft_grid.planning.estimate import Throughput
from tests.report_cdp import click, errors, names, opened, plot_pixels, requests

from .conftest import run_sft

pytestmark = pytest.mark.backend

MODELS = {
    "tiny_llama": "models/tiny-llama3",
    "tiny_llama_m": "sizes/tiny-llama3-m",
    "tiny_llama_l": "sizes/tiny-llama3-l",
}
COMMON = ["epochs=2", "global_batch_size=4", "micro_batch_size=2", "sweep_name=tiny_scaling"]


def parameters(model_dir: Path) -> int:
    """Parameters of a safetensors checkpoint, from its header alone."""
    with (model_dir / "model.safetensors").open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return sum(prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def check_page(page: Path, profile: Path, data: dict, plots: int) -> None:
    with opened(page, profile) as (browser, s):
        pixels = plot_pixels(browser, s)
        assert len(pixels) == plots and min(pixels.values()) >= 60, pixels
        shown = names(browser, s)
        assert sorted(shown) == sorted(c["name"] for c in data["cells"])
        click(browser, s, "final loss")
        losses = {c["name"]: c["final_loss"] for c in data["cells"]}
        done = sorted((n for n in shown if losses[n] is not None), key=lambda n: losses[n])
        assert names(browser, s)[: len(done)] == done
        assert not errors(browser), errors(browser)
        assert all(u == page.as_uri() or u.startswith("data:") for u in requests(browser)), requests(browser)


def test_report_of_a_tiny_grid_trained_here(tmp_path: Path, tiny_assets: Path) -> None:
    import yaml

    from sft_grid.core.paths import PACKAGE_CONF

    for name, rel in MODELS.items():  # the sizes the estimates and the scaling plot use are the models' own
        stated = yaml.safe_load((PACKAGE_CONF / "model" / f"{name}.yaml").read_text())["params_b"] * 1e9
        assert stated == pytest.approx(parameters(tiny_assets / rel), rel=0.02)
    root = tmp_path / "runs"
    grid = ["-m", f"model={','.join(MODELS)}", *COMMON, f"runs_root={root}"]
    dry = run_sft(*grid, "dataset=tiny_messages,tiny_sharegpt", "dry_run=true", check=True)
    assert "total of the grid, 6 of 6 cell(s) estimated" in dry.stdout
    run_sft(*grid, "dataset=tiny_messages", check=True, timeout=1800)

    # the partial grid: the first recipe trained, the second planned
    sweep = root / "tiny_scaling"
    page, data_file = write(sweep, resamples=100)
    data = json.loads(data_file.read_text())
    assert data["grid"]["counts"] == {"completed": 3, "planned": 3} and data["axes"] == ["model", "dataset"]
    check_page(page, tmp_path / "p1", data, plots=2 + 1)  # the trained recipe's curves; final loss vs parameters

    run_sft(*grid, "dataset=tiny_sharegpt", check=True, timeout=1800)
    page, data_file = write(sweep, resamples=100)
    data = json.loads(data_file.read_text())
    assert data["grid"]["counts"] == {"completed": 6}
    fits = {f["recipe"]: f for f in data["fits"] if f["metric"] == "final_loss"}
    assert set(fits) == {"tiny_messages", "tiny_sharegpt"} and all(f["ok"] for f in fits.values())
    assert all(len(f["keys"]) == 3 and f["band"] for f in fits.values())
    check_page(page, tmp_path / "p2", data, plots=2 * 2 + 1)

    # the second recipe's estimates, made when it was queued from the first recipe's calibration, against what
    # its cells took: their run's CPU time (start-up included; CPU-hours stand in for GPU-hours on this machine,
    # whose wall clock the other tenants' load stretches), recorded by the job with the outcome. What cannot flake:
    # the calibration moves the estimates toward what was measured (their median error below that of the default
    # throughput, which the first recipe's cells were estimated with, on the same cells: one default estimate may
    # be close by chance, measured: -22% and +4% for the smallest model, +155% to +1022% for the others), and each
    # within a factor of 3 of it. How close they come is a figure of the benchmark (benchmarks/bench_estimates.py
    # --accuracy; measured here: +19%, +19%, +30% busy, +37%, +18%, +31% less so), not a test.
    lines, cells = [], list(iter_cell_dirs(sweep))
    misses: dict[str, list[float]] = {"calibrated": [], "default": []}  # |error| of the second recipe's cells
    estimates = {cell: json.loads((cell / "estimate.json").read_text()) for cell in cells}
    default = next(e["throughput"] for e in estimates.values() if e["throughput"]["source"] == "default")
    for cell in cells:
        est = estimates[cell]
        m = measured(cell)
        assert m is not None and m.train_seconds
        ratio = est["wall_seconds"] / m.seconds
        lines.append(
            f"{cell.name}: {est['throughput']['source']} estimate {est['wall_seconds']:.1f} s, took"
            f" {m.seconds:.1f} s of CPU (training loop {m.train_seconds:.1f} s wall): {ratio - 1:+.0%}"
        )
        if "tiny_sharegpt" in cell.name:
            assert est["throughput"]["source"] == "calibration"
            assert "CPU time of 3 completed cell(s) of 3 size(s) on local" in est["throughput"]["detail"]
            uncalibrated = Throughput(**default).seconds(est["tokens"], est["flops"], est["gpus"])
            misses["calibrated"].append(abs(ratio - 1))
            misses["default"].append(abs(uncalibrated / m.seconds - 1))
            assert 1 / 3 <= ratio <= 3, "\n".join(lines)
        else:
            assert est["throughput"]["source"] == "default"
    print("\n".join(lines))
    assert len(misses["calibrated"]) == 3 and median(misses["calibrated"]) < median(misses["default"]), misses
    summary = data["estimates"]["summary"]
    print(
        f"median |error|: at launch {summary['median_abs_error_at_launch']:.1%},"
        f" leave-one-out now {summary['median_abs_error_now']:.1%}"
    )
