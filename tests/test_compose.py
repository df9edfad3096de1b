"""The fast grid composer gives exactly what hydra.compose gives, for sampled cells of varied grids."""

from __future__ import annotations

import random

import pytest

from sft_grid.compose import GridComposer

from .conftest import hydra_plain

MODELS = ["tiny_llama", "tiny_qwen3", "qwen3_8b", "qwen3_32b", "qwen3_5_9b", "qwen3_5_27b", "delphi"]
DATASETS = ["tiny_messages", "tiny_sharegpt", "magpie", "tulu3", "[magpie,delphi_warmup]", "[wildchat_386k,delphi_warmup]"]
EXTRAS = [
    [],
    ["lr=2e-5"],
    ["lr=3e-5", "model.template=llama3", "seed=7"],
    ["mix.strategy=interleave_under", "mix.probs=[0.9,0.1]"],
    ["+extra.neat_packing=false", "+cluster.env.FOO=bar"],
    ["epochs=2", "~cluster.env.WANDB_MODE"],
    ["+sweep=smoke", "max_steps=3"],
]


def test_sampled_cells_equal_hydra_compose(hydra_loader):
    rng = random.Random(0)
    grid = [[f"model={m}", f"dataset={d}", *e] for m in MODELS for d in DATASETS for e in EXTRAS]
    sample = rng.sample(grid, 60)
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(sample)
    assert not errors, [e.message for e in errors]
    assert composer.stats["fast"] >= 40, composer.stats  # the point of the composer: few Hydra composes
    for cell in composed:
        assert cell.config == hydra_plain(cell.overrides), cell.overrides


def test_dataset_group_override_order_is_kept(hydra_loader):
    composer = GridComposer(hydra_loader, "config")
    composer.compose(["model=tiny_llama"])
    mixed = composer.compose(["dataset=[delphi_warmup,magpie]"])
    assert list(mixed.config["dataset"]) == ["delphi_warmup", "magpie"]
    assert mixed.config == hydra_plain(["dataset=[delphi_warmup,magpie]"])


def test_cells_do_not_share_mutable_state(hydra_loader):
    composer = GridComposer(hydra_loader, "config")
    a = composer.compose(["model=qwen3_8b", "model.template=qwen3_nothink"])
    b = composer.compose(["model=qwen3_8b"])
    assert a.config["model"]["template"] == "qwen3_nothink"
    assert b.config["model"]["template"] == "qwen3"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["lrr=1e-5"], "Key 'lrr' not in 'CellConf'"),
        (["model=qwen3_9b"], "Could not find 'model/qwen3_9b'"),
        (["lr=fast"], "could not be converted to Float"),
        (["model.templat=qwen3"], "Key 'templat' not in 'ModelConf'"),
    ],
)
def test_errors_are_hydras(hydra_loader, overrides, expected):
    composer = GridComposer(hydra_loader, "config")
    composer.compose(["model=tiny_llama"])  # the reference
    composed, errors = composer.compose_all([overrides])
    assert not composed
    assert expected in errors[0].message
    assert errors[0].overrides == overrides


def test_interpolations_that_read_other_keys_are_composed_by_hydra(hydra_loader):
    composer = GridComposer(hydra_loader, "config")
    cells = [["model=tiny_llama", "lr=1e-4", "+extra.tag='${model.name}-${lr}'"],
             ["model=qwen3_8b", "lr=2e-4", "+extra.tag='${model.name}-${lr}'"]]
    composed, errors = composer.compose_all(cells)
    assert not errors
    assert [c.config["extra"]["tag"] for c in composed] == ["tiny_llama-0.0001", "qwen3_8b-0.0002"]
    for c in composed:
        assert c.config == hydra_plain(c.overrides)
