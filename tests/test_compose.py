"""The fast grid composer gives exactly what hydra.compose gives: for generated override lists (groups, nested
keys, list elements, `+`, `++`, `~`, interpolations, sweep files, options found through hydra.searchpath),
composed as one grid, and for the errors Hydra raises."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from omegaconf import OmegaConf

from sft_grid.planning.compose import GridComposer

from .conftest import hydra_plain

MODELS = ["tiny_llama", "tiny_qwen3", "qwen3_8b", "qwen3_32b", "qwen3_5_9b", "delphi", "searched"]
TWO_DATASETS = ["[magpie,delphi_warmup]", "[tiny_messages,tiny_sharegpt]", "[wildchat_386k,delphi_warmup]"]
ONE_DATASET = ["tiny_messages", "tiny_sharegpt", "magpie", "tulu3"]
SCALARS = [
    "lr=2e-5",
    "lr=3e-5",
    "seed=7",
    "seed=8",
    "max_steps=10",
    "cutoff_len=512",
    "epochs=2",
    "global_batch_size=32",
    "warmup_ratio=0.1",
    "scheduler=linear",
    "report_to=wandb",
]
NESTED = [
    "model.template=llama3",
    "cluster.cpus_per_node=3",
    "cluster.env.OMP_NUM_THREADS=2",
    "model.params_b=1.5",
    "mix.strategy=interleave_under",
]
ADDED = [
    "+extra.a.b=1",
    "+extra.packing=true",
    "+cluster.env.FOO=bar",
    "+extra.k=[1,2]",
    "+cluster.need_venvs.transformers_ge_5_3.llamafactory=/envs/q35",
    "+cluster.sbatch_extra.hold=true",
    "+cluster.need_envs.transformers_ge_5_3.llamafactory=/envs/old",
    "+vars.row.x=3",
]
FORCED = ["++lr=4e-5", "++extra.z=1", "++cluster.partition=gpu"]
DELETED = ["~cluster.env.WANDB_MODE", "~cluster.env.OMP_NUM_THREADS"]
INTERPOLATED = ["+extra.tag='${model.name}-${lr}'", "+extra.home='${oc.env:HOME}'", "+extra.copy='${seed}'"]
SWEEPS = ["+sweep=smoke"]


@pytest.fixture
def searchpath(tmp_path: Path) -> list[str]:
    """A config directory added with hydra.searchpath, holding a model option conf/ does not have."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "searched.yaml").write_text(
        "name: searched\nhub_id: org/searched\nparams_b: 1.0\ntokenizer_family: llama3\ntemplate: llama3\n"
    )
    return [f"hydra.searchpath=[file://{tmp_path}]"]


def generated(seed: int, n: int) -> list[list[str]]:
    """n override lists, each one cell: a model, its data, then a few value overrides of the kinds above."""
    rng = random.Random(seed)
    cells = []
    for _ in range(n):
        cell = [f"model={rng.choice(MODELS)}"]
        two = rng.random() < 0.4
        cell.append(f"dataset={rng.choice(TWO_DATASETS if two else ONE_DATASET)}")
        if two and rng.random() < 0.6:
            cell += ["mix.strategy=interleave_under", "mix.probs=[0.5,0.5]"]
            if rng.random() < 0.5:
                cell.append("mix.probs.0=0.7")  # a list element, after the list it changes
        pools = [SCALARS, NESTED, ADDED, FORCED, DELETED, INTERPOLATED, SWEEPS]
        for pool in rng.sample(pools, rng.randint(1, 4)):
            cell.append(rng.choice(pool))
        cells.append(list(dict.fromkeys(cell)))
    return cells


def hydra_or_error(overrides: list[str]) -> dict | str:
    try:
        return hydra_plain(overrides)
    except Exception as exc:  # Hydra's refusal is part of what must match
        return f"error: {type(exc).__name__}"


def test_generated_grids_equal_hydra_compose(hydra_loader, searchpath):
    grid = generated(0, 28)
    composer = GridComposer(hydra_loader, "config", searchpath)
    composed, errors = composer.compose_all(grid)
    ours = {tuple(c.overrides): c.config for c in composed}
    ours.update({tuple(e.overrides): "error" for e in errors})
    for cell in grid:
        expected = hydra_or_error([*searchpath, *cell])
        got = ours[tuple(cell)]
        if isinstance(expected, str):
            assert got == "error", (cell, expected)
        else:
            assert got == expected, cell
    # grids this mixed send many cells to Hydra in full (interpolations, sweep files): still, some go the fast way
    assert composer.stats["fast"] >= 5, composer.stats


