"""Text a person reads: the dry-run table, the launch summary, the final states. Formatting only."""

from __future__ import annotations

import os
from typing import Iterable, Sequence

from sft_grid.ledger import CellState
from sft_grid.plan import Cell


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in body]
    return "\n".join(lines)


def _length(cell: Cell) -> str:
    s = cell.spec
    return f"{s.max_steps} steps" if s.max_steps > 0 else f"{s.epochs:g} ep"


def _tags(cell: Cell) -> str:
    return "; ".join(
        f"{name}:{ds.messages}[{ds.tags.role_tag}/{ds.tags.user_tag}/{ds.tags.assistant_tag}]"
        for name, ds in cell.spec.dataset.items()
    )


def relative(path: os.PathLike[str] | str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("../..") else str(path)


CHECK_HEADERS = ("cell", "model", "template", "length", "lr", "grad_acc", "data[role/user/assistant]", "push_to_hub", "output")


def check_rows(cells: Sequence[Cell], dirs: Sequence[os.PathLike[str]]) -> list[tuple[object, ...]]:
    return [
        (c.name, c.spec.model.name, c.spec.model.template, _length(c), f"{c.spec.lr:g}", c.grad_accum, _tags(c),
         c.spec.push_to_hub, relative(os.path.join(d, "output")))
        for c, d in zip(cells, dirs)
    ]


def progress_text(state: CellState) -> str:
    if state.step is None:
        return ""
    total = f"/{state.total_steps}" if state.total_steps else ""
    loss = f" loss {state.loss:.4g}" if isinstance(state.loss, (int, float)) else ""
    return f"step {state.step}{total}{loss}"
