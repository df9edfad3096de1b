"""Hydra's basic sweeper (same grammar: a,b / range() / choice() / glob() / params), all cells in one batch."""

from __future__ import annotations

from typing import Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class SftGridSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        # The stock check composes every cell with Hydra one more time; sft_grid's planner composes each
        # cell itself and reports every problem of every cell at once, so this would only double the cost.
        return None
