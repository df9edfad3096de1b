"""Benchmark: tokenize once per grid against each cell tokenizing in its own job, real runs on both backends.

Why: before tokenize-once every cell tokenized its data in its own job (on a GPU node, and again on every rank of a
multi-node job); now cells whose data tokenizes the same share one tokenized dataset, built once by the backend's
own preprocessing before them (stages/tokenize.py). Targets, for a grid of 8 cells on the same data, each backend:

  * CPU time spent tokenizing, with sharing against without: cells / unique tokenizations times less (8x here: the
    8 cells share one tokenization). That is a bound, not a target any implementation meets: sharing replaces the
    cells' 8 passes by one pass of the same code that also writes its result once, and 8 loads of it, so the ratio
    is 8t / (t + w) < 8 for a write w > 0. The verdict is PASS when every cell tokenized without sharing, none did
    with it, and the ratio is within 10% of the bound (the one write and the noise between passes);
  * each cell's time from job start to its first training step, before (tokenize_once=false) and after: reported.

What it runs: for each backend, a warm-up cell, then the same grid twice through the orchestrator, locally
(cluster=local: the cells run one at a time, nothing else runs beside them), on the tiny local assets
(`sft-grid assets build`, a no-op when built), each run in a fresh runs root:

    python -m sft_grid -m backend=B model=tiny_llama lr=1e-05,2e-05,..,8e-05 max_steps=1 global_batch_size=2
        cutoff_len=256 runs_root=TMP/B-{own,shared} tokenize_once={false,true} dataset=bench_rows

on tiny_messages' 60 conversations repeated to 20000 rows (`--rows N`; each row's user turn numbered, so no two rows
are the same; `--rows 0`: the 60 rows as they are, where a pass costs about 0.1 s and fixed costs weigh more).

How each number is measured:

  * tokenizing CPU: each backend process records its data step (sft_grid/in_venv/data_step.py, in the job
    directory's data_step.jsonl): the CPU (user + system, its own and its waited-for children's) of the backend's
    own call that prepares the training data (LLaMA-Factory's get_dataset, axolotl's load_datasets). Without
    sharing, summed over the cells, each of which tokenizes; with sharing, the tokenize job's (it tokenizes and
    saves the result). The cells' data steps with sharing (loading the shared dataset) are shown beside it.
  * whole processes, for context: the tokenize job's whole CPU (its marker's `cpu_s`: interpreter start-up, imports
    and the tokenizer load included) against the cells' job CPU (`cpu_seconds` of each `completed` event) without
    sharing minus with it, summed.
  * evidence: with sharing, every cell's log is checked to show it loading the shared dataset and never its raw
    data; without sharing, the cells whose log shows the backend's tokenizing pass (LLaMA-Factory: "Running tokenizer
    on dataset"; axolotl: "Tokenizing Prompts") are counted ("tokenized in-cell k/N").
  * the HF datasets cache: by default each job gets its own (HF_DATASETS_CACHE is a relative path, and each job runs
    in its own directory), so that without sharing every cell tokenizes, as jobs on different nodes do.
    `--datasets-cache grid` gives each run one cache instead, as on one machine or a shared filesystem: then
    axolotl's later cells find the first one's tokenization there (datasets' map cache; they still load the raw data
    and save a prepared copy of their own), while LLaMA-Factory's cells tokenize anyway (its map is not found in
    the cache from one process to the next).
  * job start to first training step: a watcher polls every cell directory every 50 ms and records when its ledger
    gets the job's `running` event (appended as the job starts, before the deferred checks and the backend) and when
    output/trainer_log.jsonl gets its first line (logging_steps=1: written at the end of step 1, both backends).

`--quick` runs 4 cells instead of 8.

    python benchmarks/bench_tokenize.py [--quick] [--cells N] [--backends llamafactory,axolotl] [--rows N]
                                        [--datasets-cache job|grid] [--keep DIR] [--check] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sft_grid.core.layout import DATA_STEP_FILE  # noqa: E402
from sft_grid.core.tokenized import MARKER, TOKENIZED  # noqa: E402

BACKENDS = ("llamafactory", "axolotl")
# what each backend logs when it prepares its raw data itself (tests/test_tokenize_train.py), when it loads a shared
# tokenized dataset, and when its tokenizing pass runs (not when datasets' map cache answers it)
RAW = {"llamafactory": "Running tokenizer on dataset", "axolotl": "Loading raw datasets"}
LOADS = {"llamafactory": "Loaded tokenized dataset from", "axolotl": "Loading prepared dataset from disk at"}
TOKENIZES = {"llamafactory": "Running tokenizer on dataset", "axolotl": "Tokenizing Prompts"}
FIXED = ["model=tiny_llama", "max_steps=1", "global_batch_size=2", "cutoff_len=256"]
GRID_TIMEOUT_S = 3600
ROWS = 20000
FLOOR = 0.9  # of the bound cells / unique tokenizations (see above)
POLL_S = 0.05
CACHE = Path(os.environ.get("SFT_GRID_CACHE", Path.home() / ".cache" / "sft_grid"))


class BenchError(Exception):
    """A run failed or left something other than what it should: no number can be trusted."""


@dataclass
class Cell:
    name: str
    cpu_s: float  # the job's processes, start-up included
    data_cpu_s: float  # its data step: tokenizing (own) or loading the shared dataset (shared)
    start_to_first_step_s: float
    tokenized_in_cell: bool


@dataclass
class Run:
    mode: str  # own (tokenize_once=false) or shared (tokenize_once=true)
    wall_s: float
    cells: dict[str, Cell] = field(default_factory=dict)
    tokenizations: int = 0  # tokenized datasets built (shared)
    tokenize_cpu_s: float = 0.0  # their jobs' whole CPU (their markers' cpu_s): start-up and imports included
    tokenize_data_cpu_s: float = 0.0  # their jobs' data steps: the tokenizing itself


@dataclass
class Backend:
    name: str
    cells: int
    own: Run | None = None
    shared: Run | None = None
    tokenizing_own_s: float | None = None  # the cells' data steps, each of which tokenized
    tokenizing_shared_s: float | None = None  # the tokenize job's data step
    ratio: float | None = None
    loading_shared_s: float | None = None  # the cells' data steps with sharing: loading the tokenized dataset
    job_ratio: float | None = None  # whole processes: the cells' extra job CPU / the tokenize job's whole CPU
    target: float | None = None
    passed: bool | None = None


class Watcher(threading.Thread):
    """When each cell's job started (its `running` event) and logged its first step, by polling its files."""

    def __init__(self, sweep: Path) -> None:
        super().__init__(daemon=True)
        self.sweep = sweep
        self.start_at: dict[str, float] = {}
        self.first_at: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.poll()
            time.sleep(POLL_S)
        self.poll()

    def poll(self) -> None:
        now = time.time()
        for cell in self.sweep.iterdir() if self.sweep.is_dir() else ():
            name = cell.name
            if name not in self.start_at:
                try:
                    ledger = (cell / "events.jsonl").read_text()
                except OSError:
                    continue
                if '"event": "running"' in ledger:
                    self.start_at[name] = now
            elif name not in self.first_at:
                log = cell / "output" / "trainer_log.jsonl"
                if log.is_file() and log.stat().st_size > 0:
                    self.first_at[name] = now


