"""Every validation rule, with its message; all problems of all cells reported at once."""

from __future__ import annotations

import pytest

from sft_grid.core.problems import GridError, Problem
from sft_grid.grid.flow import plan_cells
from sft_grid.planning.hydra_errors import composition_problem
from sft_grid.planning.validate import validate

from .conftest import run_sft


def problems_of(make_cells, *overrides):
    (cell,) = make_cells(list(overrides))
    return validate([cell])


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert found, f"no {rule} problem in {problems}"
    return found[0]


def test_shipped_defaults_are_valid(make_cells):
    assert problems_of(make_cells) == []


def test_global_batch_must_divide_by_ranks_and_micro_batch(make_cells):
    p = only(problems_of(make_cells, "global_batch_size=10", "micro_batch_size=4"), "batch-divisible")
    assert p.key == "global_batch_size" and p.value == 10
    assert "1 x 1 x 4 = 4" in p.message and "multiple of 4" in p.fix
    p = only(
        problems_of(make_cells, "global_batch_size=96", "cluster.gpus_per_node=4", "nodes=5", "cluster.executor=slurm"),
        "batch-divisible",
    )
    assert "5 x 4 x 1 = 20" in p.message


def test_interleave_probabilities_must_match_the_datasets(make_cells):
    p = only(
        problems_of(make_cells, "dataset=[magpie,delphi_warmup]", "mix.strategy=interleave_under", "mix.probs=[0.9]"),
        "mix-probs",
    )
    assert "2 dataset(s) (magpie, delphi_warmup), 1 given" in p.message
    p = only(
        problems_of(
            make_cells, "dataset=[magpie,delphi_warmup]", "mix.strategy=interleave_under", "mix.probs=[0.9,0.2]"
        ),
        "mix-probs",
    )
    assert "sum to 1" in p.message
    p = only(problems_of(make_cells, "dataset=[magpie,delphi_warmup]", "mix.probs=[0.5,0.5]"), "mix-probs")
    assert "only used by interleave" in p.message
    p = only(problems_of(make_cells, "mix.strategy=interleave"), "choice")
    assert "interleave_under" in p.fix


def test_wall_time_over_the_cluster_maximum(make_cells):
    p = only(problems_of(make_cells, "time=30:00:00"), "time-max")
    assert p.key == "time" and "24:00:00" in p.message and "time=24:00:00" in p.fix
    p = only(problems_of(make_cells, "time=soon"), "time-format")
    assert "04:00:00" in p.message


def test_chatml_template_on_a_llama3_tokenizer(make_cells):
    p = only(problems_of(make_cells, "model=delphi", "model.template=qwen3"), "template-tokenizer")
    assert p.key == "model.template" and p.value == "qwen3"
    assert "delphi tokenizer" in p.message and p.fix == "model.template=delphi"
    p = only(problems_of(make_cells, "model=tiny_llama", "model.template=qwen3"), "template-tokenizer")
    assert "llama3 tokenizer" in p.message and p.fix == "model.template=llama3"
    p = only(problems_of(make_cells, "model=qwen3_8b", "model.template=llama3"), "template-tokenizer")
    assert p.fix == "model.template=qwen3"
    p = only(problems_of(make_cells, "model.template=lama3"), "choice")
    assert "did you mean 'llama3'" in p.fix


def test_other_rules(make_cells):
    assert only(problems_of(make_cells, "nodes=2"), "local-one-node").key == "nodes"
    assert only(problems_of(make_cells, "lr=0"), "range").key == "lr"
    assert only(problems_of(make_cells, "epochs=0"), "length").key == "epochs"
    assert only(problems_of(make_cells, "finetuning_type=qlora"), "choice").key == "finetuning_type"
    p = only(problems_of(make_cells, "push_to_hub=true"), "hub-id")
    assert "hub_model_id" in p.fix
    # the upload is a post-training stage: no internet on compute nodes is no error (it waits for the login node)
    assert problems_of(make_cells, "push_to_hub=true", "hub_model_id=org/x") == []
    assert (
        only(problems_of(make_cells, "push_to_hub=true", "hub_model_id='org/{nope}'"), "hub-id").key == "hub_model_id"
    )
    assert (
        only(
            problems_of(make_cells, "register_db=true", "push_to_hub=true", "hub_model_id=org/x"), "register-command"
        ).key
        == "register_command"
    )


def test_all_problems_of_all_cells_are_reported_at_once(make_cells):
    cells = make_cells(
        ["global_batch_size=3", "micro_batch_size=2", "time=99:00:00"], ["model=delphi", "model.template=qwen3"]
    )
    problems = validate(cells)
    assert {p.rule for p in problems} == {"batch-divisible", "time-max", "template-tokenizer"}
    text = str(GridError(problems))
    assert text.startswith("3 problem(s) in 2 cell(s)") and "nothing was submitted" in text
    for cell in cells:
        assert f"cell {cell.name}" in text


def test_a_problem_of_the_grid_as_a_whole_is_told_as_the_grids_not_a_cells():
    from sft_grid.core.problems import GRID, Problem

    cell = Problem(cell="a-1", key="lr", value=-1, rule="range", message="must be > 0", fix="set lr > 0")
    grid = Problem(cell=GRID, key="prune.keep", value=1.5, rule="prune-block", message="must lie in (0, 1)", fix="0.3")
    text = str(GridError([cell, grid]))
    assert text.startswith("2 problem(s) in 1 cell(s) and the grid found by validation"), text
    assert "\n  cell a-1\n" in text and "\n  the grid\n    prune.keep=1.5" in text and "cell (grid)" not in text
    assert str(GridError([grid])).startswith("1 problem(s) in the grid found by validation")


