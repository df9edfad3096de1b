"""sweeps/delphi_scaling.yaml: the Delphi scaling grid in one file. Its dry run renders 72 cells on Leonardo
with no warnings, and each rendered cell holds the grid's rules: one lr, cutoff, global batch, nodes by model
size with the accumulation derived, the 90/10 mix, the delphi template from a prepared tokenizer, a Hub
repository of its own derived from its identity, upload on and database registration off."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from sft_grid.core.paths import REPO_ROOT
from sft_grid.planning.compose import GridComposer

from .conftest import hydra_plain, run_sft

SWEEP = REPO_ROOT / "sweeps" / "delphi_scaling.yaml"
BUDGETS = ["3e18", "9e18", "2e19", "3e19", "9e19", "2e20", "3e20", "1e21", "1e22"]
MIXES = ["p33m67", "p50m50", "p67m33"]
BASE_SIZES = {
    "447M": 0.447,
    "550M": 0.55,
    "837M": 0.837,
    "998M": 0.998,
    "1.4B": 1.4,
    "1.9B": 1.9,
    "2.5B": 2.5,
    "3.4B": 3.4,
    "9.7B": 9.7,
}


def nodes_for(params_b: float) -> int:
    """The issue's rule: 1 node up to ~1B parameters, 2 for 1.4-2.5B, 4 above."""
    return 1 if params_b <= 1.0 else 2 if params_b <= 2.5 else 4


