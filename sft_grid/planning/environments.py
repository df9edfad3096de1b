"""Which virtual environment a cell trains in, and the pinned specs of the managed ones.

A managed virtual environment is created by project code from pins (conf/backend/<name>.yaml `venv:`, the
harness's conf/harness/<name>.yaml) and its lock (conf/locks/<name>.txt: every package of a verified build at its
version, given to pip as constraints, so that every build installs the same packages and pip has nothing to
resolve) at `<cache root>/envs/<name>-<hash of its pins and lock>`: changing a pin or the lock makes a new one,
and CI caches them by that key. The orchestrator never imports a backend: it only runs programs from these
environments. Building them (and writing a lock afresh) is sft_grid/stages/venv_build.py.

A site names its own environment instead (`cluster.backend_venvs.<backend>`, `need_venvs`): a virtualenv's or a conda
environment's directory (bin/python in it), or a conda environment by name (`sft311`, or `conda:sft311`), found the
way conda finds it (`locate`, reading conda's own files: conda need not run, nor be activated). Whether it is usable
(there, its python runs, the backend importable) is checked before anything is queued: sft_grid/checks/own_envs.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
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
    """backend -> the directory of the site's own environment (backend_venvs, or its deprecated spelling; a conda
    environment's name resolved to its directory, `where`); a backend whose entry is null has none."""
    named = {**cluster.backend_envs, **{k: v for k, v in cluster.backend_venvs.items() if v}}
    return {k: str(where(v)) for k, v in named.items() if v}


def need_venvs(cluster: ClusterConf) -> dict[str, dict[str, str]]:
    return {**cluster.need_envs, **cluster.need_venvs}


def own_entry(cluster: ClusterConf, name: str) -> tuple[str, str] | None:
    """(the dotted key, the value as written) of the site's own environment for a backend or a harness (`name`), or
    None where the cluster names none (the managed one is used)."""
    if cluster.backend_venvs.get(name):
        return f"cluster.backend_venvs.{name}", str(cluster.backend_venvs[name])
    if cluster.backend_envs.get(name):
        return f"cluster.backend_envs.{name}", cluster.backend_envs[name]
    return None


def _need_entry(cluster: ClusterConf, need: str, backend: str) -> tuple[str, str] | None:
    """(key, value) of the cluster's environment for a model need and a backend (for a need, need_venvs wins over
    the deprecated need_envs as a whole, as `need_venvs` merges them), or None."""
    named = (need_venvs(cluster).get(need) or {}).get(backend)
    if not named:
        return None
    field = "need_venvs" if need in cluster.need_venvs else "need_envs"
    return f"cluster.{field}.{need}.{backend}", named


def own_source(spec: CellConf) -> tuple[str, str] | None:
    """(key, value as written) of the site's own environment the cell trains in (the one `select` picks), or None
    where it trains in the managed one."""
    need = next((n for n in spec.model.needs if n in VENV_NEEDS), None)  # the first need decides, as in `_select`
    named = _need_entry(spec.cluster, need, spec.backend.name) if need else None
    return named or own_entry(spec.cluster, spec.backend.name)


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
        _cwd(),  # a relative path is the working directory's
        *(os.environ.get(v, "") for v in CONDA_VARIABLES),  # where a conda environment's name is looked up
    )
    found = _SELECTED.get(key)
    if found is None:
        if len(_SELECTED) > 4096:
            _SELECTED.clear()
        found = _SELECTED[key] = _select(spec)
    return found


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # a working directory removed under the process: a relative value cannot be resolved anyway
        return ""


def _select(spec: CellConf) -> tuple[Path, str | None]:
    """A model with a need (Qwen3.5: transformers >= 5.3) trains in the cluster's environment for that need
    (cluster.need_venvs.<need>.<backend>), or in the managed one when the backend's pins meet it (conf/backend
    `provides`) and the cluster names no environment of its own for the backend. The team's main environment
    on a site is never assumed to meet it: that is the mistake this guards against.
    """
    backend, cluster = spec.backend.name, spec.cluster
    managed = managed_for(spec)
    own = own_entry(cluster, backend)
    general = where(own[1]) if own else managed
    for need in (n for n in spec.model.needs if n in VENV_NEEDS):
        named = _need_entry(cluster, need, backend)
        if named:
            return where(named[1]), None
        if general == managed and need in spec.backend.provides:
            return managed, None
        return general, need
    return general, None


def bin_dir(spec: CellConf) -> Path:
    """The bin/ of the virtual environment a cell trains in (a conda environment's name resolved to its directory:
    what launch.sh puts first on PATH, and the python of every job of the cell)."""
    return select(spec)[0] / "bin"


