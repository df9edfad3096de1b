"""Which virtual environment a cell trains in, and the pinned specs of the managed ones (pure).

A managed virtual environment is created by project code from pins (conf/backend/<name>.yaml `venv:`, the
harness's conf/harness/<name>.yaml) and its lock (conf/locks/<name>.txt: every package of a verified build at its
version, given to pip as constraints, so that every build installs the same packages and pip has nothing to
resolve) at `<cache root>/envs/<name>-<hash of its pins and lock>`: changing a pin or the lock makes a new one,
and CI caches them by that key. The orchestrator never imports a backend: it only runs programs from these
environments. Building them (and writing a lock afresh) is sft_grid/stages/venv_build.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sft_grid.core import project
from sft_grid.core.paths import PACKAGE_CONF, venvs_dir
from sft_grid.core.schema import CellConf, ClusterConf, VenvSpecConf, fingerprint

READY_MARKER = ".sft_grid_ready"
# Model needs (conf/model `needs`) that only a virtual environment with the right packages meets -> what it takes
VENV_NEEDS = {"transformers_ge_5_3": "transformers >= 5.3 (Qwen3.5's hybrid attention layers)"}


@dataclass(frozen=True)
class VenvSpec:
    name: str
    python: str
    packages: tuple[str, ...]
    packages_no_deps: tuple[str, ...] = ()
    drop_native_libs: tuple[str, ...] = ()
    check: str = ""
    lock: str = ""  # conf/locks/<name>.txt's text ("" without one)

    @classmethod
    def load(cls, name: str) -> VenvSpec:
        """The spec of a backend (conf/backend/<name>.yaml) or of a harness (conf/harness/<name>.yaml)."""
        for group in ("backend", "harness"):
            path = project.find_option(group, name)
            if path is not None:
                return cls.from_conf(name, yaml.safe_load(path.read_text())["venv"])
        known = sorted({*project.options("backend"), *project.options("harness")})
        raise KeyError(f"unknown virtual environment {name!r}: expected one of {', '.join(known)}")

    @classmethod
    def from_conf(cls, name: str, venv: Mapping[str, Any] | VenvSpecConf) -> VenvSpec:
        data = venv if isinstance(venv, Mapping) else dataclasses.asdict(venv)
        return cls(
            name=name,
            python=data["python"],
            packages=tuple(data["packages"]),
            packages_no_deps=tuple(data.get("packages_no_deps") or ()),
            drop_native_libs=tuple(data.get("drop_native_libs") or ()),
            check=data.get("check") or "",
            lock=lock_text(name),
        )

    @property
    def key(self) -> str:
        parts: list[object] = [self.python, self.packages, self.packages_no_deps, self.drop_native_libs]
        if self.lock:
            parts.append(hashlib.sha256(self.lock.encode()).hexdigest())
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return venvs_dir() / f"{self.name}-{self.key}"


def lock_path(name: str) -> Path:
    return PACKAGE_CONF / "locks" / f"{name}.txt"


@functools.cache
def lock_text(name: str) -> str:
    path = lock_path(name)
    return path.read_text() if path.is_file() else ""


def is_ready(path: Path) -> bool:
    return (path / READY_MARKER).is_file()


def managed_for(spec: CellConf) -> Path:
    """The managed virtual environment of a cell's backend pins (spec: its CellConf)."""
    return VenvSpec.from_conf(spec.backend.name, spec.backend.venv).path


def site_venvs(cluster: ClusterConf) -> dict[str, str]:
    """backend -> the site's own virtual environment (backend_venvs, or its deprecated spelling); a backend whose
    entry is null has none."""
    return {**cluster.backend_envs, **{k: v for k, v in cluster.backend_venvs.items() if v}}


def need_venvs(cluster: ClusterConf) -> dict[str, dict[str, str]]:
    return {**cluster.need_envs, **cluster.need_venvs}


# a grid's cells share their backend, cluster and model sections: each combination (by value, and by where this
# process keeps its environments and its home: a managed environment's path, a site's `~/...`) is selected once
_SELECTED: dict[tuple[str, ...], tuple[Path, str | None]] = {}


def select(spec: CellConf) -> tuple[Path, str | None]:
    """The virtual environment a cell (spec: its CellConf) trains in, and the need it leaves unmet (None: all met)."""
    key = (
        fingerprint(spec.backend),
        fingerprint(spec.cluster),
        fingerprint(spec.model),
        os.environ.get("SFT_GRID_CACHE", ""),  # what venvs_dir() and `~` read
        os.environ.get("HOME", ""),
    )
    found = _SELECTED.get(key)
    if found is None:
        if len(_SELECTED) > 4096:
            _SELECTED.clear()
        found = _SELECTED[key] = _select(spec)
    return found


def _select(spec: CellConf) -> tuple[Path, str | None]:
    """A model with a need (Qwen3.5: transformers >= 5.3) trains in the cluster's environment for that need
    (cluster.need_venvs.<need>.<backend>), or in the managed one when the backend's pins meet it (conf/backend
    `provides`) and the cluster names no environment of its own for the backend. The team's main environment
    on a site is never assumed to meet it: that is the mistake this guards against.
    """
    backend, cluster = spec.backend.name, spec.cluster
    managed = managed_for(spec)
    own = site_venvs(cluster).get(backend)
    general = Path(own).expanduser() if own else managed
    for need in (n for n in spec.model.needs if n in VENV_NEEDS):
        named = (need_venvs(cluster).get(need) or {}).get(backend)
        if named:
            return Path(named).expanduser(), None
        if general == managed and need in spec.backend.provides:
            return managed, None
        return general, need
    return general, None


def bin_dir(spec: CellConf) -> Path:
    """The bin/ of the virtual environment a cell trains in."""
    return select(spec)[0] / "bin"
