"""Where sft_grid keeps things outside the repository: one cache root, overridable by environment."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"


def cache_root() -> Path:
    """Backend environments and tiny assets live here, shared by every checkout (CI caches it)."""
    return Path(os.environ.get("SFT_GRID_CACHE") or Path.home() / ".cache" / "sft_grid")


def assets_dir() -> Path:
    return cache_root() / "assets"


def envs_dir() -> Path:
    return cache_root() / "envs"
