"""`python -m sft_grid.show`: the same as `sft-grid show` (sft_grid/cli/cmd_show.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["show", *sys.argv[1:]]))