def ledger(cell: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (cell / "events.jsonl").read_text().splitlines() if line.strip()]


def data_step_cpu(directory: Path, what: str) -> float:
    """The CPU of a job's data steps, from its processes' records (sft_grid/in_venv/data_step.py); each must have
    ended well."""
    path = directory / DATA_STEP_FILE
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    ends = [r for r in records if r["event"] == "end"]
    if not ends or len(ends) != len(records) - len(ends) or not all(r["ok"] for r in ends):
        raise BenchError(f"{what}: no complete data step in {path}: {records}")
    return sum(float(r["cpu_s"]) for r in ends)


def grid(
    backend: str,
    lrs: Sequence[str],
    runs_root: Path,
    shared: bool,
    env: tuple[dict[str, str], Path],
    extra: Sequence[str],
) -> tuple[float, Watcher, str]:
    """Run one grid to its end, with (its environment, its working directory); (wall seconds, the watcher's times,
    the command's output)."""
    argv = [
        sys.executable,
        "-m",
        "sft_grid",
        "-m",
        f"backend={backend}",
        *FIXED,
        "lr=" + ",".join(lrs),
        f"runs_root={runs_root}",
        f"tokenize_once={str(shared).lower()}",
        *extra,
    ]
    watcher = Watcher(runs_root / "default")
    watcher.start()
    started = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=env[1], env=env[0], capture_output=True, text=True, timeout=GRID_TIMEOUT_S)
    finally:
        watcher.done.set()
        watcher.join()
    wall = time.perf_counter() - started
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv[1:])} exited {proc.returncode}:\n" + "\n".join(output.splitlines()[-30:]))
    return wall, watcher, output


