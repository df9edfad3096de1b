"""python -m sft_grid.venv build|path|key|lock NAME: the managed virtual environments of the backends and harnesses.

Each lives under the cache root at ``envs/<name>-<hash of its pins and lock>`` (conf/backend/<name>.yaml `venv:`,
conf/harness/<name>.yaml, and conf/locks/<name>.txt: every package of a verified build at its version), so
changing a pin or the lock builds a new one and CI can cache them by key.

    python -m sft_grid.venv build llamafactory     # create (no-op when it exists)
    python -m sft_grid.venv build llamafactory axolotl lm_eval   # several at once, side by side
    python -m sft_grid.venv path llamafactory      # print its location
    python -m sft_grid.venv lock llamafactory      # after changing a pin: resolve afresh, rewrite the lock
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from sft_grid.planning.venvs import VenvSpec

    parser = argparse.ArgumentParser(prog="python -m sft_grid.venv", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "path", "key", "lock"])
    parser.add_argument("names", nargs="+", metavar="name",
                        help="a backend (conf/backend) or an evaluation harness (conf/harness); build takes several")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(args.names) > 1 and args.action != "build":
        parser.error(f"{args.action} takes one name")
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
        except Exception as exc:  # noqa: BLE001 (a pip or check failure: reported with its environment)
            return f"building the {name} environment failed: {exc}"

    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        failures = [f for f in pool.map(one, names) if f]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
