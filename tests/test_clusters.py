"""The Slurm site profiles in conf/cluster/: they compose with their per-user variables set, carry the site
facts of the team's cluster definitions (their old launcher's hpc.py), and an unset variable stops the grid with a
message that names it and says how to set it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sft_grid.core.paths import PACKAGE_CONF
from sft_grid.planning import resolvers
from sft_grid.planning.cells import plan_cell
from sft_grid.planning.compose import GridComposer
from sft_grid.planning.validate import validate

from .conftest import hydra_plain, run_sft
from .test_shipped_configs import set_user_env

SITES = ["capella", "empireai", "jupiter", "jureca", "juwels", "leonardo", "perlmutter", "vista"]
OFFLINE = {"jupiter", "jureca", "juwels", "leonardo"}
KINDS = ("ACCOUNT", "RUNS", "ENV")


def clear_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-user variable from the shell running the tests."""
    for site in SITES:
        for kind in KINDS:
            monkeypatch.delenv(f"SFT_GRID_{site.upper()}_{kind}", raising=False)


def cluster(monkeypatch: pytest.MonkeyPatch, site: str) -> dict:
    set_user_env(monkeypatch, "cluster", site)
    return hydra_plain([f"cluster={site}"])["cluster"]


@pytest.mark.parametrize("site", SITES)
def test_site_composes_validates_and_reads_its_variables(hydra_loader, monkeypatch, site):
    clear_user_env(monkeypatch)
    names = set_user_env(monkeypatch, "cluster", site)
    assert names == [f"SFT_GRID_{site.upper()}_{kind}" for kind in KINDS]
    config = hydra_plain([f"cluster={site}"])
    c = config["cluster"]
    assert c["name"] == site and c["executor"] == "slurm" and c["precision"] == "bf16"
    assert c["account"] == f"dummy-sft_grid_{site}_account"
    assert c["runs_root"] == f"dummy-sft_grid_{site}_runs"
    assert c["backend_venvs"] == {"llamafactory": f"dummy-sft_grid_{site}_env", "axolotl": None, "lm_eval": None}
    assert c["env"]["DISABLE_VERSION_CHECK"] == "1"
    assert c["cpu_arch"] == ("aarch64" if site in ("jupiter", "vista", "empireai") else "x86_64")
    assert c["internet_on_compute"] is (site not in OFFLINE)
    if site in OFFLINE:
        assert c["env"]["HF_HUB_OFFLINE"] == "1"
        assert c["env"]["WANDB_MODE"] in ("offline", "disabled")
    else:
        assert "HF_HUB_OFFLINE" not in c["env"]
    cell = plan_cell([f"cluster={site}"], config)
    assert validate([cell]) == []
    # a global batch that fits the site's GPUs on 4 nodes validates too
    overrides = [f"cluster={site}", "nodes=4", f"global_batch_size={4 * c['gpus_per_node'] * 2}", "time=04:00:00"]
    cell = plan_cell(overrides, hydra_plain(overrides))
    assert validate([cell]) == []


@pytest.mark.parametrize("site", SITES)
def test_header_says_what_the_site_is_how_to_run_it_and_what_to_export(site):
    text = (PACKAGE_CONF / "cluster" / f"{site}.yaml").read_text()
    header = text.split("\nname:", 1)[0]
    assert f"sft-grid run -m +sweep=<grid> cluster={site}" in header
    assert "internet" in header.lower() and re.search(r"GPU|GH200|B200|A100|H100", header)
    for name in resolvers.variables(text):
        assert re.fullmatch(rf"SFT_GRID_{site.upper()}_({'|'.join(KINDS)})", name), name
        assert name in header, f"{site}.yaml: document {name} in the header"


