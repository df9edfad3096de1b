"""`python -m sft_grid.stage`: the same as `sft-grid stage` (sft_grid/cli/cmd_stage.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["stage", *sys.argv[1:]]))
