"""Tokenize once per grid, as planned (no backend runs here): cells whose data tokenizes the same share one
tokenized dataset, any change of what decides the tokens gives a new one, training-only values do not, and
tokenizers are compared by content (two Delphi checkpoints carry the same prepared tokenizer). On Slurm the
tokenizations are one CPU array that the training arrays wait for, after the model preps."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from sft_grid.checks.tokenizers import prepared_tokenizer, tokenizer_digest
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.stages import tokenize
from tests.hubtools import tiny_asset

from .conftest import run_sft


def keys(make_cells, *variants) -> list[str]:
    cells = make_cells(*variants)
    planned = tokenize.plan(cells)
    return [planned[c.name].data.key for c in cells]


def test_training_values_share_a_tokenization_and_data_values_do_not(make_cells):
    base = ["model=tiny_llama", "dataset=tiny_messages", "max_steps=2"]
    shared = keys(
        make_cells,
        base,
        [*base, "lr=2e-5"],
        [*base, "micro_batch_size=2"],
        [*base, "save_steps=7"],
        [*base, "global_batch_size=32"],
        [*base, "epochs=3"],
        [*base, "seed=7"],
    )
    assert len(set(shared)) == 1  # LLaMA-Factory's concatenated sources tokenize the same whatever the seed
    apart = keys(
        make_cells,
        base,
        [*base, "cutoff_len=256"],
        [*base, "dataset=tiny_sharegpt"],
        [*base, "backend=axolotl"],
        [*base, "model=tiny_qwen3"],
        [*base, "packing=true"],
        [*base, "dataset=[tiny_messages,tiny_sharegpt]"],
        [*base, "dataset=[tiny_messages,tiny_sharegpt]", "mix.strategy=interleave_under", "mix.probs=[0.5,0.5]"],
    )
    assert len(set(apart)) == len(apart), apart


@pytest.mark.parametrize(
    "variant",
    [
        ["backend=axolotl"],  # axolotl shuffles the prepared dataset with the seed
        [
            "dataset=[tiny_messages,tiny_sharegpt]",
            "mix.strategy=interleave_under",
            "mix.probs=[0.5,0.5]",
        ],  # interleaved
        ["+extra.val_size=0.1"],  # LLaMA-Factory splits a validation set off with it
    ],
)
def test_the_seed_counts_where_the_backends_data_preparation_uses_it(make_cells, variant):
    base = ["model=tiny_llama", "dataset=tiny_messages", "max_steps=2", *variant]
    one, other = keys(make_cells, base, [*base, "seed=7"])
    assert one != other


def test_tokenizers_are_compared_by_content(make_cells, tmp_path):
    source = tiny_asset("models/tiny-llama3")
    copies = []
    for name in ("checkpoint-a", "checkpoint-b", "checkpoint-c"):
        shutil.copytree(source, tmp_path / name)
        copies.append(tmp_path / name)
    config = json.loads((copies[1] / "config.json").read_text())
    (copies[1] / "config.json").write_text(json.dumps({**config, "note": "other weights, same tokenizer"}))
    tok = json.loads((copies[2] / "tokenizer.json").read_text())
    tok["added_tokens"][-1]["content"] = "<|something_else|>"
    (copies[2] / "tokenizer.json").write_text(json.dumps(tok))
    a, b, c = keys(make_cells, *[["model=tiny_llama", f"model.path={p}", "max_steps=2"] for p in copies])
    assert a == b != c
    assert tokenizer_digest(copies[0]) == tokenizer_digest(copies[1]) != tokenizer_digest(copies[2])


def test_two_delphi_checkpoints_carry_one_prepared_tokenizer(make_cells, tmp_path, monkeypatch):
    """Proved by hashing: the prepared tokenizers of two Delphi checkpoints (other weights, the same Llama-3
    tokenizer files as saved) are the same content, so their cells of one recipe share one tokenization."""
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    source = tiny_asset("models/tiny-delphi")
    dirs = []
    for name in ("delphi-3e18", "delphi-9e18"):
        shutil.copytree(source, tmp_path / name)
        dirs.append(tmp_path / name)
    (dirs[1] / "config.json").write_text(json.dumps({**json.loads((dirs[1] / "config.json").read_text()), "x": 1}))
    prepared = [prepared_tokenizer(d) for d in dirs]
    assert prepared[0] == prepared[1]  # one directory: the digest of the same content
    assert tokenizer_digest(prepared[0]) != tokenizer_digest(dirs[0])  # the prep changed it
    cells = make_cells(*[["model=tiny_delphi", f"model.path={d}", "max_steps=2"] for d in dirs])
    planned = tokenize.plan(cells)
    assert len({planned[c.name].dir for c in cells}) == 1
    assert planned[cells[0].name].identity["tokenizer"] == {"digest": tokenizer_digest(prepared[0])}


@pytest.mark.parametrize("backend, loads", [("llamafactory", "tokenized_path"), ("axolotl", "dataset_prepared_path")])
def test_slurm_plan_tokenizes_once_on_a_cpu_node_before_the_cells(tmp_path, backend, loads):
    proc = run_sft(
        "-m",
        "cluster=slurm_local",
        f"backend={backend}",
        "model=tiny_llama",
        "lr=1e-5,2e-5,3e-5",
        "max_steps=2",
        f"runs_root={tmp_path}",
        "dry_run=true",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "tokenize once: 1 tokenized dataset(s) for 3 cell(s)" in out
    tok_job = re.search(r"  (sft_grid-\w+): tokenize once, 1 job", out)
    assert tok_job, out
    train = re.search(r"  sft_grid-\w+: training, 3 task\(s\), after afterany:(sft_grid-\w+)", out)
    assert train and train.group(1) == tok_job.group(1)
    script = (tmp_path / "default" / ".dry_run" / f"{tok_job.group(1)}.sbatch").read_text()
    assert "--gpus" not in script and "--gres" not in script and "#SBATCH --nodes=1" in script
    cells = list(iter_cell_dirs(tmp_path / "default"))
    configs = [yaml.safe_load(next(c.glob("*_config.yaml")).read_text()) for c in cells]
    assert len({str(cfg[loads]) for cfg in configs}) == 1 and "/_tokenized/" in str(configs[0][loads])
    assert not (tmp_path / "_tokenized").exists()  # a dry run builds nothing
    assert all("tokenized" in (c / "preflight.json").read_text() for c in cells)  # the job's first step checks it
