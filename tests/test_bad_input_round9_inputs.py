"""Bad input, ninth round (inputs): one reader of a model's config.json for the shape rule and the estimate, a local
model folder without its tokenizer.json told under model.path, a short commit hash as a revision, the same data file
under two dataset names, and weight_decay / max_grad_norm held to sensible ranges. Each is refused naming the key,
the value and the fix, with no traceback and nothing written."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from sft_grid.checks.preflight import checks_for, run
from sft_grid.core.hubcache import Pin, snapshot_path, write_ref
from sft_grid.core.paths import assets_dir
from sft_grid.planning import costs
from sft_grid.planning.hub_rules import model_facts
from sft_grid.planning.readable import model_config
from sft_grid.planning.schema_rules import values
from sft_grid.planning.validate import inputs_named

from .test_bad_input_round8_model_eval import CONFIG as LLAMA_CONFIG
from .test_bad_input_round8_model_eval import _refused

# a checkpoint's config.json as transformers writes it (another shape than the one conf/model/qwen3_8b.yaml declares)
CONFIG = {**LLAMA_CONFIG, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
SHA_A = "a" * 40
SHA_B = "b" * 40


def _snapshot(cache: Path, sha: str, config: dict[str, object]) -> Path:
    folder = snapshot_path(cache, "Qwen/Qwen3-8B", "model", sha)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


# -- 1. one reader of a model's config.json --------------------------------------------------------------------------


def _both_read(cell) -> tuple[tuple[object, str], list[str]]:
    """What the estimate took the model's shape from, and the shape keys the shape rule found contradicted."""
    model, source = costs._model(cell)
    return ((model.n_layers, model.d_attn), source), sorted(p.key for p in model_facts(cell) if p.rule == "model-shape")


def test_a_pinned_snapshots_config_is_read_by_the_estimate_as_by_the_shape_rule(make_cells, hub_cache):
    folder = _snapshot(hub_cache, SHA_A, CONFIG)
    (cell,) = make_cells(["model=qwen3_8b"])
    cell = dataclasses.replace(cell, pins=(Pin("model", "Qwen/Qwen3-8B", "main", SHA_A, hub_cache),))
    assert model_config(cell) == (folder / "config.json", CONFIG)
    # the estimate read it too (it used to look for `Qwen/Qwen3-8B@<sha>` in the cache, find nothing and fall back
    # on the shape the conf declares), and the shape rule compares the conf with it
    shape, contradicted = _both_read(cell)
    assert shape == ((2, 64), "config.json"), shape
    assert "model.num_layers" in contradicted and "model.hidden_size" in contradicted, contradicted


def test_a_revision_is_read_at_its_own_commit_never_the_caches_newest_copy(make_cells, hub_cache):
    _snapshot(hub_cache, SHA_A, CONFIG)
    newest = _snapshot(hub_cache, SHA_B, {**CONFIG, "num_hidden_layers": 36, "hidden_size": 4096})
    os.utime(newest, (2e9, 2e9))
    # a sha the cache holds is read at that sha, by both (the estimate used to read the newest copy, another commit)
    (cell,) = make_cells(["model=qwen3_8b", f"model.revision={SHA_A}"])
    shape, contradicted = _both_read(cell)
    assert shape == ((2, 64), "config.json") and "model.num_layers" in contradicted, (shape, contradicted)
    # a branch is read at the commit its refs/ file points at; a branch the cache has no ref of is not read at all
    write_ref(hub_cache, "Qwen/Qwen3-8B", "model", "v1", SHA_A)
    (cell,) = make_cells(["model=qwen3_8b", "model.revision=v1"])
    assert model_config(cell) is not None and model_config(cell)[1] == CONFIG
    (cell,) = make_cells(["model=qwen3_8b", "model.revision=v2"])
    assert model_config(cell) is None
    shape, contradicted = _both_read(cell)
    assert shape == ((36, 4096), "the model's stated shape") and contradicted == [], (shape, contradicted)


def test_a_config_with_a_null_text_config_is_read_one_way(make_cells, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIG, "text_config": None}))
    (cell,) = make_cells(["model=qwen3_8b", f"model.path={folder}", "model.hub_id=null"])
    # the estimate read `text_config` (null) as the config and guessed the shape; the shape rule read the file
    shape, contradicted = _both_read(cell)
    assert shape == ((2, 64), "config.json") and "model.num_layers" in contradicted, (shape, contradicted)


# -- 2. a local model folder without its tokenizer.json --------------------------------------------------------------


def test_a_model_folder_without_its_tokenizer_is_told_under_model_path(make_cells, tmp_path):
    folder = tmp_path / "ckpt"  # a checkpoint whose tokenizer.json was left behind in a copy
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIG, "model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer_config.json").write_text("{}")
    (cell,) = make_cells(["model=tiny_llama", f"model.path={folder}"])
    checks = {c.kind: c for c in checks_for(cell)}
    model, template = run(checks["model"]), run(checks["template_tokens"])
    assert checks["model"].key == "model.path" and not model.ok, model
    assert f"no tokenizer.json in {folder}" in model.message, model
    assert f".save_pretrained('{folder}')" in model.fix and "AutoTokenizer" in model.fix, model
    # the template's check does not tell it again under model.template, where nothing is to fix
    assert template.ok, template


