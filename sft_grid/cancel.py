"""`python -m sft_grid.cancel`: the same as `sft-grid cancel` (sft_grid/cli/cmd_cancel.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["cancel", *sys.argv[1:]]))