def test_the_cases_that_failed_in_a_multirun_compose(hydra_loader):
    """A list element and new nested keys, in a grid whose other cells set them differently."""
    grid = [
        [
            "model=tiny_llama",
            "dataset=[magpie,delphi_warmup]",
            "mix.strategy=interleave_under",
            "mix.probs=[0.5,0.5]",
            "mix.probs.0=0.7",
        ],
        [
            "model=tiny_qwen3",
            "dataset=[magpie,delphi_warmup]",
            "mix.strategy=interleave_under",
            "mix.probs=[0.5,0.5]",
            "mix.probs.1=0.2",
        ],
        ["model=tiny_llama", "+cluster.need_venvs.transformers_ge_5_3.llamafactory=/d"],
        ["model=tiny_qwen3", "+extra.a.b=1"],
        ["model=tiny_qwen3", "+extra.a.c=2"],
    ]
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(grid)
    assert not errors, [e.message for e in errors]
    assert composed[0].config["mix"]["probs"] == [0.7, 0.5] and composed[1].config["mix"]["probs"] == [0.5, 0.2]
    assert composed[2].config["cluster"]["need_venvs"] == {"transformers_ge_5_3": {"llamafactory": "/d"}}
    assert composed[3].config["extra"] == {"a": {"b": 1}} and composed[4].config["extra"] == {"a": {"c": 2}}
    for cell in composed:
        assert cell.config == hydra_plain(cell.overrides), cell.overrides


def test_a_scalar_sweep_applies_each_value_once(hydra_loader):
    """10 lrs x 20 seeds: each value override is applied by Hydra's code once, not once per cell."""
    grid = [["model=tiny_llama", f"lr={lr}e-5", f"seed={seed}"] for lr in range(1, 11) for seed in range(20)]
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(grid)
    assert not errors and len(composed) == 200
    assert composer.values.applications <= 10 + 20 + 1
    for cell in random.Random(3).sample(composed, 4):
        assert cell.config == hydra_plain(cell.overrides)


def test_dataset_group_override_order_is_kept(hydra_loader):
    composer = GridComposer(hydra_loader, "config")
    composer.compose(["model=tiny_llama"])
    mixed = composer.compose(["dataset=[delphi_warmup,magpie]"])
    assert list(mixed.config["dataset"]) == ["delphi_warmup", "magpie"]
    assert mixed.config == hydra_plain(["dataset=[delphi_warmup,magpie]"])


def test_cells_do_not_share_mutable_state(hydra_loader):
    composer = GridComposer(hydra_loader, "config")
    a = composer.compose(["model=qwen3_8b", "model.template=qwen3_nothink", "+extra.a.b=1"])
    b = composer.compose(["model=qwen3_8b", "+extra.a.c=2"])
    assert a.config["model"]["template"] == "qwen3_nothink" and a.config["extra"] == {"a": {"b": 1}}
    assert b.config["model"]["template"] == "qwen3" and b.config["extra"] == {"a": {"c": 2}}


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
    cells = [
        ["model=tiny_llama", "lr=1e-4", "+extra.tag='${model.name}-${lr}'"],
        ["model=qwen3_8b", "lr=2e-4", "+extra.tag='${model.name}-${lr}'"],
    ]
    composed, errors = composer.compose_all(cells)
    assert not errors
    assert [c.config["extra"]["tag"] for c in composed] == ["tiny_llama-0.0001", "qwen3_8b-0.0002"]
    for c in composed:
        assert c.config == hydra_plain(c.overrides)


def test_hydra_plain_is_hydras_own_compose(hydra_loader):
    """The oracle: the fixture is hydra.compose itself, resolved, without the hydra node."""
    cfg = hydra_compose("config", overrides=["model=tiny_llama"])
    expected = OmegaConf.to_container(cfg, resolve=True)
    assert hydra_plain(["model=tiny_llama"]) == expected and "hydra" not in expected
