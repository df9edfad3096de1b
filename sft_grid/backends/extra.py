"""A cell's `extra` (backend keys passed through as they are) never sets a key sft_grid derives or models.

`+extra.gradient_accumulation_steps=4` would reach the backend while everything sft_grid says about the cell (the
dry run's table, the estimates, the identity) still says what it derived: the dry run would no longer show what
is submitted. Which keys collide is read from the renderer itself, never from a list kept by hand: the keys a
backend's renderer writes for this cell from the cell alone (its config with no `extra` and no
`backend.train_defaults`, which `extra` may override), and the keys it writes for some other value of a modelled
key (a key rendered only when set, such as max_steps). The same probe names the modelled keys to set instead:
those whose change changes the backend key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from sft_grid.backends.base import Backend
from sft_grid.core.problems import Problem
from sft_grid.core.schema import CellConf
from sft_grid.planning.cells import Cell

# sections of the cell whose scalar keys are probed, besides the cell's own
_SECTIONS = ("model", "cluster", "mix", "layout")
# keys that say where or how sft_grid runs, or what it passes through: never probed
# (sweep_name and runs_root place the cell's directory, which sft_grid derives whole: output_dir is its own)
_SKIP = frozenset(
    {
        "extra",
        "vars",
        "backend",
        "dataset",
        "eval",
        "notify",
        "failure_policy",
        "watchdog",
        "dry_run",
        "sweep_name",
        "runs_root",
    }
)


def _bare(cell: Cell, spec: CellConf) -> Cell:
    return dataclasses.replace(
        cell, spec=dataclasses.replace(spec, extra={}, backend=dataclasses.replace(spec.backend, train_defaults={}))
    )


def _render(backend: Backend, cell: Cell) -> dict[str, Any]:
    # rendered for the cell's own directory (nothing is written)
    return dict(backend.files(cell, cell.sweep_dir / cell.name)[backend.config_file])


def _other(value: Any, choices: tuple[str, ...] | None, hint: Any = None) -> Any:
    """Another value of a modelled key, or None when it is not a scalar to vary (an unset switch, `bool | None`
    such as packing, varies to on)."""
    if value is None and "bool" in str(hint):
        return True
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 1 if value > 0 else 2
    if isinstance(value, float):
        return value * 2 + 0.25
    if isinstance(value, str):
        return next((c for c in choices or () if c != value), value + "x")
    return None


def _variants(spec: CellConf) -> Iterator[tuple[str, Any]]:
    """(modelled key, the cell's spec with that key changed) for each scalar key of the cell and its sections."""
    for f in dataclasses.fields(spec):
        if f.name in _SKIP:
            continue
        value = getattr(spec, f.name)
        if f.name in _SECTIONS and dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                other = _other(getattr(value, g.name), g.metadata.get("choices"), g.type)
                if other is not None:
                    section: Any = dataclasses.replace(value, **{g.name: other})  # type: ignore[type-var]
                    yield f"{f.name}.{g.name}", dataclasses.replace(spec, **{f.name: section})
            continue
        other = _other(value, f.metadata.get("choices"), f.type)
        if other is not None:
            yield f.name, dataclasses.replace(spec, **{f.name: other})


_MISSING = object()
# backend -> (every key its renderer writes for some value of a modelled key, backend key -> those modelled keys)
_PROBED: dict[str, tuple[frozenset[str], dict[str, list[str]]]] = {}


def _probe(backend: Backend, cell: Cell) -> tuple[frozenset[str], dict[str, list[str]]]:
    """Once per backend and process, on the first cell with an `extra`: which modelled keys change which
    backend keys (a variant the renderer cannot render is skipped)."""
    if backend.name not in _PROBED:
        base = _render(backend, _bare(cell, cell.spec))
        keys = set(base)
        modelled: dict[str, list[str]] = {}
        for name, spec in _variants(cell.spec):
            try:
                changed = _render(backend, _bare(cell, spec))
            except Exception:  # a value the renderer refuses: that key tells nothing here
                continue
            keys |= set(changed)
            for k in set(base) | set(changed):
                if base.get(k, _MISSING) != changed.get(k, _MISSING):
                    modelled.setdefault(k, []).append(name)
        _PROBED[backend.name] = (frozenset(keys), modelled)
    return _PROBED[backend.name]


def collisions(backend: Backend, cell: Cell) -> Iterator[Problem]:
    """Each `extra` key that the backend's renderer derives from the cell, refused with the modelled key(s)."""
    extra = cell.spec.extra
    if not extra:
        return
    derived = _render(backend, _bare(cell, cell.spec))
    ever, modelled = _probe(backend, cell)
    for key in sorted(extra):
        if key not in derived and key not in ever:
            continue
        instead = modelled.get(key, [])
        shown = f", where sft_grid writes {derived[key]!r}" if key in derived else ""
        yield Problem(
            cell=cell.name,
            key=f"extra.{key}",
            value=extra[key],
            rule="extra-derived",
            message=f"sets {backend.name}'s {key!r}, which sft_grid derives"
            + (f" from {', '.join(instead)}" if instead else " itself (from the cell's directory and inputs)")
            + f"{shown}: the backend would get the extra value while the dry run, the estimates and the cell's"
            " identity say what sft_grid derived",
            fix=(f"set {' / '.join(instead)} instead and drop extra.{key}" if instead else f"drop extra.{key}")
            + " (extra is for backend keys sft_grid does not model)",
        )
