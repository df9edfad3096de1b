"""Backend virtual environments, created by project code from the pins in conf/backend/<name>.yaml.

Each environment lives under the cache root at ``envs/<backend>-<hash of its pins>``, so changing a pin
builds a new one and CI can cache them by key. The orchestrator never imports a backend: it only runs
programs from these environments.

    python -m sft_grid.env build llamafactory     # create (no-op when it exists)
    python -m sft_grid.env path llamafactory      # print its location
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from sft_grid.paths import CONF_DIR, envs_dir

log = logging.getLogger(__name__)

READY_MARKER = ".sft_grid_ready"


@dataclass(frozen=True)
class EnvSpec:
    backend: str
    python: str
    packages: tuple[str, ...]
    packages_no_deps: tuple[str, ...]
    drop_native_libs: tuple[str, ...]
    check: str

    @classmethod
    def load(cls, backend: str) -> "EnvSpec":
        path = CONF_DIR / "backend" / f"{backend}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (CONF_DIR / "backend").glob("*.yaml"))
            raise SystemExit(f"unknown backend {backend!r}: expected one of {known}")
        return cls.from_conf(backend, yaml.safe_load(path.read_text())["env"])

    @classmethod
    def from_conf(cls, backend: str, env: Mapping[str, Any]) -> "EnvSpec":
        return cls(
            backend=backend,
            python=env["python"],
            packages=tuple(env["packages"]),
            packages_no_deps=tuple(env.get("packages_no_deps", ())),
            drop_native_libs=tuple(env.get("drop_native_libs", ())),
            check=env["check"],
        )

    @property
    def key(self) -> str:
        blob = json.dumps([self.python, self.packages, self.packages_no_deps, self.drop_native_libs])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return envs_dir() / f"{self.backend}-{self.key}"


def managed_env(backend: str) -> Path:
    return EnvSpec.load(backend).path


# Model needs (conf/model `needs`) that only an environment with the right packages meets -> what it takes
ENV_NEEDS = {"transformers_ge_5_3": "transformers >= 5.3 (Qwen3.5's hybrid attention layers)"}


def select(spec: Any) -> tuple[Path, str | None]:
    """The environment a cell (spec: its CellConf) trains in, and the need it leaves unmet (None: all met).

    A model with an environment need (Qwen3.5: transformers >= 5.3) trains in the cluster's environment for
    that need (cluster.need_envs.<need>.<backend>), or in the managed one when the backend's pins meet it
    (conf/backend `provides`) and the cluster names no environment of its own for the backend. The team's
    main environment on a site is never assumed to meet it: that is the mistake this guards against.
    """
    backend, cluster = spec.backend.name, spec.cluster
    managed = managed_for(spec)
    general = Path(cluster.backend_envs[backend]).expanduser() if cluster.backend_envs.get(backend) else managed
    for need in (n for n in spec.model.needs if n in ENV_NEEDS):
        named = (cluster.need_envs.get(need) or {}).get(backend)
        if named:
            return Path(named).expanduser(), None
        if general == managed and need in spec.backend.provides:
            return managed, None
        return general, need
    return general, None


def managed_for(spec: Any) -> Path:
    """The managed environment of a cell's backend pins (spec: its CellConf)."""
    return EnvSpec.from_conf(spec.backend.name, _plain(spec.backend.env)).path


def _plain(env: Any) -> dict[str, Any]:
    return dict(env) if isinstance(env, Mapping) else {k: getattr(env, k) for k in vars(env)}


def is_ready(path: Path) -> bool:
    return (path / READY_MARKER).is_file()


def _run(argv: list[str]) -> None:
    log.info("$ %s", " ".join(argv))
    subprocess.run(argv, check=True)


def build(backend: str) -> Path:
    """Create the backend's environment unless a finished one exists. Safe to call concurrently."""
    spec = EnvSpec.load(backend)
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
        _run([str(target / "bin" / "python"), "-c", spec.check])
        (target / READY_MARKER).write_text(json.dumps({"packages": spec.packages + spec.packages_no_deps}))
    return target


def _drop_native_libs(env: Path, module: str) -> None:
    for site in (env / "lib").glob("python3*/site-packages"):
        for so in (site / module / "lib").glob("*.so"):
            so.unlink()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sft_grid.env", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "path", "key"])
    parser.add_argument("backend")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.action == "build":
        print(build(args.backend))
    elif args.action == "path":
        print(managed_env(args.backend))
    else:
        print(EnvSpec.load(args.backend).key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
