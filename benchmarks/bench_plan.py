"""Benchmark: plan + validate + render 1000-cell grids of the shapes users write, against Hydra's stock multirun.

Why: sft_grid's promise is that a whole grid is composed, validated and rendered before anything is queued, fast
enough to run on every edit, whatever the grid sweeps. Targets, on a 2-core machine:

  * every shape below, 1000 cells, `dry_run=true`: at most 2 s wall time (median of the fresh runs), and at
    least 30x faster than Hydra's stock multirun of the same grid (basic sweeper + basic launcher, a task that
    does nothing: benchmarks/noop_app.py), run side by side here;
  * `python -m sft_grid --help`: at most 0.5 s (and `sft-grid --help`, the console script's list, for information).

Shapes (each 1000 cells, the estimates and the tokenize-once plan on, as by default: every run is checked to
print both):

  groups      20 models x 50 datasets (group options only)
  scalars     2 models x 10 learning rates x 50 seeds (value overrides only)
  sweep_file  a sweep file (`+sweep=bench`) whose params give 10 models x 100 seeds
  mix         10 models x 10 mixing probabilities x 10 seeds of one data mix (dataset=[tiny_messages,tiny_sharegpt],
              mix.strategy=interleave_under, mix.probs swept over lists)
  mixed       5 models x 4 datasets x 5 learning rates x 10 seeds, with a nested key and a `+` key set

Each shape is also run again over the cells its first run wrote (the re-invocation: every cell exists, its
ledger and files are read, and the files that would change are rewritten).

The models and datasets are small valid configs written into a temporary directory that Hydra's search path gets
(`hydra.searchpath=[file://DIR]`); they point at the tiny local assets. Each command runs as a subprocess (wall
time around subprocess.run: interpreter start-up and imports count, as for a user), after an os.sync() so that no
command pays for the writeback of the one before it, and every sft_grid run is checked to have written its 1000
cell directories. The stock baseline runs a 100-cell slice of each shape with --quick and is scaled to 1000 cells
(labelled as such).

    python benchmarks/bench_plan.py [--quick] [--shapes groups,scalars] [--before CHECKOUT] [--check] [--json out.json]

--before runs an earlier checkout of sft_grid (e.g. `git worktree add /tmp/before <ref>`) on the same grids,
interleaved with this one on the same machine, for before/after figures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NOOP_APP = Path(__file__).resolve().parent / "noop_app.py"
TARGET_PLAN_S = 2.0
TARGET_RATIO = 30.0
TARGET_HELP_S = 0.5
CACHE = "${oc.env:SFT_GRID_CACHE,${oc.env:HOME}/.cache/sft_grid}"
TINY_MODELS = (("tiny-llama3", "llama3"), ("tiny-qwen3", "qwen3"))
STOCK_TIMEOUT_S = 3600
SFT_TIMEOUT_S = 600


def models(n: int) -> list[str]:
    return [f"bench_m{i:02d}" for i in range(n)]


def datasets(n: int) -> list[str]:
    return [f"bench_d{i:02d}" for i in range(n)]


def lrs(n: int) -> list[str]:
    return [f"{i + 1}e-5" for i in range(n)]


def seeds(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def probs(n: int) -> list[str]:
    """n two-source mixing probabilities, each list summing to 1: [0.05,0.95], [0.1,0.9], ..."""
    return [f"[{(i + 1) / 20:g},{1 - (i + 1) / 20:g}]" for i in range(n)]


MIX = ["dataset=[tiny_messages,tiny_sharegpt]", "mix.strategy=interleave_under"]


# shape -> (sweep overrides for sft_grid, the same for a 100-cell slice of the stock baseline)
SHAPES: dict[str, tuple[list[str], list[str]]] = {
    "groups": (
        ["model=" + ",".join(models(20)), "dataset=" + ",".join(datasets(50))],
        ["model=" + ",".join(models(2)), "dataset=" + ",".join(datasets(50))],
    ),
    "scalars": (
        ["model=" + ",".join(models(2)), "lr=" + ",".join(lrs(10)), "seed=" + ",".join(seeds(50))],
        ["model=" + ",".join(models(2)), "lr=" + ",".join(lrs(1)), "seed=" + ",".join(seeds(50))],
    ),
    "sweep_file": (["+sweep=bench"], ["+sweep=bench_slice"]),
    "mix": (
        ["model=" + ",".join(models(10)), *MIX, "mix.probs=" + ",".join(probs(10)), "seed=" + ",".join(seeds(10))],
        ["model=" + ",".join(models(1)), *MIX, "mix.probs=" + ",".join(probs(10)), "seed=" + ",".join(seeds(10))],
    ),
    "mixed": (
        [
            "model=" + ",".join(models(5)),
            "dataset=" + ",".join(datasets(4)),
            "lr=" + ",".join(lrs(5)),
            "seed=" + ",".join(seeds(10)),
            "cluster.cpus_per_node=3",
            "+extra.ddp_timeout=3600",  # a key LLaMA-Factory takes and sft_grid does not model
        ],
        [
            "model=" + ",".join(models(5)),
            "dataset=" + ",".join(datasets(4)),
            "lr=" + ",".join(lrs(5)),
            "seed=0",
            "cluster.cpus_per_node=3",
            "+extra.ddp_timeout=3600",  # a key LLaMA-Factory takes and sft_grid does not model
        ],
    ),
}


class BenchError(Exception):
    """A benchmarked command failed or did not write what it should: no timing can be trusted."""


@dataclass
class Shape:
    name: str
    runs_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    reinvocation_s: float | None = None
    stock_cells: int = 0
    stock_measured_s: float | None = None
    stock_1000_s: float | None = None
    ratio: float | None = None
    before_median_s: float | None = None  # --before: an earlier checkout, same grid, same machine


@dataclass
class Results:
    date: str
    machine: dict[str, Any]
    quick: bool
    shapes: list[Shape] = field(default_factory=list)
    help_runs_s: list[float] = field(default_factory=list)
    help_median_s: float | None = None
    before_help_median_s: float | None = None
    # `sft-grid --help` (the console script's command list; no Hydra): for information
    cli_help_runs_s: list[float] = field(default_factory=list)
    cli_help_median_s: float | None = None
    before_cli_help_median_s: float | None = None
    passed: dict[str, bool] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def write_configs(conf_dir: Path) -> None:
    """20 model and 50 dataset options shaped like conf/model/tiny_llama.yaml and conf/dataset/tiny_messages.yaml,
    and the sweep files of the sweep_file shape."""
    for group in ("model", "dataset", "sweep"):
        (conf_dir / group).mkdir(parents=True)
    for i, name in enumerate(models(20)):
        asset, family = TINY_MODELS[i % 2]
        (conf_dir / "model" / f"{name}.yaml").write_text(
            f"name: {name}\nhub_id: null\npath: {CACHE}/assets/models/{asset}\nparams_b: {0.0002 + i * 1e-5:.5f}\n"
            f"tokenizer_family: {family}\ntemplate: {family}\nneeds: []\n"
        )
    for name in datasets(50):
        (conf_dir / "dataset" / f"{name}.yaml").write_text(
            f"{name}:\n  source: {CACHE}/assets/data/tiny_messages.jsonl\n  formatting: sharegpt\n"
            "  messages: messages\n  tags: {role_tag: role, content_tag: content, user_tag: user,"
            " assistant_tag: assistant, system_tag: system}\n"
        )
    for sweep, (n_models, n_seeds) in {"bench": (10, 100), "bench_slice": (1, 100)}.items():
        (conf_dir / "sweep" / f"{sweep}.yaml").write_text(
            "# @package _global_\n"
            f"sweep_name: default\nmax_steps: 4\nhydra:\n  sweeper:\n    params:\n"
            f"      model: {','.join(models(n_models))}\n      seed: {','.join(seeds(n_seeds))}\n"
        )


def timed(
    argv: list[str], cwd: Path, timeout: float, pythonpath: Path | None = None, variables: dict[str, str] | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}), **(variables or {})}
    # every command starts with nothing of the earlier ones left to write back (a stock run writes 1000 job
    # directories, a dry run 8000 files): else a run pays for its predecessor's writeback, by chance
    os.sync()
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - started, proc


def check(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        tail = lambda text: "\n".join(text.splitlines()[-30:])  # noqa: E731
        raise BenchError(f"{what} exited {proc.returncode}\n{tail(proc.stderr)}\n{tail(proc.stdout)}")


def grid_argv(conf: Path, overrides: list[str], runs_root: Path, *settings: str) -> list[str]:
    """`python -m sft_grid -m OVERRIDES SETTINGS` on the benchmark's configs (`conf` on Hydra's search path), into
    `runs_root`: the command each benchmark times."""
    return [
        sys.executable,
        "-m",
        "sft_grid",
        "-m",
        *overrides,
        f"hydra.searchpath=[file://{conf}]",
        *settings,
        f"runs_root={runs_root}",
    ]


def run_sft_grid(
    conf: Path, overrides: list[str], runs_root: Path, cwd: Path, label: str, checkout: Path | None = None
) -> float:
    argv = grid_argv(conf, overrides, runs_root, "dry_run=true")
    seconds, proc = timed(argv, cwd, SFT_TIMEOUT_S, checkout, {"SFT_GRID_ESTIMATES": "1"})
    check(f"sft_grid dry run ({label})", proc)
    sweep = runs_root / "default"
    cells = sum(1 for d in sweep.iterdir() if (d / "cell.yaml").is_file()) if sweep.is_dir() else 0
    if cells != 1000:
        raise BenchError(f"sft_grid dry run ({label}) wrote {cells} cells, expected 1000")
    # what is measured includes the estimates and the tokenize-once plan (a run without them would be cheaper)
    if "total of the grid, 1000 of 1000 cell(s) estimated" not in proc.stdout:
        raise BenchError(f"sft_grid dry run ({label}) did not estimate its 1000 cells")
    if "tokenize once: " not in proc.stdout:
        raise BenchError(f"sft_grid dry run ({label}) planned no shared tokenization")
    return seconds


def run_stock(conf: Path, overrides: list[str], sweep_dir: Path, cwd: Path) -> float:
    argv = [
        sys.executable,
        str(NOOP_APP),
        "-m",
        "hydra/launcher=basic",
        "hydra/sweeper=basic",
        *overrides,
        f"hydra.searchpath=[file://{conf}]",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    seconds, proc = timed(argv, cwd, STOCK_TIMEOUT_S)
    check("stock Hydra multirun", proc)
    return seconds


def sweep_values(value: str) -> int:
    """How many values an override sweeps: its commas outside brackets (`[a,b],[c,d]` is two lists)."""
    depth, n = 0, 1
    for ch in value:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        n += ch == "," and depth == 0
    return n


def stock_cells(overrides: list[str]) -> int:
    n = 1
    for o in overrides:
        if "=" in o:
            n *= sweep_values(o.split("=", 1)[1])
    return n if overrides != ["+sweep=bench_slice"] else 100


def bench(args: argparse.Namespace, work: Path, r: Results) -> None:
    conf, cwd = work / "conf", work / "cwd"
    cwd.mkdir()
    write_configs(conf)
    print("building the tiny assets (no-op when built) ...", flush=True)
    subprocess.run([sys.executable, "-m", "sft_grid", "assets", "build"], cwd=REPO, check=True, capture_output=True)
    for name in args.shapes:
        full, slice_ = SHAPES[name]
        shape = Shape(name)
        r.shapes.append(shape)
        for i in range(args.repeats):
            shape.runs_s.append(run_sft_grid(conf, full, work / f"runs-{name}-{i}", cwd, f"{name} run {i + 1}"))
        shape.median_s = statistics.median(shape.runs_s)
        shape.reinvocation_s = run_sft_grid(conf, full, work / f"runs-{name}-0", cwd, f"{name} again")
        print(
            f"  {name}: "
            + ", ".join(f"{s:.2f} s" for s in shape.runs_s)
            + f"; again over its cells {shape.reinvocation_s:.2f} s",
            flush=True,
        )
        if args.before:
            runs = [
                run_sft_grid(conf, full, work / f"runs-{name}-before-{i}", cwd, f"{name} before {i + 1}", args.before)
                for i in range(args.repeats)
            ]
            shape.before_median_s = statistics.median(runs)
            print(f"  {name}, before ({args.before}): " + ", ".join(f"{s:.2f} s" for s in runs), flush=True)
        if args.skip_stock:
            continue
        stock = slice_ if args.quick else full
        shape.stock_cells = stock_cells(stock) if args.quick else 1000
        shape.stock_measured_s = run_stock(conf, stock, work / f"stock-{name}", cwd)
        shape.stock_1000_s = shape.stock_measured_s * 1000 / shape.stock_cells
        shape.ratio = shape.stock_1000_s / shape.median_s
        print(f"  {name}, stock Hydra: {shape.stock_measured_s:.1f} s for {shape.stock_cells} cells", flush=True)
    # each help's runs interleaved with the earlier checkout's, so that a busy moment of the machine hits both
    helps = {
        "app": [sys.executable, "-m", "sft_grid", "--help"],
        "cli": [sys.executable, "-m", "sft_grid.cli.main", "--help"],
    }
    before: dict[str, list[float]] = {"app": [], "cli": []}
    for _ in range(args.help_repeats):
        for which, argv in helps.items():
            seconds, proc = timed(argv, cwd, 60)
            check(" ".join(argv[2:]), proc)
            (r.help_runs_s if which == "app" else r.cli_help_runs_s).append(seconds)
            if args.before:
                before[which].append(timed(argv, cwd, 60, args.before)[0])
    r.help_median_s = statistics.median(r.help_runs_s)
    r.cli_help_median_s = statistics.median(r.cli_help_runs_s)
    if args.before:
        r.before_help_median_s = statistics.median(before["app"])
        r.before_cli_help_median_s = statistics.median(before["cli"])


def report(r: Results) -> None:
    rows = [("shape (1000 cells)", "sft_grid median", "again", "before", "stock Hydra", "ratio", "result")]
    for s in r.shapes:
        stock = "-" if s.stock_1000_s is None else f"{s.stock_1000_s:.1f} s" + (" (scaled)" if r.quick else "")
        ok = s.median_s is not None and s.median_s <= TARGET_PLAN_S and (s.ratio is None or s.ratio >= TARGET_RATIO)
        r.passed[s.name] = ok
        before = "-" if s.before_median_s is None else f"{s.before_median_s:.2f} s"
        rows.append(
            (
                s.name,
                "-" if s.median_s is None else f"{s.median_s:.2f} s",
                "-" if s.reinvocation_s is None else f"{s.reinvocation_s:.2f} s",
                before,
                stock,
                "-" if s.ratio is None else f"{s.ratio:.0f}x",
                "PASS" if ok else "FAIL",
            )
        )
    r.passed["help"] = r.help_median_s is not None and r.help_median_s <= TARGET_HELP_S
    before_help = "-" if r.before_help_median_s is None else f"{r.before_help_median_s:.2f} s"
    help_s = "-" if r.help_median_s is None else f"{r.help_median_s:.2f} s"
    rows.append(("--help", help_s, "", before_help, "", "", "PASS" if r.passed["help"] else "FAIL"))
    before_cli = "-" if r.before_cli_help_median_s is None else f"{r.before_cli_help_median_s:.2f} s"
    cli_s = "-" if r.cli_help_median_s is None else f"{r.cli_help_median_s:.2f} s"
    rows.append(("sft-grid --help", cli_s, "", before_cli, "", "", "(info)"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(f"targets: <= {TARGET_PLAN_S:g} s a shape, >= {TARGET_RATIO:g}x stock Hydra, --help <= {TARGET_HELP_S:g} s")
    for err in r.errors:
        print(f"ERROR: {err}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="stock baseline on a 100-cell slice of each shape, scaled")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", type=Path, metavar="PATH")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--help-repeats", type=int, default=5)
    p.add_argument("--skip-stock", action="store_true")
    p.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="also time an earlier checkout of sft_grid (run with PYTHONPATH=CHECKOUT), side by side",
    )
    args = p.parse_args(argv)
    args.shapes = [s for s in args.shapes.split(",") if s]
    r = Results(
        _dt.date.today().isoformat(),
        {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        args.quick,
    )
    failed = False
    with tempfile.TemporaryDirectory(prefix="sft_grid_bench_") as tmp:
        try:
            bench(args, Path(tmp), r)
        except (BenchError, subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
            r.errors.append(str(exc))
            failed = True
    print()
    report(r)
    if args.json:
        args.json.write_text(json.dumps(asdict(r), indent=2) + "\n")
    if failed:
        return 2
    return 1 if args.check and not all(r.passed.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
