"""Synthetic report data shaped like a Delphi grid (model sizes x midtrain mixes x recipes), for the report
tests and benchmarks/bench_report.py. Deterministic: a seeded random.Random, nothing timed.

Losses follow L = E_recipe + A N^-alpha plus a decaying training transient and a little noise, so the fit
has a real curve to find; scores rise with size.
"""

from __future__ import annotations

import math
import random
from typing import Any

# (budget, params): the Delphi base models' sizes and their compute budgets
DELPHI_SIZES = (
    (3e18, 447e6),
    (9e18, 550e6),
    (2e19, 837e6),
    (3e19, 998e6),
    (9e19, 1.4e9),
    (2e20, 1.9e9),
    (3e20, 2.5e9),
    (1e21, 3.4e9),
    (1e22, 9.7e9),
)
MIXES = ("base", "p33m67", "p50m50", "p67m33")
RECIPES = {"magpie": 0.55, "wildchat_386k": 0.75}  # recipe -> E
A, ALPHA = 180.0, 0.3
TOKENS_PER_STEP = 16 * 1500


def grid(
    sizes: int = 9,
    mixes: int = 4,
    recipes: int = 2,
    steps: int = 2000,
    states: dict[str, str] | None = None,
    seed: int = 0,
    scores: bool = True,
) -> dict[str, Any]:
    """A report-data dict; `states` maps cell names to a state other than completed (running cells stop at
    60% of their steps, failed ones at 30%, planned ones have no curve)."""
    rng = random.Random(seed)
    states = states or {}
    cells: list[dict[str, Any]] = []
    for recipe, e in list(RECIPES.items())[:recipes]:
        for budget, params in DELPHI_SIZES[:sizes]:
            for mix in MIXES[:mixes]:
                model = f"delphi-{budget:.0e}-{mix}".replace("e+", "e")
                name = f"{model}__{recipe}"
                state = states.get(name, "completed")
                floor = e + A * params**-ALPHA
                ran = {"completed": steps, "running": int(0.6 * steps), "failed": int(0.3 * steps)}.get(state, 0)
                curve = []
                for s in range(1, ran + 1):
                    loss = floor * (1 + 0.9 * math.exp(-s / (0.05 * steps)) + 0.15 / math.sqrt(s))
                    curve.append([s, s * TOKENS_PER_STEP, round(loss * math.exp(rng.gauss(0, 0.01)), 5)])
                final = floor * math.exp(rng.gauss(0, 0.004)) if state == "completed" else None
                cell: dict[str, Any] = {
                    "name": name,
                    "key": f"k{len(cells):03d}",
                    "dir": f"/runs/delphi_scaling/{name}",
                    "values": {"model": model, "dataset": recipe},
                    "state": state,
                    "step": ran or None,
                    "total_steps": steps,
                    "final_loss": final,
                    "scores": (
                        {
                            "gsm8k/exact_match": {
                                "value": 0.1 + 0.05 * math.log(params / 4e8) - 0.2 * (e - 0.55),
                                "stderr": 0.01,
                            },
                            "ifeval/prompt_strict": {"value": 0.3 + 0.02 * math.log(params / 4e8), "stderr": 0.02},
                        }
                        if scores and state == "completed"
                        else {}
                    ),
                    "wall_seconds": 3600.0 * params / 1e9 * ran / steps if ran else None,
                    "gpu_hours": 4 * params / 1e9 * ran / steps if ran else None,
                    "estimate_gpu_hours": 4 * params / 1e9,
                    "params": params,
                    "compute_budget": budget,
                    "recipe": recipe,
                    "curve": curve,
                }
                if state == "failed":
                    cell["reason"] = "exit code 137 (out of memory)"
                cells.append(cell)
    counts: dict[str, int] = {}
    for c in cells:
        counts[c["state"]] = counts.get(c["state"], 0) + 1
    return {
        "grid": {
            "name": "delphi_scaling",
            "sweep_file": "conf/sweep/delphi_scaling.yaml",
            "git_revision": "6da9475",
            "git_dirty": False,
            "generated_at": "2026-11-30T12:00:00Z",
            "runs_root": "/runs",
            "counts": counts,
            "gpu_hours_used": sum(c["gpu_hours"] or 0 for c in cells),
            "gpu_hours_estimated": sum(c["estimate_gpu_hours"] for c in cells),
            "device": "GPU",
        },
        "axes": ["model", "dataset"],
        "cells": cells,
        "base_models": [
            {
                "name": f"delphi-{b:.0e}-base (no SFT)".replace("e+", "e"),
                "params": p,
                "scores": {"gsm8k/exact_match": {"value": 0.02 + 0.03 * math.log(p / 4e8), "stderr": 0.01}},
            }
            for b, p in DELPHI_SIZES[:sizes]
        ]
        if scores
        else [],
        "fits": [],
    }
