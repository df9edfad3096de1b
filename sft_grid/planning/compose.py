"""Compose every cell of a grid with Hydra's semantics at a fraction of Hydra's cost.

Hydra composes one cell in ~60 ms (defaults tree, a merge per config file, struct flags, overrides). A grid of
20 models x 50 datasets has 1000 cells but only 70 distinct group options, and cells differ only in which option
fills each group package and in a few value overrides. So: (1) one reference cell is composed by Hydra itself;
(2) each (group, option) a cell picks differently is composed once, by Hydra's own merge restricted to that
group's package; (3) each value override (each set of overlapping ones) is applied once by Hydra's own override
code, on the reference with the groups its keys live in swapped, and the final value it leaves is kept; (4) a
cell is the reference's plain data with its subtrees and override values put in place.

Every step is Hydra's own code on the same inputs; what this adds is the observation that group packages are
disjoint. Where the grid's config reads other keys (a sweep file's model table), step 4 works on the reference's
unresolved config and resolves each cell as a whole, as Hydra does. Where the observation does not hold (an
option with its own defaults list or a package header, an override value that reads other keys), the cell is
composed by Hydra in full. tests/test_compose.py proves the result equals ``hydra.compose`` for generated grids.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.default_element import ResultDefault
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from sft_grid.planning.compose_parts import (Composed, CompositionError, NeedsHydra, Open, Reference, error_text,
                                             has_non_env_interpolation, plain, set_path)
from sft_grid.planning.compose_values import ValueEffects, applied

log = logging.getLogger(__name__)

class GridComposer:
    """Composes cells of one grid. Build it once per grid; call :meth:`compose_all`."""

    def __init__(self, loader: ConfigLoaderImpl, config_name: str, hydra_overrides: Sequence[str] = ()) -> None:
        self._loader = loader
        self._config_name = config_name
        self._hydra_overrides = list(hydra_overrides)
        # built as Hydra builds it for a composition, so `hydra.searchpath` adds its config dirs here too
        _, self._repo = loader._parse_overrides_and_create_caching_repo(config_name, self._hydra_overrides)
        self._parser = OverridesParser.create(config_loader=loader)
        self._parsed: dict[str, Override] = {}
        self._groups: dict[str, bool] = {}
        self._subtrees: dict[tuple[str, Any], Any] = {}
        self._layer_cache: dict[str, Any] = {}
        self.values = ValueEffects()
        self._ref: Reference | None = None
        self.stats = {"hydra_composes": 0, "fast": 0}

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse(self, line: str) -> Override:
        parsed = self._parsed.get(line)
        if parsed is None:
            parsed = self._parser.parse_override(line)
            self._parsed[line] = parsed
        return parsed

    def _is_group(self, ov: Override) -> bool:
        if ov.package is not None:
            return False
        key = ov.key_or_group
        known = self._groups.get(key)
        if known is None:
            known = self._groups[key] = self._repo.group_exists(key)
        return known

    def _split(self, overrides: Sequence[str]) -> tuple[dict[str, Override], list[Override]]:
        groups: dict[str, Override] = {}
        values: list[Override] = []
        for line in overrides:
            ov = self._parse(line)
            if self._is_group(ov):
                groups[ov.key_or_group] = ov
            else:
                values.append(ov)
        return groups, values

    # -- Hydra's own composition -----------------------------------------------------------------------
    def hydra_compose(self, overrides: Sequence[str]) -> DictConfig:
        self.stats["hydra_composes"] += 1
        try:
            return self._loader.load_configuration(
                config_name=self._config_name,
                overrides=self._hydra_overrides + list(overrides),
                run_mode=RunMode.RUN,
                from_shell=False,
            )
        except Exception as exc:  # Hydra raises several types; all are the user's input problems here
            raise CompositionError(overrides, error_text(exc)) from exc

    def _composeplain(self, overrides: Sequence[str]) -> dict[str, Any]:
        cfg = self.hydra_compose(overrides)
        with Open(cfg):
            del cfg["hydra"]
        try:
            return plain(cfg, resolve=True)
        except Exception as exc:
            raise CompositionError(overrides, error_text(exc)) from exc

    # -- the reference cell ----------------------------------------------------------------------------
    def _reference(self, overrides: Sequence[str]) -> "Reference":
        # Only the group choices: every cell, this one included, gets its value overrides applied on top.
        groups, _ = self._split(overrides)
        group_lines = [ov.input_line for ov in groups.values()]
        cfg = self.hydra_compose(group_lines)
        defaults = self._loader.compute_defaults_list(
            self._config_name, self._hydra_overrides + group_lines, RunMode.RUN
        ).defaults
        group_entries: dict[str, list[int]] = {}
        for i, d in enumerate(defaults):
            if d.parent == self._config_name and d.package and "." not in d.package and not d.is_self:
                group_entries.setdefault(d.package, []).append(i)
        with Open(cfg):
            del cfg["hydra"]
        return Reference(
            groups={k: v.input_line for k, v in groups.items()},
            cfg=cfg,
            plain=plain(cfg, resolve=True),
            defaults=defaults,
            group_entries=group_entries,
            fast_groups={g for g, idx in group_entries.items() if all(self._simple_option(defaults[i]) for i in idx)},
            # an interpolation that reads other keys resolves differently per cell: Hydra composes those
            context_free=not has_non_env_interpolation(plain(cfg, resolve=False)),
        )

    def _simple_option(self, entry: ResultDefault) -> bool:
        """An option whose content lands entirely in its own group package."""
        if entry.config_path is None:
            return False
        loaded = self._repo.load_config(entry.config_path)
        if loaded is None:
            return False
        package = loaded.header.get("package")
        return not loaded.defaults_list and package in (None, "", "_group_")

    # -- per-option subtrees ---------------------------------------------------------------------------
    def _layers(self, ref: "Reference", group: str) -> tuple[list[Any], list[Any]] | None:
        """The group's part of every other config in the reference's defaults list (the schema, the primary
        config, a sweep file), split at the group's own entries: Hydra merges them in this order."""
        if group not in self._layer_cache:
            first = ref.group_entries[group][0]
            before: list[Any] = []
            after: list[Any] = []
            result: Any = (before, after)
            for owner, i in self._entry_owners(ref):
                d = ref.defaults[i]
                if owner is not None or d.config_path == "hydra/config":
                    continue
                if d.package:  # placed somewhere other than the root: let Hydra compose it
                    result = None
                    break
                loaded = self._repo.load_config(d.config_path) if d.config_path else None
                # keys(), not `in`: the schema's group nodes are MISSING, and `in` skips missing values
                if loaded is not None and group in loaded.config.keys():
                    (before if i < first else after).append(loaded.config._get_node(group))
            self._layer_cache[group] = result
        return self._layer_cache[group]

    def _subtree(self, ref: "Reference", group: str, override: Override) -> Any:
        """(plain resolved data, config node) of the group's package for this choice, or None when the
        fast path does not apply. It is the same merge Hydra does, restricted to the group's package."""
        choice = override.value()
        key = (group, repr(choice))
        if key in self._subtrees:
            return self._subtrees[key]
        options = choice if isinstance(choice, list) else [choice]
        result: Any = None
        layers = self._layers(ref, group)
        entries = [ResultDefault(config_path=f"{group}/{opt}", package=group) for opt in options if isinstance(opt, str)]
        loaded = [self._repo.load_config(d.config_path) for d in entries]
        if layers is not None and len(entries) == len(options) and all(loaded) and all(map(self._simple_option, entries)):
            before, after = layers
            try:
                node = OmegaConf.merge(*before, *(x.config for x in loaded), *after)
                if not has_non_env_interpolation(plain(node, resolve=False)):
                    result = (plain(node, resolve=True), node)
            except Exception:  # let the full compose report it, with Hydra's message for this cell
                result = None
        self._subtrees[key] = result
        return result

    def _entry_owners(self, ref: "Reference") -> list[tuple[str | None, int]]:
        """(owning group or None, index) of each non-Hydra entry of the reference's defaults list."""
        owner = {i: g for g, idx in ref.group_entries.items() for i in idx}
        return [(owner.get(i), i) for i, d in enumerate(ref.defaults) if not (d.package or "").startswith("hydra")]

    # -- cells -----------------------------------------------------------------------------------------
    def compose(self, overrides: Sequence[str]) -> Composed:
        try:
            if self._ref is None:
                self._ref = self._reference(overrides)
            ref = self._ref
            config = self._fast(ref, overrides)
        except NeedsHydra:
            config = None
        except Exception as exc:
            raise CompositionError(overrides, error_text(exc)) from exc
        if config is None:
            return Composed(tuple(overrides), self._composeplain(overrides))
        self.stats["fast"] += 1
        return Composed(tuple(overrides), config)

    def _fast(self, ref: "Reference", overrides: Sequence[str]) -> dict[str, Any] | None:
        groups, values = self._split(overrides)
        if set(groups) - set(ref.groups) and any(g not in ref.fast_groups for g in set(groups) - set(ref.groups)):
            return None
        changed: dict[str, Override] = {}
        for g in set(groups) | set(ref.groups):
            line = groups[g].input_line if g in groups else None
            if line != ref.groups.get(g):
                if g not in ref.fast_groups or g not in groups:
                    return None
                changed[g] = groups[g]
        config = dict(ref.plain)
        swapped: dict[str, Any] = {}
        for g, ov in changed.items():
            sub = self._subtree(ref, g, ov)
            if sub is None:
                return None
            config[g] = sub[0]
            swapped[g] = sub
        if not ref.context_free:
            return self._resolved_whole(ref, values, swapped)
        for path, value in self.values.effects_of(ref, values, swapped) if values else ():
            set_path(config, path, value)
        return config

    def _resolved_whole(self, ref: "Reference", values: list[Override], swapped: dict[str, Any]) -> dict[str, Any] | None:
        """A cell of a grid whose config reads other keys (a sweep file's table: `${vars.models.${vars.model}.hub_id}`):
        the reference's unresolved config with this cell's group subtrees swapped in and its value overrides
        applied by Hydra's own code, then resolved as a whole, as Hydra resolves a composed config. What it
        skips is only the defaults tree and the file loads, which are the same for every cell."""
        return plain(applied(ref, values, swapped), resolve=True)

    def compose_all(self, cells: Iterable[Sequence[str]]) -> tuple[list[Composed], list[CompositionError]]:
        composed: list[Composed] = []
        errors: list[CompositionError] = []
        for overrides in cells:
            try:
                composed.append(self.compose(overrides))
            except CompositionError as exc:
                errors.append(exc)
        log.debug("composed %d cells: %s", len(composed), self.stats)
        return composed, errors
