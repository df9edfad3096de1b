"""Benchmark: the grid report and the results table of the 72-cell Delphi grid with full loss logs.

Why: a report is rebuilt whenever someone looks at a grid, and the results table answers as a command line does.
Targets on a 2-core machine, cold (a fresh `python -m` each time: interpreter start-up and imports counted):
`sft-grid report` under 3 s, `sft-grid results` under 1 s. Baseline, side by side in the
same run over the same cells: `sft-grid status`, which reads each cell's ledger and progress too.

The grid: sweeps/delphi_scaling.yaml rendered by its own dry run (72 cells: 36 checkpoints x 2 recipes, Leonardo),
then every cell given what a run leaves (tests/grid_fixture.py): a ledger, trainer_state.json with 2000 logged
steps whose final losses follow L = E_recipe + A N^-alpha, LLaMA-Factory's trainer_log.jsonl, estimate.json, and
two score files (format); one cell running, one failed, one never run; the 9 base models evaluated.
The report fits final loss and both scores per recipe, against parameters and against the compute budget in the
model names (12 fits, 300 bootstrap resamples each).

    python benchmarks/bench_report.py [--repeats N] [--check] [--keep DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {"report": 3.0, "results": 1.0}
STEPS = 2000
A, ALPHA, E = 180.0, 0.3, {"magpie": 0.55, "wildchat_386k": 0.75}
SPECIAL = {3: "running", 10: "failed", 20: "planned"}  # cell index -> state other than completed


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SFT_GRID_LEONARDO_ACCOUNT": "bench",
        "SFT_GRID_LEONARDO_ENV": "/nonexistent/env",
    }


def build_grid(work: Path) -> Path:
    """The Delphi grid's 72 cells as its dry run renders them, then filled as their runs leave them."""
    from sft_grid.core.layout import iter_cell_dirs
    from tests import grid_fixture as gf

    runs = work / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "-m", "+sweep=delphi_scaling", "dry_run=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env(), "SFT_GRID_LEONARDO_RUNS": str(runs)},
    )
    if proc.returncode:
        raise SystemExit(f"the Delphi dry run failed:\n{proc.stderr[-3000:]}")
    sweep = runs / "delphi_scaling"
    rng = random.Random(0)
    import yaml

    for i, cell in enumerate(iter_cell_dirs(sweep)):
        cfg = yaml.safe_load((cell / "cell.yaml").read_text())
        params, recipe = cfg["model"]["params_b"] * 1e9, next(iter(cfg["dataset"]))
        state = SPECIAL.get(i, "completed")
        gpus = cfg["nodes"] * 4
        gf.estimate(cell, params, 4.1e7, STEPS, gpus=gpus, cluster="leonardo", gpu="A100-64GB")
        if state == "planned":
            continue
        floor = (E[recipe] + A * params**-ALPHA) * math.exp(rng.gauss(0, 0.004))
        losses = [(s, round(v * math.exp(rng.gauss(0, 0.01)), 5)) for s, v in gf.curve(STEPS, floor, start=3.0)]
        steps = {"completed": STEPS, "running": STEPS * 3 // 5, "failed": STEPS * 3 // 10}[state]
        gf.run(cell, state, losses[:steps], STEPS, start=gf.T0 + 3600 * i, seconds=3600 * params / 1e9)
        if state == "completed":  # accuracies whose error falls with size as the loss does
            gf.score(
                cell,
                "gsm8k",
                {
                    "exact_match,strict-match": 1 - floor / 1.5 * (0.95 if recipe == "magpie" else 1),
                    "exact_match_stderr,strict-match": 0.01,
                },
            )
            gf.score(
                cell,
                "ifeval",
                {
                    "prompt_level_strict_acc": 1 - 0.6 * floor + rng.gauss(0, 0.005),
                    "prompt_level_strict_acc_stderr": 0.02,
                },
            )
    models = {yaml.safe_load((c / "cell.yaml").read_text())["model"]["name"]: c for c in iter_cell_dirs(sweep)}
    for model in [m for m in models if m.endswith("-base")]:
        cfg = yaml.safe_load((models[model] / "cell.yaml").read_text())
        gf.base_score(
            sweep,
            f"{model}-0000",
            model,
            cfg["model"]["hub_id"],
            "gsm8k",
            {"exact_match,strict-match": 0.02, "exact_match_stderr,strict-match": 0.005},
        )
    return runs


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one command, cold."""
    c0 = os.times()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env())
    wall = time.perf_counter() - t0
    c1 = os.times()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    return wall, (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--keep", type=Path, help="build the grid here and keep it (the report is in it)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sft_grid_bench_report_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs = build_grid(work)
        commands = {
            "status (baseline)": [
                sys.executable,
                "-m",
                "sft_grid",
                "status",
                "delphi_scaling",
                "--runs-root",
                str(runs),
            ],
            "results": [sys.executable, "-m", "sft_grid", "results", "delphi_scaling", "--runs-root", str(runs)],
            "report": [sys.executable, "-m", "sft_grid", "report", "delphi_scaling", "--runs-root", str(runs)],
        }
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
        for _ in range(args.repeats):  # interleaved: the same machine state for each
            for name, argv in commands.items():
                times[name].append(timed(argv))
        data = json.loads((runs / "delphi_scaling" / "report.json").read_text())
    points = sum(len(c["curve"]) for c in data["cells"])
    print(
        f"{len(data['cells'])} cells ({points} logged steps), {len(data['base_models'])} base models,"
        f" {len(data['fits'])} fits ({sum(f['ok'] for f in data['fits'])} ok); load {os.getloadavg()[0]:.1f}"
        f" on {os.cpu_count()} CPUs"
    )
    base = statistics.median(w for w, _ in times["status (baseline)"])
    verdicts = {}
    for name, runs_ in times.items():
        wall, cpu = statistics.median(w for w, _ in runs_), statistics.median(c for _, c in runs_)
        target = TARGETS.get(name)
        verdicts[name] = target is None or wall < target
        print(
            f"  {name:18} median {wall:5.2f} s wall, {cpu:5.2f} s CPU, {wall / base:4.2f}x the baseline"
            + (f"; target < {target:g} s: {'PASS' if verdicts[name] else 'FAIL'}" if target else "")
        )
    if args.json:
        args.json.write_text(json.dumps({"times": times, "targets": TARGETS, "verdicts": verdicts}, indent=2) + "\n")
    return 1 if args.check and not all(verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
