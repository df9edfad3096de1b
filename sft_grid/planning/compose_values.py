"""Value overrides of a grid's cells, each applied once by Hydra's own override code.

A sweep of 10 learning rates x 50 seeds has 1000 cells but 60 distinct value overrides: each is applied on the
reference config (with the groups its keys live in swapped to the cell's options) and the final value it leaves is
kept, keyed by the override and those groups.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from sft_grid.planning.compose_parts import (DELETED, NeedsHydra, Open, Reference, effective_path, get_path,
                                             has_non_env_interpolation, plain)


class ValueEffects:
    """(path, final value) of value overrides, cached per override and per swapped groups."""

    def __init__(self) -> None:
        self._effects: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}
        self._scratches: dict[tuple[Any, ...], DictConfig] = {}
        self.applications = 0  # distinct (overrides, swapped groups) applied by Hydra's code

    def effects_of(self, ref: "Reference", values: list[Override], swapped: dict[str, Any]) -> list[tuple[str, Any]]:
        """(path, final value) of each value override, applied by Hydra's own code on the reference with the
        cell's group subtrees. Overrides on disjoint paths are applied one by one and cached alone (a sweep of
        10 lrs x 50 seeds is 60 applications, not 1000); overrides on overlapping paths (`mix.probs=[..]` with
        `mix.probs.0=0.7`) are applied together, in order, as Hydra applies them."""
        paths = [v.key_or_group for v in values]
        overlapping = {i for i, a in enumerate(paths) for j, b in enumerate(paths)
                       if i != j and (a == b or a.startswith(b + ".") or b.startswith(a + "."))}
        effects: list[tuple[str, Any]] = []
        together = [v for i, v in enumerate(values) if i in overlapping]
        for i, ov in enumerate(values):
            if i not in overlapping:
                effects += self._effects_cached(ref, [ov], swapped)
        if together:
            effects += self._effects_cached(ref, together, swapped)
        return effects

    def _effects_cached(self, ref: "Reference", values: list[Override], swapped: dict[str, Any]) -> list[tuple[str, Any]]:
        owners = {v.key_or_group.split(".", 1)[0] for v in values}
        touched = {g: t for g, t in swapped.items() if g in owners}
        groups = tuple(sorted((g, id(t)) for g, t in touched.items()))
        key = (tuple(v.input_line for v in values), groups)
        cached = self._effects.get(key)
        if cached is not None:
            return cached
        self.applications += 1
        before = {**ref.plain, **{g: sub[0] for g, sub in touched.items()}}
        # a new nested key or a list element: the value that changed is the nearest node the cell has
        paths = [effective_path(before, ov.key_or_group) for ov in values]
        if any(ov.is_delete() or ov.is_add() or ov.is_force_add() for ov in values) or any(
                isinstance(get_path(before, p), Mapping) for p in paths):
            scratch = applied(ref, values, touched)
        else:  # assignments to existing leaves: on a kept copy, put back afterwards (a deep copy costs ~10 ms)
            scratch = self._scratches.get(groups) or self._scratches.setdefault(groups, applied(ref, [], touched))
            saved = {p: plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=False) for p in paths}
            try:
                apply_overrides(values, scratch)
                effects = [(p, plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=True)) for p in paths]
            except Exception:
                self._scratches.pop(groups, None)  # left half-changed: never used again
                raise
            for p, old in saved.items():
                OmegaConf.update(scratch, p, old, merge=False)
            self._effects[key] = effects
            return effects
        effects = [(ov.key_or_group, DELETED) if ov.is_delete() else
                   (p, plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=True))
                   for ov, p in zip(values, paths)]
        self._effects[key] = effects
        return effects


def applied(ref: "Reference", values: list[Override], swapped: dict[str, Any]) -> DictConfig:
    """A copy of the reference's config with these group subtrees and value overrides (Hydra's own code)."""
    scratch = copy.deepcopy(ref.cfg)
    with Open(scratch):
        for group, (_, node) in swapped.items():
            scratch[group] = node
    OmegaConf.set_struct(scratch, True)
    apply_overrides(values, scratch)
    return scratch


def apply_overrides(values: list[Override], scratch: DictConfig) -> None:
    if any(has_non_env_interpolation(v.value()) for v in values):
        raise NeedsHydra()  # the value reads other keys, which differ from cell to cell
    ConfigLoaderImpl._apply_overrides_to_config(values, scratch)
