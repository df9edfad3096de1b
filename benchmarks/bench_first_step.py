"""Benchmark: the first minute of the README's demo grid, before and after, side by side in one run.

    python benchmarks/bench_first_step.py [--baseline REV] [--repeats N] [--fresh] [--json out.json] [--check]

The demo's shape, new cells, nothing of the runs root there yet:

    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=4e-5 runs_root=TMP

run by two checkouts of sft_grid: the baseline revision (default: 950c893, before work on the first
minute; a git worktree made in a temporary directory) and this one, alternately, `--repeats` times each, and in two
modes:

  * cold: an empty loss-mask probe cache (SFT_GRID_PREFLIGHT_CACHE in a fresh directory): the probe runs (new data);
  * warm: the probe cache of an earlier run of the same grid (what a second grid on the same data sees).

`--fresh`: "this one" is a fresh clone of HEAD too (a git worktree: no bytecode of sft_grid itself, as on a new
machine where PYTHONDONTWRITEBYTECODE=1 is set), not the working tree.

Each run is timed from the command's start to (1) its first line on stdout or stderr (something on the screen),
(2) the first cell's first training step (the first line of its output/trainer_log.jsonl: LLaMA-Factory writes it
at the end of step 1; polled every 50 ms), (3) the first cell completed (a `completed` event in its ledger), and
(4) its end; and (5) the longest time the pipe went without a line (stdout and stderr in one pipe, each line timed
as this script reads it). Targets: the first cell completed in at most 10 s, at most 3 s without a line,
cold and warm. The environments and the tiny assets must be built (`make setup-demo`); the machine should be
otherwise idle: the load average is printed beside the numbers.
"""

from __future__ import annotations

import argparse
import itertools
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
BASELINE = "950c893"
TARGET_CELL_S = 10.0
TARGET_GAP_S = 3.0
MEASURES = ("first line", "first step", "first cell", "end", "longest gap")


def first_step(runs: Path) -> bool:
    for log in (runs / "default").glob("*/output/trainer_log.jsonl"):
        try:
            if any('"current_steps"' in line for line in log.read_text().splitlines()):
                return True
        except OSError:
            pass
    return False


def first_cell(runs: Path) -> bool:
    for ledger in (runs / "default").glob("*/events.jsonl"):
        try:
            if '"event": "completed"' in ledger.read_text():
                return True
        except OSError:
            pass
    return False


def timed_run(code: Path, runs: Path, cache: Path) -> dict[str, float]:
    """One run of the demo grid by the checkout at `code`: seconds to the first line, the first step, the first
    cell completed, the end, and the longest time without a line."""
    env = {**os.environ, "PYTHONPATH": str(code), "SFT_GRID_PREFLIGHT_CACHE": str(cache)}
    started = time.monotonic()
    seen: dict[str, float] = {}
    lines: list[float] = [started]

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
            lines.append(time.monotonic())
            seen.setdefault("first line", lines[-1] - started)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        if "first step" not in seen and first_step(runs):
            seen["first step"] = time.monotonic() - started
        if "first cell" not in seen and first_cell(runs):
            seen["first cell"] = time.monotonic() - started
        time.sleep(0.05)
    reader.join(timeout=10)
    seen["end"] = time.monotonic() - started
    lines.append(started + seen["end"])
    seen["longest gap"] = max(b - a for a, b in itertools.pairwise(lines))
    seen.setdefault("first cell", seen["end"])  # completed between the last poll and the end
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
    p.add_argument("--fresh", action="store_true", help="this checkout as a fresh clone of HEAD (no bytecode)")
    p.add_argument("--json", type=Path)
    p.add_argument("--check", action="store_true", help="exit 1 unless every target is met")
    args = p.parse_args(argv)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench_first_") as tmp:
        work = Path(tmp)
        variants = {"baseline": worktree(args.baseline, work / "baseline")}
        variants["now"] = worktree("HEAD", work / "now") if args.fresh else REPO
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
            for name in ("baseline", "now"):
                if variants[name] != REPO:
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(variants[name])], check=False
                    )
    end_load = os.getloadavg()
    print(f"\nload average at the start: {load[0]:.2f}, at the end: {end_load[0]:.2f}; {args.repeats} run(s) each")
    print(f"{'':14}" + "".join(f"{k:>13}" for k in MEASURES))
    verdict = True
    for mode in ("cold", "warm"):
        for name in times:
            med = {k: statistics.median(r[k] for r in times[name][mode]) for k in MEASURES}
            print(f"{name + ' ' + mode:14}" + "".join(f"{med[k]:>12.1f}s" for k in MEASURES))
        cell = {n: statistics.median(r["first cell"] for r in times[n][mode]) for n in times}
        gap = {n: statistics.median(r["longest gap"] for r in times[n][mode]) for n in times}
        ok = cell["now"] <= TARGET_CELL_S and gap["now"] <= TARGET_GAP_S
        verdict &= ok
        print(
            f"  {mode}: first cell completed {cell['baseline']:.1f} s -> {cell['now']:.1f} s"
            f" ({cell['baseline'] / cell['now']:.2f}x; target <= {TARGET_CELL_S:.0f} s), longest gap"
            f" {gap['baseline']:.1f} s -> {gap['now']:.1f} s (target <= {TARGET_GAP_S:.0f} s):"
            f" {'PASS' if ok else 'FAIL'}"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"load": [load[0], end_load[0]], "times": times, "pass": verdict}, indent=1) + "\n"
        )
    return 1 if args.check and not verdict else 0


if __name__ == "__main__":
    sys.exit(main())
