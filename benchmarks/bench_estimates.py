"""Benchmark: the dry run with the cost estimates against the same dry run without them, side by side.

Why: since issue 12 the dry run (and every real invocation) estimates each cell before launch: tokens from the
loss-mask probe's token sample and the data's row counts, FLOPs, GPU-hours, wall time, disk, the calibration scan
of the runs root's completed cells, the wall-time check, estimate.json in each cell and the printed cost table.
Target: the dry run with estimates takes at most 10% longer than without (SFT_GRID_ESTIMATES=0 turns them off).

What it runs: bench_plan.py's 1000-cell `groups` grid (20 models x 50 datasets of the tiny local assets, so every
cell has a token sample and readable data: every cell is estimated), as `python -m sft_grid -m ... dry_run=true`
subprocesses, estimates off and on alternating (`--repeats` pairs, a fresh runs root each), then the same pair
again over a runs root that already holds the grid's cells (a re-invocation: the calibration scan reads them all).
Wall time around subprocess.run; the medians and their ratio are reported.

    python benchmarks/bench_estimates.py [--repeats N] [--check] [--json out.json]
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
    args = p.parse_args()
    subprocess.run([sys.executable, "-m", "sft_grid.assets", "build"], cwd=REPO, check=True, capture_output=True)
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
