"""Hydra's basic sweeper (same grammar: a,b / range() / choice() / glob() / params), all cells in one batch."""

from __future__ import annotations

import tempfile
from typing import Any, List, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import open_dict


class SftGridSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        # The stock check composes every cell with Hydra one more time; sft_grid's planner composes each
        # cell itself and reports every problem of every cell at once, so this would only double the cost.
        return None

    def sweep(self, arguments: List[str]) -> Any:
        # The basic sweeper saves multirun.yaml into hydra.sweep.dir; a grid's record is its cells'
        # directories, so that file goes to a directory that is removed afterwards.
        assert self.config is not None
        with tempfile.TemporaryDirectory(prefix="sft_grid-sweep-") as scratch:
            with open_dict(self.config):
                self.config.hydra.sweep.dir = scratch
            return super().sweep(arguments)
