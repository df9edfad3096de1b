"""The schema's own rules, over every composed cell: no key the schema does not have, every number in its range,
every fixed-set key one of its values.

Hydra rejects an unknown key at compose time, except one added with `+` (that is what `+` is for): `+lrr=1e-5`
would train with the default lr in a cell named as if lr were set. So every key of the composed config is
checked against the dataclasses; only the mappings (`extra`, `vars`, `cluster.env`, ...) take keys of their own.
Ranges and value sets are read from the fields' metadata (sft_grid/core/schema.py), so there is one place to
change a key's rule. A grid's cells share their group sections, so each section is checked once.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator, Mapping

from sft_grid.core.problems import Problem
from sft_grid.core.schema import CellConf
from sft_grid.core.schema_fields import Range, field_shapes
from sft_grid.planning.messages import did_you_mean

MISSING_TEXT = "???"
# (key, value, rule, message, fix) of a section, before the cell's name is known
Finding = tuple[str, Any, str, str, str]


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any, Range | None, tuple[str, ...] | None]]:
    """name -> (how its value nests, the dataclass it holds, its range, its values)."""
    return {name: (how, held, f.metadata.get("range"), f.metadata.get("choices"))
            for name, how, held, f in field_shapes(cls)}


# checked sections: (kind, class, id) -> (the section, its findings); an entry keeps the section alive
_SEEN: dict[tuple[str, type, int], tuple[Any, list[Finding]]] = {}


def _cached(kind: str, cls: type, obj: Any, compute: Any) -> list[Finding]:
    key = (kind, cls, id(obj))
    hit = _SEEN.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    found = compute()
    if len(_SEEN) > 8192:
        _SEEN.clear()
    _SEEN[key] = (obj, found)
    return found


def _prefixed(prefix: str, found: list[Finding]) -> Iterator[Finding]:
    """Findings of a section, their keys under `prefix`. In their text, {where} is the section a key is in
    (until the outermost section: then "the cell") and {key} the key's full path; both filled in at the top."""
    for key, value, rule, message, fix in found:
        full = f"{prefix}{key}"
        if prefix:
            yield full, value, rule, message, fix
            continue
        section = full.rsplit(".", 1)[0] if "." in full else "the cell"
        yield (full, value, rule, message.replace("{where}", section).replace("{key}", full),
               fix.replace("{where}", section).replace("{key}", full))


def _unknown(data: Mapping[str, Any], cls: type) -> list[Finding]:
    fields = _fields(cls)
    found: list[Finding] = []
    for key, value in data.items():
        if key not in fields:
            valid = sorted(fields)
            found.append((key, value, "unknown-key",
                          f"{{where}} has no key {key!r} ({cls.__name__}); nothing reads it, so it would change nothing"
                          " (Hydra lets a key added with `+` through)",
                          f"use a key of {{where}}{did_you_mean(key, valid)}: {', '.join(valid)}; backend keys sft_grid"
                          " does not model go under extra, e.g. +extra.packing=true"))
            continue
        how, held, _, _ = fields[key]
        if how == "dataclass" and isinstance(value, Mapping):
            found += _prefixed(f"{key}.", _cached("keys", held, value, lambda v=value, h=held: _unknown(v, h)))
        elif how == "mapping" and isinstance(value, Mapping):
            for name, sub in value.items():
                if isinstance(sub, Mapping):
                    found += _prefixed(f"{key}.{name}.", _cached("keys", held, sub, lambda v=sub, h=held: _unknown(v, h)))
    return found


def unknown_keys(cell: str, data: Mapping[str, Any], cls: type = CellConf) -> list[Problem]:
    """Keys of the composed config (plain data) that the schema does not have."""
    return [Problem(cell, *f) for f in _prefixed("", _unknown(data, cls))]


def _values(spec: Any) -> list[Finding]:
    found: list[Finding] = []
    for name, (how, held, rng, choices) in _fields(type(spec)).items():
        value = getattr(spec, name)
        if isinstance(value, str) and value == MISSING_TEXT:
            found.append((name, None, "required", "has no value, and the cell needs one",
                          "set {key} (in its conf/ file, or as an override {key}=...)"))
            continue
        if rng is not None and value is not None and not isinstance(value, bool) and isinstance(value, (int, float)):
            if not rng.admits(value):
                found.append((name, value, "range", f"must be {rng.text()}", f"set {{key}} to a value {rng.text()}"))
        if choices is not None and value is not None:
            for item in value if isinstance(value, list) else [value]:
                if item not in choices:
                    found.append((name, item, "choice", "not a value sft_grid and the backends support",
                                  f"use one of {', '.join(choices)}{did_you_mean(str(item), choices)}"))
        if how == "dataclass" and dataclasses.is_dataclass(value):
            found += _prefixed(f"{name}.", _cached("values", held, value, lambda v=value: _values(v)))
        elif how == "mapping" and isinstance(value, dict):
            for key, sub in value.items():
                if dataclasses.is_dataclass(sub):
                    found += _prefixed(f"{name}.{key}.", _cached("values", held, sub, lambda v=sub: _values(v)))
    return found


def values(cell: str, spec: Any) -> list[Problem]:
    """Every field with a range or a value set (its metadata) holds an allowed value; nothing required is unset."""
    return [Problem(cell, *f) for f in _prefixed("", _values(spec))]
