"""python -m sft_grid.assets build|path: the tiny local models, tokenizers and datasets of the tests and the demo.

No test machine can reach the Hugging Face Hub, so they are built here by project code (sft_grid/stages/assets.py),
under the cache root; `build` is a no-op when they are there and current.

    python -m sft_grid.assets build [--force]
    python -m sft_grid.assets path
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    from sft_grid.core.paths import assets_dir
    from sft_grid.stages import assets

    parser = argparse.ArgumentParser(prog="python -m sft_grid.assets", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "path"])
    parser.add_argument("--force", action="store_true", help="rebuild even when the assets are up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(assets.build(force=args.force) if args.action == "build" else assets_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
