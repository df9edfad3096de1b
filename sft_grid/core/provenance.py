"""What makes a cell's result traceable besides its config: the sft_grid version, the git revision of the checkout
its config came from (and whether it had uncommitted changes), and a hash of the packages installed in the
environment that trained it.

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


@functools.cache
def checkout(root: Path = REPO_ROOT) -> dict[str, Any]:
    """{"sft_grid": version, "git": {"revision", "dirty"}} of the checkout conf/ is read from (once a process);
    git revision "unknown" outside a git checkout."""
    from sft_grid import __version__

    git: dict[str, Any] = {"revision": "unknown", "dirty": None}
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if rev.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            git = {"revision": rev.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"sft_grid": __version__, "git": git}


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