# -- 3. a short commit hash as a revision ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("revision", "says", "fix"),
    [
        ("a1b2c3d", "is a commit sha cut to 7 characters", "https://huggingface.co/Qwen/Qwen3-8B/commit/a1b2c3d"),
        ("a1b2c3d4e5f6", "is a commit sha cut to 12 characters", "revision='a1b2c3d4e5f6').sha"),
        ("A" * 39 + "1", "is a commit sha in capitals", "model.revision=" + "a" * 39 + "1"),
    ],
)
def test_a_short_or_capital_commit_sha_is_refused_before_staging(make_cells, revision, says, fix):
    (cell,) = make_cells(["model=qwen3_8b", f"model.revision={revision}"])
    (problem,) = [p for p in model_facts(cell) if p.key == "model.revision"]
    assert problem.rule == "revision" and problem.value == revision, problem
    assert (says in problem.message and "offline" in problem.message) or "capitals" in says, problem
    assert fix in problem.fix, problem


@pytest.mark.parametrize("revision", [SHA_A, "main", "v1.0", "20240101", "deadbeef", "refs/pr/1"])
def test_a_full_sha_a_branch_or_a_tag_passes(make_cells, revision):
    (cell,) = make_cells(["model=qwen3_8b", f"model.revision={revision}"])
    assert [p for p in model_facts(cell) if p.key == "model.revision"] == []


# -- 4. one data file under two dataset names ------------------------------------------------------------------------


def test_one_file_under_two_dataset_names_is_refused(make_cells, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"messages": []}\n')
    (tmp_path / "link.jsonl").symlink_to(data)
    mix = ["dataset=[tiny_messages,tiny_sharegpt]"]
    linked, spelled, other_split = make_cells(
        [*mix, f"dataset.tiny_messages.source={data}", f"dataset.tiny_sharegpt.source={tmp_path / 'link.jsonl'}"],
        [
            *mix,
            f"dataset.tiny_messages.source={data}",
            f"dataset.tiny_sharegpt.source={tmp_path}/../{tmp_path.name}/data.jsonl",
        ],
        [
            *mix,
            f"dataset.tiny_messages.source={tmp_path}",
            f"dataset.tiny_sharegpt.source={tmp_path}",
            "dataset.tiny_sharegpt.split=test",
        ],
    )
    for cell in (linked, spelled):
        (problem,) = [p for p in inputs_named(cell) if p.rule == "dataset-twice"]
        assert problem.key == "dataset.tiny_sharegpt.source", problem
        assert f"the same data as dataset 'tiny_messages' (both read {data.resolve()})" in problem.message, problem
        assert "mix.probs" in problem.fix, problem
    # one folder's two splits are two sources
    assert [p for p in inputs_named(other_split) if p.rule == "dataset-twice"] == []


# -- 5. weight_decay and max_grad_norm -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "fix"),
    [
        ("weight_decay=10", "weight_decay", "set weight_decay to a value >= 0 and <= 1"),
        ("weight_decay=1e2", "weight_decay", "(did you mean 0.01? the exponent's minus sign may be missing)"),
        ("max_grad_norm=1e3", "max_grad_norm", "(did you mean 0.001? the exponent's minus sign may be missing)"),
        ("max_grad_norm=-1", "max_grad_norm", "set max_grad_norm to a value >= 0 and <= 100"),
    ],
)
def test_weight_decay_and_max_grad_norm_have_ranges(make_cells, override, key, fix):
    (cell,) = make_cells([override])
    (problem,) = [p for p in values(cell.name, cell.spec) if p.key == key]
    assert problem.rule == "range" and fix in problem.fix, problem


def test_the_shipped_configs_and_common_settings_pass_the_ranges(make_cells):
    cells = make_cells(
        ["weight_decay=0.1", "max_grad_norm=0"],  # 0: no clipping, as the Trainer reads it
        ["weight_decay=1", "max_grad_norm=100"],
        *[[f"model={m}"] for m in ("qwen3_8b", "delphi", "tiny_llama")],
    )  # (conf/sweep/delphi_scaling.yaml's max_grad_norm: 1.0 is in range; tests/test_delphi_sweep.py runs it)
    assert [p for c in cells for p in values(c.name, c.spec) if p.key in ("weight_decay", "max_grad_norm")] == []


# -- the CLI: the mistakes validation finds, together, before anything is written ------------------------------------


def test_the_cli_refuses_a_short_revision_a_linked_dataset_and_lost_exponents_together(tmp_path):
    link = tmp_path / "link.jsonl"
    link.symlink_to(assets_dir() / "data" / "tiny_messages.jsonl")  # where SFT_GRID_CACHE puts it (CI: its own)
    said = _refused(
        tmp_path,
        "model=qwen3_8b",
        "model.revision=a1b2c3d",
        "weight_decay=1e2",
        "max_grad_norm=1e3",
        "dataset=[tiny_messages,tiny_sharegpt]",
        f"dataset.tiny_sharegpt.source={link}",
    )
    assert "model.revision='a1b2c3d': is a commit sha cut to 7 characters" in said, said
    assert "weight_decay=100.0: must be >= 0 and <= 1 [range]" in said and "did you mean 0.01?" in said, said
    assert "max_grad_norm=1000.0: must be >= 0 and <= 100 [range]" in said and "did you mean 0.001?" in said, said
    assert f"dataset.tiny_sharegpt.source='{link}': the same data as dataset 'tiny_messages' (both read" in said, said
