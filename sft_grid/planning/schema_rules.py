"""The schema's own rules over a composed cell: no key the schema does not have (Hydra lets a key added with `+`
through, and nothing would read it), and every field with a range or a value set (its metadata) holds an allowed
value, nothing required left unset. Read from the schema's fields (core/schema.py), so a new key is checked as
soon as it is declared; each section checked once per grid (the cells share most of theirs)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from sft_grid.core.problems import Problem
from sft_grid.core.schema import CellConf, Range, field_shapes, fingerprint
from sft_grid.planning.hydra_errors import did_you_mean

MISSING_TEXT = "???"
# (key, value, rule, message, fix) of a section, before the cell's name is known
Finding = tuple[str, Any, str, str, str]


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any, Range | None, tuple[str, ...] | None]]:
    """name -> (how its value nests, the dataclass it holds, its range, its values)."""
    return {
        name: (how, held, f.metadata.get("range"), f.metadata.get("choices"))
        for name, how, held, f in field_shapes(cls)
    }


# checked sections: (kind, class, the section's value) -> its findings; the cells of a grid share most sections
_SEEN: dict[tuple[str, type, str], list[Finding]] = {}


def _cached(kind: str, cls: type, obj: Any, compute: Callable[[], list[Finding]]) -> list[Finding]:
    key = (kind, cls, fingerprint(obj))
    found = _SEEN.get(key)
    if found is None:
        if len(_SEEN) > 8192:
            _SEEN.clear()
        found = _SEEN[key] = compute()
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
        yield (
            full,
            value,
            rule,
            message.replace("{where}", section).replace("{key}", full),
            fix.replace("{where}", section).replace("{key}", full),
        )


def _unknown(data: Mapping[str, Any], cls: type) -> list[Finding]:
    fields = _fields(cls)
    found: list[Finding] = []
    for key, value in data.items():
        if key not in fields:
            valid = sorted(fields)
            found.append(
                (
                    key,
                    value,
                    "unknown-key",
                    f"{{where}} has no key {key!r} ({cls.__name__}); nothing reads it, so it would change nothing"
                    " (Hydra lets a key added with `+` through)",
                    f"use a key of {{where}}{did_you_mean(key, valid)}: {', '.join(valid)}; backend keys sft_grid"
                    " does not model go under extra, e.g. +extra.ddp_timeout=3600",
                )
            )
            continue
        how, held, _, _ = fields[key]
        if how == "dataclass" and isinstance(value, Mapping):
            found += _prefixed(f"{key}.", _cached("keys", held, value, functools.partial(_unknown, value, held)))
        elif how == "mapping" and isinstance(value, Mapping):
            for name, sub in value.items():
                if isinstance(sub, Mapping):
                    found += _prefixed(
                        f"{key}.{name}.", _cached("keys", held, sub, functools.partial(_unknown, sub, held))
                    )
    return found


def unknown_keys(cell: str, data: Mapping[str, Any], cls: type = CellConf) -> list[Problem]:
    """Keys of the composed config (plain data) that the schema does not have."""
    return [
        Problem(cell=cell, key=k, value=v, rule=r, message=m, fix=x)
        for k, v, r, m, x in _prefixed("", _unknown(data, cls))
    ]


def _lost_minus(value: float, rng: Range) -> str:
    """A hint where the value is above its range and the same digits with the exponent's sign turned are in it
    (lr=2e5 for 2e-5): the minus sign lost in typing. From 100 up only: 40 was not typed with an exponent."""
    if not (math.isfinite(value) and value >= 100 and value > rng.hi):
        return ""
    turned = value / 10.0 ** (2 * math.floor(math.log10(value)))
    return f" (did you mean {turned:g}? the exponent's minus sign may be missing)" if rng.admits(turned) else ""


def _values(spec: Any) -> list[Finding]:
    found: list[Finding] = []
    cls: type = type(spec)
    for name, (how, held, rng, choices) in _fields(cls).items():
        value = getattr(spec, name)
        if isinstance(value, str) and value == MISSING_TEXT:
            found.append(
                (
                    name,
                    None,
                    "required",
                    "has no value, and the cell needs one",
                    "set {key} (in its conf/ file, or as an override {key}=...)",
                )
            )
            continue
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        infinite = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, float)]
        infinite = [v for v in infinite if not math.isfinite(v)]
        if infinite and (rng is None or not numeric):
            # a number no key gives a range to (a probability list, ...): finite all the same
            found.append((name, value, "finite", f"holds {infinite[0]}: not a number", "set {key} to finite numbers"))
        if rng is not None and numeric and not rng.admits(value):
            finite = "" if math.isfinite(value) else "a finite number "
            found.append(
                (
                    name,
                    value,
                    "range",
                    f"must be {finite}{rng.text()}",
                    f"set {{key}} to a value {rng.text()}{_lost_minus(value, rng)}",
                )
            )
        if choices is not None and value is not None:
            found.extend(
                (
                    name,
                    item,
                    "choice",
                    "not a value sft_grid and the backends support",
                    f"use one of {', '.join(choices)}{did_you_mean(str(item), choices)}",
                )
                for item in (value if isinstance(value, list) else [value])
                if item not in choices
            )
        if how == "dataclass" and dataclasses.is_dataclass(value):
            found += _prefixed(f"{name}.", _cached("values", held, value, functools.partial(_values, value)))
        elif how == "mapping" and isinstance(value, dict):
            for key, sub in value.items():
                if dataclasses.is_dataclass(sub):
                    found += _prefixed(f"{name}.{key}.", _cached("values", held, sub, functools.partial(_values, sub)))
    return found


def values(cell: str, spec: CellConf) -> list[Problem]:
    """Every field with a range or a value set (its metadata) holds an allowed value; nothing required is unset."""
    return [
        Problem(cell=cell, key=k, value=v, rule=r, message=m, fix=x) for k, v, r, m, x in _prefixed("", _values(spec))
    ]


def section_values(cell: str, prefix: str, section: Any) -> list[Problem]:
    """`values` of one section read on its own (a site's cluster profile, `sites=[...]`), its keys under `prefix`."""
    found = [(f"{prefix}{k}", v, r, m, x) for k, v, r, m, x in _values(section)]
    return [Problem(cell=cell, key=k, value=v, rule=r, message=m, fix=x) for k, v, r, m, x in _prefixed("", found)]
