"""What makes a cell's result traceable besides its config: the sft_grid version, the git revision of the checkout
sft_grid came from and of the team's repository its configs came from (and whether each had uncommitted changes),
and a hash of the packages installed in the environment that trained it.

The grid records the first two in each cell's `submitted` event (with the commits its Hub inputs were pinned
to); the job records the packages of its environment in its `running` event, because that is the environment
that really trains (a site's own, or a managed one rebuilt since).
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path
from typing import Any

from sft_grid.core.paths import REPO_ROOT


def _git_state(root: Path) -> dict[str, Any]:
    """{"revision", "dirty"} of the git checkout at root; revision "unknown" outside one."""
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if rev.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            return {"revision": rev.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"revision": "unknown", "dirty": None}


@functools.cache
def checkout(root: Path = REPO_ROOT) -> dict[str, Any]:
    """{"sft_grid": version, "git": {"revision", "dirty"}} of sft_grid's own checkout (once a process), and
    "configs": the same of the team's repository when its configs were searched (core/project.py)."""
    from sft_grid import __version__
    from sft_grid.core import project

    out: dict[str, Any] = {"sft_grid": __version__, "git": _git_state(root)}
    found = project.find()
    if found is not None:
        out["configs"] = {"root": str(found.root), **_git_state(found.root)}
    return out


def packages_hash(python: Path | str) -> dict[str, Any]:
    """A hash of the distributions (name==version) installed in the environment of this python, read from its
    site-packages' metadata directories (no process started); {} when there is none to read."""
    env = Path(python).parent.parent
    found = sorted(
        {d.name.rsplit(".", 1)[0].lower() for d in env.glob("lib/python*/site-packages/*.dist-info")}
        | {d.name.rsplit(".", 1)[0].lower() for d in env.glob("lib/python*/site-packages/*.egg-info")}
    )
    if not found:
        return {}
    return {
        "packages": hashlib.sha256("\n".join(found).encode()).hexdigest()[:16],
        "package_count": len(found),
        "env": str(env),
    }
