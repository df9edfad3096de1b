"""Benchmark: a 1000-cell grid to the local Slurm cluster, and its status, against Hydra's stock submitit launcher.

Targets: one `sbatch` invocation per job of the grid's plan (the tokenize-once array, the training array, the
post-training array: 3), the 1000 cells as the training array's 1000 tasks, and at most 5 s from command to all
jobs queued; status of the 1000-cell
grid in at most 0.5 s (interpreter start-up included) with one `sacct` call. Side by side: Hydra's stock submitit
launcher on the same grid (it composes every cell, submits, then blocks until the jobs finish).

The jobs are submitted held (`--hold`): the benchmark measures queueing, not training, and cancels every
job it queued. `sbatch` and `sacct` are counted by wrappers put first on PATH that exec the real ones.

    make slurm-up && pip install -e '.[bench]'
    python benchmarks/bench_slurm.py [--stock-cells N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_plan  # the same 20 x 50 grid of small test configs

REPO = Path(__file__).resolve().parent.parent
WRAPPER = """#!/usr/bin/env bash
echo x >> {count}
exec {real} "$@"
"""


def counting_path(work: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """A PATH whose sbatch and sacct count their calls, and the count files."""
    bin_dir = work / "bin"
    bin_dir.mkdir()
    counts = {}
    for tool in ("sbatch", "sacct"):
        counts[tool] = work / f"{tool}.count"
        counts[tool].write_text("")
        script = bin_dir / tool
        script.write_text(WRAPPER.format(count=counts[tool], real=f"/usr/bin/{tool}"))
        script.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, counts


def calls(counts: dict[str, Path], tool: str) -> int:
    return len(counts[tool].read_text().splitlines())


def reset(counts: dict[str, Path]) -> None:
    for path in counts.values():
        path.write_text("")


def cancel_named(prefix: str) -> None:
    ids = subprocess.run(["squeue", "-h", "-o", "%A %j"], capture_output=True, text=True).stdout.split("\n")
    doomed = sorted({line.split()[0] for line in ids if line.strip() and line.split()[1].startswith(prefix)})
    if doomed:
        subprocess.run(["scancel", *doomed], check=False)


def queued_tasks(prefix: str) -> int:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%j"], capture_output=True, text=True).stdout.split()
    return sum(1 for name in out if name.startswith(prefix))


def train_job(output: str) -> str:
    """The training array's name, from the command's line `queued N cell(s) as sft_grid-<hash>: ...`."""
    found = re.search(r"queued \d+ cell\(s\) as (sft_grid-[0-9a-f]{12})", output)
    return found.group(1) if found else "(no training array announced)"


GROUPS = [*bench_plan.SHAPES["groups"][0]]


def bench_sft_grid(
    work: Path,
    conf: Path,
    env: dict[str, str],
    counts: dict[str, Path],
    label: str = "",
) -> dict[str, float]:
    runs = work / f"runs{label}"
    argv = bench_plan.grid_argv(conf, GROUPS, runs, "cluster=slurm_local", "+cluster.sbatch_extra.hold=true")
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    queue_s = time.perf_counter() - started
    try:
        if proc.returncode != 0:
            raise SystemExit(f"sft_grid failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result = {
            "queue_s": queue_s,
            "sbatch_calls": calls(counts, "sbatch"),
            # the plan's jobs, as the command announces each: "<what> ... as sft_grid-<hash>" or "array sft_grid-..."
            "jobs_planned": len(set(re.findall(r"\b(sft_grid-[0-9a-f]{12})\b", proc.stdout + proc.stderr))),
            "tasks_queued": queued_tasks(train_job(proc.stdout + proc.stderr)),
        }
        reset(counts)
        started = time.perf_counter()
        status = subprocess.run(
            [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(runs)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        result["status_s"] = time.perf_counter() - started
        result["sacct_calls"] = calls(counts, "sacct")
        result["status_cells"] = status.stdout.count("submitted")
        return result
    finally:
        cancel_named("sft_grid-")


def bench_stock(work: Path, conf: Path, n_datasets: int, deadline_s: float) -> dict[str, float]:
    """Hydra's submitit launcher: time until every cell is queued (it then blocks; we stop it there)."""
    name = "stockbench"
    datasets = bench_plan.datasets(n_datasets)
    n = 20 * len(datasets)
    argv = [
        sys.executable,
        str(REPO / "benchmarks" / "noop_app.py"),
        "-m",
        "hydra/launcher=submitit_slurm",
        "hydra/sweeper=basic",
        "model=" + ",".join(bench_plan.models(20)),
        "dataset=" + ",".join(datasets),
        f"hydra.searchpath=[file://{conf}]",
        f"hydra.sweep.dir={work / 'stock'}",
        "hydra.launcher.partition=debug",
        "hydra.launcher.timeout_min=5",
        f"hydra.launcher.name={name}",
        "+hydra.launcher.additional_parameters={hold: true}",
        "hydra.launcher.array_parallelism=1000",
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    queued_at = None
    try:
        while time.perf_counter() - started < deadline_s:
            if queued_tasks(name) >= n:
                queued_at = time.perf_counter() - started
                break
            if proc.poll() is not None:
                assert proc.stderr is not None  # a pipe
                raise SystemExit(f"stock launcher exited early:\n{proc.stderr.read()[-3000:]}")
            time.sleep(0.5)
        return {
            "cells": n,
            "queue_s": queued_at or float("nan"),
            "returned": proc.poll() is not None,
            "deadline_s": deadline_s,
        }
    finally:
        proc.kill()
        cancel_named(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock-cells", type=int, default=1000, help="cells for the stock launcher (20 x N/20)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="also time an earlier checkout of sft_grid (PYTHONPATH) on the same grid, side by side",
    )
    args = parser.parse_args(argv)
    subprocess.run([sys.executable, "-m", "sft_grid", "assets", "build"], cwd=REPO, check=True, capture_output=True)
    before = None
    with tempfile.TemporaryDirectory(prefix="bench_slurm-") as tmp:
        work = Path(tmp)
        conf = work / "conf"
        bench_plan.write_configs(conf)
        env, counts = counting_path(work)
        ours = bench_sft_grid(work, conf, env, counts)
        if args.before:
            reset(counts)
            before = bench_sft_grid(work, conf, {**env, "PYTHONPATH": str(args.before.resolve())}, counts, "-before")
        stock = bench_stock(work, conf, max(1, args.stock_cells // 20), deadline_s=600)
    scale = 1000 / stock["cells"]
    rows = [
        ("sft_grid: command to 1000 cells queued", f"{ours['queue_s']:.2f} s", "<= 5 s", ours["queue_s"] <= 5),
        (
            "sft_grid: sbatch invocations",
            f"{ours['sbatch_calls']}",
            f"one per job planned ({ours['jobs_planned']})",
            ours["sbatch_calls"] == ours["jobs_planned"] <= 3,
        ),
        ("sft_grid: training array tasks in squeue", f"{ours['tasks_queued']}", "1000", ours["tasks_queued"] == 1000),
        ("sft_grid: status of 1000 cells", f"{ours['status_s']:.2f} s", "<= 0.5 s", ours["status_s"] <= 0.5),
        ("sft_grid: sacct calls for status", f"{ours['sacct_calls']}", "1", ours["sacct_calls"] == 1),
        (
            f"stock submitit launcher: {stock['cells']} cells queued",
            f"{stock['queue_s']:.1f} s"
            + (f" (x{scale:g} = {stock['queue_s'] * scale:.0f} s for 1000)" if scale != 1 else ""),
            "(baseline)",
            None,
        ),
        ("stock launcher returned after queueing", str(stock["returned"]), "(it blocks)", None),
    ]
    if before is not None:
        rows += [
            (
                "before (--before): command to 1000 cells queued",
                f"{before['queue_s']:.2f} s",
                f"ratio {ours['queue_s'] / before['queue_s']:.2f}",
                None,
            ),
            (
                "before (--before): status of 1000 cells",
                f"{before['status_s']:.2f} s",
                f"ratio {ours['status_s'] / before['status_s']:.2f}",
                None,
            ),
        ]
    width = max(len(r[0]) for r in rows)
    for label, value, target, ok in rows:
        verdict = "" if ok is None else ("PASS" if ok else "FAIL")
        print(f"{label:<{width}}  {value:<28} {target:<12} {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"sft_grid": ours, "before": before, "stock": stock}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
