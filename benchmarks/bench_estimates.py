"""Benchmark: the dry run with the cost estimates against the same dry run without them, side by side.

Why: the dry run (and every real invocation) estimates each cell before launch: tokens from the
loss-mask probe's token sample and the data's row counts, FLOPs, GPU-hours, wall time, disk, the calibration scan
of the runs root's completed cells, the wall-time check, estimate.json in each cell and the printed cost table.
Target: the dry run with estimates takes at most 10% longer than without (SFT_GRID_ESTIMATES=0 turns them off).

What it runs: bench_plan.py's 1000-cell `groups` grid (20 models x 50 datasets of the tiny local assets, so every
cell has a token sample and readable data: every cell is estimated), as `python -m sft_grid -m ... dry_run=true`
subprocesses, estimates off and on alternating (`--repeats` pairs, a fresh runs root each), then the same pair
again over a runs root that already holds the grid's cells (a re-invocation: the calibration scan reads them all).
Wall time around subprocess.run; the medians and their ratio are reported.

    python benchmarks/bench_estimates.py [--repeats N] [--check] [--json out.json]

With --accuracy, how close the calibrated estimates come instead (what tests/test_report_tiny_grid.py asserted
until recently: a figure of the machine and its load, not a test): the tiny scaling grid of that test (3 sizes of
tiny Llama x 2 recipes, LLaMA-Factory on the CPU, the local executor), the first recipe trained, then the second,
which is estimated when it is queued from the calibration of the first; each of its estimates against the CPU
time its cell took (start-up included). Target: every calibrated estimate within 25% (ACCURACY_TARGET).

    python benchmarks/bench_estimates.py --accuracy [--check] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_plan import REPO, SFT_TIMEOUT_S, SHAPES, BenchError, check, grid_argv, timed, write_configs

TARGET_RATIO = 1.10
ACCURACY_TARGET = 0.25
TINY_SIZES = ("tiny_llama", "tiny_llama_m", "tiny_llama_l")
RECIPES = ("tiny_messages", "tiny_sharegpt")  # the first calibrates the second's estimates
TRAIN_TIMEOUT_S = 3600


def accuracy(work: Path) -> dict[str, object]:
    """Train the tiny scaling grid, one recipe after the other; each calibrated estimate against what it took."""
    from sft_grid.core.layout import iter_cell_dirs
    from sft_grid.planning.costs import measured, read_estimate

    root = work / "runs"
    grid = [sys.executable, "-m", "sft_grid", "-m", f"model={','.join(TINY_SIZES)}", "epochs=2"]
    grid += ["global_batch_size=4", "micro_batch_size=2", "sweep_name=tiny_scaling", f"runs_root={root}"]
    for recipe in RECIPES:
        seconds, proc = timed([*grid, f"dataset={recipe}"], REPO, TRAIN_TIMEOUT_S, REPO)
        check(f"the tiny grid's {recipe} recipe", proc)
        print(f"  trained the {recipe} recipe (3 cells) in {seconds:.0f} s")
    cells = []
    for cell in iter_cell_dirs(root / "tiny_scaling"):
        est, m = read_estimate(cell), measured(cell)
        if est is None or m is None or est["throughput"]["source"] != "calibration":
            continue
        error = est["wall_seconds"] / m.seconds - 1
        cells.append({"cell": cell.name, "estimate_s": est["wall_seconds"], "cpu_s": m.seconds, "error": error})
        print(f"  {cell.name}: estimate {est['wall_seconds']:.1f} s, took {m.seconds:.1f} s of CPU: {error:+.0%}")
    if len(cells) != len(TINY_SIZES):
        raise BenchError(f"{len(cells)} calibrated estimates, expected {len(TINY_SIZES)}")
    worst = max(abs(c["error"]) for c in cells)
    return {"cells": cells, "worst_abs_error": worst, "target": ACCURACY_TARGET, "pass": worst <= ACCURACY_TARGET}


def dry_run(conf: Path, runs_root: Path, cwd: Path, estimates: bool) -> tuple[float, str]:
    argv = grid_argv(conf, SHAPES["groups"][0], runs_root, "dry_run=true")
    # this checkout, whatever pip installed
    seconds, proc = timed(argv, cwd, SFT_TIMEOUT_S, REPO, {"SFT_GRID_ESTIMATES": "1" if estimates else "0"})
    check(f"dry run, estimates {'on' if estimates else 'off'}", proc)
    cells = [d for d in (runs_root / "default").iterdir() if (d / "cell.yaml").is_file()]
    if len(cells) != 1000:
        raise BenchError(f"the dry run wrote {len(cells)} cells, expected 1000")
    estimated = sum(1 for d in cells if (d / "estimate.json").is_file())
    if estimates and (estimated != 1000 or "total of the grid, 1000 of 1000 cell(s) estimated" not in proc.stdout):
        raise BenchError(f"estimates on, but {estimated} of 1000 cells have an estimate.json")
    return seconds, proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--check", action="store_true", help="exit 1 when the ratio misses the target")
    p.add_argument("--json", type=Path, metavar="PATH")
    p.add_argument("--accuracy", action="store_true", help="the calibrated estimates against what tiny cells took")
    args = p.parse_args()
    subprocess.run([sys.executable, "-m", "sft_grid", "assets", "build"], cwd=REPO, check=True, capture_output=True)
    if args.accuracy:
        with tempfile.TemporaryDirectory(prefix="sft_grid_bench_acc_") as tmp:
            print(f"calibrated estimates of the tiny grid, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
            result = accuracy(Path(tmp))
        print(
            f"worst |error| {result['worst_abs_error']:.0%}; target <= {ACCURACY_TARGET:.0%}:"
            f" {'PASS' if result['pass'] else 'FAIL'}"
        )
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 1 if args.check and not result["pass"] else 0
    times: dict[str, list[float]] = {"off": [], "on": [], "off again": [], "on again": []}
    with tempfile.TemporaryDirectory(prefix="sft_grid_bench_est_") as tmp:
        work = Path(tmp)
        conf, cwd = work / "conf", work / "cwd"
        cwd.mkdir()
        write_configs(conf)
        dry_run(conf, work / "warm", cwd, True)  # the probe's cache and the page cache, for both sides alike
        for i in range(args.repeats):
            for on in (False, True) if i % 2 == 0 else (True, False):
                root = work / f"runs-{'on' if on else 'off'}-{i}"
                times["on" if on else "off"].append(dry_run(conf, root, cwd, on)[0])
        for i in range(args.repeats):
            for on in (False, True) if i % 2 == 0 else (True, False):
                times["on again" if on else "off again"].append(dry_run(conf, work / "runs-on-0", cwd, on)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    fresh, again = med["on"] / med["off"], med["on again"] / med["off again"]
    print(f"dry run of 1000 cells, {args.repeats} runs each, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for k, v in times.items():
        print(f"  estimates {k:9}: median {med[k]:.2f} s  ({', '.join(f'{s:.2f}' for s in v)})")
    ok = fresh <= TARGET_RATIO and again <= TARGET_RATIO
    print(
        f"ratio on/off: fresh runs root {fresh:.3f}, over the grid's existing cells {again:.3f};"
        f" target <= {TARGET_RATIO:.2f}: {'PASS' if ok else 'FAIL'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "times": times,
                    "medians": med,
                    "ratio_fresh": fresh,
                    "ratio_again": again,
                    "target": TARGET_RATIO,
                    "pass": ok,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
