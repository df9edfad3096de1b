"""Benchmark: plan + validate + render a 1000-cell grid with sft_grid, against Hydra's stock multirun.

Why: sft_grid's promise is that a whole grid is composed, validated and rendered before anything is
queued, fast enough to run on every edit. The speed targets are

  * `python -m sft_grid -m <20 models> <50 datasets> dry_run=true` (1000 cells): at most 3 s wall time
    on a 2-core machine, and at least 30x faster than
  * Hydra's stock multirun (basic sweeper + basic launcher, a task that does nothing: benchmarks/noop_app.py)
    over the same grid, run side by side here; and
  * `python -m sft_grid --help`: at most 0.8 s.

What it does: writes 20 model and 50 dataset configs (small, valid, pointing at the tiny local assets) into a
temporary config directory, adds that directory to Hydra's search path with `hydra.searchpath=[file://DIR]`,
and times each command as a subprocess (wall time around subprocess.run, so interpreter start-up and imports
count, as they do for a user). Every sft_grid run gets a fresh runs_root and is checked to have written 1000
cell directories with cell.yaml and train_config.yaml; one more run over an existing runs_root (a
re-invocation: every cell is already planned) is reported separately. For comparison (information only, no
target) the same grid is also timed with the directory given as `--config-dir DIR` instead, which puts it on
the primary search path rather than adding it per composition. Everything is written under a temporary
directory, which is removed at the end.

    python benchmarks/bench_plan.py [--quick] [--check] [--json out.json]

--quick runs the stock-Hydra baseline on a 100-cell subgrid (2 models x 50 datasets) and extrapolates to 1000
cells (labelled as such). Exit status: 0 whatever the timings, unless --check is given (then 1 when a target is
missed); 2 when a command failed or wrote the wrong cells, because then there are no numbers to judge.

Note: `glob(bench_m*)` is not used for the sweep: neither Hydra's basic sweeper nor sft_grid's (which
inherits its override parsing) sees options that only a command-line `hydra.searchpath` adds, so a glob over
them expands to nothing (0 cells). The explicit comma lists are used instead.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
NOOP_APP = Path(__file__).resolve().parent / "noop_app.py"

N_MODELS = 20
N_DATASETS = 50
QUICK_MODELS = 2  # --quick: the stock baseline runs 2 x 50 cells and is scaled by N_MODELS / QUICK_MODELS

TARGET_PLAN_S = 3.0
TARGET_RATIO = 30.0
TARGET_HELP_S = 0.8

CACHE = "${oc.env:SFT_GRID_CACHE,${oc.env:HOME}/.cache/sft_grid}"
TINY_MODELS = (("tiny-llama3", "llama3"), ("tiny-qwen3", "qwen3"))  # (asset dir, template = tokenizer family)

STOCK_TIMEOUT_S = 3600
SFT_TIMEOUT_S = 600


class BenchError(Exception):
    """A benchmarked command failed or did not write what it should: no timing can be trusted."""


@dataclass
class Timed:
    seconds: float
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Results:
    date: str
    machine: dict[str, Any]
    cells: int
    sft_grid_runs_s: list[float] = field(default_factory=list)
    sft_grid_min_s: float | None = None
    sft_grid_median_s: float | None = None
    sft_grid_reinvocation_s: float | None = None
    config_dir_runs_s: list[float] = field(default_factory=list)
    config_dir_median_s: float | None = None
    stock_cells_run: int = 0
    stock_measured_s: float | None = None
    stock_1000_s: float | None = None
    stock_extrapolated: bool = False
    stock_jobs_seen: int | None = None
    ratio: float | None = None
    config_dir_ratio: float | None = None
    help_runs_s: list[float] = field(default_factory=list)
    help_min_s: float | None = None
    help_median_s: float | None = None
    targets: dict[str, float] = field(default_factory=dict)
    passed: dict[str, bool] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# -- setup ----------------------------------------------------------------------------------------------------


def model_names() -> list[str]:
    return [f"bench_m{i:02d}" for i in range(N_MODELS)]


def dataset_names() -> list[str]:
    return [f"bench_d{i:02d}" for i in range(N_DATASETS)]


def write_configs(conf_dir: Path) -> None:
    """20 model and 50 dataset options shaped like conf/model/tiny_llama.yaml and conf/dataset/tiny_messages.yaml."""
    (conf_dir / "model").mkdir(parents=True)
    (conf_dir / "dataset").mkdir(parents=True)
    for i, name in enumerate(model_names()):
        asset, family = TINY_MODELS[0] if i < N_MODELS // 2 else TINY_MODELS[1]
        (conf_dir / "model" / f"{name}.yaml").write_text(
            f"# benchmark model {i}: the tiny local {family} model\n"
            f"name: {name}\n"
            "hub_id: null\n"
            f"path: {CACHE}/assets/models/{asset}\n"
            f"params_b: {0.0002 + i * 0.00001:.5f}\n"
            f"tokenizer_family: {family}\n"
            f"template: {family}\n"
            "needs: []\n"
        )
    for i, name in enumerate(dataset_names()):
        (conf_dir / "dataset" / f"{name}.yaml").write_text(
            f"# benchmark dataset {i}: the tiny local conversations, role/content in `messages`\n"
            f"{name}:\n"
            f"  source: {CACHE}/assets/data/tiny_messages.jsonl\n"
            "  formatting: sharegpt\n"
            "  messages: messages\n"
            "  tags:\n"
            "    role_tag: role\n"
            "    content_tag: content\n"
            "    user_tag: user\n"
            "    assistant_tag: assistant\n"
            "    system_tag: system\n"
        )


def ensure_assets() -> None:
    proc = subprocess.run([sys.executable, "-m", "sft_grid.assets", "build"], cwd=REPO, env=dict(os.environ),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"`python -m sft_grid.assets build` exited {proc.returncode}:\n{tail(proc.stderr)}")


def grid_overrides(conf_dir: Path, models: Sequence[str], datasets: Sequence[str]) -> list[str]:
    return [*sweep_overrides(models, datasets), f"hydra.searchpath=[file://{conf_dir}]"]


def sweep_overrides(models: Sequence[str], datasets: Sequence[str]) -> list[str]:
    return ["model=" + ",".join(models), "dataset=" + ",".join(datasets)]


# -- running --------------------------------------------------------------------------------------------------


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def timed(argv: list[str], cwd: Path, timeout: float) -> Timed:
    env = dict(os.environ)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - started
    return Timed(seconds, proc.returncode, proc.stdout, proc.stderr)


def check_ok(what: str, result: Timed) -> None:
    if result.returncode != 0:
        raise BenchError(f"{what} exited {result.returncode} after {result.seconds:.2f} s\n"
                         f"--- stderr (tail) ---\n{tail(result.stderr)}\n--- stdout (tail) ---\n{tail(result.stdout)}")


def count_rendered_cells(runs_root: Path) -> int:
    sweep = runs_root / "default"
    if not sweep.is_dir():
        return 0
    return sum(1 for d in sweep.iterdir()
               if d.is_dir() and (d / "cell.yaml").is_file() and (d / "train_config.yaml").is_file())


def sft_grid_argv(overrides: list[str], runs_root: Path, flags: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "sft_grid", "-m", *flags, *overrides, "dry_run=true", f"runs_root={runs_root}"]


def run_sft_grid(overrides: list[str], runs_root: Path, cwd: Path, expect_cells: int, label: str,
                 flags: Sequence[str] = ()) -> float:
    result = timed(sft_grid_argv(overrides, runs_root, flags), cwd, SFT_TIMEOUT_S)
    check_ok(f"sft_grid dry run ({label})", result)
    cells = count_rendered_cells(runs_root)
    if cells != expect_cells:
        raise BenchError(f"sft_grid dry run ({label}) exited 0 but {cells} cell dirs with cell.yaml and "
                         f"train_config.yaml are under {runs_root / 'default'}, expected {expect_cells}\n"
                         f"--- stdout (tail) ---\n{tail(result.stdout)}")
    return result.seconds


_JOB_LINE = re.compile(r"^\s*#(\d+) : ", re.MULTILINE)


def run_stock(overrides: list[str], sweep_dir: Path, cwd: Path) -> tuple[float, int | None]:
    """Hydra's basic sweeper + launcher over the grid; returns (seconds, highest job number logged + 1)."""
    argv = [sys.executable, str(NOOP_APP), "-m", "hydra/launcher=basic", "hydra/sweeper=basic", *overrides,
            f"hydra.sweep.dir={sweep_dir}"]
    result = timed(argv, cwd, STOCK_TIMEOUT_S)
    check_ok("stock Hydra multirun", result)
    # The basic launcher logs "#<n> : <overrides>" per job (from the 2nd job on, once the job's logging
    # config is installed); the highest number seen confirms how many jobs it ran.
    nums = [int(m) for m in _JOB_LINE.findall(result.stdout + "\n" + result.stderr)]
    return result.seconds, (max(nums) + 1 if nums else None)


