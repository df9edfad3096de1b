"""Where sft_grid keeps things outside the repository: one cache root, overridable by environment."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# the checkout (or site-packages) the package sits in: a git checkout's root when run from one
REPO_ROOT = PACKAGE_DIR.parent
# the shipped config groups, package data (pkg://sft_grid.conf); a team's own come first (core/project.py)
PACKAGE_CONF = PACKAGE_DIR / "conf"
# code that runs with the python of a backend's (or the harness's) virtual environment, never in the orchestrator
IN_VENV_DIR = PACKAGE_DIR / "in_venv"


def cache_root() -> Path:
    """Virtual environments, tiny assets and check results live here, shared by every checkout (CI caches it)."""
    return Path(os.environ.get("SFT_GRID_CACHE") or Path.home() / ".cache" / "sft_grid")


def assets_dir() -> Path:
    return cache_root() / "assets"


def venvs_dir() -> Path:
    return cache_root() / "envs"


def torch_extensions(python: str) -> str:
    """Where DeepSpeed's ops are built, with g++, the first time a job of the environment whose interpreter is
    `python` needs one (on the CPU its shared-memory collectives, 1-2 minutes; on GPUs an op not prebuilt, such as
    CPU Adam for an offloaded optimizer): the job's own TORCH_EXTENSIONS_DIR where set, else a folder of that
    environment under the cache root, so that every training and stage run with it finds what one built (a second
    job waits on the first's lock) instead of building it again in torch's default in each user's home. Torch keys
    its default folder by Python and CUDA version but takes TORCH_EXTENSIONS_DIR as it is, so the folder is keyed
    here: by the environment's name and path (not resolved: a virtualenv's python links to the base interpreter),
    and an op built against one environment's torch is never loaded by another's."""
    own = os.environ.get("TORCH_EXTENSIONS_DIR")
    if own:
        return own
    env = Path(os.path.abspath(python)).parent.parent
    key = hashlib.sha256(str(env).encode()).hexdigest()[:8]
    return str(cache_root() / "torch_extensions" / f"{env.name}-{key}")


# the environment variables that name a folder sft_grid (or the Hub's client it calls) reads and writes: what each is,
# and what unsetting it gives
FOLDER_VARS = {
    "SFT_GRID_CACHE": ("sft_grid's cache (virtual environments, tiny assets, check results)", "~/.cache/sft_grid"),
    "SFT_GRID_PREFLIGHT_CACHE": ("where sft_grid keeps its checks' results", "<the sft_grid cache>/preflight"),
    "HF_HOME": ("the Hugging Face home (its token and its hub cache)", "~/.cache/huggingface"),
    "HF_HUB_CACHE": ("the Hugging Face hub cache", "$HF_HOME/hub"),
}
# the ones read from every folder and by every job: a relative one would name another folder in each
ABSOLUTE_VARS = ("SFT_GRID_CACHE",)


def folder_var_problem(var: str) -> str | None:
    """Why environment variable `var` (one of FOLDER_VARS) cannot name its folder, with the fix, or None: a relative
    path where it must be absolute, or a path that is (or runs through) a file. Unset, empty (refused where it is read:
    planning/resolvers.py) or missing (created when needed) is no problem here."""
    value = os.environ.get(var)
    if not value or not value.strip():
        return None
    what, default = FOLDER_VARS[var]
    path = Path(value).expanduser()
    fix = f"export {var}=<an absolute directory>, or `unset {var}` to use {default}"
    if var in ABSOLUTE_VARS and not path.is_absolute():
        return (
            f"environment variable {var} is {value!r}, a relative path: it names {what}, read from every folder and"
            f" by every job, where it would name another folder; export {var}={Path(os.path.abspath(path))} (an"
            f" absolute directory), or `unset {var}` to use {default}"
        )
    for part in (path, *path.parents):
        if part.exists():
            if part.is_dir():
                return None
            where = "is a file" if part == path else f"runs through the file {part}"
            return f"environment variable {var} is {value!r}, which {where}, not a directory: it names {what}; {fix}"
    return None
