"""Where sft_grid keeps things outside the repository: one cache root, overridable by environment."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# the checkout (or site-packages) the package sits in: a git checkout's root when run from one
REPO_ROOT = PACKAGE_DIR.parent
# the shipped config groups, package data (pkg://sft_grid.conf); a team's own come first (core/project.py)
PACKAGE_CONF = PACKAGE_DIR / "conf"
# code that runs with the python of a backend's (or the harness's) virtual environment, never in the orchestrator
IN_VENV_DIR = PACKAGE_DIR / "in_venv"


def cache_root() -> Path:
    """Virtual environments, tiny assets and check results live here, shared by every checkout (CI caches it)."""
    return Path(os.environ.get("SFT_GRID_CACHE") or Path.home() / ".cache" / "sft_grid")


def assets_dir() -> Path:
    return cache_root() / "assets"


def venvs_dir() -> Path:
    return cache_root() / "envs"
