"""A config file Hydra cannot read (a sweep file, a conf group option) as one line: the file, line and column (of
a YAML error, or of the first byte that is not UTF-8).

Hydra loads each YAML file with OmegaConf (PyYAML with a loader that refuses duplicated keys). A file that does
not parse (a syntax error, a tab where YAML wants spaces, the same key twice in one mapping) raises PyYAML's
error from deep inside Hydra's composition, and Hydra prints it under a full stack trace. `install` makes
Hydra's config sources raise it as a composition error instead, which Hydra prints as its one line (and the grid
composer reports like any other cell that cannot be composed): the file source (a team's conf/) and the package
source (pkg://sft_grid.conf, the shipped configs, where a user may add a sweep file of their own too).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

YAML_ERROR = ": not valid YAML: "


def yaml_error_line(exc: Any, path: str) -> str:
    """`<file>:<line>:<column>: <what>` of a PyYAML error (MarkedYAMLError: 0-based marks), with the fix."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    start = getattr(exc, "context_mark", None)
    if context and start is not None and start is not mark:
        problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    if "duplicate key" in problem:
        fix = "keep one of the two entries (a later one would silently replace the first)"
    elif "'\\t'" in problem or "\\t" in problem:
        fix = "indent with spaces, not tabs"
    else:
        fix = "fix the YAML syntax there (a quote, bracket or indentation)"
    return f"{where}{YAML_ERROR}{problem}; {fix}"


def option_data(path: Any) -> Any:
    """An option file's YAML data as written (plain, the values as the user wrote them); None where it is empty or
    cannot be read (not UTF-8, not YAML, gone: `install`'s one line says which, when Hydra reads it)."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _shown(path: str) -> str:
    """A file's path as the one line names it: relative where it is under the working directory."""
    import os

    return os.path.relpath(path) if os.path.abspath(path).startswith(os.getcwd() + os.sep) else path


def _one_line(original: Any, scheme: str) -> Any:
    """A config source's load_config that raises a YAML error as a composition error, its one line."""
    from hydra.errors import ConfigCompositionException

    @functools.wraps(original)
    def load_config(self: Any, config_path: str) -> Any:
        import os
        from importlib import resources

        import yaml

        from sft_grid.core.cellfiles import not_utf8

        try:
            return original(self, config_path)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            name = self._normalize_file_name(config_path)
            if scheme == "pkg":  # self.path is the package, dotted (sft_grid.conf): the file where it is installed
                path = str(resources.files(self.path).joinpath(name))
            else:
                path = os.path.join(self.path.split("://", 1)[-1], name)
            if isinstance(exc, UnicodeDecodeError):  # Hydra reads the file as UTF-8 (a file saved as latin-1, UTF-16)
                fix = "save it as UTF-8 (iconv -f <its encoding> -t utf-8)"
                said = f"{_shown(path)}{YAML_ERROR}{not_utf8(exc.object, exc)}; {fix}"
                raise ConfigCompositionException(said) from None
            raise ConfigCompositionException(yaml_error_line(exc, _shown(path))) from None

    load_config._sft_grid_yaml_lines = True  # type: ignore[attr-defined]
    return load_config


def install() -> None:
    """Hydra's file and package config sources raise a YAML error as one line naming the file (once per
    process)."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    # Hydra's plugin scan executes its core plugins' modules again (new classes): the classes to wrap are the ones
    # the scan registered, so the scan runs first (once per process; Hydra would run it at its first use anyway)
    Plugins.instance()
    for scheme in ("file", "pkg"):
        source: Any = SourcesRegistry.instance().resolve(scheme)
        if not getattr(source.load_config, "_sft_grid_yaml_lines", False):
            source.load_config = _one_line(source.load_config, scheme)