def test_one_mistake_swept_over_an_axis_is_told_once_with_each_value(tmp_path):
    """An unknown key swept (`lrr=1e-5,...`): Hydra refuses each cell with its own value in the message; told once,
    with the cells and their values, not once a cell. Different keys, or a rule whose words differ beyond the value,
    stay apart."""
    proc = run_sft("-m", "model=tiny_llama", "lrr=1e-5,2e-5,3e-5,4e-5", f"runs_root={tmp_path}")
    said = proc.stderr
    assert proc.returncode == 1 and said.startswith("4 problem(s) in 4 cell(s)"), said
    assert said.count("Key 'lrr' not in 'CellConf'") == 1 and "  4 cells: " in said, said
    assert "lrr='1e-05', '2e-05', '3e-05' and 1 more: Could not override 'lrr'" in said, said

    def lr(cell, value, message):
        return Problem(cell=cell, key="lr", value=value, rule="range", message=message, fix="set lr > 0")

    text = str(GridError([lr("a", -1.0, "must be > 0"), lr("b", -2.0, "must be > 0")]))
    assert "  2 cells: a, b\n    lr=-1.0, -2.0: must be > 0 [range]" in text, text
    apart = str(GridError([lr("a", -1.0, "must be > 0"), lr("b", -2.0, "must be > 0 here")]))
    assert "\n  cell a\n    lr=-1.0: must be > 0 [range]" in apart and "\n  cell b\n" in apart, apart


def test_duplicate_identity_in_one_grid(make_cells):
    cells = make_cells(["nodes=1"], ["micro_batch_size=2"])
    _, problems = plan_cells([type("C", (), {"overrides": c.overrides, "config": c.config})() for c in cells], [])
    assert [p.rule for p in problems] == ["identity-unique"]


def test_unknown_key_lists_the_valid_keys():
    p = composition_problem(
        ["model.templat=qwen3"],
        "Could not override 'model.templat'.\n"
        "Key 'templat' not in 'ModelConf'\n    full_key: model.templat\n    object_type=ModelConf",
    )
    assert p.key == "templat" and p.cell == "model.templat=qwen3"
    assert "valid keys of ModelConf: name, hub_id, path" in p.fix and "did you mean 'template'" in p.fix


@pytest.mark.parametrize(
    "key, bad",
    [("model.name", "my model"), ("model.name", "x;rm -rf ~"), ("sweep_name", "it's"), ("model.name", 'a"b')],
)
def test_unsafe_names_are_rejected(make_cells, key, bad):
    (cell,) = make_cells([f"{key}='{bad}'" if "'" not in bad else f'{key}="{bad}"'])
    p = only(validate([cell]), "safe-name")
    assert p.key == key and p.value == bad and "no spaces, quotes, ; or commas" in p.message


def test_unsafe_dataset_name_is_rejected(make_cells):
    from sft_grid.planning.cells import plan_cell

    (cell,) = make_cells([])
    config = {**cell.config, "dataset": {"my data;x": cell.config["dataset"]["tiny_messages"]}}
    p = only(validate([plan_cell(cell.overrides, config)]), "safe-name")
    assert p.key == "dataset.my data;x" and p.fix == "rename it, e.g. my_data_x"


def test_the_hf_cache_must_be_an_absolute_directory(make_cells, tmp_path):
    """Jobs run in their cells' directories: a relative cache would be another directory in each; a file is no
    cache. A missing directory is fine (staging creates it), and so is ~."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for value, why in (("relative/dir", "relative path"), (str(a_file), "not a directory")):
        p = only(problems_of(make_cells, f"cluster.hf_cache={value}"), "hf-cache")
        assert p.key == "cluster.hf_cache" and p.value == value and why in p.message
    for value in (str(tmp_path / "missing" / "hub"), "'~/hf_cache_for_a_test'"):
        assert [p for p in problems_of(make_cells, f"cluster.hf_cache={value}") if p.rule == "hf-cache"] == []


@pytest.mark.parametrize("visible", ["", "-1", "0,1"])
def test_a_local_cell_asking_for_more_gpus_than_this_process_sees_is_refused_but_not_in_a_dry_run(
    make_cells, monkeypatch, visible
):
    """CUDA_VISIBLE_DEVICES hides every GPU ("" and -1) or lists more than the machine has (this machine has none):
    a real local run of 2 ranks per cell would fail at start; a dry run still renders what a GPU machine runs."""
    from sft_grid.planning.validate import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    here = visible_gpus()
    if here is None or here >= 2:
        pytest.skip("this machine's GPUs are not counted from /dev/nvidia<N>, or it has 2 of them")
    p = only(problems_of(make_cells, "cluster.gpus_per_node=2", "global_batch_size=4"), "local-gpus")
    assert p.key == "cluster.gpus_per_node" and p.value == 2
    assert f"this process sees {here} NVIDIA GPU(s)" in p.message and f"CUDA_VISIBLE_DEVICES={visible!r}" in p.message
    assert p.fix.startswith(f"cluster.gpus_per_node={here}") and "dry_run=true" in p.fix
    assert not problems_of(make_cells, "cluster.gpus_per_node=2", "global_batch_size=4", "dry_run=true")
    assert not problems_of(make_cells, "cluster.gpus_per_node=2", "global_batch_size=4", "cluster.executor=slurm")
