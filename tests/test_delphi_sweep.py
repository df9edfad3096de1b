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

from sft_grid.core.paths import PACKAGE_CONF
from sft_grid.planning.compose import GridComposer

from .conftest import hydra_plain, run_sft

SWEEP = PACKAGE_CONF / "sweep" / "delphi_scaling.yaml"
BUDGETS = ["3e18", "9e18", "2e19", "3e19", "9e19", "2e20", "3e20", "1e21", "1e22"]
MIXES = ["p33m67", "p50m50", "p67m33"]
# marin's canonical Delphi registry, as published (marin-community/marin at 5afac0bdf8202b7f908a48d87af65fe41b60cc54,
# experiments/delphi_models.py: ALL_DELPHI_MODELS and DELPHI_HF_REVISIONS): budget -> (repo, pinned Hub commit, hidden
# size, layers, batch, trainer steps)
REGISTRY = {
    "3e18": ("delphi-3e18-447Mparams-1.2Btokens", "d39dd26109500de83cb3a7b79d73420785139246", 1024, 11, 8, 37335),
    "9e18": ("delphi-9e18-550Mparams-2.9Btokens", "24722a6b925deaa9b51d9cb59373a2edf42e959e", 1152, 12, 16, 44096),
    "2e19": ("delphi-2e19-837Mparams-3.6Btokens", "513d4b7333233fa3a63f24430d7ac78237d9db36", 1408, 15, 16, 54915),
    "3e19": ("delphi-3e19-998Mparams-5Btokens", "b1648396f93f50daf561208b3e4cfe080b9d5e2c", 1536, 16, 32, 38014),
    "9e19": ("delphi-9e19-1.4Bparams-10.6Btokens", "d5712937fe6d6666d7205107539b9ec6dc801fa7", 1792, 18, 64, 40163),
    "2e20": ("delphi-2e20-1.9Bparams-14.8Btokens", "6c7305b56385327c60eecbab6482201477c8172d", 2048, 21, 64, 56392),
    "3e20": ("delphi-3e20-2.5Bparams-18.6Btokens", "b585d913d6f72cf86482a7adc71cc77af4b910f3", 2304, 23, 128, 35510),
    "1e21": ("delphi-1e21-3.4Bparams-46.3Btokens", "586f00015fed3a11a72db392c1236d9947e8b652", 2560, 26, 512, 22057),
    "1e22": ("delphi-1e22-9.7Bparams-160Btokens", "ca7b0e7c0a6b9ea8e3a4bbe847efa8b53f793902", 3840, 37, 1024, 38235),
}
# the midtrained ids #6279's consolidated model map (checked live by its authors) and the team's launch scripts show;
# and the one whose commit marin's own SFT config pins (experiments/sft/configs/delphi_1e22.py)
CONFIRMED_MIDTRAINED = {
    *(f"delphi-{b}-{m}" for b in ("3e18", "9e18", "2e19") for m in MIXES),
    "delphi-3e19-p33m67",
    "delphi-9e19-p33m67",
    "delphi-2e20-p33m67",
    "delphi-1e22-p33m67",
}
PINNED_MIDTRAINED = {"delphi-1e22-p33m67": "56cc5aaf65cd59d6632962cee636a0423abfbf66"}


def exact_params(d: int, layers: int, vocab: int = 128256, head_dim: int = 128) -> int:
    """A Delphi checkpoint's parameters from its shape: embeddings in and out, per layer q/k/v/o (4d^2) and the
    SwiGLU of 4d (12d^2), two RMSNorms and the q- and k-norms of one head each, the final norm."""
    return 2 * vocab * d + layers * (16 * d * d + 2 * d + 2 * head_dim) + d


def planned_tokens(budget: float, d: int, layers: int, vocab: int = 128256, seq: int = 4096) -> float:
    """The tokens a Delphi run's name carries: its compute over Levanter's FLOPs a token,
    3 x (L x (32 d^2 + 4 seq d) + 2 d V)."""
    return budget / (3 * (layers * (32 * d * d + 4 * seq * d) + 2 * d * vocab))


def name_label(x: float, unit: str) -> str:
    """Delphi's naming: below 1B whole millions ("447M"); else billions to one decimal without ".0" ("5B",
    "46.3B"), whole from 100B ("160B")."""
    if x < 1e9:
        return f"{round(x / 1e6)}M{unit}"
    b = x / 1e9
    text = f"{round(b)}" if b >= 100 else f"{b:.1f}".removesuffix(".0")
    return f"{text}B{unit}"


