"""A Hydra launcher that receives every cell of the grid at once and hands them to sft_grid.cli.app."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class SftGridLauncher(Launcher):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from sft_grid.cli.app import run_grid

        assert self.config is not None and self.hydra_context is not None
        result = run_grid(self.config, [list(o) for o in job_overrides], self.hydra_context.config_loader)
        returns = []
        # not strict: cells that differ only in their evaluation suite (an `eval=a,b` axis) are one cell, one state
        for overrides, state in zip(job_overrides, result.states, strict=False):
            ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
            ret.return_value = state
            returns.append(ret)
        return returns
