"""The managed environments' locks (conf/locks/<name>.txt): every pin of a spec is in its lock at the pinned version,
the lock is in the environment's key, and a build gives pip the lock as constraints and compiles no bytecode. The
environments built from them are used by every backend test (tests/conftest.py); building one here would take
minutes."""

from __future__ import annotations

import re

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
