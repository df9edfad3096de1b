"""An override (`key=value` as written on the command line or in a sweep file's params) that gives nothing: a swept
axis that gives no cell, with the fix in values that work for the key (pure: the axis's own text, parsed by Hydra's
override grammar, and the schema's type of the key; the grid is refused with them before anything runs, cli/app.py:
fail_empty_axes, ...), and an empty mapping that clears nothing (`empty_mappings`, a validation rule)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sft_grid.core.problems import Problem

if TYPE_CHECKING:
    from sft_grid.planning.cells import Cell


def _swept(axis: str) -> Any:
    """The sweep a `key=value` axis gives (RangeSweep, Glob, IntervalSweep, ...), None where it does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(axis).value()
    except Exception:
        return None


def _n(x: float) -> str:
    return f"{x:g}"


def _range_of(sweep: Any) -> tuple[float, float, float]:
    """A range's (start, stop, step), as the parser gives them (none is left out once parsed)."""
    return (sweep.start or 0, sweep.stop or 0, 1 if sweep.step is None else sweep.step)


def empty_fix(axis: str) -> str:
    from hydra.core.override_parser.types import Glob, RangeSweep

    from sft_grid.core import project

    key, sweep = axis.split("=", 1)[0], _swept(axis)
    if isinstance(sweep, RangeSweep):
        a, b, step = _range_of(sweep)

        def rng(start: float, stop: float, by: float) -> str:
            return f"{key}=range({_n(start)},{_n(stop)}" + ("" if by == 1 else f",{_n(by)}") + ")"

        if a == b:
            return f"range({_n(a)},{_n(b)}) starts at its stop, which is left out: {rng(a, a + 1, 1)} sweeps {_n(a)}"
        if step > 0:
            return (
                f"a positive step counts up, and {_n(a)} is above {_n(b)}: {rng(b, a, step)} counts up,"
                f" {rng(a, b, -step)} down (the stop is left out)"
            )
        return (
            f"a negative step counts down, and {_n(a)} is below {_n(b)}: {rng(a, b, -step)} counts up,"
            f" {rng(b, a, step)} down (the stop is left out)"
        )
    listed = project.options(key) if key in project.GROUPS else []
    if isinstance(sweep, Glob) and listed:
        return f"glob() matches options of {key}, and there are: {', '.join(listed)}"
    return "glob() matches only options under conf/ (see `sft-grid run --help` for them); list the values: key=a,b"


def zero_step_fix(axis: str) -> str:
    from hydra.core.override_parser.types import RangeSweep

    key, sweep = axis.split("=", 1)[0], _swept(axis)
    if not isinstance(sweep, RangeSweep):
        return f"give a step that is not 0: {key}=range(start,stop,step)"
    start, stop, _ = _range_of(sweep)
    a, b = _n(start), _n(stop)
    if start > stop:
        return f"give a step that is not 0, negative to count down: {key}=range({a},{b},-1)"
    return f"give a step that is not 0: {key}=range({a},{b},1), or leave it out: {key}=range({a},{b}) counts by 1"


def interval_fix(axis: str) -> str:
    """The values to list for an interval, as the key takes them: whole numbers for an integer key (seed), a few
    numbers between the ends for a float (lr)."""
    import math

    from hydra.core.override_parser.types import IntervalSweep

    from sft_grid.planning.hydra_errors import schema_type

    key, sweep = axis.split("=", 1)[0], _swept(axis)
    kind = schema_type(key.lstrip("+"))
    if not isinstance(sweep, IntervalSweep) or kind not in (int, float):
        return f"list the values: {key}=a,b,c (one cell each; or range(start,stop,step), choice(a,b,c))"
    a, b = sorted((sweep.start or 0.0, sweep.end or 0.0))
    if kind is int:
        lo, hi = math.ceil(a), math.floor(b)
        if lo > hi:
            return f"list the values: {key}=a,b,c ({key} takes whole numbers, and none is between {_n(a)} and {_n(b)})"
        some = ",".join(map(str, range(lo, min(hi, lo + 2) + 1))) + ("" if hi - lo <= 2 else ",...")
        return (
            f"list the values: {key}={some}, or every whole number from {lo} to {hi}: {key}=range({lo},{hi + 1})"
            f" ({key} takes whole numbers; range's stop is left out)"
        )
    mid = math.sqrt(a * b) if a > 0 and b / a >= 10 else (a + b) / 2  # a decade apart or more: the geometric middle
    return f"list the values: {key}={a:.3g},{mid:.3g},{b:.3g} (one cell each; or choice(...) of them)"


def empty_mappings(cell: Cell) -> Iterator[Problem]:
    """`key={}` where the key holds entries: Hydra merges a mapping into the one there, and an empty one changes
    nothing, so `eval.tasks={}` still evaluates every task of the suite and `extra={}` still passes every extra.
    (One value among a swept axis's, `extra={},{a:1}`, is a cell of the grid's choosing: left alone.)"""
    from sft_grid.planning.compose import get_path

    keys = [line.lstrip("+~").partition("=")[0] for line in cell.overrides]
    for at, line in enumerate(cell.overrides):
        key, _, written = line.lstrip("+").partition("=")
        if line.startswith("~") or written.strip() != "{}" or _swept(line) != {}:
            continue
        held = get_path(cell.config, key)
        later = {k[len(key) + 1 :].split(".")[0] for k in keys[at + 1 :] if k.startswith(f"{key}.")}
        names = sorted(str(n) for n in held if str(n) not in later) if isinstance(held, Mapping) else []
        if not names:  # nothing there, or only what later overrides put in
            continue
        emptied = " ".join(f"~{key}.{n}" for n in names)
        instead = "; to run no evaluation, eval=none" if key == "eval.tasks" else ""
        yield Problem(
            cell=cell.name,
            key=key,
            value=written,
            rule="empty-mapping",
            message=f"{{}} is merged into {key}, which keeps what it holds ({', '.join(names)}): an empty mapping"
            " clears nothing",
            fix=f"remove its entries one by one: {emptied}{instead}",
        )
