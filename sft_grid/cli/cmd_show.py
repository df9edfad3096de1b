"""sft-grid show CELL_DIR | OVERRIDES...: what a cell trains on, token by token.

For each data source of the cell it prints the first example exactly as the backend renders it (its own
preprocessing, in its own virtual environment: the loss-mask check's probe), with the trained tokens marked,
and how many tokens of it are trained, so a person can eyeball the mask as the users' guide asks. In a
terminal trained text is green and masked text dim; otherwise (a log, a pipe) trained text is wrapped in [[ ]].

    sft-grid show runs/default/tiny_llama-419d50cf           # a rendered cell (its cell.yaml)
    sft-grid show model=tiny_qwen3 dataset=tiny_sharegpt     # the cell these overrides compose
    sft-grid show backend=axolotl model=tiny_llama --rows 3  # the first 3 examples of each source

A directory that is not there, is no cell's, or whose cell.yaml is damaged (cut short, not UTF-8, not YAML: core/
cellfiles.py), and overrides that compose no cell, are said in one line, exit status 1: show's answer is a verdict
on the cell's loss mask, and there is no cell to judge.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sft_grid.planning.cells import Cell


class NoCell(Exception):
    """What show was given names no cell it can read: why, in one line."""


def load_cell(args: Sequence[str]) -> Cell:
    """The cell of a rendered directory (its resolved cell.yaml), or the one the overrides compose; NoCell where
    there is none."""
    if len(args) == 1 and "=" not in args[0] and not args[0].startswith(("+", "~")):
        return _cell_of_dir(Path(args[0]).expanduser())
    dirs = [a for a in args if "=" not in a and os.path.isdir(a)]
    if len(dirs) > 1:  # a pattern the shell expanded: one cell at a time
        raise NoCell(
            f"show takes one cell's directory, and {len(dirs)} were given (a pattern the shell expanded?):"
            f" sft-grid show {shlex.quote(dirs[0])}"
        )
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from sft_grid.planning.cells import plan_cell

    try:
        return plan_cell(tuple(args), compose(args))
    except (HydraException, OmegaConfBaseException) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise NoCell(f"the overrides compose no cell: {first}") from None


def _cell_of_dir(path: Path) -> Cell:
    from sft_grid.core.cellfiles import READ_ERRORS, CellYaml, DamagedFile
    from sft_grid.core.layout import not_a_cell_dir

    if not path.exists():
        if os.sep in str(path) or str(path).startswith("."):
            from sft_grid.analysis.view import cell_dirs
            from sft_grid.cli.present import no_cell

            raise NoCell(no_cell(path, cell_dirs(path.parent)))
        raise NoCell(
            f"{str(path)!r} is no cell's directory here, and no override (key=value): give a cell's directory"
            " (<runs_root>/<grid>/<cell>), or overrides"
        )
    try:
        config = dict(CellYaml.read(path).config)
    except DamagedFile as exc:
        raise NoCell(f"{path}: {exc.damage.text()}") from None
    except OSError:
        from sft_grid.analysis.view import cell_dirs

        cells = cell_dirs(path) if path.is_dir() else []
        if cells:  # a grid's directory: one of its cells
            more = f" ({len(cells)} cells: {', '.join(c.name for c in cells[:3])}{', ...' if len(cells) > 3 else ''})"
            raise NoCell(
                f"{path} is a grid's directory, not a cell's{more}: give one of its cells,"
                f" sft-grid show {shlex.quote(str(path / cells[0].name))}"
            ) from None
        raise NoCell(not_a_cell_dir(path) or f"{path}: {CellYaml.damage(path) or 'cannot be read'}") from None
    from sft_grid.planning.cells import plan_cell

    try:
        return plan_cell((), config)
    except READ_ERRORS as exc:
        what = f"no `{exc.args[0]}`" if isinstance(exc, KeyError) and exc.args else type(exc).__name__
        raise NoCell(f"{path}: cell.yaml is not a cell's whole resolved config ({what})") from None


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from sft_grid.planning.resolvers import register

    register()
    with initialize_config_module("sft_grid.conf", version_base=None):
        cfg = hydra_compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def show(cell: Cell, rows: int = 1, color: bool = False, use_cache: bool = True, name: str = "") -> tuple[str, bool]:
    """The report for a cell (`name`: its directory's, where it was read from one), and whether every source's
    loss-mask check passes."""
    from sft_grid.checks import mask
    from sft_grid.cli.present import CLOSE, OPEN, example

    checks = mask.checks_for(cell)
    if not checks:
        return f"{name or cell.name}: no loss-mask probe for backend {cell.spec.backend.name!r}", True
    lines = [
        f"cell {name or cell.name}: {cell.spec.model.name} ({cell.spec.model.template}) with {cell.spec.backend.name}"
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
    from sft_grid.cli.options import whole

    parser.add_argument("cell", nargs="+", help="a cell directory (with cell.yaml), or Hydra overrides")
    parser.add_argument("--rows", type=whole(1), default=1, help="examples shown per source (default 1)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--no-cache", action="store_true", help="run the probe even if its result is cached")


def run(args: argparse.Namespace) -> int:
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    try:
        cell = load_cell(args.cell)
    except NoCell as exc:
        print(f"sft-grid show: {exc}", file=sys.stderr)
        return 1
    one = args.cell[0] if len(args.cell) == 1 and os.path.isdir(args.cell[0]) else ""  # a directory: its name
    text, ok = show(cell, args.rows, color, use_cache=not args.no_cache, name=Path(one).resolve().name if one else "")
    print(text)
    return 0 if ok else 1
