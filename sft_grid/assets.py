"""`python -m sft_grid.assets`: the same as `sft-grid assets` (sft_grid/cli/cmd_assets.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["assets", *sys.argv[1:]]))
