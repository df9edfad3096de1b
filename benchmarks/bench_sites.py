"""Benchmark: `sft-grid status` of a 1000-cell grid on a remote site, read from here over ssh.

Target: the status of 1000 remote cells in at most 1 s plus one round trip, where a round trip is a fresh `ssh HOST
true` (connection, key authentication and a command: what each status refresh pays). Side by side in one run: the
same status read on the site itself (no ssh), and the round trip alone.

The site is this machine behind a real sshd on a loopback port (tests/sshd.py: Debian's openssh-server, `make
sshd`, a generated key); the grid is 1000 cells written by a dry run (`seed=range(0,1000)`, the local Slurm
cluster's profile: nothing is queued), and the site's code is this checkout's snapshot, extracted as a launch does.

    make sshd && python benchmarks/bench_sites.py [--cells N] [--sites N] [--repeats N] [--json out.json] [--check]

`--sites 2` splits the cells over two remote sites (a grid across remote sites: each site asked at once over its own
connection, the answers merged here, sft_grid/sites/merged.py); the target is the same.

    python benchmarks/bench_sites.py --spread [--json out.json] [--check]

`--spread` measures the other targets on the two real local Slurm clusters (`make slurm-up slurm-site-up`): a
12-cell grid (the synthetic backend's simulator, sweeps/synthetic_delphi.yaml) spread over ci and siteb: cells
trained exactly once (one `running` event each, every cell completed), placements within each cell's constraints
(sft_grid/sites/placement.py's `refusal` of the site its ledger names: none); then 4 cells queued on siteb with its
node drained, its controller stopped (scripts/slurm_site_down.sh --controller): two runs of the grid command
(refreshes) within the profile's grace (`site_answer_tries` silent answers over at least `site_down_after_s`) move
none of them (target: none), then, with the grace off (a team's profile of siteb: one look, no wait), the refreshes
until every one of them is queued on ci (target: at most two). siteb is restarted at the end.
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


TWELVE = [
    "+sweep=synthetic_delphi",
    "vars.model=delphi-3e18,delphi-9e18,delphi-2e19,delphi-3e19,delphi-9e19,delphi-2e20",
    "cluster=slurm_local",
]
SITES = "sites=[slurm_local,slurm_siteb]"
SITE_B = {**os.environ, "SLURM_CONF": "/etc/slurm-siteb/slurm.conf"}


def _events(cell: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (cell / "events.jsonl").read_text().splitlines() if line.strip()]


def _grid(env: dict[str, str], *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "sft_grid", "-m", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(2)


def _wait(cells: list[Path], deadline_s: float = 900) -> None:
    from sft_grid.core.state import State, state_of

    t0 = time.monotonic()
    while not all(state_of(c).state is State.COMPLETED for c in cells):
        if time.monotonic() - t0 > deadline_s:
            raise SystemExit(f"not completed after {deadline_s} s")
        time.sleep(1)


def spread(args: argparse.Namespace) -> int:
    from sft_grid.core.cellfiles import CellYaml
    from sft_grid.core.layout import iter_cell_dirs
    from sft_grid.sites.placement import SiteFacts, need_of, profiles, refusal

    work = Path(tempfile.mkdtemp(prefix="bench_sites_spread-"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "SFT_GRID_SHIP_DIRTY": "1"}
    up = ["bash", str(REPO / "scripts" / "slurm_site_up.sh")]
    subprocess.run(up, check=True, capture_output=True)
    result: dict[str, object] = {}
    node = "s1"
    try:
        _grid(env, *TWELVE, SITES, f"runs_root={work / 'spread'}")
        cells = list(iter_cell_dirs(work / "spread" / "synthetic_delphi"))
        _wait(cells)
        once = sum(1 for c in cells if [e["event"] for e in _events(c)].count("running") == 1)
        sites, _ = profiles([type("C", (), {"spec": type("S", (), {"sites": ["slurm_local", "slurm_siteb"]})})()])
        within, placed = 0, dict[str, int]()
        for c in cells:
            site = next(str(e["site"]) for e in _events(c) if e["event"] == "submitted")
            placed[site] = placed.get(site, 0) + 1
            spec = CellYaml.load(c, ("nodes", "time", "site_needs")).spec
            need = need_of(type("C", (), {"name": c.name, "spec": spec})())
            within += refusal(need, SiteFacts(name=site, cluster=sites[site])) is None
        result.update(cells=len(cells), trained_once=once, within_constraints=within, placed=placed)
        # a lost site: 4 cells queued on siteb (its node drained), its controller stopped, the grid run again
        b = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=SITE_B, capture_output=True, text=True).stdout
        node = b.split()[0]
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=bench"], env=SITE_B)
        four = ["+sweep=synthetic_delphi", "vars.model=delphi-3e18,delphi-9e18", "cluster=slurm_local"]
        _grid(env, *four, "sites=[slurm_siteb]", f"runs_root={work / 'lost'}")
        lost = list(iter_cell_dirs(work / "lost" / "synthetic_delphi"))
        subprocess.run(["bash", str(REPO / "scripts" / "slurm_site_down.sh"), "--controller"], check=True)

        def moved() -> int:
            last = [[e.get("site") for e in _events(c) if e["event"] == "submitted"][-1] for c in lost]
            return sum(site == "slurm_local" for site in last)

        # the profile's own grace first (a site is down after site_answer_tries silent answers over at least
        # site_down_after_s): two refreshes within it move nothing
        for _ in range(2):
            _grid(env, *four, SITES, f"runs_root={work / 'lost'}")
        result.update(moved_within_grace=moved())
        # then the grace off (one look, no wait: a team's profile of siteb, as a site that must move at once sets)
        conf = work / "conf" / "cluster"
        conf.mkdir(parents=True)
        shipped = (REPO / "sft_grid" / "conf" / "cluster" / "slurm_siteb.yaml").read_text()
        (conf / "slurm_siteb.yaml").write_text(shipped + "site_answer_tries: 1\nsite_down_after_s: 0\n")
        refreshes = 0
        while refreshes < 5:
            refreshes += 1
            _grid({**env, "SFT_GRID_CONF": str(work / "conf")}, *four, SITES, f"runs_root={work / 'lost'}")
            if moved() == len(lost):
                break
        result.update(lost_cells=len(lost), refreshes_to_replace=refreshes)
    finally:
        subprocess.run(up, capture_output=True)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=SITE_B, capture_output=True)
        subprocess.run(["scancel", "-u", "root", "--name", "sft_grid"], env=SITE_B, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    ok = (
        result.get("trained_once") == result.get("cells") == 12
        and result.get("within_constraints") == 12
        and int(str(result.get("refreshes_to_replace", 99))) <= 2
        and result.get("moved_within_grace") == 0
    )
    print(f"12 cells over two sites: {result.get('placed')}")
    print(f"trained exactly once: {result.get('trained_once')} of {result.get('cells')} (target 12 of 12)")
    print(f"placements within each cell's constraints: {result.get('within_constraints')} of {result.get('cells')}")
    n_lost, n_refreshes = result.get("lost_cells"), result.get("refreshes_to_replace")
    grace = result.get("moved_within_grace")
    print(f"a stopped site's {n_lost} queued cells moved within its grace: {grace} (target 0)")
    print(f"... re-placed after {n_refreshes} refresh(es) with the grace off (target <= 2)")
    if args.json:
        args.json.write_text(json.dumps({**result, "met": ok}, indent=1))
    return 1 if args.check and not ok else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spread", action="store_true", help="the targets of a grid across the two local clusters")
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--sites", type=int, default=1, help="split the cells over this many remote sites")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if args.spread:
        return spread(args)

    work = Path(tempfile.mkdtemp(prefix="bench_sites-"))
    site_root, laptop = work / "site", work / "laptop"
    runs = site_root / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SFT_GRID_SHIP_DIRTY": "1"}
    # --sites N: the cells split over N sites (each its runs root on the site), their status merged here
    roots = [runs] if args.sites == 1 else [site_root / f"runs{i}" for i in range(args.sites)]
    share = -(-args.cells // len(roots))
    for i, root in enumerate(roots):
        first, last = i * share, min(args.cells, (i + 1) * share)
        dry = [
            sys.executable,
            "-m",
            "sft_grid",
            "-m",
            "model=tiny_llama",
            f"seed=range({first},{last})",
            "cluster=slurm_local",
            "sweep_name=wide",
            f"runs_root={root}",
            "dry_run=true",
        ]
        _, done = timed(dry, {**env, "SFT_GRID_ESTIMATES": "0"})
        if done.returncode != 0:
            print(f"the dry run failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            return 2
    cells = sum(1 for root in roots for _ in (root / "wide").glob("*/cell.yaml"))
    if cells != args.cells:
        print(f"the dry runs wrote {cells} cells", file=sys.stderr)
        return 2
    print(f"wrote {cells} cells on {len(roots)} site(s) (dry runs)")

    changed = snapshot.changed_paths(REPO) or []
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    code = CodeSnapshot(head, f"{head}-bench", site_root / "code" / f"{head}-bench", REPO, tuple(changed), "bench")
    snapshot.materialize(code)
    server = sshd.start(work / "sshd", {"site_a": {}}, env={"SFT_GRID_CACHE": os.environ.get("SFT_GRID_CACHE", "")})
    try:
        sites = [
            remote.Site(f"site{i}", "site_a", str(site_root), sys.executable, str(server.config), str(root))
            for i, root in enumerate(roots)
        ]
        placed = [remote.Placed(site=s, code_dir=code.dir, code=code.key, commit=code.commit) for s in sites]
        remote.write_record(laptop / "wide", placed)
        # the baseline: the status of the biggest share, on its site (the sites answer at once)
        here = [sys.executable, "-c", CLI, "status", "wide", "--runs-root", str(roots[0])]
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
        ("status on a site itself (baseline)", f"{result['status_on_site_s']:.2f} s", ""),
        ("one ssh round trip (fresh connection)", f"{result['round_trip_s']:.2f} s", ""),
        (
            f"status of {cells} cells on {len(roots)} remote site(s) from here",
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
