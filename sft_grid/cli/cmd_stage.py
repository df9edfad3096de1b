"""sft-grid stage: stage Hub models and datasets into the site's Hugging Face cache ahead of time.

    sft-grid stage -m +sweep=delphi_scaling           # every Hub input of a grid (the grid's overrides)
    sft-grid stage --repo org/model [--dataset] [--revision REV] [--cache DIR]   # one repository

The grid command stages its inputs by itself before anything is queued; this does only that, so a login node
that kills long processes can be given repeated short runs (each continues where the last stopped; a finished
file is never fetched again), or a whole grid's inputs can be staged the day before. With a grid's overrides it
stages exactly what `sft-grid run` with the same overrides would stage here, into the cluster's `hf_cache`,
and renders and queues nothing; inputs whose cluster stages them in a job (`staging.where: job`) are only pinned
(the grid command queues their staging job). Exit status: 0 staged, 1 a problem (named, with its fix: a missing
repository or revision, a failing server, a time limit too short to transfer anything), 3 stopped before the
site's process time limit (run it again).
"""

from __future__ import annotations

import argparse
import sys


def repo_parser() -> argparse.ArgumentParser:
    """`sft-grid stage --repo ...`: one repository's arguments."""
    parser = argparse.ArgumentParser(prog="sft-grid stage", description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="the hub id, org/name")
    parser.add_argument("--dataset", action="store_true", help="a dataset repository (default: a model)")
    parser.add_argument("--revision", default="main", help="a branch, tag or commit sha (default: main)")
    parser.add_argument("--cache", help="the Hugging Face hub cache (default: HF_HUB_CACHE or HF_HOME/hub)")
    parser.add_argument(
        "--time-limit",
        type=_seconds,
        help="seconds this process may run here (a login node's limit): it stops cleanly before, and a rerun continues",
    )
    return parser


def _seconds(text: str) -> float:
    """--time-limit's type: seconds above 0 (0, nan or inf would read as no limit at all, or as none that works)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. --time-limit 3600)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: seconds above 0, the login node's limit (e.g. --time-limit 3600)")
    return value


def _one(argv: list[str]) -> int:
    from sft_grid.cli.live import Live
    from sft_grid.core import human
    from sft_grid.stages.staging import Budget, HubError, TimeLimitTooShort, download

    args = repo_parser().parse_args(argv)
    from sft_grid.core.hubcache import revision_problem

    # the revision rule a grid's models are held to (planning/hub_rules.py), before anything is fetched (the id's
    # rule is the download's own, below)
    why = revision_problem(args.revision)
    if why:
        print(
            f"sft-grid stage: --revision {args.revision!r}: {why}; nothing was staged. Fix: a branch or tag name, or"
            " a 40-character commit sha",
            file=sys.stderr,
        )
        return 1
    budget = Budget.since_process_start(args.time_limit) if args.time_limit else None
    kind = "dataset" if args.dataset else "model"
    live = Live(sys.stderr)
    try:
        staged = download(
            args.repo,
            kind,  # type: ignore[arg-type]
            args.revision,
            args.cache,
            budget=budget,
            on_progress=live.transfer,
        )
    except TimeLimitTooShort as exc:
        live.end()
        print(f"staging refused: {exc}", file=sys.stderr)
        return 1
    except HubError as exc:
        live.end()
        print(f"staging {kind} {args.repo} failed: {exc}", file=sys.stderr)
        return 1
    live.end()
    if not staged.complete:
        print(f"staging stopped: {staged.stopped}", file=sys.stderr)
        return 3
    print(
        f"{kind} {args.repo}@{staged.sha}: {staged.path} ({len(staged.fetched)} file(s),"
        f" {human.size(staged.fetched_bytes)} fetched{', already staged' if staged.offline else ''})"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # one repository's options (a missing --repo is then said by its own parser, with its usage)
    if any(a.split("=", 1)[0] in ("--repo", "--dataset", "--revision", "--cache", "--time-limit") for a in argv):
        return _one(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    # the grid command itself, in this process (exec: a login node's process clock keeps counting from our start)
    import os

    from sft_grid.cli.options import RUN_AS

    os.environ[RUN_AS] = "sft-grid stage"  # the app's usage errors name this command
    os.execv(sys.executable, [sys.executable, "-m", "sft_grid", "run", *argv, "stage_only=true"])
    return 1  # not reached
