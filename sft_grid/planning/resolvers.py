"""OmegaConf resolvers of sft_grid's configs.

``${user_env:VAR}`` reads a per-user value (a Slurm account, a scratch directory, a virtual environment)
from the environment. An unset variable reads as a placeholder, ``<VAR>``: a dry run renders with it (its cells
under the local runs/ when the runs folder is the one missing) and says which exports a real run needs, and a real
run is refused before anything is written, naming the variable, the key that reads it and the ``export`` line
(rule site-variable, planning/site_rules.py). A variable set but empty is an error when the cell is composed.
``${user_env:VAR,default}`` falls back to ``default`` instead.

Cluster profiles name their variables ``SFT_GRID_<SITE>_<WHAT>``, and the last part says what the value is:

    SFT_GRID_<SITE>_ACCOUNT   the Slurm account (sbatch --account) the jobs are charged to
    SFT_GRID_<SITE>_RUNS      the directory on the site's shared scratch file system that cells go under
    SFT_GRID_<SITE>_ENV       the virtual environment (a directory with bin/) with the backend installed
"""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import OmegaConf

from sft_grid.core.paths import cache_root
from sft_grid.planning import conf_files

NAME = "user_env"

# The last part of a variable's name -> (what it is, a placeholder for the export line)
KINDS = {
    "ACCOUNT": ("your Slurm account", "<account>"),
    "RUNS": ("your directory for cells, on the site's scratch file system", "<directory>"),
    "ENV": ("your environment with the backend installed: its directory, or a conda environment's name", "<directory>"),
}