def run_help(cwd: Path, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        result = timed([sys.executable, "-m", "sft_grid", "--help"], cwd, 60)
        check_ok("python -m sft_grid --help", result)
        times.append(result.seconds)
    return times


# -- report ---------------------------------------------------------------------------------------------------


def fmt(value: float | None, unit: str = "s", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f} {unit}".strip()


def verdict(results: Results, key: str) -> str:
    if key not in results.passed:
        return "n/a"
    return "PASS" if results.passed[key] else "FAIL"


def print_table(r: Results) -> None:
    stock_label = f"stock Hydra multirun, {r.cells} cells" + (
        f" (extrapolated from {r.stock_cells_run})" if r.stock_extrapolated else "")
    rows = [
        ("measurement", "value", "target", "result"),
        (f"sft_grid dry run, {r.cells} cells (min / median of {len(r.sft_grid_runs_s)})",
         f"{fmt(r.sft_grid_min_s)} / {fmt(r.sft_grid_median_s)}", f"<= {TARGET_PLAN_S:g} s (median)",
         verdict(r, "plan")),
        ("sft_grid re-invocation over existing cells", fmt(r.sft_grid_reinvocation_s), "(info)", ""),
        (f"sft_grid dry run, configs via --config-dir (median of {len(r.config_dir_runs_s)})",
         fmt(r.config_dir_median_s), "(info)", ""),
        (stock_label, fmt(r.stock_1000_s, digits=1), "(baseline)", ""),
        ("ratio stock / sft_grid median", fmt(r.ratio, "x", 1), f">= {TARGET_RATIO:g}x", verdict(r, "ratio")),
        ("ratio stock / sft_grid --config-dir median", fmt(r.config_dir_ratio, "x", 1), "(info)", ""),
        (f"python -m sft_grid --help (min / median of {len(r.help_runs_s)})",
         f"{fmt(r.help_min_s)} / {fmt(r.help_median_s)}", f"<= {TARGET_HELP_S:g} s (median)", verdict(r, "help")),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    if r.stock_jobs_seen is not None and r.stock_jobs_seen != r.stock_cells_run:
        print(f"note: the stock launcher logged {r.stock_jobs_seen} job(s), expected {r.stock_cells_run}")
    for err in r.errors:
        print(f"ERROR: {err}")


def judge(r: Results) -> None:
    r.targets = {"plan_s": TARGET_PLAN_S, "ratio": TARGET_RATIO, "help_s": TARGET_HELP_S}
    if r.sft_grid_median_s is not None:
        r.passed["plan"] = r.sft_grid_median_s <= TARGET_PLAN_S
    if r.ratio is not None:
        r.passed["ratio"] = r.ratio >= TARGET_RATIO
    if r.help_median_s is not None:
        r.passed["help"] = r.help_median_s <= TARGET_HELP_S


def machine_info() -> dict[str, Any]:
    try:
        from importlib.metadata import version

        hydra_version = version("hydra-core")
        omegaconf_version = version("omegaconf")
    except Exception:  # informational only
        hydra_version = omegaconf_version = "?"
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hydra_core": hydra_version,
        "omegaconf": omegaconf_version,
    }


# -- main -----------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"stock-Hydra baseline on {QUICK_MODELS}x{N_DATASETS} cells, extrapolated to "
                        f"{N_MODELS * N_DATASETS}")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON here")
    p.add_argument("--repeats", type=int, default=3, help="fresh sft_grid dry runs (default 3)")
    p.add_argument("--help-repeats", type=int, default=5, help="`--help` runs (default 5)")
    p.add_argument("--skip-stock", action="store_true", help="do not run the stock-Hydra baseline (no ratio)")
    return p.parse_args(argv)


