"""sft_grid's Hydra plugins: a sweeper and a launcher that hand the whole grid to sft_grid at once.

Hydra's stock sweeper composes every cell once more just to validate it (~60 ms a cell) and its stock
launchers run the task once per cell; sft_grid instead plans, validates, renders and submits all cells
together (sft_grid/grid/flow.py) and returns as soon as they are queued.
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore


@dataclass
class SftGridSweeperConf:
    _target_: str = "hydra_plugins.sft_grid_plugins.sweeper.SftGridSweeper"
    max_batch_size: int | None = None
    # the grid's axes, as a sweep file writes them: {key: "a,b,c"} in Hydra's override grammar
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class SftGridLauncherConf:
    _target_: str = "hydra_plugins.sft_grid_plugins.launcher.SftGridLauncher"


ConfigStore.instance().store(group="hydra/sweeper", name="sft_grid", node=SftGridSweeperConf, provider="sft_grid")
ConfigStore.instance().store(group="hydra/launcher", name="sft_grid", node=SftGridLauncherConf, provider="sft_grid")
