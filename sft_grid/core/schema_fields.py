"""The schema's field helpers: a numeric key's range, a key's fixed set of values, and how each field nests.

Each numeric key of the schema (sft_grid/core/schema.py) carries its range and each key with a fixed set of
values carries that set, in the field's metadata: one generic validation rule (planning/schema_rules.py) reads
them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """Allowed numbers: lo <= x <= hi (open ends excluded); `none_ok`: null means "not set"."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def admits(self, x: float) -> bool:
        if isinstance(x, float) and math.isnan(x):
            return False
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def text(self) -> str:
        def show(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        lo = "" if self.lo == -math.inf else f"{'>' if self.lo_open else '>='} {show(self.lo)}"
        hi = "" if self.hi == math.inf else f"{'<' if self.hi_open else '<='} {show(self.hi)}"
        return " and ".join(p for p in (lo, hi) if p)


def num(default: Any, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
        hi_open: bool = False) -> Any:
    """A numeric key with its range."""
    return field(default=default, metadata={"range": Range(lo, hi, lo_open, hi_open)})


def one_of(default: Any, values: tuple[str, ...]) -> Any:
    """A key with a fixed set of values (for a list: of its items)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"choices": values})
    return field(default=default, metadata={"choices": values})


@functools.cache
def field_shapes(cls: type) -> tuple[tuple[str, str, Any, Any], ...]:
    """(name, how its value nests: dataclass | mapping | plain, the dataclass it holds, the field) of each field
    of a schema class; what building typed cells and checking unknown keys both walk."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Union:
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = inner[0] if len(inner) == 1 else hint
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            out.append((f.name, "dataclass", hint, f))
        elif typing.get_origin(hint) in (dict, typing.Dict) and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            out.append((f.name, "mapping", args[1], f))
        else:
            out.append((f.name, "plain", None, f))
    return tuple(out)
