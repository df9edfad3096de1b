"""One grid invocation at a time decides and submits for a sweep directory (two invocations take turns)."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO, Any

from sft_grid.core.layout import LOCK_FILE


class SweepLock:
    def __init__(self, sweep_dirs: set[Path]) -> None:
        self.paths = sorted(sweep_dirs)
        self.handles: list[IO[Any]] = []

    def __enter__(self) -> "SweepLock":
        for path in self.paths:
            path.mkdir(parents=True, exist_ok=True)
            handle = open(path / LOCK_FILE, "w")
            fcntl.flock(handle, fcntl.LOCK_EX)
            self.handles.append(handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.close()
