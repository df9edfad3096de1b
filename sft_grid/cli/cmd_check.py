"""sft-grid check: resolve every model and dataset of a grid against the site's Hub or mirror, from a login node.

    sft-grid check -m +sweep=delphi_scaling            # the grid's overrides, as `sft-grid run` takes them

One table, one row a repository: the revision asked (a model's pinned commit, else `main`), the commit it resolves
to, what `main` points at now, its files and their size, the cells that use it, and the verdict: found, or what
is wrong (no such repository, no such revision, gated, the Hub not answering). These are the verdicts a real run
reaches before it queues anything, from the same code (the grid's staging plan), so a wrong id costs a minute on
the login node, never a queued job. Nothing is written, staged, rendered or queued. It asks the Hub the cluster's
cells would be staged from (HF_ENDPOINT, the cluster's hf_cache), so run it where the grid itself would run.
Exit status: 0 every input found, 1 otherwise.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    # the grid command itself, in this process: the same composition and the same resolution as a real run
    from sft_grid.cli.options import RUN_AS

    os.environ[RUN_AS] = "sft-grid check"  # the app's usage errors name this command
    os.execv(sys.executable, [sys.executable, "-m", "sft_grid", "run", *argv, "check_only=true"])
    return 1  # not reached
