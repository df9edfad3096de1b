"""The environments a grid's cells name themselves, checked before anything is queued or written.

A site names its own environment for a backend or a harness (`cluster.backend_venvs.<backend>`, `need_venvs`,
`cluster.backend_venvs.lm_eval`): a virtualenv's or a conda environment's directory, or a conda environment's name
(planning/environments.py `locate` finds it as conda does). Every job of the cell runs that environment's python, so
each environment a cell uses must be there (a directory, or a name conda's registries know), have a python that runs
here, and have what its jobs import (LLaMA-Factory: `llamafactory`, axolotl: `axolotl`, the harness: `lm_eval`).
Otherwise the grid would queue jobs that fail at their first step, or (a missing directory) wait for a loss-mask
check that never runs here. What the python answers is venv_facts' (one process of it, cached per environment and
its installed packages); each distinct environment is judged once per grid.

A cell of a remote site (`cluster.remote.host`) is not checked here: the grid command the site runs over ssh checks
it there, where its environments are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sft_grid.checks import venv_facts
from sft_grid.core.problems import Problem
from sft_grid.planning import environments, resolvers
from sft_grid.planning.cells import Cell
from sft_grid.planning.evaluation import suites_of
from sft_grid.planning.hydra_errors import did_you_mean

RULE = "preflight-venv"


@dataclass(frozen=True)
class Named:
    """An environment a cell names: the key it is named under, the value as written, the backend or harness."""

    key: str
    value: str
    name: str


@dataclass(frozen=True)
class Refusal:
    message: str
    fix: str
    python: str  # the python the cell's jobs would run: its other checks that run there are not run


def named(cell: Cell) -> list[Named]:
    """The site's own environments the cell uses: the one it trains in (`environments.own_source`) and its
    evaluation harness's; none for a cell of a remote site."""
    s = cell.spec
    if s.cluster.remote.host:
        return []
    found = []
    training = environments.own_source(s)
    if training:
        found.append(Named(*training, s.backend.name))
    for suite in suites_of(cell):
        harness = environments.own_entry(s.cluster, suite.harness)
        if harness:
            found.append(Named(*harness, suite.harness))
    # a placeholder for an unset per-user variable (a dry run's stand-in): the real run is refused for the variable
    return [n for n in dict.fromkeys(found) if not resolvers.is_placeholder(n.value)]


def check(cells: Iterable[Cell]) -> tuple[list[Problem], set[str]]:
    """Every cell's problems with the environments it names (one each), and the pythons of the environments refused
    (what the loss-mask probe and the other checks run in them need not try)."""
    problems: list[Problem] = []
    unusable: set[str] = set()
    judged: dict[Named, Refusal | None] = {}
    for cell in cells:
        for env in named(cell):
            if env not in judged:
                judged[env] = judge(env)
            refusal = judged[env]
            if refusal is not None:
                problems.append(
                    Problem(
                        cell=cell.name,
                        key=env.key,
                        value=env.value,
                        rule=RULE,
                        message=refusal.message,
                        fix=refusal.fix,
                    )
                )
                unusable.add(refusal.python)
    return problems, unusable


def pinned(name: str) -> str:
    """What to install for a backend or harness: the requirement sft_grid's managed environment pins
    (conf/backend/<name>.yaml, conf/harness/<name>.yaml: llamafactory==0.9.5), or its module's name."""
    module = venv_facts.BACKEND_MODULES.get(name, name)
    try:
        spec = environments.VenvSpec.load(name)
    except (KeyError, OSError, ValueError, TypeError):
        return module
    for requirement in (*spec.packages, *spec.packages_no_deps):
        if _normal(re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0]) == _normal(module):
            return requirement
    return module


