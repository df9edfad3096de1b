"""python -m sft_grid: compose, validate, render and run a grid of SFT cells (a Hydra app).

    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5     # a grid from the command line
    python -m sft_grid -m +sweep=smoke                             # a grid from sweeps/smoke.yaml
    python -m sft_grid -m +sweep=smoke dry_run=true                # render only, print the check table
    python -m sft_grid model=tiny_llama lr=2e-5                    # one cell (a rerun)

Only light modules are imported here: `--help` must stay fast.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from sft_grid.schema import register

register()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    # Without -m Hydra hands over one composed cell; with -m the sft_grid launcher gets all cells.
    from sft_grid.grid import run_single

    run_single(cfg)


if __name__ == "__main__":
    main()
