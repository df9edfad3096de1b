"""Where a grid's configs come from: the team's own repository first, then the configs sft_grid ships.

A team keeps its clusters, models, datasets and sweeps in its own repository and installs sft_grid as a tool. The
repository a command runs in is found from the working directory upwards, stopping at the repository's root (the
first directory with `.git`):

- a project file, `sft_grid.yaml` (what `sft-grid init` writes), names its config folder relative to itself
  (`conf: conf`, the default);
- without one, a `conf/` folder holding any of the config groups (`cluster/`, `model/`, `dataset/`, `sweep/`, ...)
  is the config folder;
- `$SFT_GRID_CONF` (folders separated by `:`) names config folders outright, before the project's.

A relative runs_root (the default: `runs`) is taken from the project's root, wherever in it the command runs, so a
grid's cells land in the team's repository (`sft-grid init` writes the `.gitignore` that keeps them out of git).

These folders are searched before the shipped ones (`pkg://sft_grid.conf`), so an option of the same name in the
team's repository wins; Hydra's own `--config-dir` goes before both, and `hydra.searchpath` after them, as in any
Hydra app. The Hydra side of it is hydra_plugins/sft_grid_plugins/searchpath.py; every other reader of a group
(the option lists, the sites' profiles, the environments' specs, a report's sweep file) asks `find` and `options`
here, so that what `--help` lists, what composes and what is checked are the same files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from sft_grid.core.paths import FOLDER_VARS, PACKAGE_CONF, folder_var_problem

PROJECT_FILE = "sft_grid.yaml"
CONF_ENV = "SFT_GRID_CONF"
# where grids are, when neither runs_root= nor --runs-root says (the shipped local profiles read it too)
RUNS_ENV = "SFT_GRID_RUNS"
# the groups a config folder may hold (a folder with none of them is not taken for one)
GROUPS = ("cluster", "backend", "model", "dataset", "eval", "harness", "sweep")


class ProjectError(ValueError):
    """A project file that cannot be used (which file, which key, the fix)."""


@dataclass(frozen=True)
class Project:
    root: Path  # the team's repository (where sft_grid.yaml is, or the folder holding conf/)
    conf: Path  # its config folder
    file: Path | None = None  # its sft_grid.yaml, when it has one


def _is_conf(path: Path) -> bool:
    return path.is_dir() and any((path / g).is_dir() for g in GROUPS)


def _from_file(path: Path) -> Project:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ProjectError(f"{path}: not readable as YAML ({str(exc).splitlines()[0]}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ProjectError(f"{path}: expected a mapping (conf: conf), got {type(data).__name__}")
    unknown = sorted(map(str, set(data) - {"conf"}))
    if unknown:
        raise ProjectError(f"{path}: unknown key(s) {', '.join(unknown)}; it takes conf: (the config folder)")
    value = data.get("conf", "conf")
    if not isinstance(value, str) or not value.strip():
        raise ProjectError(f"{path}: conf: {value!r} is not a folder; give a path relative to {path.parent}")
    conf = (path.parent / os.path.expanduser(value)).resolve()
    if not conf.is_dir():
        raise ProjectError(f"{path}: conf: {conf} is not a folder; create it (sft-grid init) or fix conf:")
    return Project(root=path.parent.resolve(), conf=conf, file=path)


def _upwards(start: Path) -> Iterator[Path]:
    for here in (start, *start.parents):
        yield here
        if (here / ".git").exists():  # the repository's root: a project never spans repositories
            return


_FOUND: dict[tuple[Path, str], Project | None] = {}


def _env_dirs() -> list[Path]:
    return [Path(p).expanduser().resolve() for p in os.environ.get(CONF_ENV, "").split(os.pathsep) if p.strip()]


def check_conf_env() -> None:
    """$SFT_GRID_CONF's folders are folders, as `--config-dir`'s are (cli/app.py): one that is missing or a file would
    be passed over, and the team's configs with it, silently. Set but empty (or only `:`) is refused naming it as
    empty; an empty entry beside folders (`$MINE:$SFT_GRID_CONF` with it unset) is left, as a PATH's is."""
    value = os.environ.get(CONF_ENV)
    if value is None:
        return
    entries = [p for p in value.split(os.pathsep) if p.strip()]
    if not entries:
        raise ProjectError(
            f"environment variable {CONF_ENV} is {'empty' if not value.strip() else f'{value!r}, naming no folder'}:"
            f" it names the folders of your configs (separated by ':'); `unset {CONF_ENV}` to use the project's conf/,"
            f" or export {CONF_ENV}=<folder>"
        )
    for entry in entries:
        path = Path(entry).expanduser()
        if not path.is_dir():
            what = "is a file" if path.exists() else "does not exist"
            raise ProjectError(
                f"environment variable {CONF_ENV} names {entry!r}, which {what}: it names the folders of your configs"
                f" (separated by ':'); export {CONF_ENV}=<folder> with the folders that hold them, or"
                f" `unset {CONF_ENV}`"
            )


