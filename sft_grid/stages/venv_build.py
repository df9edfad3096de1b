"""Building a managed virtual environment from its pins and lock (planning/environments.py says which, and where).

    python -m sft_grid.venv build llamafactory     # create (no-op when a finished one exists)
    python -m sft_grid.venv lock llamafactory      # resolve the pins afresh, write conf/locks/llamafactory.txt

Safe to call concurrently: a lock per environment, and the second builder finds the work done. A build that
was interrupted is started over; the ready marker is written last, so a half-built environment is never used.
pip gets the lock file as constraints: every package at the version of the verified build, so its resolver
has one candidate each and nothing to search (without one, axolotl's 240 packages kept pip's resolver busy for
minutes). Bytecode is not compiled at install (--no-compile): Python compiles what is imported, when it is.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

from sft_grid.core.lock import Lock
from sft_grid.planning.environments import READY_MARKER, VenvSpec, is_ready, lock_path

log = logging.getLogger(__name__)


def _run(argv: list[str]) -> None:
    log.info("$ %s", " ".join(argv))
    subprocess.run(argv, check=True)


def build(name: str) -> Path:
    """Create the named environment (a backend's or a harness's) unless a finished one exists."""
    spec = VenvSpec.load(name)
    target = spec.path
    target.parent.mkdir(parents=True, exist_ok=True)
    with Lock(target.parent / f".{target.name}.lock"):
        if is_ready(target):
            return target
        if target.exists():  # an interrupted build: start over
            shutil.rmtree(target)
        _install(spec, target, locked=bool(spec.lock))
        (target / READY_MARKER).write_text(json.dumps({"packages": spec.packages + spec.packages_no_deps}))
    return target


def _install(spec: VenvSpec, target: Path, locked: bool) -> None:
    python = shutil.which(spec.python) or sys.executable
    _run([python, "-m", "venv", str(target)])
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    if locked:
        pip += ["-c", str(lock_path(spec.name))]
    _run(pip + list(spec.packages))
    if spec.packages_no_deps:
        _run([*pip, "--no-deps", *spec.packages_no_deps])
    for module in spec.drop_native_libs:
        _drop_native_libs(target, module)
    if spec.check:
        _run([str(target / "bin" / "python"), "-c", spec.check])


def relock(name: str) -> Path:
    """Resolve the pins afresh in a scratch environment (no lock), check it as a build does, and write what it
    installed as the lock; the next build is then a new environment (its key has the lock's hash)."""
    spec = VenvSpec.load(name)
    scratch = spec.path.parent / f".lock-{name}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _install(spec, scratch, locked=False)
        frozen = subprocess.run(
            [str(scratch / "bin" / "python"), "-m", "pip", "freeze", "--disable-pip-version-check"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# {name}: every package of a verified build of its pins (python -m sft_grid.venv lock {name})\n" + frozen
    )
    return path


def _drop_native_libs(venv: Path, module: str) -> None:
    for site in (venv / "lib").glob("python3*/site-packages"):
        for so in (site / module / "lib").glob("*.so"):
            so.unlink()
