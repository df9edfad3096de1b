"""sft-grid venv build|path|key|lock NAME: the managed virtual environments of the backends and harnesses.

Each lives under the cache root at ``envs/<name>-<hash of its pins and lock>`` (conf/backend/<name>.yaml `venv:`,
conf/harness/<name>.yaml, and conf/locks/<name>.txt: every package of a verified build at its version), so
changing a pin or the lock builds a new one and CI can cache them by key.

    sft-grid venv build llamafactory     # create (no-op when it exists)
    sft-grid venv build llamafactory axolotl lm_eval   # several at once, side by side
    sft-grid venv path llamafactory      # print its location
    sft-grid venv lock llamafactory      # after changing a pin: resolve afresh, rewrite the lock
"""

from __future__ import annotations

import argparse
import logging
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["build", "path", "key", "lock"])
    parser.add_argument(
        "names",
        nargs="+",
        metavar="name",
        help="a backend (conf/backend) or an evaluation harness (conf/harness); build takes several",
    )


def run(args: argparse.Namespace) -> int:
    from sft_grid.planning.environments import VenvSpec

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(args.names) > 1 and args.action != "build":
        print(f"sft-grid venv: error: {args.action} takes one name", file=sys.stderr)
        return 2
    try:
        specs = [VenvSpec.load(name) for name in args.names]
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    spec = specs[0]
    if args.action == "build":
        return _build_all(args.names)
    if args.action == "lock":
        from sft_grid.stages.venv_build import relock

        print(relock(spec.name))
    elif args.action == "path":
        print(spec.path)
    else:
        print(spec.key)
    return 0


def _build_all(names: list[str]) -> int:
    """Build each named environment (several side by side: their pip runs wait on downloads and disks as much as on
    the CPU); every failure is named, and the status is 1 if any failed."""
    from concurrent.futures import ThreadPoolExecutor

    from sft_grid.stages.venv_build import build

    def one(name: str) -> str | None:
        try:
            print(build(name), flush=True)
            return None
        except Exception as exc:  # a pip or check failure: reported with its environment
            return f"building the {name} environment failed: {exc}"

    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        failures = [f for f in pool.map(one, names) if f]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0
