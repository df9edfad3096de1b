"""Registers the cell schema and sft_grid's resolvers with Hydra and OmegaConf (once per process)."""

from __future__ import annotations


def register() -> None:
    """`base_config` (the CellConf schema conf/config.yaml starts from) and ${user_env:...}/${by_size:...}.
    Calling it again is harmless."""
    from hydra.core.config_store import ConfigStore

    from sft_grid.core.schema import CellConf
    from sft_grid.planning import resolvers

    ConfigStore.instance().store(name="base_config", node=CellConf)
    resolvers.register()