def _python_of(name: str) -> str:
    """The python a new environment for the backend is made with (its managed environment's: python3.11)."""
    try:
        return environments.VenvSpec.load(name).python
    except (KeyError, OSError, ValueError, TypeError):
        return "python3"


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def judge(env: Named) -> Refusal | None:
    """Why the environment cannot run the cell's jobs (message and fix), or None when it can."""
    located = environments.locate(env.value)
    module = venv_facts.BACKEND_MODULES.get(env.name)
    requirement, maker = pinned(env.name), _python_of(env.name)
    elsewhere = (
        f"or point {env.key} at an environment that has {module or env.name} (its directory, or a conda"
        " environment's name)"
    )
    if located.path is None:
        return _unknown_name(env, located, requirement, maker)
    path = located.path
    python = path / "bin" / "python"
    subject = f"the conda environment {located.name!r} ({path})" if located.name else str(path)
    make = f"{maker} -m venv {path} && {python} -m pip install {requirement}"

    def refuse(message: str, fix: str) -> Refusal:
        return Refusal(message, fix, str(python))

    if not path.exists() and path.is_symlink():
        return refuse(
            f"{path} is a broken link (to {os.readlink(path)}): the environment it named was moved or removed",
            f"point it at the environment's new place, or create one there ({make}), {elsewhere}",
        )
    if not path.exists():
        relative = "" if os.path.isabs(os.path.expanduser(env.value)) else f" ({env.value!r} from {os.getcwd()})"
        return refuse(f"no such directory {path}{relative}{_near(path)}", f"create it ({make}), {elsewhere}")
    if not path.is_dir():
        if path.parent.name == "bin" and path.name.startswith("python"):
            return refuse(
                f"{path} is a python, not an environment's directory", f"point {env.key} at {path.parent.parent}"
            )
        return refuse(
            f"{path} is a file, not an environment's directory (one with bin/python)",
            f"point {env.key} at an environment's directory; {elsewhere}",
        )
    if not python.exists():
        if python.is_symlink():
            return refuse(
                f"{subject}: its python {python} is a broken link (to {os.readlink(python)}): the interpreter it"
                " was made from was moved or removed",
                f"make it again ({maker} -m venv --clear {path} && {python} -m pip install {requirement}), {elsewhere}",
            )
        if (path / "python").is_file():
            return refuse(
                f"{path} has no bin/python: it is an environment's bin/ itself", f"point {env.key} at {path.parent}"
            )
        if (path / "conda-meta").is_dir():
            return refuse(
                f"{subject} has no python (a conda environment without the python package)",
                f"install it there: conda install -p {path} python && {python} -m pip install {requirement};"
                f" {elsewhere}",
            )
        return refuse(
            f"{path} has no bin/python: it is neither a virtualenv nor a conda environment",
            f"point {env.key} at the environment's directory (the one with bin/python), or make one: {make}",
        )
    found = venv_facts.answer(str(python))
    if isinstance(found, str):
        return refuse(
            f"{subject}: its python {python} does not run here: {found}",
            f"repair it or make it again ({maker} -m venv --clear {path} && {python} -m pip install {requirement});"
            " where it runs only after the cluster's setup lines (module load ...), run the grid from a shell that"
            f" has loaded them; {elsewhere}",
        )
    if module and not dict(found.get("modules") or {}).get(module):
        conda = located.name or (str(path) if (path / "conda-meta").is_dir() else "")
        also = f" (or: conda activate {conda} && pip install {requirement})" if conda else ""
        return refuse(
            f"`{module}` is not importable in {subject} (its python {python}): every job of the cell imports it",
            f"install it there: {python} -m pip install {requirement}{also}; {elsewhere}",
        )
    return None


def _unknown_name(env: Named, located: environments.Located, requirement: str, maker: str) -> Refusal:
    """A conda environment's name no registry here knows: where it looked, the names it knows, how to make it."""
    name = located.name or ""
    known = ", ".join(located.known) if located.known else "none"
    here = Path(env.value)
    hint = f" (for the directory {here.resolve()} here, write ./{env.value})" if here.is_dir() else ""
    version = maker.removeprefix("python") or "3"
    return Refusal(
        f"no conda environment named {name!r} here{did_you_mean(name, located.known)}: conda's registries"
        f" ({', '.join(located.searched)}) know {known}",
        f"create it (conda create -n {name} python={version} && conda activate {name} && pip install {requirement}),"
        f" or name an environment they know, or give an environment's directory{hint}",
        str(here / "bin" / "python"),
    )


def _near(path: Path) -> str:
    """(did you mean 'x'?) where a sibling environment's name is close to the missing one's."""
    try:
        siblings = [p.name for p in path.parent.iterdir() if (p / "bin" / "python").exists()]
    except OSError:
        return ""
    return did_you_mean(path.name, siblings)