# -- conda environments by name -----------------------------------------------------------------------------------
# A value with no "/" (and not ~ . ..) names a conda environment, as `conda activate` reads its argument (a path
# separator makes it a prefix); `conda:NAME` says so explicitly. Found where conda itself finds it, from conda's own
# files and variables, without running conda:
# - conda's `locate_prefix_by_name` (conda/base/context.py) takes the first of `context.envs_dirs` that has a
#   directory NAME; "base" (and "root") is the root prefix;
# - `context.envs_dirs` is the configured `envs_dirs` first (.condarc's `envs_dirs`, or its alias `envs_path`; the
#   variables CONDA_ENVS_DIRS / CONDA_ENVS_PATH, os.pathsep-separated, win over the files), then <root>/envs, then
#   ~/.conda/envs ("Specify environment directories (envs_dirs)" in conda's configuration docs,
#   https://docs.conda.io/projects/conda/en/latest/user-guide/configuration/use-condarc.html);
# - the .condarc files, lowest precedence first, are conda's search path (conda/base/constants.py SEARCH_PATH, the
#   docs' "Searching for .condarc"): /etc/conda, /var/lib/conda, $CONDA_ROOT, $XDG_CONFIG_HOME/conda,
#   ~/.config/conda, ~/.conda (each .condarc, condarc and condarc.d/*.yml), ~/.condarc, $CONDA_PREFIX's, $CONDARC;
# - the root prefix is the installation's: $CONDA_EXE's (<root>/bin/conda or <root>/condabin/conda) and
#   $CONDA_PYTHON_EXE's, $_CONDA_ROOT, or $CONDA_PREFIX's (the active environment: <root>/envs/<name>, or the root),
#   the variables conda's shell hook and activation set (the docs' "`conda init` and `conda activate`" deep dive,
#   https://docs.conda.io/projects/conda/en/latest/dev-guide/deep-dives/activation.html);
# - ~/.conda/environments.txt is conda's registry of every environment it created (conda/core/envs_manager.py
#   `register_env`, read by `conda env list`): an entry whose last part is NAME is taken too (after the envs_dirs),
#   and a registered root prefix (one with condabin/) gives <root>/envs, so a name resolves where conda was never
#   activated in the shell that runs the grid;
# - last, when a `conda` executable is on PATH, what `conda env list --json` lists (asked once per process, only for
#   a name not found otherwise).
CONDA_SCHEME = "conda:"
# the variables the lookup reads (the cached `select` keys on them)
CONDA_VARIABLES = (
    "CONDA_PREFIX",
    "CONDA_EXE",
    "CONDA_PYTHON_EXE",
    "_CONDA_ROOT",
    "CONDA_ROOT",
    "CONDARC",
    "CONDA_ENVS_DIRS",
    "CONDA_ENVS_PATH",
    "XDG_CONFIG_HOME",
)
ROOT_NAMES = ("base", "root")


@dataclass(frozen=True)
class Located:
    """Where a configured environment value (`cluster.backend_venvs.<backend>`) is: its directory (absolute), or None
    for a conda name no registry here knows; for a name, the names the registries know and where it looked."""

    value: str
    path: Path | None
    name: str | None = None  # the conda environment's name, where the value gives one
    known: tuple[str, ...] = ()
    searched: tuple[str, ...] = ()


def conda_name(value: str) -> str | None:
    """The conda environment's name a value gives (`sft311`, `conda:sft311`), or None for a directory."""
    if value.startswith(CONDA_SCHEME):
        return value[len(CONDA_SCHEME) :].strip()
    if "/" in value or value.startswith("~") or value in (".", ".."):
        return None
    return value


def locate(value: str) -> Located:
    """The environment a value names: a directory (~ expanded, made absolute), or a conda environment by name."""
    name = conda_name(value)
    if name is None:
        return Located(value, Path(os.path.abspath(os.path.expanduser(value))))
    roots = _conda_roots()
    dirs = conda_envs_dirs(roots)
    registered = _registered()
    searched = (*(_home_short(d) for d in dirs), _home_short(environments_txt()))
    if name in ROOT_NAMES and roots:
        return Located(value, roots[0], name)
    for prefix in [d / name for d in dirs] + [p for p in registered if p.name == name]:
        if name and prefix.is_dir():
            return Located(value, Path(os.path.abspath(prefix)), name)
    listed = _conda_env_list() if name else ()
    for prefix in listed:
        if prefix.name == name and prefix.is_dir():
            return Located(value, prefix, name)
    known = {p.name for d in dirs for p in _children(d) if (p / "conda-meta").is_dir()}
    known |= {p.name for p in (*registered, *listed) if p.is_dir() and p not in roots}
    if roots:
        known.add("base")
    if listed:
        searched = (*searched, "conda env list")
    return Located(value, None, name, tuple(sorted(known)), searched)