def nodes_for(params: int) -> int:
    """The grid's rule: 1 node up to ~1B parameters, 2 up to the 2.5B of 3e20 (2.545B exactly), 4 above."""
    return 1 if params <= 1.0e9 else 2 if params <= 2.6e9 else 4


@pytest.fixture
def leonardo(monkeypatch, tmp_path):
    monkeypatch.setenv("SFT_GRID_LEONARDO_ACCOUNT", "acct")
    monkeypatch.setenv("SFT_GRID_LEONARDO_RUNS", str(tmp_path / "runs"))
    # the site's environment is not on this machine: unset, a dry run renders it as a placeholder
    monkeypatch.delenv("SFT_GRID_LEONARDO_ENV", raising=False)
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the whole grid, read by several tests (it takes seconds)."""
    root = tmp_path_factory.mktemp("delphi")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SFT_GRID_LEONARDO_ACCOUNT", "acct")
        mp.setenv("SFT_GRID_LEONARDO_RUNS", str(root / "runs"))
        mp.delenv("SFT_GRID_LEONARDO_ENV", raising=False)  # not on this machine: a placeholder in the dry run
        proc = run_sft("-m", "+sweep=delphi_scaling", "dry_run=true", check=True)
    cells = sorted(p for p in (root / "runs" / "delphi_scaling").iterdir() if (p / "cell.yaml").is_file())
    return proc, cells


def test_the_table_is_the_real_suite():
    """Every base row is the registry's repository at the registry's commit, with its shape, the exact parameter
    count that shape gives, and a name whose size and token count agree with both (the old guesses divided the
    budget by 6N and missed by up to 10%); every midtrained row has its base's shape and a real-pattern id, and is
    marked unconfirmed unless a public record shows it."""
    sweep = yaml.safe_load(SWEEP.read_text())
    models = sweep["vars"]["models"]
    axis = sweep["hydra"]["sweeper"]["params"]["vars.model"].split(",")
    assert len(axis) == 36 and set(axis) == set(models) - {"delphi-1e23-base"}
    for budget, (repo, sha, d, layers, batch, steps) in REGISTRY.items():
        row = models[f"delphi-{budget}-base"]
        params = exact_params(d, layers)
        assert row["hub_id"] == f"marin-community/{repo}" and row["revision"] == sha
        assert (row["hidden_size"], row["num_layers"], row["num_heads"]) == (d, layers, d // 128)
        assert row["params"] == params and abs(row["params_b"] * 1e9 - params) < 0.001 * params
        tokens = planned_tokens(row["compute_budget"], d, layers)
        assert repo == f"delphi-{budget}-{name_label(params, 'params')}-{name_label(tokens, 'tokens')}"
        # and the registry's trainer schedule ran those tokens, to within 1%
        assert abs(steps * batch * 4096 - tokens) < 0.01 * tokens
        assert row.get("confirmed", True) is True
    # the "2e19" and "2e20" buckets are 1.8e19 and 1.8e20 FLOPs
    assert [models[f"delphi-{b}-base"]["compute_budget"] for b in ("2e19", "2e20")] == [1.8e19, 1.8e20]
    for budget in BUDGETS:
        base = models[f"delphi-{budget}-base"]
        for mix in MIXES:
            name = f"delphi-{budget}-{mix}"
            row = models[name]
            assert {k: row[k] for k in ("params", "num_layers", "hidden_size", "num_heads")} == {
                k: base[k] for k in ("params", "num_layers", "hidden_size", "num_heads")
            }
            assert re.fullmatch(
                rf"laion/delphi-{budget}-{mix}-(k0p20-lr83-a00[123]|[0-9p]+b-lr[0-9.]+-[0-9a-f]+)", row["hub_id"]
            )
            assert row.get("confirmed", True) is (name in CONFIRMED_MIDTRAINED), name
            assert row["revision"] == PINNED_MIDTRAINED.get(name)
    # the optional 25B: documented and pinned, trained like the 32B (ZeRO-3, consolidated before the upload)
    big = models["delphi-1e23-base"]
    assert big["revision"] == "e175dd1b9f30639b476c7b6c41972f62a4064c31"
    assert {"zero3", "consolidate", "delphi_tokenizer_prep"} <= set(big["needs"])
    assert big["params"] == exact_params(big["hidden_size"], big["num_layers"])


def test_dry_run_renders_72_cells_without_warnings(dry_run):
    proc, cells = dry_run
    assert "dry run: 72 cell(s) rendered, nothing submitted" in proc.stdout
    assert not re.search(r"warn", proc.stdout + proc.stderr, re.IGNORECASE), proc.stderr
    assert len(cells) == 72 and len({c.name.rsplit("-", 1)[1] for c in cells}) == 72
    # the 8 cells of the 9.7B train with ZeRO-3 (their layout on 64 GB A100s), whose shards are consolidated first
    for count, stages in ((64, "tokenizer, upload, cleanup"), (8, "consolidate, tokenizer, upload, cleanup")):
        assert (
            f"post-training stages of {count} cell(s): {stages}; the upload waits for the login node: sft-grid post"
        ) in proc.stdout
    # every cell fits Leonardo's 64 GB by the model, packed, with the site's FlashAttention and Liger
    assert "72 packed cell(s): a global batch is 16 x 4096 tokens" in proc.stdout
    assert re.search(r"the fullest is delphi-\S+, .* = (\d+\.\d) GiB of 64 GiB", proc.stdout)


def test_every_cell_holds_the_grids_rules(dry_run):
    proc, cells = dry_run
    hub_ids, per_model, layouts = set(), {}, {}
    for cell in cells:
        cfg = yaml.safe_load((cell / "train_config.yaml").read_text())
        conf = yaml.safe_load((cell / "cell.yaml").read_text())
        post = json.loads((cell / "post.json").read_text())
        key = cell.name.rsplit("-", 1)[1]
        model, params = conf["model"]["name"], conf["model"]["params"]
        per_model.setdefault(model, []).append(cell)
        assert cfg["learning_rate"] == 2e-5 and cfg["cutoff_len"] == 4096 and cfg["num_train_epochs"] == 1.0
        assert conf["global_batch_size"] == 16 and cfg["per_device_train_batch_size"] == 1
        # the layout as chosen to fit Leonardo's 64 GB A100s (sft_grid/planning/gpus.py), said in cell.yaml and rendered
        nodes, lay = conf["nodes"], conf["layout"]
        assert cfg["gradient_accumulation_steps"] == 16 // (nodes * 4) and f"#SBATCH --nodes={nodes}" in proc.stdout
        assert ("deepspeed" in cfg) == (lay["sharding"] != "none") and conf["packing"] is True
        assert cfg["packing"] is True and cfg["neat_packing"] is True  # no example attends to another
        assert cfg["disable_gradient_checkpointing"] is not lay["checkpointing"]
        layouts[params] = (nodes, lay["sharding"], lay["checkpointing"])
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
        consolidate = ["consolidate"] if lay["sharding"] == "zero3" else []  # ZeRO-3 saves shards
        assert post["stages"] == [*consolidate, "tokenizer", "upload", "cleanup"] and post["upload_in_job"] is False
        assert conf["register_db"] is False and "register" not in post["stages"]
        assert conf["cluster"]["name"] == "leonardo"
        hub_ids.add(hub)
    assert len(hub_ids) == 72
    # sizes up to 3.4B train on one node; the 9.7B needs ZeRO-3 and checkpointing (plain data parallel on 4 nodes,
    # as the grid once rendered it, needed 155 GB a GPU)
    assert layouts[9714698752][1:] == ("zero3", True) and layouts[9714698752][0] == 1
    assert all(layouts[p][0] == 1 and layouts[p][1] in ("none", "zero2") for p in layouts if p < 9e9)
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
    # 4 sbatch calls: the prep array, the tokenize array, one training array (every cell fits one node) and its post
    assert "Slurm: 4 sbatch call(s)" in proc.stdout and proc.stdout.count("#SBATCH --array=") == 4


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


def test_the_dry_run_shows_the_commit_each_model_trains(dry_run):
    proc, _ = dry_run
    lines = {line.split(":", 1)[0].strip(): line for line in proc.stdout.splitlines() if line.startswith("  delphi-")}
    for budget, (repo, sha, d, layers, *_) in REGISTRY.items():
        line = lines[f"delphi-{budget}-base"]
        assert f"marin-community/{repo}@{sha}" in line and f"{exact_params(d, layers):,} parameters, float32" in line
    sweep = yaml.safe_load(SWEEP.read_text())
    for name, row in sweep["vars"]["models"].items():
        if name.endswith("-base"):
            continue
        line = lines[name]
        assert f"{row['hub_id']}@{row['revision'] or 'main'}" in line
        assert ("id unconfirmed: queued only once resolved" in line) is (name not in CONFIRMED_MIDTRAINED), line
    # float32 on disk: 4 bytes a parameter to stage (447,244,032 x 4 = 1.79 GB)
    assert "(1.79 GB as stored)" in lines["delphi-3e18-base"]
