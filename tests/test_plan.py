"""Cell identity, names and derived values."""

from __future__ import annotations

import pytest

from sft_grid.core.layout import CELL_FILE
from sft_grid.planning.cells import PART_LEN, SLUG_LEN, dirs_of, identity_key, slugify


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


def test_a_long_fixed_value_leaves_room_for_the_swept_one(make_cells, tmp_path):
    """A long value first (a local checkpoint's path) used to fill the name, so every cell of an lr sweep read the
    same but for its key; now the long part is cut, head and tail, and each lr stays in its cell's name. A cell
    rendered under the old name is still found by its identity key: renaming never runs a finished cell again."""
    ckpt = tmp_path / "checkpoints" / ("a_very_long_run_name_from_another_team_" * 2) / "final_export"
    ckpt.mkdir(parents=True)
    cells = make_cells(*([f"model.path={ckpt}", f"lr={lr}", "seed=3"] for lr in ("1e-5", "2e-5")))
    for cell, lr in zip(cells, ("1e-5", "2e-5"), strict=True):
        assert len(cell.slug) <= SLUG_LEN
        assert cell.slug.endswith(f"_lr{lr}_seed3"), cell.slug
        head, _, _ = cell.slug.partition(f"_lr{lr}")
        assert len(head) <= PART_LEN and head.startswith("path-tmp") and head.endswith("_-final_export"), head
    old = cells[0].sweep_dir / f"{slugify(f'path{ckpt}_lr1e-5_seed3')}-{cells[0].key}"
    old.mkdir(parents=True)
    (old / CELL_FILE).write_text("{}")  # what makes a directory a rendered cell's
    assert old.name != cells[0].name
    assert dirs_of(cells) == [old, cells[1].sweep_dir / cells[1].name]


def test_a_name_over_its_length_drops_a_part_whole_never_cuts_a_value_at_its_end(make_cells):
    """`examples200` at the end of a name one character too long was cut to `examples20`: another value of the
    axis, read as such in every table. A part that does not fit is left out whole (the key tells the cells apart)."""
    extra = ["backend=replay", "max_steps=20", "+extra.replay={dataset: flan}", "+extra.replay.model=t5-small"]
    cells = make_cells(*([*extra, f"+extra.replay.examples={n}"] for n in (200, 800)))
    for cell in cells:
        assert len(cell.slug) <= SLUG_LEN and cell.slug.endswith("_modelt5-small"), cell.slug
    assert cells[0].key != cells[1].key


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
