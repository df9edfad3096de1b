"""The checks' disk cache: where it is, and what keys an answer to the files it was computed from.

A check whose answer costs a backend process (the loss-mask probe, the environment's facts, a prepared tokenizer) is
cached under <cache root>/preflight/, keyed by what it read: each file's path, size and mtime, and the backend
environment's ready marker and site-packages directories (rebuilt, or a package installed: asked again).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sft_grid.core.paths import cache_root
from sft_grid.planning.environments import READY_MARKER


def cache_dir() -> Path:
    """<cache root>/preflight, or $SFT_GRID_PREFLIGHT_CACHE (tests and timing use a fresh one)."""
    return Path(os.environ.get("SFT_GRID_PREFLIGHT_CACHE") or cache_root() / "preflight")


def stat_key(path: Path) -> list[Any]:
    """A file's part of a cache key: its path, size and mtime (None for a file that is not there)."""
    try:
        st = path.stat()
        return [str(path), st.st_size, st.st_mtime_ns]
    except OSError:
        return [str(path), None]


def venv_marker(python: str) -> Path:
    """The ready marker of the environment a python belongs to (rewritten when it is built or compiled again)."""
    return Path(python).parent.parent / READY_MARKER


def env_state(python: str) -> list[Any]:
    """The part of a cache key that changes with what the environment of a python has installed: its ready marker
    (a managed environment built again) and its site-packages directories (a `pip install` or `conda install` into a
    site's own environment, which has no marker, adds or removes entries there and so changes their mtime)."""
    prefix = Path(python).parent.parent
    return [stat_key(venv_marker(python)), *(stat_key(p) for p in sorted(prefix.glob("lib/python*/site-packages")))]
