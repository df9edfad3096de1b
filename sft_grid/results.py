"""`python -m sft_grid.results`: the same as `sft-grid results` (sft_grid/cli/cmd_results.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["results", *sys.argv[1:]]))
