"""`python -m sft_grid.post`: the same as `sft-grid post` (sft_grid/cli/cmd_post.py)."""

import sys

from sft_grid.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["post", *sys.argv[1:]]))
