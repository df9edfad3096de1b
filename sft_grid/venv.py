"""python -m sft_grid.venv build|path|key NAME: the managed virtual environments of the backends and harnesses.

Each lives under the cache root at ``envs/<name>-<hash of its pins>`` (conf/backend/<name>.yaml `venv:`,
conf/harness/<name>.yaml), so changing a pin builds a new one and CI can cache them by key.

    python -m sft_grid.venv build llamafactory     # create (no-op when it exists)
    python -m sft_grid.venv path llamafactory      # print its location
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from sft_grid.planning.venvs import VenvSpec

    parser = argparse.ArgumentParser(prog="python -m sft_grid.venv", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "path", "key"])
    parser.add_argument("name", help="a backend (conf/backend) or an evaluation harness (conf/harness)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        spec = VenvSpec.load(args.name)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.action == "build":
        from sft_grid.stages.venv_build import build

        print(build(args.name))
    elif args.action == "path":
        print(spec.path)
    else:
        print(spec.key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
