"""`python -m sft_grid.venv`: the same as `sft-grid venv` (sft_grid/cli/cmd_venv.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["venv", *sys.argv[1:]]))
