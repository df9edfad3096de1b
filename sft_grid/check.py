"""`python -m sft_grid.check`: the same as `sft-grid check` (sft_grid/cli/cmd_check.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["check", *sys.argv[1:]]))
