"""`python -m sft_grid.report`: the same as `sft-grid report` (sft_grid/cli/cmd_report.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["report", *sys.argv[1:]]))
