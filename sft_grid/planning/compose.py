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

Below the composer: its plain data (the composed cell, its errors, the reference, setting a dotted key) and the value
overrides of a grid's cells each applied once by Hydra's own override code (`ValueEffects`). What Hydra and OmegaConf
refuse is said for a user in planning/hydra_errors.py; the command line read before Hydra composes, in
planning/command_line.py.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import create_defaults_list
from hydra.core.default_element import ResultDefault
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def _line(override: Override) -> str:
    """The override as the command line gave it (a parsed override always has its line)."""
    return override.input_line or ""


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
        self._layer_cache: dict[str, tuple[list[Any], list[Any]] | None] = {}
        self._sections: dict[tuple[Any, ...], tuple[Any, list[tuple[str, Any]], Any]] = {}
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
            return as_dict(plain(cfg, resolve=True))
        except Exception as exc:
            raise CompositionError(overrides, error_text(exc)) from exc

    # -- the reference cell ----------------------------------------------------------------------------
    def _reference(self, overrides: Sequence[str]) -> Reference:
        # Only the group choices: every cell, this one included, gets its value overrides applied on top.
        groups, _ = self._split(overrides)
        group_lines = [_line(ov) for ov in groups.values()]
        cfg = self.hydra_compose(group_lines)
        # Hydra's compute_defaults_list, on the grid's repository: it would build a repository of its own and
        # load every config file again (the search path depends on the Hydra overrides only, which built ours)
        defaults = create_defaults_list(
            repo=self._repo,
            config_name=self._config_name,
            prepend_hydra=True,
            skip_missing=False,
            overrides_list=OverridesParser.create().parse_overrides(self._hydra_overrides + group_lines),
        ).defaults
        group_entries: dict[str, list[int]] = {}
        for i, d in enumerate(defaults):
            if d.parent == self._config_name and d.package and "." not in d.package and not d.is_self:
                group_entries.setdefault(d.package, []).append(i)
        with Open(cfg):
            del cfg["hydra"]
        return Reference(
            groups={k: _line(v) for k, v in groups.items()},
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
    def _layers(self, ref: Reference, group: str) -> tuple[list[Any], list[Any]] | None:
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
                if loaded is not None and group in cast(DictConfig, loaded.config).keys():  # noqa: SIM118 (MISSING)
                    (before if i < first else after).append(loaded.config._get_node(group))
            self._layer_cache[group] = result
        return self._layer_cache[group]

    def _subtree(self, ref: Reference, group: str, override: Override) -> Any:
        """(plain resolved data, config node) of the group's package for this choice, or None when the
        fast path does not apply. It is the same merge Hydra does, restricted to the group's package."""
        choice = override.value()
        key = (group, repr(choice))
        if key in self._subtrees:
            return self._subtrees[key]
        options = choice if isinstance(choice, list) else [choice]
        result: Any = None
        layers = self._layers(ref, group)
        entries = [
            ResultDefault(config_path=f"{group}/{opt}", package=group) for opt in options if isinstance(opt, str)
        ]
        loaded = [self._repo.load_config(f"{group}/{opt}") for opt in options if isinstance(opt, str)]
        if (
            layers is not None
            and len(entries) == len(options)
            and all(loaded)
            and all(map(self._simple_option, entries))
        ):
            before, after = layers
            try:
                node = OmegaConf.merge(*before, *(x.config for x in loaded if x is not None), *after)
                if not has_non_env_interpolation(plain(node, resolve=False)):
                    result = (plain(node, resolve=True), node)
            except Exception:  # let the full compose report it, with Hydra's message for this cell
                result = None
        self._subtrees[key] = result
        return result

    def _entry_owners(self, ref: Reference) -> list[tuple[str | None, int]]:
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

    def _fast(self, ref: Reference, overrides: Sequence[str]) -> dict[str, Any] | None:
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
        by_top: dict[str, list[tuple[str, Any]]] = {}
        for effect in self.values.effects_of(ref, values, swapped) if values else ():
            by_top.setdefault(effect[0].split(".", 1)[0], []).append(effect)
        for top, effects in by_top.items():
            if all("." in path for path, _ in effects):
                config[top] = self._section(top, config.get(top), effects)
            else:  # the key itself is set: in order, as Hydra applies them
                for path, value in effects:
                    set_path(config, path, value)
        return config

    def _section(self, top: str, base: Any, effects: list[tuple[str, Any]]) -> Any:
        """The top-level section `base` with these value overrides in it (in order), built once for every cell
        that has the same section and overrides (`cluster.cpus_per_node=3` in every cell): the cells then share
        one object, as they share an unchanged section, and what is derived per section (the typed spec, the
        environment, the section's YAML) is derived once. Keyed by identity: the effects are ValueEffects'
        cached objects and the base a shared section; the entry keeps them alive, so an id is not reused."""
        key = (top, id(base), tuple(id(e) for e in effects))
        hit = self._sections.get(key)
        if hit is not None and hit[0] is base and all(a is b for a, b in zip(hit[1], effects, strict=True)):
            return hit[2]
        holder: dict[str, Any] = {top: base} if base is not None else {}
        for path, value in effects:
            set_path(holder, path, value)
        self._sections[key] = (base, effects, holder.get(top))
        return holder.get(top)

    def _resolved_whole(self, ref: Reference, values: list[Override], swapped: dict[str, Any]) -> dict[str, Any] | None:
        """A cell of a grid whose config reads other keys (a sweep file's table: `${vars.models.${vars.model}.hub_id}`):
        the reference's unresolved config with this cell's group subtrees swapped in and its value overrides
        applied by Hydra's own code, then resolved as a whole, as Hydra resolves a composed config. What it
        skips is only the defaults tree and the file loads, which are the same for every cell."""
        return as_dict(plain(applied(ref, values, swapped), resolve=True))

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


# An interpolation that reads only the environment resolves the same way in any cell.
_NON_ENV_INTERPOLATION = re.compile(r"\$\{(?!oc\.env:|user_env:|sft_grid_cache:)")
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


def as_dict(data: Any) -> dict[str, Any]:
    """A composed config as plain data: a mapping at its root (what Hydra composes from a primary config)."""
    if not isinstance(data, dict):
        raise TypeError(f"a composed config is a mapping, not {type(data).__name__}")
    return data


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


class ValueEffects:
    """(path, final value) of value overrides, cached per override and per swapped groups."""

    def __init__(self) -> None:
        self._effects: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}
        self._scratches: dict[tuple[Any, ...], DictConfig] = {}
        self.applications = 0  # distinct (overrides, swapped groups) applied by Hydra's code

    def effects_of(self, ref: Reference, values: list[Override], swapped: dict[str, Any]) -> list[tuple[str, Any]]:
        """(path, final value) of each value override, applied by Hydra's own code on the reference with the
        cell's group subtrees. Overrides on disjoint paths are applied one by one and cached alone (a sweep of
        10 lrs x 50 seeds is 60 applications, not 1000); overrides on overlapping paths (`mix.probs=[..]` with
        `mix.probs.0=0.7`) are applied together, in order, as Hydra applies them."""
        paths = [v.key_or_group for v in values]
        overlapping = {
            i
            for i, a in enumerate(paths)
            for j, b in enumerate(paths)
            if i != j and (a == b or a.startswith(b + ".") or b.startswith(a + "."))
        }
        effects: list[tuple[str, Any]] = []
        together = [v for i, v in enumerate(values) if i in overlapping]
        for i, ov in enumerate(values):
            if i not in overlapping:
                effects += self._effects_cached(ref, [ov], swapped)
        if together:
            effects += self._effects_cached(ref, together, swapped)
        return effects

    def _effects_cached(self, ref: Reference, values: list[Override], swapped: dict[str, Any]) -> list[tuple[str, Any]]:
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
            isinstance(get_path(before, p), Mapping) for p in paths
        ):
            scratch = applied(ref, values, touched)
        else:  # assignments to existing leaves: on a kept copy, put back afterwards (a deep copy costs ~10 ms)
            scratch = self._scratches.get(groups) or self._scratches.setdefault(groups, applied(ref, [], touched))
            saved = {p: plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=False) for p in paths}
            try:
                apply_overrides(values, scratch)
                effects = [
                    (p, plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=True)) for p in paths
                ]
            except Exception:
                self._scratches.pop(groups, None)  # left half-changed: never used again
                raise
            for p, old in saved.items():
                OmegaConf.update(scratch, p, old, merge=False)
            self._effects[key] = effects
            return effects
        effects = [
            (ov.key_or_group, DELETED)
            if ov.is_delete()
            else (p, plain(OmegaConf.select(scratch, p, throw_on_missing=False), resolve=True))
            for ov, p in zip(values, paths, strict=True)
        ]
        self._effects[key] = effects
        return effects


def applied(ref: Reference, values: list[Override], swapped: dict[str, Any]) -> DictConfig:
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
