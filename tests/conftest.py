"""Shared fixtures.

Tests marked `backend` use the real LLaMA-Factory environment and the tiny local assets (built on first
use by project code: `python -m sft_grid.env build llamafactory`, `python -m sft_grid.assets build`).
Everything else is pure or reads only small local files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from sft_grid.compose import Composed, GridComposer
from sft_grid.paths import CONF_DIR, REPO_ROOT
from sft_grid.plan import Cell, plan_cell
from sft_grid.schema import register

register()


@pytest.fixture
def hydra_loader() -> Iterator[Any]:
    """Hydra initialised on conf/, as `python -m sft_grid` sees it; yields its config loader."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


def hydra_plain(overrides: Sequence[str]) -> dict[str, Any]:
    """What stock `hydra.compose` gives for these overrides, resolved, without the hydra node."""
    return OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)


@pytest.fixture
def make_cells(hydra_loader: Any, tmp_path: Path):
    """Compose and plan cells from override lists (runs_root in a tmp dir unless given)."""

    def make(*cells: Sequence[str]) -> list[Cell]:
        composer = GridComposer(hydra_loader, "config")
        composed, errors = composer.compose_all([[*c, f"runs_root={tmp_path / 'runs'}"] for c in cells])
        assert not errors, [e.message for e in errors]
        return [plan_cell(c.overrides, c.config) for c in composed]

    return make


def run_sft(*args: str, cwd: Path | None = None, check: bool = False, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m sft_grid <args>` as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "sft_grid", *args], cwd=cwd or REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"sft_grid {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    from sft_grid import assets, env

    env.build("llamafactory")
    return assets.build()


@pytest.fixture(scope="session")
def axolotl_env(tiny_assets: Path) -> Path:
    """The managed axolotl environment (built on first use, about 3-5 minutes), with the tiny assets."""
    from sft_grid import env

    return env.build("axolotl")
