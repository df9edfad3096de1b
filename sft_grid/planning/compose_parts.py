"""The pieces of the grid composer that are plain data: the composed cell, its errors, the reference, and setting
an override's effect into a cell's plain config."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from hydra.core.default_element import ResultDefault
from omegaconf import DictConfig, OmegaConf

# An interpolation that reads only the environment resolves the same way in any cell.
_NON_ENV_INTERPOLATION = re.compile(r"\$\{(?!oc\.env:|user_env:)")
DELETED = object()


class CompositionError(Exception):
    """A cell's overrides could not be composed; the message is Hydra's/OmegaConf's."""

    def __init__(self, overrides: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.overrides = list(overrides)
        self.message = message


@dataclass(frozen=True)
class Composed:
    overrides: tuple[str, ...]
    # the resolved cell config as plain data (no `hydra` node)
    config: Mapping[str, Any]


def plain(node: Any, resolve: bool) -> Any:
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=resolve)
    return node


def has_non_env_interpolation(data: Any) -> bool:
    if isinstance(data, str):
        return bool(_NON_ENV_INTERPOLATION.search(data))
    if isinstance(data, dict):
        return any(has_non_env_interpolation(v) for v in data.values())
    if isinstance(data, list):
        return any(has_non_env_interpolation(v) for v in data)
    return False


def error_text(exc: Exception) -> str:
    parts = [str(exc)]
    cause = exc.__cause__
    while cause is not None:
        parts.append(str(cause))
        cause = cause.__cause__
    return "\n".join(p for p in parts if p)


class NeedsHydra(Exception):
    """This cell is outside what the fast path models: Hydra composes it in full."""


@dataclass
class Reference:
    """The grid's first cell composed by Hydra with its group choices only."""

    groups: dict[str, str]
    cfg: DictConfig
    plain: dict[str, Any]
    defaults: list[ResultDefault]
    group_entries: dict[str, list[int]]
    fast_groups: set[str]
    context_free: bool


class Open:
    """Temporarily lift struct on a config, as Hydra's open_dict does for one flag."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg

    def __enter__(self) -> None:
        self.struct = self.cfg._get_node_flag("struct")
        OmegaConf.set_struct(self.cfg, False)

    def __exit__(self, *exc: object) -> None:
        OmegaConf.set_struct(self.cfg, self.struct)


def effective_path(before: Mapping[str, Any], path: str) -> str:
    """The part of an override's dotted path the cell already has as nested mappings, plus the first key it does
    not have (`+extra.a.b=1` changes `extra.a`); a path into a list stops at the list (`mix.probs.0=0.7`
    changes `mix.probs`)."""
    keys = path.split(".")
    node: Any = before
    for i, key in enumerate(keys):
        if not isinstance(node, Mapping):
            return ".".join(keys[:i])  # a list (or a scalar) holds the rest: it is replaced whole
        if key not in node:
            return ".".join(keys[: i + 1])
        node = node[key]
    return path


def get_path(data: Any, path: str) -> Any:
    """The value at a dotted path of plain data (list elements by index), or None where there is none."""
    node = data
    for key in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(key)
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path in plain data, copying each dict on the way (the inputs are shared caches)."""
    keys = path.split(".")
    node = config
    for k in keys[:-1]:
        child = dict(node.get(k) or {})
        node[k] = child
        node = child
    if value is DELETED:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = copy.deepcopy(value)
