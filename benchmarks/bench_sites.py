"""Benchmark: `sft-grid status` of a 1000-cell grid on a remote site, read from here over ssh (issue 25).

Target: the status of 1000 remote cells in at most 1 s plus one round trip, where a round trip is a fresh `ssh HOST
true` (connection, key authentication and a command: what each status refresh pays). Side by side in one run: the
same status read on the site itself (no ssh), and the round trip alone.

The site is this machine behind a real sshd on a loopback port (tests/sshd.py: Debian's openssh-server, `make
sshd`, a generated key); the grid is 1000 cells written by a dry run (`seed=range(0,1000)`, the local Slurm
cluster's profile: nothing is queued), and the site's code is this checkout's snapshot, extracted as a launch does.

    make sshd && python benchmarks/bench_sites.py [--cells N] [--repeats N] [--json out.json] [--check]

The other targets of issue 25 (12 of 12 cells trained exactly once across sites, placements within constraints, a
lost site's cells re-placed within two refreshes) need grids spread over sites, which sft_grid does not do yet
(one site per grid); they are not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sft_grid.core.submission import CodeSnapshot  # noqa: E402
from sft_grid.sites import remote, snapshot  # noqa: E402
from tests import sshd  # noqa: E402

CLI = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    os.sync()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    return time.perf_counter() - started, done


def median_of(repeats: int, argv: list[str], env: dict[str, str], expect: str) -> float:
    times = []
    for _ in range(repeats):
        seconds, done = timed(argv, env)
        if done.returncode != 0 or expect not in done.stdout:
            print(f"failed: {' '.join(argv)}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}", file=sys.stderr)
            raise SystemExit(2)
        times.append(seconds)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench_sites-"))
    site_root, laptop = work / "site", work / "laptop"
    runs = site_root / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SFT_GRID_SHIP_DIRTY": "1"}
    dry = [
        sys.executable,
        "-m",
        "sft_grid",
        "-m",
        "model=tiny_llama",
        f"seed=range(0,{args.cells})",
        "cluster=slurm_local",
        "sweep_name=wide",
        f"runs_root={runs}",
        "dry_run=true",
    ]
    seconds, done = timed(dry, {**env, "SFT_GRID_ESTIMATES": "0"})
    cells = sum(1 for _ in (runs / "wide").glob("*/cell.yaml"))
    if done.returncode != 0 or cells != args.cells:
        print(f"the dry run wrote {cells} cells:\n{done.stderr[-3000:]}", file=sys.stderr)
        return 2
    print(f"wrote {cells} cells (dry run, {seconds:.1f} s)")

    changed = snapshot.changed_paths(REPO) or []
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    code = CodeSnapshot(head, f"{head}-bench", site_root / "code" / f"{head}-bench", REPO, tuple(changed), "bench")
    snapshot.materialize(code)
    server = sshd.start(work / "sshd", {"site_a": {}}, env={"SFT_GRID_CACHE": os.environ.get("SFT_GRID_CACHE", "")})
    try:
        site = remote.Site("slurm_local", "site_a", str(site_root), sys.executable, str(server.config), str(runs))
        remote.write_record(laptop / "wide", site, code)
        here = [sys.executable, "-c", CLI, "status", "wide", "--runs-root", str(runs)]
        there = [sys.executable, "-c", CLI, "status", "wide", "--runs-root", str(laptop)]
        trip = ["ssh", "-F", str(server.config), "-o", "BatchMode=yes", "site_a", "true"]
        on_site, forwarded, round_trip = [], [], []
        for _ in range(args.repeats):  # interleaved: the three see the same machine load
            on_site.append(median_of(1, here, env, "planned"))
            forwarded.append(median_of(1, there, env, "planned"))
            round_trip.append(median_of(1, trip, env, ""))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "cells": cells,
        "status_on_site_s": statistics.median(on_site),
        "status_from_here_s": statistics.median(forwarded),
        "round_trip_s": statistics.median(round_trip),
    }
    target = 1.0 + result["round_trip_s"]
    ok = result["status_from_here_s"] <= target
    rows = [
        ("status on the site itself (baseline)", f"{result['status_on_site_s']:.2f} s", ""),
        ("one ssh round trip (fresh connection)", f"{result['round_trip_s']:.2f} s", ""),
        (
            f"status of {cells} remote cells from here",
            f"{result['status_from_here_s']:.2f} s",
            f"<= 1 s + round trip = {target:.2f} s: {'met' if ok else 'MISSED'}",
        ),
        (
            "overhead over the site's own status",
            f"{result['status_from_here_s'] - result['status_on_site_s']:.2f} s",
            "",
        ),
    ]
    for name, value, verdict in rows:
        print(f"{name:<42} {value:>8}  {verdict}")
    if args.json:
        args.json.write_text(json.dumps({**result, "target_s": target, "met": ok}, indent=1))
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
