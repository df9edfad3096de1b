"""W&B, where a site has it (`report_to=wandb`): runs grouped by grid, named by cell, the swept values as config and
tags, so the W&B view and the grid report (sft-grid report) name and group the same things.

Both backends start W&B through the HF Trainer's callback, which reads the run's grouping from the environment:
launch.sh exports WANDB_RUN_GROUP (the grid), WANDB_NAME (the cell), WANDB_TAGS (`key=value` of each swept
value), WANDB_CONFIG_PATHS (the cell's wandb_config.yaml: grid, cell, identity and swept values under
`grid/`), and WANDB_PROJECT unless the user set one (the grid's name, as axolotl's `wandb_project` is). The run
id (WANDB_RUN_ID, one run per cell across requeues) is set for every cell by launch.sh already.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from sft_grid.core.overrides import swept_values
from sft_grid.planning.cells import Cell

CONFIG_FILE = "wandb_config.yaml"
_TAG_UNSAFE = re.compile(r"[,\s]+")


def files(cell: Cell) -> dict[str, Any]:
    if cell.spec.report_to != "wandb":
        return {}
    values = {f"grid/{k}": v for k, v in swept_values(cell.overrides).items()}
    return {CONFIG_FILE: {"grid": cell.spec.sweep_name, "grid/cell": cell.name, "grid/key": cell.key, **values}}


def tags(cell: Cell) -> list[str]:
    """W&B tags: at most 64 characters each, and no comma (WANDB_TAGS is a comma-separated list)."""
    return [
        _TAG_UNSAFE.sub("+", f"{k}={v}".replace("[", "").replace("]", ""))[:64]
        for k, v in swept_values(cell.overrides).items()
    ]


def lines(cell: Cell, cell_dir: Path) -> list[str]:
    if cell.spec.report_to != "wandb":
        return []
    s = cell.spec
    return [
        f"export WANDB_RUN_GROUP={shlex.quote(s.sweep_name)} WANDB_NAME={shlex.quote(cell.name)}"
        f" WANDB_TAGS={shlex.quote(','.join(tags(cell)))}"
        f" WANDB_CONFIG_PATHS={shlex.quote(str(cell_dir / CONFIG_FILE))}",
        f"export WANDB_PROJECT=${{WANDB_PROJECT:-{shlex.quote(s.sweep_name)}}}",
    ]