def read_run(backend: str, mode: str, runs_root: Path, wall: float, watcher: Watcher, n: int) -> Run:
    run = Run(mode, wall)
    sweep = runs_root / "default"
    cells = sorted(d for d in sweep.iterdir() if (d / "events.jsonl").is_file()) if sweep.is_dir() else []
    if len(cells) != n:
        raise BenchError(f"{backend} {mode}: {len(cells)} cell directories, expected {n}")
    for cell in cells:
        events = ledger(cell)
        done = [e for e in events if e.get("event") == "completed" and "cpu_seconds" in e]
        if not done:
            raise BenchError(f"{backend} {mode}: {cell.name} did not complete (last event: {events[-1]})")
        if cell.name not in watcher.first_at:
            raise BenchError(f"{backend} {mode}: no start or first step seen for {cell.name}")
        log = (cell / "logs" / "train.log").read_text(errors="replace")
        if mode == "shared" and (RAW[backend] in log or LOADS[backend] not in log):
            raise BenchError(f"{backend} shared: {cell.name} tokenized itself, or did not load the shared dataset")
        run.cells[cell.name] = Cell(
            cell.name,
            float(done[-1]["cpu_seconds"]),
            data_step_cpu(cell, cell.name),
            watcher.first_at[cell.name] - watcher.start_at[cell.name],
            TOKENIZES[backend] in log,
        )
    built = list((runs_root / TOKENIZED).iterdir()) if (runs_root / TOKENIZED).is_dir() else []
    if mode == "own" and built:
        raise BenchError(f"{backend} own: tokenize_once=false built {len(built)} tokenized dataset(s)")
    for d in built:
        run.tokenize_cpu_s += float(json.loads((d / MARKER).read_text())["cpu_s"])
        run.tokenize_data_cpu_s += data_step_cpu(d, f"{backend} tokenize job")
    run.tokenizations = len(built)
    return run


def write_rows(work: Path, rows: int) -> list[str]:
    """A local dataset of `rows` rows, tiny_messages' conversations in turn, each user turn numbered, and its config
    in a search-path directory: the overrides that select it."""
    src = [
        json.loads(line)
        for line in (CACHE / "assets" / "data" / "tiny_messages.jsonl").read_text().splitlines()
        if line.strip()
    ]
    data = work / "data" / f"bench_rows_{rows}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    with data.open("w") as fh:
        for i in range(rows):
            row = json.loads(json.dumps(src[i % len(src)]))
            for turn in row["messages"]:
                if turn["role"] == "user":
                    turn["content"] = f"{i}: {turn['content']}"
                    break
            fh.write(json.dumps(row) + "\n")
    conf = work / "conf" / "dataset"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "bench_rows.yaml").write_text(
        f"bench_rows:\n  source: {data}\n  formatting: sharegpt\n  messages: messages\n"
        "  tags: {role_tag: role, content_tag: content, user_tag: user, assistant_tag: assistant,"
        " system_tag: system}\n"
    )
    return ["dataset=bench_rows", f"hydra.searchpath=[file://{work / 'conf'}]"]


