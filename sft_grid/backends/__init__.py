"""Layer 2, backends: each turns a cell into the backend's own files and command line (pure).

One interface (`base.Backend`): files, command, variables, pre-commands, resume arguments, the loss-mask
probe's spec and the backend's own validation rules. A closed registry: conf/backend/<name>.yaml must have a
backend here (tests/test_shipped_configs.py checks both directions). `launch` builds launch.sh from a backend's
command and the cluster's setup; `zero` the DeepSpeed ZeRO-3 config of the models that need it; `wandb` the
W&B grouping (group, name, tags, config) of cells that report to W&B.

Imports sft_grid.core and sft_grid.planning.
"""

from __future__ import annotations

from sft_grid.backends import axolotl, llamafactory, replay, synthetic
from sft_grid.backends.base import Backend, MaskSpec

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (llamafactory.BACKEND, axolotl.BACKEND, synthetic.BACKEND, replay.BACKEND)
}

__all__ = ["BACKENDS", "Backend", "MaskSpec", "get"]


def get(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}") from None
