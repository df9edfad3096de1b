"""Cell identity, names and derived values."""

from __future__ import annotations

import pytest

from sft_grid.planning.cells import identity_key, slugify


def test_identity_ignores_where_and_how_a_cell_runs(make_cells, tmp_path):
    base, *same = make_cells(
        ["model=qwen3_8b", "lr=2e-5"],
        ["model=qwen3_8b", "lr=2e-5", "time=01:00:00", "micro_batch_size=2", "nodes=2"],
        ["model=qwen3_8b", "lr=2e-5", "save_steps=7", "logging_steps=3", "sweep_name=other", "dry_run=true"],
        ["model=qwen3_8b", "lr=2e-5", "cluster.partition=gpu", "cluster.setup=[module load cuda]", "force=true"],
    )
    assert all(c.key == base.key for c in same)


@pytest.mark.parametrize(
    "change",
    [
        "lr=3e-5",
        "seed=1",
        "global_batch_size=32",
        "epochs=2",
        "cutoff_len=2048",
        "model=qwen3_32b",
        "model.template=qwen3_nothink",
        "dataset=magpie",
        "dataset=[tiny_messages,magpie]",
        "+extra.packing=true",
        "scheduler=linear",
        "warmup_ratio=0.1",
        "max_steps=10",
    ],
)
def test_identity_changes_with_what_determines_the_model(make_cells, change):
    base, changed = make_cells(["model=qwen3_8b", "lr=2e-5"], ["model=qwen3_8b", "lr=2e-5", change])
    assert base.key != changed.key


def test_identity_of_a_local_model_does_not_depend_on_the_machine_path(make_cells):
    (cell,) = make_cells(["model=tiny_llama"])
    moved = {**cell.config, "model": {**cell.config["model"], "path": "/elsewhere/assets/models/tiny-llama3"}}
    assert identity_key(moved) == cell.key
    renamed = {**cell.config, "model": {**cell.config["model"], "path": "/elsewhere/models/other"}}
    assert identity_key(renamed) != cell.key


def test_name_is_a_readable_slug_plus_the_identity(make_cells):
    (cell,) = make_cells(["model=qwen3_8b", "dataset=[magpie,delphi_warmup]", "lr=2e-5", "nodes=2"])
    assert cell.name == f"qwen3_8b_magpie+delphi_warmup_lr2e-5-{cell.key}"
    assert len(cell.key) == 8


def test_derived_gradient_accumulation(make_cells):
    (local,) = make_cells(["global_batch_size=16", "micro_batch_size=2"])
    assert (local.world_size, local.grad_accum) == (1, 8)
    (gpu,) = make_cells(["global_batch_size=96", "micro_batch_size=1", "cluster.gpus_per_node=4", "nodes=4"])
    assert (gpu.world_size, gpu.grad_accum) == (16, 6)


def test_cells_land_under_runs_root_and_sweep(make_cells, tmp_path):
    (cell,) = make_cells(["sweep_name=delphi"])
    assert cell.sweep_dir == tmp_path / "runs" / "delphi"


@pytest.mark.parametrize("text, slug", [("a b;c", "a-b-c"), ("../x", "x"), ("", "cell"), ("q" * 80, "q" * 64)])
def test_slugify(text, slug):
    assert slugify(text) == slug
