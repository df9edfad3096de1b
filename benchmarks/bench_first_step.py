"""Benchmark: the first minute of the README's demo grid, before and after, side by side in one run.

    python benchmarks/bench_first_step.py [--baseline REV] [--repeats N] [--json out.json] [--check]

The demo's shape, new cells, nothing of the runs root there yet:

    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=4e-5 runs_root=TMP

run by two checkouts of sft_grid: the baseline revision (default: 4554f87, before the first minute's work; a git
worktree made in a temporary directory) and this one, alternately, `--repeats` times each, and in two modes:

  * cold: an empty loss-mask probe cache (SFT_GRID_PREFLIGHT_CACHE in a fresh directory): the probe runs;
  * warm: the probe cache of an earlier run of the same grid (what a second grid on the same data sees).

Each run is timed from the command's start to (1) its first line on stdout or stderr (something on the screen),
(2) the first cell's first training step (the first line of its output/trainer_log.jsonl: LLaMA-Factory writes it
at the end of step 1; polled every 50 ms), and (3) its end. The target (issue 20): the first training step in at
most half of the baseline's time, cold and warm. The environments and the tiny assets must be built
(`make setup-demo`); the machine should be otherwise idle: print `uptime` beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = ["-m", "model=tiny_llama,tiny_qwen3", "lr=4e-5"]
BASELINE = "4554f87"


def first_step(runs: Path) -> bool:
    for log in (runs / "default").glob("*/output/trainer_log.jsonl"):
        try:
            if any('"current_steps"' in line for line in log.read_text().splitlines()):
                return True
        except OSError:
            pass
    return False


def timed_run(code: Path, runs: Path, cache: Path) -> dict[str, float]:
    """One run of the demo grid by the checkout at `code`: seconds to the first line, the first step, the end."""
    env = {**os.environ, "PYTHONPATH": str(code), "SFT_GRID_PREFLIGHT_CACHE": str(cache)}
    started = time.monotonic()
    seen: dict[str, float] = {}

    proc = subprocess.Popen(
        [sys.executable, "-m", "sft_grid", *DEMO, f"runs_root={runs}"],
        cwd=code,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            seen.setdefault("first line", time.monotonic() - started)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        if "first step" not in seen and first_step(runs):
            seen["first step"] = time.monotonic() - started
        time.sleep(0.05)
    reader.join(timeout=10)
    seen["end"] = time.monotonic() - started
    if proc.returncode != 0 or "first step" not in seen:
        raise SystemExit(f"{code}: the demo grid failed (exit {proc.returncode}) or trained no step")
    return seen


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return where


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=BASELINE, help=f"the revision to compare with (default {BASELINE})")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument("--check", action="store_true", help="exit 1 unless the first step comes in half the time")
    args = p.parse_args(argv)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_first_") as tmp:
        work = Path(tmp)
        variants = {"baseline": worktree(args.baseline, work / "baseline"), "now": REPO}
        times: dict[str, dict[str, list[dict[str, float]]]] = {v: {"cold": [], "warm": []} for v in variants}
        try:
            for i in range(args.repeats):
                for name, code in variants.items():
                    for mode in ("cold", "warm"):
                        cache = work / f"cache-{name}-{i}"
                        if mode == "warm" and not cache.is_dir():
                            raise SystemExit("warm runs follow their cold run")
                        runs = work / f"runs-{name}-{mode}-{i}"
                        times[name][mode].append(timed_run(code, runs, cache))
                        last = times[name][mode][-1]
                        print(f"{name:8} {mode}: " + ", ".join(f"{k} {v:.1f} s" for k, v in last.items()), flush=True)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "baseline")], check=False
            )
    print(f"\nload average at the start: {load[0]:.2f}; {args.repeats} run(s) each, medians:")
    print(f"{'':14}{'first line':>12}{'first step':>12}{'end':>8}")
    verdict = True
    for mode in ("cold", "warm"):
        for name in times:
            med = {k: statistics.median(r[k] for r in times[name][mode]) for k in ("first line", "first step", "end")}
            print(f"{name + ' ' + mode:14}" + "".join(f"{med[k]:>11.1f}s" for k in ("first line", "first step", "end")))
        before = statistics.median(r["first step"] for r in times["baseline"][mode])
        after = statistics.median(r["first step"] for r in times["now"][mode])
        ok = after <= before / 2
        verdict &= ok
        print(
            f"  {mode}: first step {before:.1f} s -> {after:.1f} s ({before / after:.2f}x faster;"
            f" target: at most half): {'PASS' if ok else 'FAIL'}"
        )
    if args.json:
        args.json.write_text(json.dumps({"load": load[0], "times": times, "pass": verdict}, indent=1) + "\n")
    return 1 if args.check and not verdict else 0


if __name__ == "__main__":
    sys.exit(main())
