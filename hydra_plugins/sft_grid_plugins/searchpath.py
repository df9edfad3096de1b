"""The team's own configs before the shipped ones: a Hydra search path plugin (sft_grid/core/project.py says where
they are found). It acts only for sft_grid's own app (a search path whose primary configs are
`pkg://sft_grid.conf`), so another Hydra app in the same environment composes as it would without sft_grid."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

SHIPPED = "pkg://sft_grid.conf"
PROVIDER = "sft_grid project"


class ProjectSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(e.path == SHIPPED for e in search_path.get_path()):
            return
        from sft_grid.core import project

        for conf in reversed(project.user_dirs()):  # prepended one by one: the first folder ends up first
            search_path.prepend(PROVIDER, f"file://{conf}")