def test_key_facts_from_the_research_notes(hydra_loader, monkeypatch):
    leonardo = cluster(monkeypatch, "leonardo")
    assert leonardo["partition"] == "boost_usr_prod" and leonardo["launcher"] == "accelerate"
    assert leonardo["max_time"] == "23:59:00" and leonardo["gpus_per_node"] == 4 and leonardo["cpus_per_node"] == 32
    assert leonardo["env"]["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "600"

    jupiter = cluster(monkeypatch, "jupiter")
    assert jupiter["partition"] == "booster" and jupiter["launcher"] == "accelerate"
    assert jupiter["max_time"] == "12:00:00"  # the booster QOS cap, not the class's 23:59:00
    assert jupiter["gpus_per_node"] == 4 and jupiter["cpus_per_node"] == 288
    assert jupiter["env"]["TORCH_CUDNN_SDPA_ENABLED"] == "0" and jupiter["env"]["NCCL_SOCKET_IFNAME"] == "ib0"
    assert any("GCC/14.3.0" in line for line in jupiter["setup"])

    vista = cluster(monkeypatch, "vista")
    assert vista["gpus_per_node"] == 1 and vista["gpu_directive"] == "none"
    assert vista["launcher"] == "torchrun" and vista["partition"] == "gh" and vista["cpus_per_node"] == 72
    assert vista["env"]["WANDB_MODE"] == "disabled"  # wandb 0.28 crashes on TACC compute nodes

    capella = cluster(monkeypatch, "capella")
    assert capella["sbatch_extra"]["licenses"] == "walrus:1,octopus:1,narwhal:1,cat:1"
    assert capella["gpu_directive"] == "gpus_per_node" and capella["mem_gb"] == 710
    assert capella["max_time"] == "47:59:00" and capella["launcher"] == "torchrun"

    perlmutter = cluster(monkeypatch, "perlmutter")
    assert perlmutter["constraint"] == "gpu&hbm80g" and perlmutter["qos"] == "premium"
    assert perlmutter["gpu_directive"] == "gpus_per_node" and perlmutter["launcher"] == "torchrun"

    empireai = cluster(monkeypatch, "empireai")
    assert empireai["gpu_directive"] == "none" and empireai["sbatch_extra"]["gres"] == "gpu:b200:4"
    assert empireai["partition"] == "beta" and empireai["qos"] == "standard" and empireai["cpus_per_node"] == 144
    assert empireai["env"]["NCCL_SOCKET_IFNAME"] == "bond0"

    jureca = cluster(monkeypatch, "jureca")
    assert jureca["partition"] == "dc-hwai" and jureca["env"]["NCCL_IB_TIMEOUT"] == "60"
    assert jureca["launcher"] == "accelerate" and jureca["gpu_directive"] == "gres"

    juwels = cluster(monkeypatch, "juwels")
    assert juwels["partition"] == "booster" and juwels["launcher"] == "accelerate"


@pytest.mark.parametrize("site", SITES)
def test_unset_variable_names_itself_and_the_fix(hydra_loader, monkeypatch, site):
    """An unset per-user variable composes as its placeholder; a real run is refused naming each variable, the key
    that reads it and the export line (a dry run renders with the placeholder: test_bad_input_round3.py)."""
    clear_user_env(monkeypatch)
    config = hydra_plain([f"cluster={site}"])
    account = f"SFT_GRID_{site.upper()}_ACCOUNT"
    assert config["cluster"]["account"] == f"<{account}>"
    problems = [p for p in validate([plan_cell([f"cluster={site}"], config)]) if p.rule == "site-variable"]
    said = {p.key: p for p in problems}
    assert said["cluster.account"].message.startswith(f"environment variable {account} is not set")
    assert said["cluster.account"].fix.startswith(f"export {account}=<account>")
    # every unset variable is named at once: one round trip to fix them all
    assert {"cluster.account", "cluster.runs_root", "cluster.backend_venvs.llamafactory"} <= set(said)


def test_one_unset_variable_is_named_alone_and_an_empty_one_counts_as_unset(hydra_loader, monkeypatch):
    set_user_env(monkeypatch, "cluster", "leonardo")
    monkeypatch.setenv("SFT_GRID_LEONARDO_RUNS", "")
    with pytest.raises(Exception) as info:
        hydra_plain(["cluster=leonardo"])
    text = str(info.value)
    assert "environment variable SFT_GRID_LEONARDO_RUNS is empty" in text
    assert "export SFT_GRID_LEONARDO_RUNS=" in text and "cluster.runs_root" in text
    assert "ACCOUNT" not in text and "also unset" not in text


def test_grid_composer_composes_the_placeholder_for_each_cell(hydra_loader, monkeypatch):
    clear_user_env(monkeypatch)
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(
        [["cluster=leonardo", "model=qwen3_8b"], ["cluster=leonardo", "model=delphi"]]
    )
    assert not errors and len(composed) == 2
    assert all(c.config["cluster"]["account"] == "<SFT_GRID_LEONARDO_ACCOUNT>" for c in composed)


def test_resolver_default_and_registration(monkeypatch):
    resolvers.register()
    resolvers.register()  # idempotent
    monkeypatch.delenv("SFT_GRID_TEST_VALUE", raising=False)
    cfg = OmegaConf.create({"a": "${user_env:SFT_GRID_TEST_VALUE,fallback}", "b": "${user_env:SFT_GRID_TEST_VALUE}"})
    assert cfg.a == "fallback"
    assert cfg.b == "<SFT_GRID_TEST_VALUE>" and resolvers.is_placeholder(cfg.b)
    monkeypatch.setenv("SFT_GRID_TEST_VALUE", "set")
    assert (cfg.a, cfg.b) == ("set", "set")


def test_cli_stops_before_anything_is_written_and_names_the_variable(monkeypatch, tmp_path):
    clear_user_env(monkeypatch)
    proc = run_sft("-m", "cluster=leonardo", "model=qwen3_8b,delphi", f"runs_root={tmp_path}")
    assert proc.returncode != 0
    assert "environment variable SFT_GRID_LEONARDO_ACCOUNT is not set" in proc.stderr
    assert "export SFT_GRID_LEONARDO_ACCOUNT=" in proc.stderr and "nothing was submitted" in proc.stderr
    assert "2 cells:" in proc.stderr and "full_key" not in proc.stderr  # told once over the grid, no internals
    assert not any(tmp_path.iterdir())
    # the dry run renders with placeholders, and says what a real run needs
    dry = run_sft("-m", "cluster=leonardo", "model=qwen3_8b,delphi", "dry_run=true", f"runs_root={tmp_path}")
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --account='<SFT_GRID_LEONARDO_ACCOUNT>'" in dry.stdout
    assert "export SFT_GRID_LEONARDO_ACCOUNT=<account>" in dry.stdout

    set_user_env(monkeypatch, "cluster", "leonardo")
    monkeypatch.delenv("SFT_GRID_LEONARDO_ENV")  # the site's environment is not on this machine: its placeholder
    proc = run_sft(
        "-m", "cluster=leonardo", "model=qwen3_8b,delphi", "dataset=magpie", "dry_run=true", f"runs_root={tmp_path}"
    )
    assert "SFT_GRID_LEONARDO_ACCOUNT" not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=boost_usr_prod" in proc.stdout and "#SBATCH --gres=gpu:4" in proc.stdout


def test_a_sites_environment_for_another_backend_is_set_without_a_plus(hydra_loader, make_cells, monkeypatch):
    """Every backend's key is in backend_venvs (null where the site names none), so the form the hints give,
    `cluster.backend_venvs.<backend>=<dir>`, works on a site whose profile names only LLaMA-Factory's; Hydra's own
    composition agrees."""
    set_user_env(monkeypatch, "cluster", "leonardo")
    overrides = ["cluster=leonardo", "backend=axolotl", "cluster.backend_venvs.axolotl=/site/axolotl-env"]
    assert hydra_plain(overrides)["cluster"]["backend_venvs"]["axolotl"] == "/site/axolotl-env"
    (cell,) = make_cells(overrides)
    from sft_grid.planning import environments

    assert environments.select(cell.spec)[0] == Path("/site/axolotl-env")
