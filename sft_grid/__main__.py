"""python -m sft_grid: compose, validate, render and run a grid of SFT cells (a Hydra app; sft_grid/cli/app.py).

    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5     # a grid from the command line
    python -m sft_grid -m +sweep=smoke                             # a grid from sweeps/smoke.yaml
    python -m sft_grid -m +sweep=smoke dry_run=true                # render only, print the check table and plan
    python -m sft_grid model=tiny_llama lr=2e-5                    # one cell (a rerun)

`sft-grid run ...` is the same; `sft-grid --help` lists the other commands.
"""

from sft_grid.cli.app import hydra_app

if __name__ == "__main__":
    hydra_app()