@pytest.fixture
def leonardo(monkeypatch, tmp_path):
    monkeypatch.setenv("SFT_GRID_LEONARDO_ACCOUNT", "acct")
    monkeypatch.setenv("SFT_GRID_LEONARDO_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("SFT_GRID_LEONARDO_ENV", str(tmp_path / "env"))
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the whole grid, read by several tests (it takes seconds)."""
    root = tmp_path_factory.mktemp("delphi")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SFT_GRID_LEONARDO_ACCOUNT", "acct")
        mp.setenv("SFT_GRID_LEONARDO_RUNS", str(root / "runs"))
        mp.setenv("SFT_GRID_LEONARDO_ENV", str(root / "env"))
        proc = run_sft("-m", "+sweep=delphi_scaling", "dry_run=true", check=True)
    cells = sorted(p for p in (root / "runs" / "delphi_scaling").iterdir() if (p / "cell.yaml").is_file())
    return proc, cells


def test_the_table_has_the_9_bases_and_27_midtrained_checkpoints():
    sweep = yaml.safe_load(SWEEP.read_text())
    models = sweep["vars"]["models"]
    axis = sweep["hydra"]["sweeper"]["params"]["vars.model"].split(",")
    assert sorted(axis) == sorted(models) and len(axis) == 36
    assert sorted(n for n in models if n.endswith("-base")) == sorted(f"delphi-{b}-base" for b in BUDGETS)
    assert sorted(n for n in models if not n.endswith("-base")) == sorted(
        f"delphi-{b}-{m}" for b in BUDGETS for m in MIXES
    )
    for name, row in models.items():
        budget = name.split("-")[1]
        base = models[f"delphi-{budget}-base"]
        assert row["params_b"] == base["params_b"]  # a midtrained checkpoint has its base's size
        if name.endswith("-base"):
            assert re.fullmatch(rf"marin-community/delphi-{budget}-[0-9.]+[MB]params-[0-9.]+Btokens", row["hub_id"])
        else:
            assert row["hub_id"] == f"laion/{name}"
    assert sorted(models[f"delphi-{b}-base"]["params_b"] for b in BUDGETS) == sorted(BASE_SIZES.values())
    assert models["delphi-3e18-base"]["hub_id"] == "marin-community/delphi-3e18-447Mparams-1.2Btokens"


def test_dry_run_renders_72_cells_without_warnings(dry_run):
    proc, cells = dry_run
    assert "dry run: 72 cell(s) rendered, nothing submitted" in proc.stdout
    assert not re.search(r"warn", proc.stdout + proc.stderr, re.IGNORECASE), proc.stderr
    assert len(cells) == 72 and len({c.name.rsplit("-", 1)[1] for c in cells}) == 72
    assert (
        "post-training stages of 72 cell(s): tokenizer, upload, cleanup; the upload waits for the login node:"
        " python -m sft_grid.post"
    ) in proc.stdout


def test_every_cell_holds_the_grids_rules(dry_run):
    proc, cells = dry_run
    hub_ids, per_model = set(), {}
    for cell in cells:
        cfg = yaml.safe_load((cell / "train_config.yaml").read_text())
        conf = yaml.safe_load((cell / "cell.yaml").read_text())
        post = json.loads((cell / "post.json").read_text())
        key = cell.name.rsplit("-", 1)[1]
        model, params_b = conf["model"]["name"], conf["model"]["params_b"]
        per_model.setdefault(model, []).append(cell)
        assert cfg["learning_rate"] == 2e-5 and cfg["cutoff_len"] == 4096 and cfg["num_train_epochs"] == 1.0
        assert conf["global_batch_size"] == 16 and cfg["per_device_train_batch_size"] == 1
        nodes = nodes_for(params_b)
        assert conf["nodes"] == nodes and cfg["gradient_accumulation_steps"] == 16 // (nodes * 4)
        assert f"#SBATCH --nodes={nodes}" in proc.stdout
        datasets = cfg["dataset"].split(",")
        assert datasets[0] in ("magpie", "wildchat_386k") and datasets[1] == "delphi_warmup"
        assert cfg["mix_strategy"] == "interleave_under" and cfg["interleave_probs"] == "0.9,0.1"
        assert cfg["template"] == "delphi" and conf["model"]["tokenizer_family"] == "delphi"
        # trained from the model's prepared tokenizer (the prep stage), not from the hub id
        assert "/_prepared/" in cfg["model_name_or_path"] and "delphi_tokenizer_prep" in conf["model"]["needs"]
        # the Hub repository: derived from the cell's identity, uploaded by the post stage, never by the trainer
        hub = conf["hub_model_id"]
        assert hub == f"laion/{model}-{'-'.join(datasets)}-sft-{key}" and post["hub_model_id"] == hub
        assert conf["push_to_hub"] is True and cfg["push_to_hub"] is False and "hub_model_id" not in cfg
        # no internet on Leonardo
        assert post["stages"] == ["tokenizer", "upload", "cleanup"] and post["upload_in_job"] is False
        assert conf["register_db"] is False and "register" not in post["stages"]
        assert conf["cluster"]["name"] == "leonardo"
        hub_ids.add(hub)
    assert len(hub_ids) == 72
    assert len(per_model) == 36 and all(len(v) == 2 for v in per_model.values())
    # one tokenizer prep per model, shared by its two cells: one prep array of 36 tasks the training waits for
    assert "tokenizer prep of 36 models for 72 cell(s)" in proc.stdout
    assert re.search(r"model prep, 36 task\(s\)", proc.stdout)
    prepared = {Path(yaml.safe_load((c / "train_config.yaml").read_text())["model_name_or_path"]).parent for c in cells}
    assert len(prepared) == 36 and {p.name.rsplit("-", 1)[0] for p in prepared} == set(per_model)
    # the tokenizers cannot be read here (nothing staged, no Hub): tokenized datasets are keyed by each model's
    # name, one per model and recipe; on a staged site they are keyed by the tokenizer's content (2: one a recipe)
    assert "tokenize once: 72 tokenized dataset(s) for 72 cell(s)" in proc.stdout
    assert "(by name: not readable here)" in proc.stdout and re.search(r"tokenize once, 72 task\(s\)", proc.stdout)
    # 8 sbatch calls: the prep array, the tokenize array, and a training and a post array per node count (1, 2, 4)
    assert "Slurm: 8 sbatch call(s)" in proc.stdout and proc.stdout.count("#SBATCH --array=") == 8


def test_the_fast_composer_equals_hydra_for_sampled_cells(hydra_loader, leonardo):
    """The sweep's model table is read through interpolations; the grid composer resolves each cell as a
    whole, and the result is what hydra.compose gives."""
    sweep = yaml.safe_load(SWEEP.read_text())
    params = sweep["hydra"]["sweeper"]["params"]
    recipes = ["[magpie,delphi_warmup]", "[wildchat_386k,delphi_warmup]"]
    grid = [
        ["+sweep=delphi_scaling", f"vars.model={m}", f"dataset={r}"]
        for m in params["vars.model"].split(",")
        for r in recipes
    ]
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(grid)
    assert not errors and len(composed) == 72
    assert composer.stats["hydra_composes"] <= 3  # the reference, not one a cell
    for cell in random.Random(5).sample(composed, 6):
        assert cell.config == hydra_plain(cell.overrides), cell.overrides
