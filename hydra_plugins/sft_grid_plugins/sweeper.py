"""Hydra's basic sweeper (same grammar: a,b / range() / choice() / glob() / params), all cells in one batch."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override, RangeSweep
from omegaconf import open_dict


class SftGridSweeper(BasicSweeper):
    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        # The stock check composes every cell with Hydra one more time; sft_grid's planner composes each
        # cell itself and reports every problem of every cell at once, so this would only double the cost.
        return None

    @staticmethod
    def split_arguments(overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        # range(a,b,0) never reaches b (Python's range() refuses it, with a traceback, where the axis is listed below)
        stuck = [o for o in overrides if isinstance(sweep := o.value(), RangeSweep) and sweep.step == 0]
        if stuck:
            from sft_grid.cli.app import fail_zero_step_axes

            fail_zero_step_axes([o.input_line for o in stuck if o.input_line is not None])
        # An axis with no value (a glob that matches nothing, an empty range) would make the whole grid empty
        # without saying which axis: it is named, with everything else the user needs, before anything runs.
        empty = [
            o
            for o in overrides
            if o.is_sweep_override() and o.is_discrete_sweep() and not list(o.sweep_string_iterator())
        ]
        if empty:
            from sft_grid.cli.app import fail_empty_axes

            # parsed from the command line or a sweep file, every override keeps its text
            fail_empty_axes([o.input_line for o in empty if o.input_line is not None])
        # interval(a,b) is a continuous range for the samplers of Hydra's Optuna/Nevergrad sweepers: a grid has no
        # finite list of its values to give a cell each
        continuous = [o for o in overrides if o.is_sweep_override() and not o.is_discrete_sweep()]
        if continuous:
            from sft_grid.cli.app import fail_continuous_axes

            fail_continuous_axes([o.input_line for o in continuous if o.input_line is not None])
        return BasicSweeper.split_arguments(overrides, max_batch_size)

    def sweep(self, arguments: list[str]) -> Any:
        # The basic sweeper saves multirun.yaml into hydra.sweep.dir; a grid's record is its cells'
        # directories, so that file goes to a directory that is removed afterwards.
        assert self.config is not None
        with tempfile.TemporaryDirectory(prefix="sft_grid-sweep-") as scratch:
            with open_dict(self.config):
                self.config.hydra.sweep.dir = scratch
            return super().sweep(arguments)