def _search(start: Path) -> Project | None:
    for here in _upwards(start):
        if (here / PROJECT_FILE).is_file():
            return _from_file(here / PROJECT_FILE)
        if _is_conf(here / "conf") and (here / "conf").resolve() != PACKAGE_CONF:
            return Project(root=here, conf=(here / "conf").resolve())
    return None


def empty_runs(name: str) -> tuple[str, str]:
    """(why, fix) of an empty runs root: $SFT_GRID_RUNS set but empty, `runs_root=`, `cluster.runs_root=`. Read as a
    path it is the working directory (a grid's cells written straight into it, a read command looking in ./runs), or
    it is passed over for the default: never what was meant."""
    if name == RUNS_ENV:
        return (
            f"environment variable {RUNS_ENV} is empty: it names where grids are (the runs root), and an empty one"
            " would put a grid's cells straight into the working directory",
            f"`unset {RUNS_ENV}` to use runs/ at the project's root, or export {RUNS_ENV}=<directory>",
        )
    return (
        f"{name} is empty: it names where grids are (the runs root), and an empty one names no directory (it would"
        " be read as the working directory, or passed over for the default)",
        f"leave {name}= out for the default (${RUNS_ENV}, else runs/ at the project's root), or give one:"
        f" {name}=<directory>",
    )


def _runs_env() -> str | None:
    """$SFT_GRID_RUNS, or None when unset. Set but empty is refused, naming it (`empty_runs`)."""
    value = os.environ.get(RUNS_ENV)
    if value is not None and not value.strip():
        raise ProjectError("; ".join(empty_runs(RUNS_ENV)))
    return value


_FOLDERS_SEEN: set[tuple[str | None, ...]] = set()


def check_folder_vars() -> None:
    """The environment variables that name a folder (core/paths.py FOLDER_VARS: $SFT_GRID_CACHE, $HF_HOME, ...) name
    one: a file there, or a relative $SFT_GRID_CACHE, is refused naming the variable, before it is read as something
    else (a missing asset, a Hub id) or fails deep inside a read. Checked once per set of their values."""
    values = tuple(os.environ.get(v) for v in FOLDER_VARS)
    if values in _FOLDERS_SEEN:
        return
    for var in FOLDER_VARS:
        why = folder_var_problem(var)
        if why:
            raise ProjectError(why)
    _FOLDERS_SEEN.add(values)


def find(start: Path | None = None) -> Project | None:
    """The project the working directory (or `start`) is in; outside one, the project $SFT_GRID_CONF's first folder
    is in (so a cell's rerun line, which names its folders, lands in the same runs folder from anywhere); else None.
    A set but empty $SFT_GRID_RUNS, and a $SFT_GRID_CONF that names no folder (`check_conf_env`), are a ProjectError
    here too, as is an environment variable that names a file for a folder (`check_folder_vars`): the commands ask
    `find` first, before any reads."""
    _runs_env()
    check_folder_vars()
    start = (start or Path.cwd()).resolve()
    key = (start, os.environ.get(CONF_ENV, ""))
    if key not in _FOUND:
        check_conf_env()
        found = _search(start)
        if found is None:
            found = next((p for p in map(_search, _env_dirs()[:1]) if p is not None), None)
        _FOUND[key] = found
    return _FOUND[key]


def user_dirs(start: Path | None = None) -> list[Path]:
    """The team's config folders, in search order: $SFT_GRID_CONF's, then the project's."""
    out = _env_dirs()
    project = find(start)
    if project is not None and project.conf not in out:
        out.append(project.conf)
    return out


def search_dirs(start: Path | None = None) -> list[Path]:
    """Every config folder, in the order Hydra searches them: the team's, then the shipped configs."""
    return [*user_dirs(start), PACKAGE_CONF]


def find_option(group: str, name: str, start: Path | None = None) -> Path | None:
    """The file of option `name` of `group` (`cluster`, `model`, ...) as Hydra would pick it, or None."""
    for d in search_dirs(start):
        path = d / group / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def options(group: str, start: Path | None = None) -> list[str]:
    """The options of a group over every config folder (a name in two of them is one option: the first wins)."""
    return sorted({p.stem for d in search_dirs(start) for p in (d / group).glob("*.yaml")})


def runs_base(start: Path | None = None) -> Path:
    """What a relative runs_root is taken from: the project's root, else the working directory."""
    project = find(start)
    return project.root if project is not None else (start or Path.cwd())


def default_runs(start: Path | None = None) -> Path:
    """A grid's runs_root when a read command is given none: $SFT_GRID_RUNS, else the project's runs/, else ./runs."""
    env = _runs_env()
    return Path(env).expanduser() if env else runs_base(start) / "runs"