def where(value: str) -> Path:
    """The directory a configured environment value stands for; a conda name no registry knows stays as written
    (own_envs refuses it before anything is queued)."""
    found = locate(value).path
    return found if found is not None else Path(value)


def environments_txt() -> Path:
    """conda's registry of the environments it created (conda/core/envs_manager.py)."""
    return Path.home() / ".conda" / "environments.txt"


def _home_short(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home) :] if home not in ("", "/") and text.startswith(home + "/") else text


def _children(directory: Path) -> Iterator[Path]:
    try:
        yield from sorted(directory.iterdir())
    except OSError:
        return


def _conda_roots() -> list[Path]:
    """The root prefixes of the conda installations the process's variables and conda's registry name (each a
    directory with conda-meta/); the first is "base"."""
    env = os.environ
    candidates = [Path(env[v]).parent.parent for v in ("CONDA_EXE", "CONDA_PYTHON_EXE") if env.get(v)]
    candidates += [Path(env[v]) for v in ("_CONDA_ROOT", "CONDA_ROOT") if env.get(v)]
    if env.get("CONDA_PREFIX"):
        active = Path(env["CONDA_PREFIX"])
        candidates.append(active.parent.parent if active.parent.name == "envs" else active)
    candidates += [p for p in _registered() if (p / "condabin").is_dir()]
    return _unique(p for p in candidates if (p / "conda-meta").is_dir())


def _condarc_files(roots: Iterable[Path]) -> list[Path]:
    """conda's .condarc search path on Linux, lowest precedence first (those that exist)."""
    home, env = Path.home(), os.environ
    places = [Path("/etc/conda"), Path("/var/lib/conda"), *roots]
    if env.get("XDG_CONFIG_HOME"):
        places.append(Path(env["XDG_CONFIG_HOME"]) / "conda")
    places += [home / ".config" / "conda", home / ".conda"]
    files: list[Path] = []
    for place in places:
        files += [place / ".condarc", place / "condarc", *_yaml_files(place / "condarc.d")]
    files.append(home / ".condarc")
    if env.get("CONDA_PREFIX"):
        place = Path(env["CONDA_PREFIX"])
        files += [place / ".condarc", place / "condarc", *_yaml_files(place / "condarc.d")]
    if env.get("CONDARC"):
        files.append(Path(os.path.expanduser(env["CONDARC"])))
    return [f for f in _unique(files) if f.is_file()]


def _yaml_files(directory: Path) -> list[Path]:
    return [p for p in _children(directory) if p.suffix in (".yml", ".yaml")]


def _envs_dirs_in(condarc: Path) -> list[str]:
    """A .condarc's `envs_dirs` (or `envs_path`); nothing where it cannot be read (conda would complain: not ours)."""
    try:
        data = yaml.safe_load(condarc.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return []
    if not isinstance(data, dict):
        return []
    found = data.get("envs_dirs", data.get("envs_path")) or []
    return [str(d) for d in ([found] if isinstance(found, str) else found) if d]


def conda_envs_dirs(roots: list[Path] | None = None) -> list[Path]:
    """conda's `envs_dirs` as conda would compute them here: the configured ones (variables, then .condarc files,
    highest precedence first), then each root's envs/, then ~/.conda/envs."""
    roots = _conda_roots() if roots is None else roots
    configured = [d for v in ("CONDA_ENVS_DIRS", "CONDA_ENVS_PATH") for d in os.environ.get(v, "").split(os.pathsep)]
    for condarc in reversed(_condarc_files(roots)):
        configured += _envs_dirs_in(condarc)
    expanded = [Path(os.path.abspath(os.path.expanduser(os.path.expandvars(d)))) for d in configured if d]
    return _unique([*expanded, *(r / "envs" for r in roots), Path.home() / ".conda" / "envs"])


def _registered() -> list[Path]:
    """The prefixes ~/.conda/environments.txt lists (conda appends each environment it creates)."""
    try:
        lines = environments_txt().read_text().splitlines()
    except OSError:
        return []
    return _unique(Path(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _conda_env_list() -> tuple[Path, ...]:
    """What `conda env list --json` lists, where a `conda` is on PATH (nothing otherwise, or when it fails)."""
    conda = shutil.which("conda")
    return _conda_env_list_of(conda) if conda else ()


@functools.cache
def _conda_env_list_of(conda: str) -> tuple[Path, ...]:
    try:
        proc = subprocess.run([conda, "env", "list", "--json"], capture_output=True, text=True, timeout=60)
        envs = (json.loads(proc.stdout).get("envs") or []) if proc.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired, AttributeError):
        return ()
    return tuple(Path(e) for e in envs if isinstance(e, str))


def _unique(paths: Iterable[Path]) -> list[Path]:
    return list(dict.fromkeys(paths))
