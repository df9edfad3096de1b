"""`python -m sft_grid.status`: the same as `sft-grid status` (sft_grid/cli/cmd_status.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["status", *sys.argv[1:]]))
