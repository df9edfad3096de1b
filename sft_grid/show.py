"""python -m sft_grid.show CELL_DIR | OVERRIDES...: what a cell trains on, token by token.

For each data source of the cell it prints the first example exactly as the backend renders it (its own
preprocessing, in its own environment: the loss-mask preflight's probe, sft_grid/mask.py), with the
trained tokens marked, and how many tokens of it are trained, so a person can eyeball the mask as the
users' guide asks. In a terminal trained text is green and masked text dim; otherwise (a log, a pipe)
trained text is wrapped in [[ ]].

    python -m sft_grid.show runs/default/tiny_llama-419d50cf           # a rendered cell (its cell.yaml)
    python -m sft_grid.show model=tiny_qwen3 dataset=tiny_sharegpt     # the cell these overrides compose
    python -m sft_grid.show backend=axolotl model=tiny_llama --rows 3  # the first 3 examples of each source
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from sft_grid.plan import Cell

GREEN, DIM, RESET = "\x1b[32m", "\x1b[2m", "\x1b[0m"
OPEN, CLOSE = "[[", "]]"


def load_cell(args: Sequence[str]) -> Cell:
    """The cell of a rendered directory (its resolved cell.yaml), or the one the overrides compose."""
    import yaml

    from sft_grid.plan import plan_cell
    from sft_grid.render import CELL_FILE

    if len(args) == 1 and (Path(args[0]) / CELL_FILE).is_file():
        config = yaml.safe_load((Path(args[0]) / CELL_FILE).read_text())
        return plan_cell((), config)
    return plan_cell(tuple(args), compose(args))


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from sft_grid.paths import CONF_DIR
    from sft_grid.schema import register

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def marked(segments: Sequence[Sequence[Any]], color: bool) -> str:
    """The example's text with its trained spans marked (colour, or [[ ]] in plain text)."""
    out: list[str] = []
    run: list[str] = []
    flag: bool | None = None

    def flush() -> None:
        if not run:
            return
        text = "".join(run)
        if color:
            out.append(f"{GREEN if flag else DIM}{text}{RESET}")
        else:
            out.append(f"{OPEN}{text}{CLOSE}" if flag else text)
        run.clear()

    for text, trained, _markup in segments:
        if bool(trained) != flag:
            flush()
            flag = bool(trained)
        run.append(text)
    flush()
    return "".join(out)


def describe(name: str, row: Mapping[str, Any], index: int, color: bool) -> str:
    head = f"--- {name}, example {index}: "
    if row.get("dropped"):
        return head + "dropped by the backend: " + ("; ".join(row.get("warnings") or []) or "no reason logged")
    head += f"{row['n_tokens']} tokens, {row['n_trained']} trained"
    return f"{head}\n{marked(row['segments'], color)}"


def show(cell: Cell, rows: int = 1, color: bool = False, use_cache: bool = True) -> tuple[str, bool]:
    """The report for a cell, and whether every source's loss-mask check passes."""
    from sft_grid import mask

    checks = mask.checks_for(cell)
    if not checks:
        return f"{cell.name}: no loss-mask probe for backend {cell.spec.backend.name!r}", True
    lines = [f"cell {cell.name}: {cell.spec.model.name} ({cell.spec.model.template}) with {cell.spec.backend.name}"
             + ("" if color else f"; trained text is in {OPEN} {CLOSE}")]
    all_ok = True
    for p in mask.probe(checks, use_cache=use_cache):
        name = p.check.key
        outcome = mask.outcome_of(p)
        all_ok = all_ok and outcome.ok and not outcome.unreachable
        if p.outcome is not None or "rows" not in (p.result or {}):
            lines.append(f"--- {name}: {outcome.message or 'not readable here'}")
            continue
        sample = p.result["rows"]  # type: ignore[index]
        for i, row in enumerate(sample[:rows]):
            lines.append(describe(name, row, i, color))
        total = sum(r.get("n_tokens", 0) for r in sample)
        trained = sum(r.get("n_trained", 0) for r in sample)
        lines.append(f"--- {name}: {len(sample)} sampled rows, {total} tokens, {trained} trained; loss mask "
                     + ("ok" if outcome.ok else f"WRONG: {outcome.message}; fix: {outcome.fix}"))
    return "\n".join(lines), all_ok


def first_examples(cells: Sequence[Cell], color: bool = False, limit: int = 8) -> list[str]:
    """What a dry run shows: the first example of each distinct source (backend, template, tokenizer, data)
    of the grid, trained text marked, from the probe results the preflight just cached. A model the grid
    prepares first (Delphi) is shown with its source tokenizer: the text and its mask are the template's,
    only the think/tool tokens are still in pieces until the prep."""
    from dataclasses import replace

    from sft_grid import mask, prep

    # one example per (backend, template, source): the checks of the first cell that has it
    firsts: dict[tuple[str, ...], Cell] = {}
    for cell in cells:
        s = cell.spec
        for name, ds in s.dataset.items():
            firsts.setdefault((s.backend.name, s.model.template, name, ds.source), cell)
    cell_of: dict[Any, Cell] = {}
    for (_, _, name, _), cell in firsts.items():
        source = prep.prep_for(cell)
        for check in mask.checks_for(cell):
            if check.key != f"dataset.{name}":
                continue
            if source is not None and not source.complete and check.model == str(source.model_dir):
                check = replace(check, model=source.source)
            cell_of.setdefault(check, cell)
    lines: list[str] = []
    unreadable: list[str] = []
    for p in mask.probe(list(cell_of)[:limit]):
        cell = cell_of[p.check]
        label = f"{p.check.key} of {cell.name} ({cell.spec.backend.name}, template {cell.spec.model.template})"
        if p.outcome is not None or "error" in (p.result or {}) or not (p.result or {}).get("rows"):
            unreadable.append(p.check.key)
            continue
        lines.append(describe(label, p.result["rows"][0], 0, color))  # type: ignore[index]
    if unreadable:
        lines.append(f"  first examples not shown, their inputs are not readable here (the job's preflight checks"
                     f" them): {', '.join(dict.fromkeys(unreadable))}")
    if len(cell_of) > limit:
        lines.append(f"  ... {len(cell_of) - limit} more source(s): python -m sft_grid.show <cell dir>")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sft_grid.show", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("cell", nargs="+", help="a cell directory (with cell.yaml), or Hydra overrides")
    parser.add_argument("--rows", type=int, default=1, help="examples shown per source (default 1)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--no-cache", action="store_true", help="run the probe even if its result is cached")
    args = parser.parse_args(argv)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    text, ok = show(load_cell(args.cell), args.rows, color, use_cache=not args.no_cache)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
