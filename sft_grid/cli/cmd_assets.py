"""sft-grid assets build|path: the tiny local models, tokenizers and datasets of the tests and the demo.

No test machine can reach the Hugging Face Hub, so they are built here by project code (sft_grid/stages/tiny_assets.py),
under the cache root; `build` is a no-op when they are there and current.

    sft-grid assets build [--force]
    sft-grid assets path
"""

from __future__ import annotations

import argparse
import logging
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["build", "path"])
    parser.add_argument("--force", action="store_true", help="rebuild even when the assets are up to date")


def run(args: argparse.Namespace) -> int:
    from sft_grid.core.paths import assets_dir
    from sft_grid.stages import tiny_assets

    if args.force and args.action == "path":  # path prints where they are; only build rebuilds
        print(
            "sft-grid assets: --force rebuilds the assets, and path builds nothing: sft-grid assets build --force",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(tiny_assets.build(force=args.force) if args.action == "build" else assets_dir())
    return 0
