"""Building a managed virtual environment from its pins and lock (planning/environments.py says which, and where).

    sft-grid venv build llamafactory     # create (no-op when a finished one exists)
    sft-grid venv lock llamafactory      # resolve the pins afresh, write conf/locks/llamafactory.txt

Safe to call concurrently: a lock per environment, and the second builder finds the work done. A build that
was interrupted is started over; the ready marker is written last, so a half-built environment is never used.
pip gets the lock file as constraints: every package at the version of the verified build, so its resolver
has one candidate each and nothing to search (without one, axolotl's 240 packages kept pip's resolver busy for
minutes). pip installs without compiling (--no-compile, one file at a time); the whole environment is then compiled
in one parallel `compileall`, and the ready marker says so (`"bytecode": true` and the rule it was compiled by,
`"bytecode_rule"`). Without it, where
PYTHONDONTWRITEBYTECODE=1 is set (common on shared systems, and on this project's CI machines) no process ever
writes bytecode, so every backend process compiles its libraries again: importing LLaMA-Factory's trainer measured
16.8 s without bytecode and 8.3 s with it, and array tasks starting at once on a shared filesystem each did it.
An environment built before this is compiled once, on its next `build`.
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
            record = json.loads((target / READY_MARKER).read_text() or "{}")
            if record.get("bytecode_rule", 1 if record.get("bytecode") else 0) < BYTECODE_RULE:
                # built before environments carried their bytecode, or by an earlier rule that left some out:
                # compileall compiles only what has no current bytecode
                _compile(target)
                _write_marker(target, {**record, "bytecode": True, "bytecode_rule": BYTECODE_RULE})
            return target
        if target.exists():  # an interrupted build: start over
            shutil.rmtree(target)
        _install(spec, target, locked=bool(spec.lock))
        _compile(target)
        record = {"packages": spec.packages + spec.packages_no_deps, "bytecode": True, "bytecode_rule": BYTECODE_RULE}
        _write_marker(target, record)
    return target


def _write_marker(target: Path, record: dict[str, object]) -> None:
    tmp = target / f"{READY_MARKER}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(target / READY_MARKER)


# packages' own test suites (tests/, test/) are never imported by a job: left out, a third of torch's files. Rule 1
# also left out testing/ directories, but torch imports part of torch/testing/ whenever it is imported (9 modules
# compiled in every LLaMA-Factory process, seen with `python -v`): rule 2 compiles them.
BYTECODE_RULE = 2
_TESTS = r"/tests?/"


def _compile(target: Path) -> None:
    """Every module of the environment compiled to bytecode by its own interpreter, on every core. A file that does
    not compile (a package's Python 2 example, a template with a .py name) is left as it is: compileall says so and
    goes on, and no import of it would work either. Timestamp-checked bytecode, whatever SOURCE_DATE_EPOCH says
    (with it set, compileall would write hash-checked bytecode: every import would read and hash its source)."""
    for site in sorted((target / "lib").glob("python3*/site-packages")):
        argv = [str(target / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", "-x", _TESTS]
        argv += ["--invalidation-mode", "timestamp", str(site)]
        log.info("$ %s", " ".join(argv))
        rc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        if rc:
            log.info("compileall: some files of %s do not compile (exit %d); the rest are compiled", site, rc)


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
    path.write_text(f"# {name}: every package of a verified build of its pins (sft-grid venv lock {name})\n" + frozen)
    return path


def _drop_native_libs(venv: Path, module: str) -> None:
    for site in (venv / "lib").glob("python3*/site-packages"):
        for so in (site / module / "lib").glob("*.so"):
            so.unlink()
