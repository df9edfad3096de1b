"""A grid's estimates before launch (planning/costs.py): from each source's token sample and row count, the mix, the
model and the cluster; calibrated from completed cells; a cell that cannot finish in its wall time x requeues is a
problem before anything is queued; the dry run prints it all (marked backend: it runs the loss-mask probe)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from sft_grid.cli.present import cost_lines
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.planning import costs as estimates
from sft_grid.planning.costs import calibrations, measured

from . import grid_fixture as gf
from .conftest import run_sft

LENGTHS = (40, 60, 80, 100, 120, 140, 160, 2000)  # the probe's 8 rows; the last one longer than the cutoff


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": str(i)}]}) + "\n" for i in range(300)))
    return path


def test_tokens_come_from_the_sample_scaled_to_the_rows_and_the_mix(
    make_cells, data_file: Path, tmp_path: Path
) -> None:
    plain, mixed = make_cells(
        ["model=tiny_llama", f"dataset.tiny_messages.source={data_file}", "cutoff_len=1024", "epochs=2"],
        [
            "model=tiny_llama",
            "dataset=[tiny_messages,tiny_sharegpt]",
            f"dataset.tiny_messages.source={data_file}",
            f"dataset.tiny_sharegpt.source={data_file}",
            "mix.strategy=interleave_under",
            "mix.probs=[0.9,0.1]",
            "cutoff_len=1024",
        ],
    )
    lengths = {
        plain.name: {"tiny_messages": LENGTHS},
        mixed.name: {"tiny_messages": LENGTHS, "tiny_sharegpt": (10,) * 8},
    }
    costs = estimates.estimate([plain, mixed], lengths)
    mean = statistics.fmean(min(n, 1024) for n in LENGTHS)
    e = costs.estimates[plain.name]
    assert e.tokens.tokens == pytest.approx(2 * 300 * mean) and e.tokens.steps == 2 * 19  # ceil(300 / 16)
    assert e.flops_dense == pytest.approx(6 * 0.0002e9 * e.tokens.tokens)
    assert e.throughput is not None and e.throughput.source == "default" and "CPU" in e.throughput.detail
    # 90/10 stopping at the first exhausted source: 300 rows of the first, 300 / 0.9 x 0.1 of the second
    m = costs.estimates[mixed.name]
    assert m.tokens.tokens == pytest.approx(300 * mean + 300 / 0.9 * 0.1 * 10)
    written = json.loads(costs.file_text(plain.name) or "")
    assert written["tokens"] == e.tokens.tokens and written["gpus"] == 1 and written["cluster"] == "local"
    assert written["rows"] == {"tiny_messages": 300} and written["sampled_rows"] == {"tiny_messages": 8}
    text = "\n".join(cost_lines([plain.name, mixed.name], [plain.name], costs))
    assert plain.name in text and "throughput (default): MFU 0.005 (the default) x CPU" in text
    assert "to run now, 1 of 1 cell(s) estimated" in text and "disk: the cells to run keep" in text


def test_a_cell_without_a_token_sample_has_no_estimate_but_a_disk_bound(make_cells) -> None:
    (cell,) = make_cells(["model=tiny_llama", "dataset=wildchat_386k", "save_total_limit=2"])
    costs = estimates.estimate([cell], {})
    assert cell.name not in costs.estimates and "no token sample of dataset wildchat_386k" in costs.unknown[cell.name]
    # fp32 here: 4 bytes of weights + 8 of Adam per parameter, 2 checkpoints and the final weights
    assert costs.disk_bounds[cell.name] == pytest.approx(0.0002e9 * (2 * 12 + 4))
    assert "no estimate for 1 cell(s): no token sample" in "\n".join(cost_lines([cell.name], [cell.name], costs))


def test_a_dataset_that_states_its_count_is_estimated_where_it_cannot_be_read(make_cells) -> None:
    """magpie states marin's count of its tokens under the Delphi template (conf/dataset/magpie.yaml): a Delphi cell
    on Leonardo gets an estimate though nothing is staged here, packed into 4096-token sequences of 16 a step."""
    (cell,) = make_cells(
        [
            *("model=delphi", "dataset=magpie", "cutoff_len=4096", "cluster=slurm_local", "cluster.gpus_per_node=4"),
            *("cluster.gpu_type=A100-64GB", "cluster.gpu_mem_gb=64", "cluster.precision=bf16"),
        ]
    )
    costs = estimates.estimate([cell], {})
    e = costs.estimates[cell.name]
    blocks = -(-313007558 // 4096)  # 76,419 sequences of 4096 tokens
    assert e.tokens.tokens == pytest.approx(313007558) and e.tokens.sequences == blocks
    assert e.tokens.steps == -(-blocks // 16)  # packed: 16 sequences of 4096 tokens a step
    assert e.gpu_hours is not None and e.mfu is not None and 0.1 < e.mfu < 0.45


def test_completed_cells_calibrate_the_next_estimates(make_cells, data_file: Path, tmp_path: Path) -> None:
    done_cells = make_cells(
        *[
            [f"model={m}", f"dataset.tiny_messages.source={data_file}", "sweep_name=first", f"epochs={ep}"]
            for m, ep in (("tiny_llama", 1), ("tiny_llama_m", 2), ("tiny_llama_l", 1), ("tiny_llama_l", 3))
        ]
    )
    costs = estimates.estimate(done_cells, {c.name: {"tiny_messages": LENGTHS} for c in done_cells})
    for cell, d in zip(done_cells, gf.render_cells(done_cells), strict=True):
        (d / "estimate.json").write_text(costs.file_text(cell.name) or "")
        e = costs.estimates[cell.name]
        train = 1e-3 * e.tokens.tokens + 1e-9 * e.flops  # this "machine": 15 s to start, 1 ms a token, 1 GFLOP/s
        gf.run(
            d,
            "completed",
            gf.curve(19, 2.0),
            19,
            seconds=round(train) + 15,
            train_runtime=train,
            cpu_seconds=train + 15,
        )
        assert measured(d) is not None
    cal = calibrations([tmp_path / "runs"])["local"]
    assert cal.sizes == 3 and len(cal.cells) == 4
    assert (cal.startup_s, cal.per_token_s, cal.per_flop_s) == pytest.approx((15, 1e-3, 1e-9), rel=1e-6)
    (new,) = make_cells(
        ["model=tiny_llama_m", f"dataset.tiny_messages.source={data_file}", "epochs=3", "sweep_name=second"]
    )
    e = estimates.estimate([new], {new.name: {"tiny_messages": LENGTHS}}).estimates[new.name]
    assert e.throughput is not None and e.throughput.source == "calibration"
    assert "fitted to the CPU time of 4 completed cell(s) of 3 size(s) on local" in e.throughput.detail
    assert e.wall_seconds == pytest.approx(15 + 1e-3 * e.tokens.tokens + 1e-9 * e.flops, rel=1e-6)


def test_a_cell_that_cannot_finish_in_its_wall_time_is_a_problem(make_cells, data_file: Path) -> None:
    short, fine = make_cells(
        [
            "model=tiny_llama",
            "cluster=slurm_local",
            f"dataset.tiny_messages.source={data_file}",
            "epochs=1000",
            "time=00:01:00",
            "cluster.max_requeues=1",
        ],
        ["model=tiny_llama", "cluster=slurm_local", f"dataset.tiny_messages.source={data_file}"],
    )
    costs = estimates.estimate([short, fine], {c.name: {"tiny_messages": LENGTHS} for c in (short, fine)})
    (problem,) = estimates.problems(costs, [short, fine])
    assert problem.cell == short.name and problem.rule == "estimate-wall-time" and problem.key == "time"
    assert "x (1 + 1 requeue(s)) = 0.0 h" in problem.message and "default" in problem.message
    assert "cluster.max_requeues" in problem.fix
    assert estimates.problems(costs, [fine]) == []  # only the cells to run count


@pytest.mark.backend
def test_the_dry_run_prints_the_estimates_and_checks_the_wall_time(tmp_path: Path, tiny_assets: Path) -> None:
    proc = run_sft(
        "-m",
        "model=tiny_llama,tiny_llama_l",
        "dataset=tiny_messages",
        "dry_run=true",
        f"runs_root={tmp_path}",
        check=True,
    )
    out = proc.stdout
    assert "estimates (tokens: the backend's own tokenisation" in out and "total of the grid, 2 of 2 cell(s)" in out
    assert "throughput (default): MFU 0.005 (the default) x CPU" in out
    cells = list(iter_cell_dirs(tmp_path / "default"))
    assert len(cells) == 2
    for cell in cells:
        est = json.loads((cell / "estimate.json").read_text())
        assert est["sampled_rows"] == {"tiny_messages": 8} and est["rows"] == {"tiny_messages": 60}
        assert est["tokens"] > 60 * 10 and est["steps"] == 4 and est["shape_from"] == "config.json"
        assert f"{cell.name}  " in out
    # on Slurm with a wall time it can never meet: refused before anything is written or queued
    bad = run_sft(
        "-m",
        "model=tiny_llama",
        "cluster=slurm_local",
        "epochs=100000",
        "time=00:01:00",
        f"runs_root={tmp_path / 'slurm'}",
    )
    assert bad.returncode == 1 and "[estimate-wall-time]" in bad.stderr and "raise `time`" in bad.stderr
    assert not (tmp_path / "slurm").exists()
