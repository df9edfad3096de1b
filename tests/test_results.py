"""`sft-grid results GRID`: one row per cell (swept values, state, steps, final loss, each metric with its
standard error, GPU-hours), the base models' rows, missing and failed scores marked; table, csv, json and markdown;
read from ledgers and score files only. The grid's files are written as its cells leave them (tests/grid_fixture.py)
over cells the real renderer wrote."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sft_grid.analysis.table import final_loss, final_losses, last_share, parse_metrics, read_files, read_table
from sft_grid.core.paths import REPO_ROOT

from . import grid_fixture as gf

MODELS = ("tiny_llama", "tiny_llama_m", "tiny_llama_l")


def results(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sft_grid", "results", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )


@pytest.fixture
def partial_grid(make_cells, tmp_path: Path) -> Path:
    """2 models x 2 learning rates: completed with every score; completed with a failed evaluation and a missing
    score; running; failed. One base model evaluated."""
    cells = make_cells(*[[f"model={m}", f"lr={lr}", "sweep_name=g"] for m in MODELS[:2] for lr in ("1e-5", "2e-5")])
    done, half, running, failed = gf.render_cells(cells)
    losses = gf.curve(20, 1.5)
    gf.run(done, "completed", losses, 20, seconds=360.0)
    gf.score(done, "tiny_mc", {"acc,none": 0.625, "acc_stderr,none": 0.0312})
    gf.score(done, "tiny_gen", {"exact_match": 0.25, "exact_match_stderr": 0.05})
    gf.run(half, "completed", gf.curve(20, 1.4), 20, seconds=720.0)
    gf.score(half, "tiny_mc", {"acc": {"value": 0.5, "stderr": 0.04}})  # the nested form reads the same
    gf.eval_failed(half, "tiny_gen", "tiny_gen: CUDA out of memory")
    gf.run(running, "running", gf.curve(20, 1.6)[:7], 20)
    gf.run(failed, "failed", gf.curve(20, 1.7)[:3], 20, seconds=30.0)
    gf.estimate(done, 2e5, 6000, 20, gpu_hours=0.125)
    gf.base_score(tmp_path / "runs" / "g", "tiny-llama3-0a1b2c3d", "tiny_llama", "", "tiny_mc", {"acc": 0.25})
    return tmp_path / "runs"


def test_the_table_of_a_partial_grid(partial_grid: Path) -> None:
    proc = results("g", "--runs-root", str(partial_grid))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = lines[0].split()
    assert head[:6] == ["cell", "model", "lr", "state", "steps", "final"]
    assert "tiny_gen/exact_match" in head and "tiny_mc/acc" in head and head[-2:] == ["est.", "GPU-h"]
    rows = {line.split()[0]: line for line in lines[2:] if line and not line.startswith(("4 cell", "-"))}
    done, half, running, failed, base = rows.values()
    assert "completed" in done and "20/20" in done and "0.625 ± 0.031" in done and "0.25 ± 0.05" in done
    assert "0.1" in done.split() and "0.125" in done.split()  # 360 s x 1 device; the estimate at launch
    assert "failed" in half.split() and "0.5 ± 0.04" in half and "0.2" in half.split()
    assert "running" in running and "7/20" in running and running.split().count("pending") == 2
    assert failed.split()[3] == "failed" and failed.split().count("missing") == 2  # trained no model: no score
    assert base.split()[:2] == ["tiny-llama3-0a1b2c3d", "tiny_llama"] and "base" in base and "0.25" in base
    assert lines[-1].startswith("4 cell(s): 2 completed, 1 failed, 1 running; 1 base model(s)")
    assert "1 score(s) failed; 2 score(s) missing" in lines[-1]


def test_csv_json_and_markdown_carry_the_same_cells(partial_grid: Path) -> None:
    table = read_table(partial_grid / "g")
    out = results("g", "--runs-root", str(partial_grid), "--format", "csv").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["cell"] for r in rows] == [r.name for r in table.rows] + [b.name for b in table.bases]
    first = rows[0]
    assert float(first["tiny_mc/acc"]) == 0.625 and float(first["tiny_mc/acc_stderr"]) == 0.0312
    assert float(first["final_loss"]) == pytest.approx(table.rows[0].final_loss)
    assert rows[1]["tiny_gen/exact_match"] == "failed" and rows[1]["tiny_gen/exact_match_stderr"] == ""
    data = json.loads(results("g", "--runs-root", str(partial_grid), "--format", "json").stdout)
    assert data["axes"] == ["model", "lr"] and data["columns"] == ["tiny_gen/exact_match", "tiny_mc/acc"]
    gen = data["cells"][1]["scores"]["tiny_gen/exact_match"]
    assert gen == {"value": None, "stderr": None, "status": "failed", "reason": "tiny_gen: CUDA out of memory"}
    assert data["cells"][0]["gpu_hours"] == pytest.approx(0.1) and data["base_models"][0]["base"] is True
    md = results("g", "--runs-root", str(partial_grid), "--format", "markdown").stdout.splitlines()
    assert md[0].startswith("| cell | model | lr | state |") and md[1].startswith("|---|")
    assert len(md) == 2 + 4 + 1


def test_final_loss_is_the_mean_over_the_last_tenth_of_the_steps(partial_grid: Path, tmp_path: Path) -> None:
    losses = [(s, float(s)) for s in range(1, 41)]
    assert final_loss(last_share(losses)) == pytest.approx((37 + 38 + 39 + 40) / 4)
    assert final_loss(last_share([(1, 2.5)])) == 2.5 and final_loss([]) is None
    row = read_table(partial_grid / "g").rows[0]
    assert row.final_loss == pytest.approx(sum(v for _, v in gf.curve(20, 1.5)[-2:]) / 2)
    # a long log is read from its tail only, as far back as the last 10% of the steps: the same answer
    cell = tmp_path / "long"
    cell.mkdir()
    gf.run(cell, "completed", [(s, 1.0 + ((s * 7919) % 1000) / 1000) for s in range(1, 5001)], 5000)
    full = last_share([(s, 1.0 + ((s * 7919) % 1000) / 1000) for s in range(1, 5001)])
    assert len(full) == 500 and final_losses(cell / "output") == full
    (cell / "output" / "trainer_log.jsonl").unlink()  # without the trainer's log: trainer_state.json
    assert final_losses(cell / "output") == full


def test_it_reads_files_only_and_answers_fast(partial_grid: Path) -> None:
    code = (
        "import sys; from sft_grid.analysis.table import read_table; from pathlib import Path;"
        f" t = read_table(Path({str(partial_grid / 'g')!r}));"
        " print(len(t.rows), sorted(m for m in ('numpy', 'scipy', 'torch', 'lm_eval', 'transformers')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.split() == ["4", "[]"]


def test_score_files_in_each_form_and_the_latest_per_task(tmp_path: Path) -> None:
    assert parse_metrics({"acc,none": 0.5, "acc_stderr,none": 0.1, "alias": "x"}) == parse_metrics(
        {"acc": 0.5, "acc_stderr": 0.1}
    )
    assert parse_metrics({"em": {"value": 0.2, "stderr": None}})["em"].value == 0.2
    assert parse_metrics({"acc": "N/A"})["acc"].value is None
    cell = tmp_path / "c"
    gf.score(cell, "mc", {"acc": 0.1}, score_id="old", when="2026-12-01T00:00:00")
    gf.score(cell, "mc", {"acc": 0.3}, score_id="new", when="2026-12-02T00:00:00")
    (cell / "eval" / "torn.json").write_text('{"task": "mc", "metr')  # a file being written is not a score
    (only,) = read_files(cell / "eval")
    assert only.metrics["acc"].value == 0.3


def test_a_grid_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    proc = results("nope", "--runs-root", str(tmp_path))
    assert proc.returncode == 1 and f"no cells under {tmp_path / 'nope'}" in proc.stderr
    assert results("g", "--format", "xml").returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_the_cells_config_is_read_as_yaml_reads_it(make_cells: Any, tmp_path: Path) -> None:
    """cell.yaml is read by a YAML loader: what the table takes from it (model, size, GPUs, cluster) is what
    yaml.safe_load says, whatever style the file is written in (block as grid/render.py writes it, or flow)."""
    import yaml

    cells = make_cells(
        [
            "model=qwen3_8b",
            "dataset=[tiny_messages,tiny_sharegpt]",
            "mix.strategy=interleave_under",
            "mix.probs=[0.9,0.1]",
            "packing=true",
            "sweep_name=y",
        ],
        ["model=tiny_delphi", "nodes=2", "sweep_name=y"],
    )
    dirs = gf.render_cells(cells)
    # the second cell's file rewritten in flow style, its header (the rerun command) kept: the same config
    header = [line for line in (dirs[1] / "cell.yaml").read_text().splitlines() if line.startswith("#")]
    config = yaml.safe_load((dirs[1] / "cell.yaml").read_text())
    (dirs[1] / "cell.yaml").write_text(
        "\n".join(header) + "\n" + yaml.safe_dump(config, default_flow_style=True, width=10_000)
    )
    assert "\nmodel:" not in (dirs[1] / "cell.yaml").read_text()  # one line: nothing to read line by line
    table = read_table(tmp_path / "runs" / "y")
    for row, d in zip(table.rows, dirs, strict=True):
        full = yaml.safe_load((d / "cell.yaml").read_text())
        model, cluster = full["model"], full["cluster"]
        exact = model.get("params") or model["params_b"] * 1e9  # the exact count where the model states one
        assert row.model == model["name"] and row.params == pytest.approx(exact)
        assert row.gpus == full["nodes"] * max(1, cluster["gpus_per_node"] or 0) and row.cluster == cluster["name"]
        assert row.model_source == (model.get("path") or model.get("hub_id") or "")
    assert table.rows[1].model != table.rows[0].model and table.rows[1].gpus == 2 * table.rows[0].gpus


def test_the_scaling_axes_read_the_exact_parameter_count_and_the_stated_budget(make_cells, tmp_path):
    """A model that states its exact size (the Delphi table: 447,244,032, not 0.447e9) and its pretraining compute
    (the "2e19" bucket is 1.8e19 FLOPs) is placed on the fit's axes by those, not by its rounded size or its name."""
    cells = make_cells(
        [
            "model=delphi",
            "model.name=delphi-2e19-base",
            "model.params=837007744",
            "model.params_b=0.837",
            "model.compute_budget=1.8e19",
            "sweep_name=z",
        ],
        ["model=delphi", "model.name=delphi-3e18-base", "sweep_name=z"],
        ["model=tiny_llama", "sweep_name=z"],
    )
    gf.render_cells(cells)
    rows = {r.model: r for r in read_table(tmp_path / "runs" / "z").rows}
    assert rows["delphi-2e19-base"].params == 837_007_744 and rows["delphi-2e19-base"].compute_budget == 1.8e19
    assert rows["delphi-3e18-base"].params == 447_244_032 and rows["delphi-3e18-base"].compute_budget == 3e18
    # a model without an exact count: its size in billions; no stated budget and none in its name: none
    assert rows["tiny_llama"].params == pytest.approx(cells[2].spec.model.params_b * 1e9)
    assert rows["tiny_llama"].compute_budget is None
