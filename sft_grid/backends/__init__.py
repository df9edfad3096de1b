"""Training backends: each turns a cell into the backend's own files and command line.

Each module has NAME, CONFIG_FILE and files(cell, cell_dir) (its structured files, as data),
command(cell, cell_dir, env_bin) (the training argv), env(cell) (variables launch.sh exports; the
cluster's own env wins), pre_commands(cell, cell_dir, env_bin) (steps launch.sh runs before training)
and resume_args(checkpoint) (what makes a rerun resume from a checkpoint).

A closed registry: conf/backend/<name>.yaml must have a module here (tests/test_shipped_configs.py
checks both directions).
"""

from __future__ import annotations

from types import ModuleType

from sft_grid.backends import axolotl, llamafactory

BACKENDS: dict[str, ModuleType] = {m.NAME: m for m in (llamafactory, axolotl)}


def get(name: str) -> ModuleType:
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}") from None
