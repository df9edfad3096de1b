"""The checks' disk cache: where it is, and what keys an answer to the files it was computed from.

A check whose answer costs a backend process (the loss-mask probe, the environment's facts, a prepared tokenizer) is
cached under <cache root>/preflight/, keyed by what it read: each file's path, size and mtime, and the backend
environment's ready marker (rebuilt: asked again).
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
