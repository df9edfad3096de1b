"""sft-grid show CELL_DIR | OVERRIDES...: what a cell trains on, token by token.

For each data source of the cell it prints the first example exactly as the backend renders it (its own
preprocessing, in its own virtual environment: the loss-mask check's probe), with the trained tokens marked,
and how many tokens of it are trained, so a person can eyeball the mask as the users' guide asks. In a
terminal trained text is green and masked text dim; otherwise (a log, a pipe) trained text is wrapped in [[ ]].

    sft-grid show runs/default/tiny_llama-419d50cf           # a rendered cell (its cell.yaml)
    sft-grid show model=tiny_qwen3 dataset=tiny_sharegpt     # the cell these overrides compose
    sft-grid show backend=axolotl model=tiny_llama --rows 3  # the first 3 examples of each source
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sft_grid.planning.cells import Cell


def load_cell(args: Sequence[str]) -> Cell:
    """The cell of a rendered directory (its resolved cell.yaml), or the one the overrides compose."""
    from sft_grid.core.cellfiles import CellYaml
    from sft_grid.core.layout import CELL_FILE
    from sft_grid.planning.cells import plan_cell

    if len(args) == 1 and (Path(args[0]) / CELL_FILE).is_file():
        config = dict(CellYaml.load(Path(args[0])).config)
        return plan_cell((), config)
    return plan_cell(tuple(args), compose(args))


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from sft_grid.planning.resolvers import register

    register()
    with initialize_config_module("sft_grid.conf", version_base=None):
        cfg = hydra_compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def show(cell: Cell, rows: int = 1, color: bool = False, use_cache: bool = True) -> tuple[str, bool]:
    """The report for a cell, and whether every source's loss-mask check passes."""
    from sft_grid.checks import mask
    from sft_grid.cli.present import CLOSE, OPEN, example

    checks = mask.checks_for(cell)
    if not checks:
        return f"{cell.name}: no loss-mask probe for backend {cell.spec.backend.name!r}", True
    lines = [
        f"cell {cell.name}: {cell.spec.model.name} ({cell.spec.model.template}) with {cell.spec.backend.name}"
        + ("" if color else f"; trained text is in {OPEN} {CLOSE}")
    ]
    all_ok = True
    for p in mask.probe(checks, use_cache=use_cache):
        name = p.check.key
        verdict = mask.verdict_of(p)
        all_ok = all_ok and verdict.ok and not verdict.unreachable
        if p.outcome is not None or "rows" not in (p.result or {}):
            lines.append(f"--- {name}: {verdict.message or 'not readable here'}")
            continue
        sample = p.result["rows"]  # type: ignore[index]
        for i, row in enumerate(sample[:rows]):
            lines.append(example(name, row, i, color))
        total = sum(r.get("n_tokens", 0) for r in sample)
        trained = sum(r.get("n_trained", 0) for r in sample)
        lines.append(
            f"--- {name}: {len(sample)} sampled rows, {total} tokens, {trained} trained; loss mask "
            + ("ok" if verdict.ok else f"WRONG: {verdict.message}; fix: {verdict.fix}")
        )
    return "\n".join(lines), all_ok


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", nargs="+", help="a cell directory (with cell.yaml), or Hydra overrides")
    parser.add_argument("--rows", type=int, default=1, help="examples shown per source (default 1)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--no-cache", action="store_true", help="run the probe even if its result is cached")


def run(args: argparse.Namespace) -> int:
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    text, ok = show(load_cell(args.cell), args.rows, color, use_cache=not args.no_cache)
    print(text)
    return 0 if ok else 1
