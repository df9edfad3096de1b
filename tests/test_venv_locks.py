"""The managed environments' locks (conf/locks/<name>.txt): every pin of a spec is in its lock at the pinned version,
the lock is in the environment's key, and a build gives pip the lock as constraints and compiles no bytecode (the
environment is compiled afterwards, in one parallel compileall). The environments built from them are used by every
backend test (tests/conftest.py); building one here would take minutes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sft_grid.planning import environments
from sft_grid.planning.environments import VenvSpec, lock_path
from sft_grid.stages import venv_build

NAMES = ("llamafactory", "axolotl", "lm_eval")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned with ==: {line!r}"
            out[_norm(name)] = version.split("+")[0]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_pin_is_in_the_lock_at_its_version(name):
    spec = VenvSpec.load(name)
    assert spec.lock and spec.lock == lock_path(name).read_text()
    locked = _locked(spec.lock)
    for pin in (*spec.packages, *spec.packages_no_deps):
        package, _, version = pin.partition("==")
        assert locked.get(_norm(package)) == version, f"{name}: {pin} is {locked.get(_norm(package))} in the lock"


def test_the_lock_is_part_of_the_key(monkeypatch):
    spec = VenvSpec.load("llamafactory")
    other = VenvSpec(**{**spec.__dict__, "lock": spec.lock + "extra==1.0\n"})
    unlocked = VenvSpec(**{**spec.__dict__, "lock": ""})
    assert len({spec.key, other.key, unlocked.key}) == 3


def test_a_build_gives_pip_the_lock_and_no_bytecode(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(venv_build, "_run", calls.append)
    spec = VenvSpec.load("llamafactory")
    venv_build._install(spec, tmp_path / "env", locked=True)
    pip = [c for c in calls if "pip" in c]
    assert pip and all("--no-compile" in c and c[c.index("-c") + 1] == str(lock_path("llamafactory")) for c in pip)
    assert any("--no-deps" in c for c in pip) == bool(spec.packages_no_deps)
    calls.clear()
    venv_build._install(spec, tmp_path / "env", locked=False)
    assert all("-c" not in c for c in calls if "pip" in c)


def test_relock_writes_what_the_scratch_environment_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(venv_build, "lock_path", lambda name: tmp_path / "locks" / f"{name}.txt")
    monkeypatch.setattr(venv_build, "_install", lambda spec, target, locked: (target / "bin").mkdir(parents=True))

    class Frozen:
        stdout = "a==1\nb==2\n"

    monkeypatch.setattr(venv_build.subprocess, "run", lambda *a, **k: Frozen())
    monkeypatch.setattr(environments, "venvs_dir", lambda: tmp_path / "envs")
    path = venv_build.relock("llamafactory")
    assert path.read_text().splitlines()[1:] == ["a==1", "b==2"]
    assert not (tmp_path / "envs" / ".lock-llamafactory").exists()


def test_an_environment_compiled_by_an_earlier_rule_is_compiled_again_once(monkeypatch, tmp_path):
    """Rule 1 left out testing/ directories, which torch imports: the next build compiles what is missing, says so in
    the ready marker, and the build after it compiles nothing. Packages' tests/ stay out."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (site,) = (env / "lib").glob("python3*/site-packages")
    for rel in ("pkg/__init__.py", "pkg/testing/helpers.py", "pkg/tests/test_pkg.py"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("X = 1\n")
    (env / environments.READY_MARKER).write_text(json.dumps({"packages": ["pkg"], "bytecode": True}))
    monkeypatch.setattr(venv_build, "VenvSpec", SimpleNamespace(load=lambda name: SimpleNamespace(path=env)))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1")  # would make compileall write hash-checked bytecode

    assert venv_build.build("pkg") == env
    record = json.loads((env / environments.READY_MARKER).read_text())
    assert record["bytecode"] is True and record["bytecode_rule"] == venv_build.BYTECODE_RULE
    compiled = {p.relative_to(site).parent.parent.as_posix() for p in site.rglob("*.pyc")}
    assert compiled == {"pkg", "pkg/testing"}
    (pyc,) = (site / "pkg" / "testing" / "__pycache__").glob("helpers.*.pyc")
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0  # flags 0: timestamp-checked, not hash-checked
    calls: list[Path] = []
    monkeypatch.setattr(venv_build, "_compile", calls.append)
    venv_build.build("pkg")
    assert calls == []


@pytest.mark.backend
def test_a_backend_process_imports_from_bytecode_where_nothing_writes_any(tiny_assets):
    """With PYTHONDONTWRITEBYTECODE=1 (this project's CI) a backend process compiles nothing: every module
    LLaMA-Factory's trainer imports is read from the environment's own bytecode (`python -v` names each file)."""
    python = VenvSpec.load("llamafactory").path / "bin" / "python"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [str(python), "-v", "-c", "import llamafactory.train.tuner"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = [line.split(" from ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("# code object from")]
    assert len(loaded) > 1000
    assert [f for f in loaded if not f.rstrip("'").endswith(".pyc")] == []
