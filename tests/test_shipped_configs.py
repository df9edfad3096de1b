"""Every shipped config and sweep composes, is documented, and plans; the backend registry matches conf/."""

from __future__ import annotations

import pytest
import yaml

from sft_grid.backends import BACKENDS
from sft_grid.core.paths import PACKAGE_CONF
from sft_grid.planning import resolvers
from sft_grid.planning.cells import plan_cell
from sft_grid.planning.validate import validate

from .conftest import hydra_plain, run_sft

GROUPS = ("cluster", "backend", "model", "dataset")
SHIPPED = [(g, p.stem) for g in GROUPS for p in sorted((PACKAGE_CONF / g).glob("*.yaml"))]
SWEEPS = sorted(p.stem for p in (PACKAGE_CONF / "sweep").glob("*.yaml"))


def set_user_env(monkeypatch: pytest.MonkeyPatch, group: str, option: str) -> list[str]:
    """Give every per-user variable the option reads with ${user_env:VAR} a dummy value; returns their names."""
    names = resolvers.variables((PACKAGE_CONF / group / f"{option}.yaml").read_text())
    for name in names:
        monkeypatch.setenv(name, f"dummy-{name.lower()}")
    return names


@pytest.mark.parametrize("group, option", SHIPPED)
def test_every_option_composes_and_validates(hydra_loader, monkeypatch, group, option):
    set_user_env(monkeypatch, group, option)
    overrides = [f"{group}={option}"]
    if group == "model" and "zero3" in yaml.safe_load((PACKAGE_CONF / group / f"{option}.yaml").read_text())["needs"]:
        overrides.append("backend=axolotl")  # the managed environment with DeepSpeed (test_post checks the other)
    config = hydra_plain(overrides)
    cell = plan_cell(overrides, config)
    assert validate([cell]) == []


@pytest.mark.parametrize(
    "path",
    sorted(PACKAGE_CONF.rglob("*.yaml")) + sorted((PACKAGE_CONF / "sweep").glob("*.yaml")),
    ids=lambda p: str(p.relative_to(PACKAGE_CONF)),
)
def test_every_yaml_opens_with_what_it_is_and_how_to_run_it(path):
    text = path.read_text()
    assert text.startswith("#"), f"{path} must open with a comment"
    assert "sft-grid " in text or "sft_grid" in text.split("\n\n")[0], f"{path}: say how to run it"


def test_backend_registry_matches_conf():
    assert set(BACKENDS) == {p.stem for p in (PACKAGE_CONF / "backend").glob("*.yaml")}


def test_real_models_name_their_hub_ids():
    for name in ("qwen3_8b", "qwen3_32b", "qwen3_5_9b", "qwen3_5_27b", "delphi"):
        model = yaml.safe_load((PACKAGE_CONF / "model" / f"{name}.yaml").read_text())
        assert "/" in model["hub_id"] and model["path"] is None


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_dry_runs(sweep, tmp_path, tiny_assets, monkeypatch):
    for site in sorted(p.stem for p in (PACKAGE_CONF / "cluster").glob("*.yaml")):  # a sweep may name its cluster
        for name in set_user_env(monkeypatch, "cluster", site):
            if name.endswith("_ENV"):  # the site's environment is not on this machine: a dry run's placeholder
                monkeypatch.delenv(name)
    proc = run_sft("-m", f"+sweep={sweep}", "dry_run=true", f"runs_root={tmp_path}", check=True)
    assert "nothing submitted" in proc.stdout
    assert any(tmp_path.rglob("cell.yaml"))
