"""Which files of a repo staging fetches: a pure function of the listing (no server, no cache)."""

from __future__ import annotations

import pytest

from sft_grid.core.hubcache import RemoteFile, repo_folder, select_files, snapshot_path


def _files(*paths: str) -> list[RemoteFile]:
    return [RemoteFile(p, 10 + i, f"{i:040x}") for i, p in enumerate(paths)]


def _kept(paths: list[str], kind: str = "model", allow: list[str] | None = None) -> set[str]:
    return {f.path for f in select_files(_files(*paths), kind, allow).keep}  # type: ignore[arg-type]


def test_model_keeps_safetensors_and_everything_small_training_reads():
    paths = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
        "additional_chat_templates/tool.jinja",
        "modeling_custom.py",
        "README.md",
        "LICENSE",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    assert _kept(paths) == set(paths)


def test_model_drops_duplicate_weights_beside_safetensors():
    dupes = [
        "pytorch_model.bin",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model.bin.index.json",
        "consolidated.00.pth",
        "original/consolidated.00.pth",
        "model.pt",
        "tf_model.h5",
        "flax_model.msgpack",
        "onnx/model.onnx",
        "model.gguf",
    ]
    selection = select_files(_files("model.safetensors", "config.json", *dupes), "model")
    assert {f.path for f in selection.keep} == {"model.safetensors", "config.json"}
    reasons = dict(selection.skipped)
    assert reasons["pytorch_model.bin"] == "duplicate weights (.bin beside safetensors)"
    assert reasons["pytorch_model.bin.index.json"].startswith("duplicate weights")


def test_model_without_safetensors_keeps_torch_weights_only():
    paths = ["config.json", "pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack"]
    assert _kept(paths) == {"config.json", "pytorch_model.bin", "pytorch_model.bin.index.json"}


def test_model_drops_training_state_and_checkpoints():
    state = [
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "rng_state_3.pth",
        "training_args.bin",
        "scaler.pt",
        "checkpoint-500/model.safetensors",
        "checkpoint-500/optimizer.pt",
        "global_step500/mp_rank_00_model_states.pt",
        "runs/checkpoint-10/config.json",
        ".gitattributes",
    ]
    assert _kept(["model.safetensors", "config.json", *state]) == {"model.safetensors", "config.json"}


def test_safetensors_only_inside_checkpoints_do_not_hide_the_torch_weights():
    assert _kept(["pytorch_model.bin", "checkpoint-5/model.safetensors"]) == {"pytorch_model.bin"}


def test_dataset_keeps_data_files_and_the_card():
    data = [
        "data/train-00000-of-00002.parquet",
        "data/train.jsonl",
        "data/test.json",
        "data/x.csv",
        "data/y.tsv",
        "data/z.jsonl.gz",
        "data/w.jsonl.zst",
        "data-00000-of-00001.arrow",
        "dataset_info.json",
        "state.json",
        "README.md",
        "LICENSE",
    ]
    other = ["loader.py", "images/a.png", ".gitattributes", "notes.txt", "sub/README.md"]
    selection = select_files(_files(*data, *other), "dataset")
    assert {f.path for f in selection.keep} == set(data)
    assert {p for p, _ in selection.skipped} == set(other)


def test_allow_patterns_narrow_but_keep_the_card():
    paths = ["README.md", "en/train.parquet", "de/train.parquet", "en/test.parquet"]
    assert _kept(paths, "dataset", ["en/*"]) == {"README.md", "en/train.parquet", "en/test.parquet"}
    assert _kept(["config.json", "model.safetensors"], "model", ["*.json"]) == {"config.json"}


def test_selection_is_sorted_and_sums_sizes():
    selection = select_files(_files("b.json", "a.json"), "model")
    assert [f.path for f in selection.keep] == ["a.json", "b.json"]
    assert selection.bytes == 10 + 11


def test_cache_layout_names():
    assert repo_folder("org/name", "model") == "models--org--name"
    assert repo_folder("org/name", "dataset") == "datasets--org--name"
    assert str(snapshot_path("/c", "org/n", "model", "a" * 40)) == f"/c/models--org--n/snapshots/{'a' * 40}"
    with pytest.raises(ValueError, match="kind"):
        repo_folder("org/name", "space")
    with pytest.raises(ValueError, match="kind"):
        select_files([], "spaces")


def test_etag_is_the_lfs_sha256_when_there_is_one():
    assert RemoteFile("w.safetensors", 1, "b" * 40, "c" * 64).etag == "c" * 64
    assert RemoteFile("config.json", 1, "b" * 40).etag == "b" * 40