def bench_backend(backend: str, n: int, work: Path, extra: Sequence[str], datasets_cache: str) -> Backend:
    lrs = [f"{i + 1}e-05" for i in range(n)]
    b = Backend(backend, n)

    def env(tag: str) -> tuple[dict[str, str], Path]:
        """The grid command's environment, and so its jobs': this checkout, a fresh scratch working directory, and
        the HF datasets cache: relative (each job's own directory) or one fresh directory for the run."""
        cwd, cache = work / f"cwd-{backend}-{tag}", work / f"hf-datasets-{backend}-{tag}"
        for d in (cwd, cache):
            shutil.rmtree(d, ignore_errors=True)
        cwd.mkdir(parents=True)
        return {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "HF_DATASETS_CACHE": "hf_datasets" if datasets_cache == "job" else str(cache),
        }, cwd

    print(f"{backend}: a warm-up cell ...", flush=True)
    shutil.rmtree(work / f"{backend}-warmup", ignore_errors=True)
    grid(backend, ["9e-05"], work / f"{backend}-warmup", False, env("warmup"), extra)
    for mode, shared in (("own", False), ("shared", True)):
        print(f"{backend}: {n} cells, tokenize_once={str(shared).lower()} ...", flush=True)
        root = work / f"{backend}-{mode}"
        shutil.rmtree(root, ignore_errors=True)  # a kept directory of an earlier run: its cells would be skipped
        wall, watcher, _ = grid(backend, lrs, root, shared, env(mode), extra)
        setattr(b, mode, read_run(backend, mode, root, wall, watcher, n))
    assert b.own is not None and b.shared is not None
    if b.shared.tokenizations < 1:
        raise BenchError(f"{backend}: tokenize_once=true built no tokenized dataset")
    b.tokenizing_own_s = sum(c.data_cpu_s for c in b.own.cells.values())
    b.tokenizing_shared_s = b.shared.tokenize_data_cpu_s
    b.loading_shared_s = sum(c.data_cpu_s for c in b.shared.cells.values())
    b.target = n / b.shared.tokenizations
    b.ratio = b.tokenizing_own_s / b.tokenizing_shared_s if b.tokenizing_shared_s else None
    extra_own = sum(c.cpu_s - b.shared.cells[name].cpu_s for name, c in b.own.cells.items())
    b.job_ratio = extra_own / b.shared.tokenize_cpu_s if b.shared.tokenize_cpu_s else None
    everywhere = sum(c.tokenized_in_cell for c in b.own.cells.values()) == n  # and nowhere with sharing: read_run
    b.passed = everywhere and b.ratio is not None and b.ratio >= FLOOR * b.target
    return b


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: Sequence[Backend]) -> list[str]:
    rows = [
        (
            "backend",
            "cells",
            "unique tok.",
            "tokenizing CPU not shared",
            "shared",
            "ratio",
            "bound (pass)",
            "result",
            "loading, shared",
            "start->step 1 before",
            "after",
            "tokenized in-cell",
        )
    ]
    for b in results:
        assert b.own is not None and b.shared is not None and b.target is not None  # set by bench_backend
        rows.append(
            (
                b.name,
                str(b.cells),
                str(b.shared.tokenizations),
                f"{b.tokenizing_own_s:.2f} s",
                f"{b.tokenizing_shared_s:.2f} s",
                "-" if b.ratio is None else f"{b.ratio:.2f}x",
                f"{b.target:g}x (>= {FLOOR * b.target:g}x)",
                "PASS" if b.passed else "FAIL",
                f"{b.loading_shared_s:.2f} s",
                f"{median([c.start_to_first_step_s for c in b.own.cells.values()]):.1f} s",
                f"{median([c.start_to_first_step_s for c in b.shared.cells.values()]):.1f} s",
                f"{sum(c.tokenized_in_cell for c in b.own.cells.values())}/{b.cells}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out


def details(b: Backend) -> list[str]:
    assert b.own is not None and b.shared is not None  # and the sums of both, set with them by bench_backend
    assert b.tokenizing_shared_s is not None and b.loading_shared_s is not None
    lines = [
        f"{b.name}: per cell, data step CPU without / with sharing, job CPU without / with sharing (difference),"
        " job start to first step without / with sharing"
    ]
    for name, own in b.own.cells.items():
        sh = b.shared.cells[name]
        lines.append(
            f"  {name}: {own.data_cpu_s:.2f} / {sh.data_cpu_s:.2f} s, {own.cpu_s:.1f} / {sh.cpu_s:.1f} s"
            f" ({own.cpu_s - sh.cpu_s:+.1f} s),"
            f" {own.start_to_first_step_s:.1f} / {sh.start_to_first_step_s:.1f} s"
        )
    own_cpu = sum(c.cpu_s for c in b.own.cells.values())
    shared_cpu = sum(c.cpu_s for c in b.shared.cells.values()) + b.shared.tokenize_cpu_s
    lines.append(
        f"  the tokenize job: {b.shared.tokenize_cpu_s:.1f} s CPU in all, {b.shared.tokenize_data_cpu_s:.2f} s"
        " of it its data step (the rest: its interpreter, imports, tokenizer load)"
    )
    lines.append(
        f"  data steps of the whole grid: {b.tokenizing_own_s:.2f} s without sharing, "
        f"{b.tokenizing_shared_s + b.loading_shared_s:.2f} s with it"
        " (the tokenize job's and the cells' loads)"
    )
    lines.append(
        "  whole processes: the cells' job CPU without sharing minus with it, summed, against the tokenize"
        " job's whole CPU: " + ("-" if b.job_ratio is None else f"{b.job_ratio:.2f}x")
    )
    lines.append(
        f"  the whole grid: {b.own.wall_s:.0f} s wall, {own_cpu:.1f} s job CPU without sharing;"
        f" {b.shared.wall_s:.0f} s wall, {shared_cpu:.1f} s job CPU with it (the tokenize job included)"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 cells instead of 8")
    p.add_argument("--cells", type=int, help="cells per grid (default 8, 4 with --quick)")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    p.add_argument(
        "--rows",
        type=int,
        default=ROWS,
        help=f"train on a local copy of tiny_messages grown to this many rows (default {ROWS}; 0: as it is)",
    )
    p.add_argument(
        "--datasets-cache",
        choices=("job", "grid"),
        default="job",
        help="an HF datasets cache per job (default), or one per grid run",
    )
    p.add_argument("--keep", type=Path, metavar="DIR", help="run in DIR and keep the runs (default: a temporary dir)")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--json", type=Path, metavar="PATH")
    args = p.parse_args(argv)
    n = args.cells or (4 if args.quick else 8)
    backends = [x for x in args.backends.split(",") if x]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or n < 2:
        p.error(f"unknown backend(s) {unknown}" if unknown else "--cells must be at least 2")
    subprocess.run([sys.executable, "-m", "sft_grid", "assets", "build"], cwd=REPO, check=True, capture_output=True)
    results: list[Backend] = []
    error = ""
    with tempfile.TemporaryDirectory(prefix="sft_grid_bench_tok_") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        extra = write_rows(work / "rows", args.rows) if args.rows else []
        try:
            for backend in backends:  # a loop, not a comprehension: a failing backend keeps the results before it
                results.append(bench_backend(backend, n, work, extra, args.datasets_cache))  # noqa: PERF401
        except (BenchError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
    print()
    print(
        f"{n} cells a grid, 1 step each, data: "
        + (f"tiny_messages grown to {args.rows} rows" if args.rows else "tiny_messages (60 rows)")
        + f", an HF datasets cache per {args.datasets_cache}; {os.cpu_count()}"
        f" CPUs, load {os.getloadavg()[0]:.1f}"
    )
    if results:
        for line in table(results):
            print(line)
        for b in results:
            print("\n".join(details(b)))
    if error:
        print(f"ERROR: {error}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": _dt.date.today().isoformat(),
                    "cells": n,
                    "rows": args.rows,
                    "datasets_cache": args.datasets_cache,
                    "error": error or None,
                    "machine": {
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "platform": platform.platform(),
                    },
                    "backends": [asdict(b) for b in results],
                },
                indent=2,
            )
            + "\n"
        )
    if error:
        return 2
    return 1 if args.check and not all(b.passed for b in results) else 0


if __name__ == "__main__":
    sys.exit(main())