_UNSET = object()
# ${user_env:VAR} without a default
_REQUIRED = re.compile(r"\$\{user_env:\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def _context(node: Any, root: Any) -> tuple[str, str]:
    """(who needs the value, where): ("the cluster profile", " for cluster.account of conf/cluster/leonardo.yaml"),
    or less where the context is not known."""
    try:
        key = node._get_full_key(None) if node is not None else ""
    except Exception:  # a node outside a config: say less rather than fail while reporting
        key = ""
    if not key.startswith("cluster."):
        return "the config", f" for {key}" if key else ""
    try:
        site = OmegaConf.select(root, "cluster.name", default=None, throw_on_resolution_failure=False)
    except Exception:
        site = None
    return "the cluster profile", f" for {key}" + (
        f" of conf/cluster/{site}.yaml" if isinstance(site, str) and site else ""
    )


def _also_missing(root: Any, var: str) -> list[str]:
    """The other variables the config reads with ${user_env:VAR} (no default) that are unset too, so that
    one error names every export the user needs."""
    try:
        raw = OmegaConf.to_container(root, resolve=False) if root is not None else None
    except Exception:
        return []
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.extend(_REQUIRED.findall(value))
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(raw)
    return [v for v in dict.fromkeys(found) if v != var and not os.environ.get(v)]


# An unset per-user variable reads as a placeholder, `<VAR>`, recorded here: a dry run renders with it (a runs folder
# placeholder: the local runs/, planning/cells.py) and says what a real run needs; a real run is refused by the rule
# site-variable (planning/site_rules.py), once per variable over the grid.
UNSET_IN_DRY_RUN: dict[str, str] = {}  # variable -> the key that read it
_PLACEHOLDER = re.compile(r"^<(SFT_GRID_[A-Z0-9_]+|[A-Z_][A-Z0-9_]*)>$")


def placeholder(var: str) -> str:
    """What an unset per-user variable reads as: `<VAR>`."""
    return f"<{var}>"


def kind_of(var: str) -> tuple[str, str]:
    """(what the variable is, a placeholder for its export line), from the last part of its name."""
    return _what(var)


def placeholder_var(value: object) -> str | None:
    """The unset per-user variable a value stands in for in a dry run, or None: the whole value
    (`<SFT_GRID_LEONARDO_ENV>`), or a part of it the variable was read into (`${user_env:SCRATCH}/sft_runs` reads
    `<SCRATCH>/sft_runs`: a path under a folder that is not there yet)."""
    if not isinstance(value, str):
        return None
    whole = _PLACEHOLDER.match(value.strip())
    if whole:
        return whole.group(1)
    return next((var for var in UNSET_IN_DRY_RUN if placeholder(var) in value), None)


def is_placeholder(value: object) -> bool:
    """Whether a value holds a dry run's stand-in for an unset per-user variable (`placeholder_var`): the checks of
    what it names (a directory, an environment) wait for the real value, a runs folder read from it is the local
    runs/ in a dry run, and a real run is refused (site-variable)."""
    return placeholder_var(value) is not None


def user_env(var: str, default: Any = _UNSET, *, _node_: Any = None, _root_: Any = None) -> Any:
    value = os.environ.get(var)
    if value:
        return value
    if default is not _UNSET:
        return default
    if value is None:  # unset: a placeholder; a variable set but empty is a mistake of its own, refused here
        try:
            key = _node_._get_full_key(None) if _node_ is not None else ""
        except Exception:
            key = ""
        UNSET_IN_DRY_RUN.setdefault(var, key)
        return placeholder(var)
    who, where = _context(_node_, _root_)
    state = "is empty" if value == "" else "is not set"
    message = (
        f"environment variable {var} {state}: {who} needs it ({_what(var)[0]}){where}; export {var}={_what(var)[1]}"
    )
    others = _also_missing(_root_, var)
    if others:
        message += (
            "; also unset or empty: "
            + ", ".join(f"{v} ({_what(v)[0]})" for v in others)
            + "; export "
            + " ".join(f"{v}={_what(v)[1]}" for v in others)
        )
    raise ValueError(message)


def _what(var: str) -> tuple[str, str]:
    return KINDS.get(var.rsplit("_", 1)[-1], ("a value that differs from user to user", "<value>"))


CACHE_VAR = "SFT_GRID_CACHE"


def sft_grid_cache() -> str:
    """``${sft_grid_cache:}``: sft_grid's cache directory (core/paths.py: $SFT_GRID_CACHE, else ~/.cache/sft_grid),
    where the tiny assets are. A variable set but empty is an error naming it: it would otherwise put every
    asset path at the file system's root, reported as missing assets."""
    if os.environ.get(CACHE_VAR) == "":
        raise ValueError(
            f"environment variable {CACHE_VAR} is empty: it names sft_grid's cache (virtual environments, tiny"
            f" assets), and an empty one would put them at /; `unset {CACHE_VAR}` to use ~/.cache/sft_grid, or"
            f" export {CACHE_VAR}=<directory>"
        )
    return str(cache_root())


def by_size(size: float, *steps: Any) -> Any:
    """``${by_size:${model.params_b},1.0,1,2.5,2,4}``: a value chosen by a size, here nodes: 1 up to 1.0 (billion
    parameters), 2 up to 2.5, 4 above. The arguments are thresholds and values in turn, ending with the value
    above the last threshold; so a sweep file derives a cell's resources from its model, in the file."""
    if len(steps) % 2 != 1:
        raise ValueError(f"by_size needs thresholds and values in turn and a last value, got {list(steps)}")
    for i in range(0, len(steps) - 1, 2):
        if float(size) <= float(steps[i]):
            return steps[i + 1]
    return steps[-1]


def variables(text: str) -> list[str]:
    """The variables a YAML text reads with ${user_env:...}, in order, each once (used by the tests)."""
    return list(dict.fromkeys(re.findall(r"\$\{user_env:\s*([A-Za-z_][A-Za-z0-9_]*)", text)))


def register() -> None:
    """`base_config` (the CellConf schema conf/config.yaml starts from) with Hydra, and ${user_env:...} and
    ${by_size:...} with OmegaConf, once per process (calling it again is harmless)."""
    from hydra.core.config_store import ConfigStore

    from sft_grid.core.schema import CellConf

    ConfigStore.instance().store(name="base_config", node=CellConf)
    conf_files.install()
    OmegaConf.register_new_resolver(NAME, user_env, replace=True)
    OmegaConf.register_new_resolver("by_size", by_size, replace=True)
    OmegaConf.register_new_resolver("sft_grid_cache", sft_grid_cache, replace=True)
