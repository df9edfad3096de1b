"""`python -m sft_grid.requeue`: the same as `sft-grid requeue` (sft_grid/cli/cmd_requeue.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["requeue", *sys.argv[1:]]))
