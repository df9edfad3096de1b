"""Building a managed virtual environment from its pins (planning/venvs.py says which, and where).

    python -m sft_grid.venv build llamafactory     # create (no-op when a finished one exists)

Safe to call concurrently: a lock per environment, and the second builder finds the work done. A build that
was interrupted is started over; the ready marker is written last, so a half-built environment is never used.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from sft_grid.planning.venvs import READY_MARKER, VenvSpec, is_ready

log = logging.getLogger(__name__)


def _run(argv: list[str]) -> None:
    log.info("$ %s", " ".join(argv))
    subprocess.run(argv, check=True)


def build(name: str) -> Path:
    """Create the named environment (a backend's or a harness's) unless a finished one exists."""
    spec = VenvSpec.load(name)
    target = spec.path
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(target):
            return target
        if target.exists():  # an interrupted build: start over
            shutil.rmtree(target)
        python = shutil.which(spec.python) or sys.executable
        _run([python, "-m", "venv", str(target)])
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(pip + list(spec.packages))
        if spec.packages_no_deps:
            _run(pip + ["--no-deps"] + list(spec.packages_no_deps))
        for module in spec.drop_native_libs:
            _drop_native_libs(target, module)
        if spec.check:
            _run([str(target / "bin" / "python"), "-c", spec.check])
        (target / READY_MARKER).write_text(json.dumps({"packages": spec.packages + spec.packages_no_deps}))
    return target


def _drop_native_libs(venv: Path, module: str) -> None:
    for site in (venv / "lib").glob("python3*/site-packages"):
        for so in (site / module / "lib").glob("*.so"):
            so.unlink()
