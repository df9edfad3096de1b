"""The `synthetic` backend: a SIMULATOR for measuring the orchestrator, never for training a model.

A synthetic cell "trains" by writing the loss curve of a stated law with seeded noise (in_venv/synthetic_train.py
states the law), through the same cell directory, launch.sh, job, ledger, logs and checkpoints as a real
backend, so that Slurm arrays, requeue and resume, pruning, scores along training and the scaling fit run for
real against a known ground truth. It needs only a python3 on the node (the standard library): no torch, no
virtual environment, a cell of a hundred steps in well under a second. Its model and dataset sections are
composed and checked as for any cell (a tiny local model and dataset serve), but it reads neither: the law's N is
the model's `params` (or `params_b`), and each step sees `tokens_per_step` tokens.

Its knobs (conf/backend/synthetic.yaml `train_defaults`; a cell's `extra` wins, e.g. `+extra.law.E=1.8`):
max_steps (when the cell's own max_steps is unset), tokens_per_step, warmup_steps, step_seconds (a simulated
step's duration, for tests that must act while a cell runs) and `law` (the law's constants).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sft_grid.backends.base import Backend, MaskSpec
from sft_grid.core.paths import IN_VENV_DIR
from sft_grid.core.problems import Problem
from sft_grid.core.schema import exact_params
from sft_grid.in_venv.synthetic_train import LAW_DEFAULTS
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.inputs import tokenizer_source

NAME = "synthetic"
CONFIG_FILE = "synthetic.json"
TRAINER = IN_VENV_DIR / "synthetic_train.py"


def config(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """synthetic.json: what sft_grid derives from the cell, then the simulator's knobs (the backend's
    train_defaults, the cell's `extra` winning) passed through as they are."""
    s = cell.spec
    derived: dict[str, Any] = {
        "simulated": True,
        "identity": cell.key,
        "seed": s.seed,
        "params": exact_params(s.model),
        **trainer_fields(cell, cell_dir),
    }
    return {**s.backend.train_defaults, **derived, **s.extra}


def trainer_fields(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """What a stand-in trainer (this simulator, the replay backend) takes from the cell as a real trainer would:
    its schedule, its saving and logging steps, where it writes, the tokenizer it saves with each model."""
    s = cell.spec
    out: dict[str, Any] = {
        "learning_rate": s.lr,
        "lr_scheduler_type": s.scheduler,
        "save_steps": s.save_steps,
        "logging_steps": s.logging_steps,
        "output_dir": str(cell_dir / "output"),
        # saved with each "model" as a real trainer saves it (the post-training tokenizer stage reads it)
        "tokenizer_dir": tokenizer_source(cell) if is_local(tokenizer_source(cell)) else "",
    }
    if s.max_steps > 0:
        out["max_steps"] = s.max_steps
    return out


# the simulator's knobs a cell's `extra` may set, each with the least value it takes (the law is a mapping)
KNOBS: dict[str, float] = {"max_steps": 1, "tokens_per_step": math.ulp(0), "warmup_steps": 0, "step_seconds": 0}


def _problems(cell: Cell) -> Iterator[Problem]:
    """The simulator's knobs as its trainer reads them (in_venv/synthetic_train.py): a number out of range, or a law
    that is not a mapping of its constants, fails the job as it starts (a law constant it does not know would change
    nothing); each is told here, before anything is queued. Other keys are labels (an identity's recipe)."""
    s = cell.spec

    def problem(key: str, value: Any, message: str, fix: str) -> Problem:
        return Problem(cell=cell.name, key=key, value=value, rule="synthetic-knob", message=message, fix=fix)

    derived = {"simulated", "identity", "seed", "params", *trainer_fields(cell, cell.sweep_dir / cell.name)}
    for key, value in s.extra.items():
        if key in derived:
            continue  # what sft_grid derives: the extra-derived rule names the key to set instead
        if key == "law":
            if not isinstance(value, dict):
                yield problem(
                    "extra.law", value, "the law is a mapping of its constants", "e.g. +extra.law.E=1.8 (one constant)"
                )
                continue
            for name, v in value.items():
                if name not in LAW_DEFAULTS:
                    yield problem(
                        f"extra.law.{name}",
                        v,
                        "not a constant of the simulator's law",
                        f"one of {', '.join(LAW_DEFAULTS)}",
                    )
                elif not _number(v):
                    yield problem(
                        f"extra.law.{name}", v, "not a finite number", f"e.g. +extra.law.{name}={LAW_DEFAULTS[name]}"
                    )
        elif key not in KNOBS:
            continue  # a label the simulator passes by (synthetic_delphi's extra.recipe: part of the identity)
        elif not _number(value) or value < KNOBS[key]:
            least = "above 0" if key == "tokens_per_step" else f">= {KNOBS[key]:g}"
            yield problem(f"extra.{key}", value, f"not a finite number {least}", f"a number {least}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _command(cell: Cell, cell_dir: Path, env_bin: Path) -> list[str]:
    # the node's python3 (standard library only): the simulator needs no virtual environment
    return ["python3", str(TRAINER), str(cell_dir / CONFIG_FILE)]


def _resume_args(checkpoint: Path) -> list[str]:
    return [f"resume_from_checkpoint={checkpoint}"]


# no tokenizer: no loss-mask probe (it trains on no tokens), no tokenize-once job
BACKEND = Backend(
    name=NAME,
    config_file=CONFIG_FILE,
    files=lambda cell, cell_dir: {CONFIG_FILE: config(cell, cell_dir)},
    command=_command,
    problems=_problems,
    mask_spec=lambda cell: MaskSpec("", NAME),
    resume_args=_resume_args,
    legs=lambda stop, probe: [f"stop_at_step={stop}", f"probe_steps={probe}"],
    cooldown_probe=True,
)
