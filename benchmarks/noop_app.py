"""A Hydra app over sft_grid's configs whose task does nothing: the stock-Hydra baseline of bench_plan.py.

It composes exactly what `python -m sft_grid` composes (same primary config, same schema, same groups),
so running it with `-m hydra/launcher=basic hydra/sweeper=basic` over a grid measures what Hydra's own
multirun costs for that grid: the basic sweeper composes every cell once to validate the batch, and the
basic launcher composes it again and calls the task once per cell. The task itself is free, so the time
measured is Hydra's alone.

    python benchmarks/noop_app.py -m hydra/launcher=basic hydra/sweeper=basic model=a,b dataset=c,d \
        hydra.sweep.dir=/tmp/somewhere
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from sft_grid.planning.resolvers import register

register()

PACKAGE_CONF = str(Path(__file__).resolve().parent.parent / "sft_grid" / "conf")


@hydra.main(version_base=None, config_path=PACKAGE_CONF, config_name="config")
def main(cfg: DictConfig) -> None:
    """Do nothing: only Hydra's composition and launching are measured."""
    return None


if __name__ == "__main__":
    main()
