"""One grid across two remote sites, each reached over a real sshd (sft_grid/sites/coordinate.py).

The two sites are this machine's two real Slurm clusters, `ci` (`make slurm-up`) and `siteb` (`make slurm-site-up`:
its own controller, ports, state and node), each behind an ssh Host alias of one real OpenSSH server on a loopback
port (tests/sshd.py: Debian's openssh-server, key authentication); site_b's Host entry sends its SLURM_CONF, and its
profile says it has no route to the Hub (`hub_reachable: false`; its Host also points HF_ENDPOINT at a closed port).
What stands in for two real remote sites: the sites and the laptop share this machine's file system, so each site
gets runs and code roots of its own and the laptop's runs root holds only the grid's record; every answer comes
over ssh (counted in sshd's log). The two profiles are committed in a clone of the project (tests/test_snapshot.py
make_checkout), as a user commits theirs, and the grid is launched from that clone.

The grid: 12 cells of the synthetic backend (a simulator: seeded loss curves through the real job, ledger and Slurm,
seconds a cell), trained once for the module; the tests read it. Then siteb's controller is stopped with cells
queued there: the next invocation moves them to ci, once.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from sft_grid.core import gate
from sft_grid.core.cellfiles import CellYaml
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import PACKAGE_CONF, REPO_ROOT, cache_root
from sft_grid.core.schema import ClusterConf
from sft_grid.sites.placement import SiteFacts, need_of, refusal
from sft_grid.sites.remote import RECORD, recorded_cells
from sft_grid.sites.snapshot import SHIP_ENV

from . import sshd
from .conftest import holding_cluster
from .helpers import cancel_jobs_of, ledger
from .ports import free_port
from .test_sites_remote import SITE_B_CONF, site_b_jobs, wait_done
from .test_snapshot import commit_all, make_checkout

pytestmark = [pytest.mark.slurm, pytest.mark.sites, pytest.mark.xdist_group("sites_remote")]

TWELVE = [
    "-m",
    "+sweep=synthetic_delphi",
    "vars.model=delphi-3e18,delphi-9e18,delphi-2e19,delphi-3e19,delphi-9e19,delphi-2e20",
    "vars.recipe=magpie,wildchat",
]
ACROSS = "sites=[far_a,far_b]"
SITE_B = {"SLURM_CONF": SITE_B_CONF, "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}


def _profile(source: str, host: str, base: Path, config: Path) -> str:
    """A remote profile: the local cluster's, reached over ssh, its roots under `base`."""
    text = (PACKAGE_CONF / "cluster" / f"{source}.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("name:", "runs_root:")))
    return (
        f"{text}\nname: far_{host[-1]}\nruns_root: {base / host / 'runs'}\n"
        # a site that does not answer is down at once (one look, no grace): the stopped-controller test's first
        # launch moves its cells (the grace itself: tests/test_sites_spread.py)
        "site_answer_tries: 1\nsite_down_after_s: 0\n"
        f"remote:\n  host: {host}\n  root: {base / host}\n  python: {sys.executable}\n  ssh_config: {config}\n"
    )


@dataclass
class Across:
    base: Path
    server: sshd.Sshd
    checkout: Path
    laptop: Path
    launch: subprocess.CompletedProcess[str]
    connections: int

    def runs(self, host: str, grid: str = "synthetic_delphi") -> Path:
        return self.base / host / "runs" / grid

    def sft(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`sft-grid` run in the clone, as its user runs it."""
        full = {**os.environ, "PYTHONPATH": str(self.checkout), "SFT_GRID_RUNS": str(self.laptop), **(env or {})}
        full.pop(SHIP_ENV, None)  # the clone is committed: nothing to ship
        return subprocess.run(
            [sys.executable, "-m", "sft_grid", *args],
            cwd=self.checkout,
            env=full,
            capture_output=True,
            text=True,
            timeout=900,
        )


@pytest.fixture(scope="module")
def across(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> Iterator[Across]:
    base = tmp_path_factory.mktemp("across")
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")], check=True, capture_output=True)
    closed = free_port()  # nothing listens there: site_b's route to the Hub (never a port sshd.start picks)
    hosts = {"site_a": {}, "site_b": {"SLURM_CONF": SITE_B_CONF, "HF_ENDPOINT": f"http://127.0.0.1:{closed}"}}
    server = sshd.start(base / "sshd", hosts, env={"SFT_GRID_CACHE": str(cache_root())})
    checkout = make_checkout(base / "clone")
    conf = checkout / "sft_grid" / "conf" / "cluster"  # the clone's shipped configs: the snapshot carries them
    (conf / "far_a.yaml").write_text(_profile("slurm_local", "site_a", base, server.config))
    (conf / "far_b.yaml").write_text(_profile("slurm_siteb", "site_b", base, server.config))  # hub_reachable: false
    commit_all(checkout, "two remote sites")
    r = Across(base, server, checkout, base / "laptop", subprocess.CompletedProcess([], 0), 0)
    try:
        with holding_cluster(alone=False):
            before = server.accepted()
            r.launch = r.sft(*TWELVE, ACROSS)
            r.connections = server.accepted() - before
            assert r.launch.returncode == 0, r.launch.stdout + r.launch.stderr
            yield r
    finally:
        cancel_jobs_of(base / "site_a")
        ids = site_b_jobs(base)
        if ids:
            subprocess.run(["scancel", *ids], env=SITE_B, check=False, capture_output=True)
        server.stop()


def _cells(r: Across, grid: str = "synthetic_delphi") -> dict[str, list[Path]]:
    """Cell name -> its directories, on either site."""
    out: dict[str, list[Path]] = {}
    for host in ("site_a", "site_b"):
        for cell in iter_cell_dirs(r.runs(host, grid)):
            out.setdefault(cell.name, []).append(cell)
    return out


def test_twelve_cells_are_placed_on_both_sites_and_each_trains_exactly_once(across: Across):
    cells = _cells(across)
    assert len(cells) == 12 and all(len(dirs) == 1 for dirs in cells.values()), cells
    # one control connection a site for the whole launch (its snapshot, its answer, its share)
    assert across.connections == 2, across.connections
    assert "cell(s) on site far_a" in across.launch.stdout and "cell(s) on site far_b" in across.launch.stdout
    dirs = [d for found in cells.values() for d in found]
    wait_done(dirs, deadline_s=900)
    on = {}
    for cell in dirs:
        history = ledger(cell)
        submitted = [e for e in history if e["event"] == "submitted"]
        assert len(submitted) == 1 and [e["event"] for e in history].count("running") == 1, (cell, history)
        assert submitted[0]["site"] == cell.parents[2].name.replace("site_", "far_"), submitted[0]
        on[cell.name] = submitted[0]["site"]
    assert set(on.values()) == {"far_a", "far_b"}, on
    # the record here names each cell's site (what a site that stops answering keeps)
    assert recorded_cells(across.laptop / "synthetic_delphi") == on
    # every placement within the cell's constraints: the site its ledger names refuses none of them (its profile as
    # committed in the clone, the cell's needs as its cell.yaml has them)
    for cell in dirs:
        profile = OmegaConf.load(across.checkout / "sft_grid" / "conf" / "cluster" / f"{on[cell.name]}.yaml")
        cluster = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConf), profile))
        assert isinstance(cluster, ClusterConf)
        spec = CellYaml.load(cell, ("nodes", "time", "site_needs")).spec
        need = need_of(SimpleNamespace(name=cell.name, spec=spec))
        assert refusal(need, SiteFacts(name=on[cell.name], cluster=cluster)) is None, (cell.name, on[cell.name])


def test_a_second_launch_places_nothing_and_queues_nothing(across: Across):
    dirs = [d for found in _cells(across).values() for d in found]
    wait_done(dirs, deadline_s=900)
    again = across.sft(*TWELVE, ACROSS)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "12 on a site (12 completed), 0 waiting for their site, 0 to place" in again.stdout, again.stdout
    # each site refreshed its own cells, as a run on one site does: nothing to run
    assert again.stdout.count("completed - nothing to run") == 2, again.stdout
    assert all([e["event"] for e in ledger(d)].count("submitted") == 1 for d in dirs)


def test_two_launches_of_one_grid_at_once_from_two_laptops_queue_each_cell_once(across: Across):
    """Two launchers, each with its own record (two laptops' runs roots), launch a new grid at the same moment: they
    take turns on the grid's launch lock on the sites (sites/coordinate.py `hold_launch`), so the second finds the
    first one's cells queued there and queues none of them again."""
    four = ["-m", "+sweep=synthetic_delphi", "vars.model=delphi-3e18,delphi-9e18", "vars.recipe=magpie,wildchat"]
    grid = [*four, "sweep_name=two_launchers", ACROSS]  # a grid of its own: the others' tests read the twelve
    env = {**os.environ, "PYTHONPATH": str(across.checkout)}
    env.pop(SHIP_ENV, None)
    launches = [
        subprocess.Popen(
            [sys.executable, "-m", "sft_grid", *grid],
            cwd=across.checkout,
            env={**env, "SFT_GRID_RUNS": str(across.base / f"laptop{i}")},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (1, 2)
    ]
    said = [p.communicate(timeout=900) for p in launches]
    assert all(p.returncode == 0 for p in launches), said
    seeded = _cells(across, "two_launchers")
    assert len(seeded) == 4 and all(len(dirs) == 1 for dirs in seeded.values()), seeded
    dirs = [d for found in seeded.values() for d in found]
    assert all([e["event"] for e in ledger(d)].count("submitted") == 1 for d in dirs), [ledger(d) for d in dirs]
    # one of them placed the four cells; the other found them on their sites
    outs = sorted(out for out, _ in said)
    assert sum("0 waiting for their site, 4 to place" in out for out in outs) == 1, said
    assert sum("4 on a site" in out and "0 to place" in out for out in outs) == 1, said
    wait_done(dirs, deadline_s=900)


def test_status_and_results_from_the_laptop_show_every_cell_with_its_site(across: Across):
    dirs = [d for found in _cells(across).values() for d in found]
    wait_done(dirs, deadline_s=900)
    status = across.sft("status", "synthetic_delphi")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    table = [line.split() for line in lines[2:] if line.strip() and not line.startswith("12 cell")]
    assert lines[0].split()[-1] == "site" and len(table) == 12, status.stdout
    assert all(r[1] == "completed" and r[-1] in ("far_a", "far_b") for r in table), status.stdout
    assert "12 cell(s): 12 completed" in status.stdout
    results = across.sft("results", "synthetic_delphi", "--format", "csv")
    assert results.returncode == 0, results.stderr
    rows = list(csv.DictReader(io.StringIO(results.stdout)))
    assert len(rows) == 12 and {r["site"] for r in rows} == {"far_a", "far_b"}, results.stdout
    # the same grid on one site (this machine's local executor): equal results, the site column aside
    one = across.base / "one"
    local = across.sft(*TWELVE, "cluster=local", f"runs_root={one}")
    assert local.returncode == 0, local.stdout + local.stderr
    single = across.sft("results", "synthetic_delphi", "--runs-root", str(one), "--format", "csv")
    strip = ("site", "gpu_hours")
    a = sorted(({k: v for k, v in r.items() if k not in strip} for r in rows), key=lambda r: r["cell"])
    b = sorted(
        ({k: v for k, v in r.items() if k not in strip} for r in csv.DictReader(io.StringIO(single.stdout))),
        key=lambda r: r["cell"],
    )
    assert a == b


def test_a_dirty_clone_is_refused_before_any_site_is_contacted(across: Across):
    model = across.checkout / "sft_grid" / "conf" / "model" / "tiny_llama.yaml"
    original = model.read_text()
    before = across.server.accepted()
    try:
        model.write_text(original + "# an edit not committed\n")
        done = across.sft(*TWELVE, "sweep_name=dirty", ACROSS)
    finally:
        model.write_text(original)
    assert done.returncode != 0 and "conf/model/tiny_llama.yaml" in done.stderr, done.stderr
    assert across.server.accepted() == before
    assert not (across.laptop / "dirty").exists()


def _b(*argv: str) -> str:
    return subprocess.run(list(argv), env=SITE_B, capture_output=True, text=True, check=True).stdout


def test_a_sites_stopped_controller_moves_its_queued_cells_once(across: Across):
    """Four cells queued on site_b (its node drained), then its controller stopped: the next launch moves them to
    site_a (each gate claimed on site_b first), the one after finds them done; site_b back, none of its old jobs ran
    (their gates say moved): every cell trained exactly once. That the old jobs start and end at their gates is
    waited for on the local twin (tests/test_sites_spread.py), where the jobs themselves are watched."""
    up = ["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")]
    four = ["-m", "+sweep=synthetic_delphi", "vars.model=delphi-3e20,delphi-1e21", "vars.recipe=magpie,wildchat"]
    node = _b("sinfo", "-h", "-N", "-o", "%N").split()[0]
    try:
        _b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        first = across.sft(*four, "sweep_name=moving", "sites=[far_b]")
        assert first.returncode == 0, first.stdout + first.stderr
        on_b = list(iter_cell_dirs(across.runs("site_b", "moving")))
        assert len(on_b) == 4 and not list(iter_cell_dirs(across.runs("site_a", "moving")))
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_down.sh"), "--controller"], check=True)
        moved = across.sft(*four, "sweep_name=moving", ACROSS)  # refresh 1: confirmed there, queued on site_a
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "site far_b: its Slurm controller did not answer" in moved.stderr, moved.stderr
        assert "4 cell(s) on site far_a" in moved.stdout, moved.stdout
        on_a = list(iter_cell_dirs(across.runs("site_a", "moving")))
        assert sorted(c.name for c in on_a) == sorted(c.name for c in on_b)
        wait_done(on_a, deadline_s=900)
        again = across.sft(*four, "sweep_name=moving", ACROSS)  # refresh 2: nothing moves again
        assert "0 to place" in again.stdout, again.stdout
        # site_b back: the old jobs' gates say moved (the move claimed them), and none of them ran
        subprocess.run(up, check=True, capture_output=True)  # its controller back, its drained node resumed
        old = {c: next(e["job_id"] for e in ledger(c) if e["event"] == "job") for c in on_b}
        deadline = time.monotonic() + 600
        while not all(gate.read(c, gate.key("far_b", j)) for c, j in old.items()):
            assert time.monotonic() < deadline, {c.name: gate.read(c, gate.key("far_b", j)) for c, j in old.items()}
            time.sleep(1)
        assert all(gate.read(c, gate.key("far_b", j)) == gate.MOVED for c, j in old.items())
        for cell in on_b:
            assert "running" not in [e["event"] for e in ledger(cell)], ledger(cell)
        for cell in on_a:
            assert [e["event"] for e in ledger(cell)].count("running") == 1, ledger(cell)
        assert (across.laptop / "moving" / RECORD).is_file()
    finally:
        subprocess.run(up, check=False, capture_output=True)
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=resume"], env=SITE_B, check=False, capture_output=True
        )
