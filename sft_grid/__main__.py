"""python -m sft_grid: the same program as the `sft-grid` console script (sft_grid/cli/main.py: `module_main`).

    python -m sft_grid status GRID                                 # a command first: sft-grid status GRID
    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5      # otherwise the Hydra app: sft-grid run -m ...
    python -m sft_grid --help                                      # the Hydra app's help (its groups and options)

A bare first word that names no command is refused with the commands' names, never taken as a Hydra override.
"""

import sys

from sft_grid.cli.main import module_main

if __name__ == "__main__":
    sys.exit(module_main())
