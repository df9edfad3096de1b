"""The `replay` backend: cells that "train" by replaying real, public fine-tuning curves, never training a model.

A replay cell names one measured curve (`extra.replay`: the set, the fine-tuning dataset, the model) and the
number of fine-tuning examples it "trains" on (`extra.replay.examples`, one of the curve's sizes; default its
largest). Its trainer (in_venv/replay_train.py) writes that curve through the same cell directory, launch.sh, job,
ledger, logs and checkpoints as a real backend, so that the planner, the executors, the ledger, pruning and the
scaling fit meet real loss-vs-data curves, whose law nobody chose, instead of the `synthetic` simulator's.

The curves (sft_grid/conf/replay/, README.md there: source, licence, extraction): Lin et al. 2024's test losses of
30 models fine-tuned on 200 to 1.6M examples of three datasets. They are read here, at planning, and written into
the cell's replay.json, so the node needs only a python3 (the standard library), as for the simulator.

Validation: an unknown set, dataset, model or size is refused before anything is queued, naming the key and the
values it can take.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sft_grid.backends.base import Backend, MaskSpec
from sft_grid.backends.synthetic import trainer_fields
from sft_grid.core.paths import IN_VENV_DIR, PACKAGE_CONF
from sft_grid.core.problems import Problem
from sft_grid.planning.cells import Cell

NAME = "replay"
CONFIG_FILE = "replay.json"
TRAINER = IN_VENV_DIR / "replay_train.py"
REPLAY_DIR = PACKAGE_CONF / "replay"
DEFAULT_SET = "lin2024_sft"


@functools.cache
def curves(set_name: str = DEFAULT_SET) -> dict[tuple[str, str], dict[str, Any]]:
    """(dataset, model) -> {"family", "params", "points": [(examples, loss), ...] ascending} of one shipped set
    (the zero-shot point, 0 examples, is left out: it is no fine-tuning run)."""
    path = REPLAY_DIR / f"{set_name}.csv"
    out: dict[tuple[str, str], dict[str, Any]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            examples = int(row["examples"])
            if examples <= 0:
                continue
            entry = out.setdefault(
                (row["dataset"], row["model"]), {"family": row["family"], "params": int(row["params"]), "points": []}
            )
            entry["points"].append((examples, float(row["loss"])))
    for entry in out.values():
        entry["points"].sort()
    return out


def sets() -> list[str]:
    return sorted(p.stem for p in REPLAY_DIR.glob("*.csv"))


def _block(cell: Cell) -> Mapping[str, Any]:
    block = cell.spec.extra.get("replay")
    return block if isinstance(block, Mapping) else {}


def _problems(cell: Cell) -> Iterator[Problem]:
    block = _block(cell)
    set_name = str(block.get("set", DEFAULT_SET))

    def problem(key: str, value: object, message: str, fix: str) -> Problem:
        return Problem(
            cell=cell.name, key=f"extra.replay.{key}", value=value, rule="replay-curve", message=message, fix=fix
        )

    if set_name not in sets():
        yield problem("set", set_name, "names no shipped replay set", f"one of {', '.join(sets())}")
        return
    found = curves(set_name)
    datasets = sorted({d for d, _ in found})
    dataset, model = block.get("dataset"), block.get("model")
    if dataset not in datasets:
        yield problem("dataset", dataset, f"names no dataset of the {set_name} set", f"one of {', '.join(datasets)}")
        return
    models = sorted(m for d, m in found if d == dataset)
    if model not in models:
        yield problem("model", model, f"names no model of {dataset} in {set_name}", f"one of {', '.join(models)}")
        return
    sizes = [n for n, _ in found[(dataset, model)]["points"]]
    examples = block.get("examples", sizes[-1])
    if examples not in sizes:
        yield problem("examples", examples, "is not a size the curve was measured at", f"one of {sizes}")


def _entry(cell: Cell) -> dict[str, Any] | None:
    """The curve a cell replays (None where its block names none, which its rules refuse)."""
    block = _block(cell)
    set_name = str(block.get("set", DEFAULT_SET))
    return curves(set_name).get((str(block.get("dataset")), str(block.get("model")))) if set_name in sets() else None


def config(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """replay.json: the cell's schedule and files, and the curve it replays up to its number of examples."""
    s = cell.spec
    block = _block(cell)
    set_name = str(block.get("set", DEFAULT_SET))
    # a cell its rules refuse (no such curve) still renders, empty: the extra-key check renders a bare cell too
    entry = _entry(cell) or {"family": "", "params": 0, "points": [(0, 0.0)]}
    examples = int(block.get("examples", entry["points"][-1][0]))
    derived: dict[str, Any] = {
        "replayed": True,
        "set": set_name,
        "dataset": block.get("dataset"),
        "model": block.get("model"),
        "family": entry["family"],
        "params": entry["params"],
        "examples": examples,
        "points": [[n, v] for n, v in entry["points"] if n <= examples],
        **trainer_fields(cell, cell_dir),
    }
    knobs = {k: v for k, v in s.extra.items() if k != "replay"}
    return {**s.backend.train_defaults, **knobs, **derived}


def stands_for(cell: Cell) -> tuple[str, int] | None:
    """The model whose curve the cell replays: its name as the curves name it, its parameter count (None: no such
    curve, which its rules refuse)."""
    entry = _entry(cell)
    return (str(_block(cell).get("model")), int(entry["params"])) if entry else None


def _command(cell: Cell, cell_dir: Path, env_bin: Path) -> list[str]:
    return ["python3", str(TRAINER), str(cell_dir / CONFIG_FILE)]


BACKEND = Backend(
    name=NAME,
    config_file=CONFIG_FILE,
    files=lambda cell, cell_dir: {CONFIG_FILE: config(cell, cell_dir)},
    command=_command,
    problems=_problems,
    mask_spec=lambda cell: MaskSpec("", NAME),
    resume_args=lambda checkpoint: [f"resume_from_checkpoint={checkpoint}"],
    legs=lambda stop, probe: [f"stop_at_step={stop}"],
    cooldown_probe=False,
    stands_for=stands_for,
)