def bench(args: argparse.Namespace, work: Path, r: Results) -> None:
    conf_dir = work / "conf"
    cwd = work / "cwd"  # Hydra's multirun writes multirun.yaml into hydra.sweep.dir, which conf/ sets to "."
    cwd.mkdir()
    write_configs(conf_dir)
    print("building the tiny assets (no-op when built) ...", flush=True)
    ensure_assets()

    models, datasets = model_names(), dataset_names()
    full = grid_overrides(conf_dir, models, datasets)

    print(f"sft_grid dry run, {r.cells} cells, {args.repeats} fresh run(s) ...", flush=True)
    for i in range(args.repeats):
        seconds = run_sft_grid(full, work / f"runs-{i}", cwd, r.cells, f"fresh run {i + 1}")
        r.sft_grid_runs_s.append(seconds)
        print(f"  run {i + 1}: {seconds:.2f} s", flush=True)
    r.sft_grid_min_s = min(r.sft_grid_runs_s)
    r.sft_grid_median_s = statistics.median(r.sft_grid_runs_s)
    r.sft_grid_reinvocation_s = run_sft_grid(full, work / f"runs-{args.repeats - 1}", cwd, r.cells, "re-invocation")
    print(f"  re-invocation over existing cells: {r.sft_grid_reinvocation_s:.2f} s", flush=True)

    print(f"sft_grid dry run, {r.cells} cells, configs via --config-dir (info), {args.repeats} run(s) ...", flush=True)
    for i in range(args.repeats):
        seconds = run_sft_grid(sweep_overrides(models, datasets), work / f"runs-cd-{i}", cwd, r.cells,
                               f"--config-dir run {i + 1}", flags=("--config-dir", str(conf_dir)))
        r.config_dir_runs_s.append(seconds)
        print(f"  run {i + 1}: {seconds:.2f} s", flush=True)
    r.config_dir_median_s = statistics.median(r.config_dir_runs_s)

    print(f"python -m sft_grid --help x{args.help_repeats} ...", flush=True)
    r.help_runs_s = run_help(cwd, args.help_repeats)
    r.help_min_s = min(r.help_runs_s)
    r.help_median_s = statistics.median(r.help_runs_s)

    if args.skip_stock:
        return
    stock_models = models[:QUICK_MODELS] if args.quick else models
    r.stock_cells_run = len(stock_models) * len(datasets)
    r.stock_extrapolated = args.quick
    print(f"stock Hydra multirun (basic sweeper + basic launcher, no-op task), {r.stock_cells_run} cells"
          " (this takes a while) ...", flush=True)
    seconds, jobs = run_stock(grid_overrides(conf_dir, stock_models, datasets), work / "stock-sweep", cwd)
    r.stock_measured_s = seconds
    r.stock_jobs_seen = jobs
    r.stock_1000_s = seconds * r.cells / r.stock_cells_run
    print(f"  {seconds:.1f} s" + (f" -> {r.stock_1000_s:.1f} s for {r.cells} cells (extrapolated)"
                                  if args.quick else ""), flush=True)
    r.ratio = r.stock_1000_s / r.sft_grid_median_s
    r.config_dir_ratio = r.stock_1000_s / r.config_dir_median_s


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.repeats < 1 or args.help_repeats < 1:
        raise SystemExit("--repeats and --help-repeats must be >= 1")
    r = Results(date=_dt.date.today().isoformat(), machine=machine_info(), cells=N_MODELS * N_DATASETS)
    failed = False
    with tempfile.TemporaryDirectory(prefix="sft_grid_bench_") as tmp:
        try:
            bench(args, Path(tmp), r)
        except (BenchError, subprocess.TimeoutExpired) as exc:
            r.errors.append(str(exc))
            failed = True
    judge(r)
    print()
    print_table(r)
    if args.json:
        args.json.write_text(json.dumps(asdict(r), indent=2) + "\n")
        print(f"results written to {args.json}")
    if failed:
        return 2
    if args.check and not all(r.passed.get(k, False) for k in ("plan", "help", *(() if args.skip_stock else ("ratio",)))):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
