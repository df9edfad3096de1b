"""The team's own configs before the shipped ones: a Hydra search path plugin (sft_grid/core/project.py says where
they are found). It acts only for sft_grid's own configs (a search path holding `pkg://sft_grid.conf` or its
folder), so another Hydra app in the same environment composes as it would without sft_grid."""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROVIDER = "sft_grid project"


class ProjectSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from sft_grid.core import project
        from sft_grid.core.paths import PACKAGE_CONF

        shipped = ("pkg://sft_grid.conf", f"file://{PACKAGE_CONF}", str(PACKAGE_CONF))  # the app, or the folder
        if not any(e.path in shipped for e in search_path.get_path()):
            return

        for conf in reversed(project.user_dirs()):  # prepended one by one: the first folder ends up first
            search_path.prepend(PROVIDER, f"file://{conf}")
