"""Shared fixtures.

Tests marked `backend` use a real backend's virtual environment or the tiny local assets (built on first use by
project code: `python -m sft_grid.venv build llamafactory`, `python -m sft_grid.assets build`; the tiny models
are written by LLaMA-Factory's environment). A test that asks for the `tiny_assets` or `axolotl_env` fixture is
marked `backend` here, whatever its file says, so the fast set (`-m "not backend and not slurm"`) never builds a
virtual environment. Everything else is pure or reads only small local files.
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

from sft_grid.core.paths import CONF_DIR, REPO_ROOT
from sft_grid.planning.cells import Cell, plan_cell
from sft_grid.planning.compose import GridComposer
from sft_grid.planning.config import register

register()


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if {"tiny_assets", "axolotl_env"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.backend)


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
        composed, errors = composer.compose_all([
            [*c] if any(o.startswith("runs_root=") for o in c) else [*c, f"runs_root={tmp_path / 'runs'}"]
            for c in cells])
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
    from sft_grid.stages import assets
    from sft_grid.stages.venv_build import build

    build("llamafactory")
    return assets.build()


@pytest.fixture(scope="session")
def axolotl_env(tiny_assets: Path) -> Path:
    """The managed axolotl environment (built on first use, about 3-5 minutes), with the tiny assets."""
    from sft_grid.stages.venv_build import build

    return build("axolotl")


@pytest.fixture
def runs_root(tmp_path: Path, tiny_assets: Path) -> Iterator[Path]:
    """A test's runs_root on the local Slurm cluster; afterwards every array its cells name is cancelled."""
    from .helpers import cancel_jobs_of

    root = tmp_path / "runs"
    root.mkdir()
    try:
        yield root
    finally:
        cancel_jobs_of(root)


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/receiver.py), shut down after the test."""
    from .receiver import Receiver

    r = Receiver()
    yield r
    r.close()
