"""`python -m sft_grid.logs`: the same as `sft-grid logs` (sft_grid/cli/cmd_logs.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["logs", *sys.argv[1:]]))
