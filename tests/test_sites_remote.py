"""A grid on a remote site, launched and read from here over a real sshd (sft_grid/sites/remote.py).

The site is this machine behind its own OpenSSH server on a loopback port (tests/sshd.py: Debian's openssh-server,
`make sshd`, key authentication with a generated key, a test-only ssh config through `ssh -F`), with the real local
Slurm cluster as its scheduler and a site root of its own. What stands in for a real remote site: the site and the
laptop share a file system here, so the tests check that the laptop side never reads the site's files itself (its
runs root is another directory, and every answer comes over ssh, counted in sshd's log).

One grid of two tiny cells is launched once for the module (about a minute of training on the cluster); the tests
read it: the launch's one connection, the snapshot on the site, status/logs/results/report from the laptop, one
connection a command, nothing left running on the site.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import REPO_ROOT, cache_root
from sft_grid.core.state import State, state_of
from sft_grid.sites.remote import RECORD
from sft_grid.sites.snapshot import MARKER, SHIP_ENV

from . import sshd
from .conftest import holding_cluster, run_sft
from .helpers import cancel_jobs_of, ledger
from .test_snapshot import make_checkout

pytestmark = [pytest.mark.slurm, pytest.mark.backend, pytest.mark.sites, pytest.mark.xdist_group("sites_remote")]

CLI = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"  # sft-grid, from this tree
SITE_B_CONF = "/etc/slurm-siteb/slurm.conf"  # the second cluster's clients' config
TINY = ["model=tiny_llama,tiny_qwen3", "max_steps=2", "global_batch_size=4", "micro_batch_size=2"]


@dataclass
class Remote:
    server: sshd.Sshd
    site_root: Path
    site_runs: Path
    laptop: Path  # the laptop's runs root: where the grid's record is, never its cells
    launch: subprocess.CompletedProcess[str]
    launch_connections: int

    def args(self, host: str = "site_a") -> list[str]:
        """A grid's arguments for a site: its root and runs root on the site (here: beside site_a's)."""
        root = self.site_root.parent / host
        return [
            "cluster=slurm_local",
            f"cluster.remote.host={host}",
            f"cluster.remote.root={root}",
            f"cluster.remote.ssh_config={self.server.config}",
            f"cluster.remote.python={sys.executable}",
            f"runs_root={root / 'runs'}",
        ]

    def sft(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_sft(*args, env={"SFT_GRID_RUNS": str(self.laptop)})

    def one_cell_on_b(self, sweep: str, *args: str) -> tuple[Path, str]:
        """A grid of one cell launched on site_b: its directory there and its training job's id."""
        launch = self.sft(*args, "max_steps=2", f"sweep_name={sweep}", *self.args("site_b"))
        assert launch.returncode == 0, launch.stdout + launch.stderr
        (cell,) = iter_cell_dirs(self.site_root.parent / "site_b" / "runs" / sweep)
        return cell, next(e["job_id"] for e in ledger(cell) if e["event"] == "job")

    def cli(self, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
        """`sft-grid <args>` run here, and the connections it opened to the site."""
        before = self.server.accepted()
        done = subprocess.run(
            [sys.executable, "-c", CLI, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "SFT_GRID_RUNS": str(self.laptop)},
        )
        return done, self.server.accepted() - before


def site_b_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": SITE_B_CONF}


def site_b_jobs(under: Path) -> list[str]:
    """The ids of the jobs the second cluster holds that run under `under` (each job's working directory is its
    grid's code snapshot, on the site: the cells' trainings, tokenizations and post-training alike)."""
    queue = subprocess.run(["squeue", "-h", "-o", "%A|%Z"], env=site_b_env(), capture_output=True, text=True).stdout
    return [row.split("|")[0] for row in queue.splitlines() if row.split("|")[-1].startswith(f"{under}/")]


def wait_done(cells: list[Path], deadline_s: float = 900) -> None:
    deadline = time.monotonic() + deadline_s
    while not all(state_of(c).state is State.COMPLETED for c in cells):
        states = {c.name: state_of(c).state.value for c in cells}
        assert time.monotonic() < deadline, f"not completed after {deadline_s} s: {states}"
        assert not any(s in ("failed", "cancelled") for s in states.values()), states
        time.sleep(1)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path):
    base = tmp_path_factory.mktemp("sites")
    # the second cluster (scripts/slurm_site_up.sh: idempotent, seconds when it is up), site_b's scheduler
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")], check=True, capture_output=True)
    hosts = {"site_a": {}, "site_b": {"SLURM_CONF": SITE_B_CONF}}
    server = sshd.start(base / "sshd", hosts, env={"SFT_GRID_CACHE": str(cache_root())})
    site_root, laptop = base / "site_a", base / "laptop"
    r = Remote(server, site_root, site_root / "runs", laptop, subprocess.CompletedProcess([], 0), 0)
    # the grid's jobs are on ci from the launch to the module's end: ci held shared for all of it
    with holding_cluster(alone=False), _stopping(server, r, base):
        before = server.accepted()
        r.launch = r.sft("-m", *TINY, "sweep_name=far", *r.args())
        r.launch_connections = server.accepted() - before
        assert r.launch.returncode == 0, r.launch.stdout + r.launch.stderr
        yield r


@contextmanager
def _stopping(server: sshd.Sshd, r: Remote, base: Path) -> Iterator[None]:
    """Afterwards: every job of the module's grids cancelled on either cluster, the sshd stopped."""
    try:
        yield
    finally:
        cancel_jobs_of(r.site_runs)
        b_ids = site_b_jobs(base / "site_b")
        if b_ids:
            subprocess.run(["scancel", *b_ids], env=site_b_env(), check=False, capture_output=True)
        server.stop()


def test_the_launch_ships_the_commit_once_over_one_connection(remote: Remote):
    assert remote.launch_connections == 1
    cells = list(iter_cell_dirs(remote.site_runs / "far"))
    assert len(cells) == 2
    (code_dir,) = [p for p in (remote.site_root / "code").iterdir() if not p.name.startswith(".")]
    assert (code_dir / MARKER).is_file() and (code_dir / "sft_grid" / "job" / "entries.py").is_file()
    for cell in cells:
        submitted = next(e for e in ledger(cell) if e["event"] == "submitted")
        assert submitted["code"]["snapshot"] == str(code_dir)
        assert str(code_dir / "sft_grid" / "in_venv") in (cell / "launch.sh").read_text()
    # the laptop keeps only the grid's record, the cells are on the site
    assert (remote.laptop / "far" / RECORD).is_file()
    assert not list(iter_cell_dirs(remote.laptop / "far"))
    # the site's output came back: its plan of two cells
    assert "2" in remote.launch.stdout + remote.launch.stderr


def test_status_results_logs_and_report_from_the_laptop_one_connection_each(remote: Remote):
    cells = list(iter_cell_dirs(remote.site_runs / "far"))
    wait_done(cells)
    status, connections = remote.cli("status", "far")
    assert status.returncode == 0, status.stderr
    assert connections == 1
    assert status.stdout.count("completed") >= 2, status.stdout
    assert f"grid far on site slurm_local (site_a:{remote.site_runs})" in status.stderr, status.stderr
    results, connections = remote.cli("results", "far", "--format", "csv")
    assert results.returncode == 0 and connections == 1, results.stderr
    assert all(c.name.rsplit("-", 1)[-1] in results.stdout for c in cells), results.stdout
    logs, connections = remote.cli("logs", "far", "tiny_qwen3", "-n", "5")
    assert logs.returncode == 0 and connections == 1, logs.stderr
    assert logs.stdout.strip()
    report, _ = remote.cli("report", "far", "--resamples", "10")
    assert report.returncode == 0, report.stderr
    page = remote.laptop / "far" / "report.html"
    assert page.is_file() and "<html" in page.read_text()[:2000].lower()


def test_nothing_of_sft_grid_is_left_running_on_the_site(remote: Remote):
    deadline = time.monotonic() + 60
    while remote.server.sessions():  # each command's control connection ends with it
        assert time.monotonic() < deadline, f"ssh sessions left on the site: {remote.server.sessions()}"
        time.sleep(0.2)
    left = list(Path(f"/tmp/sft_grid-ssh-{os.getuid()}").glob("*"))
    assert not left, left


def test_bad_input_is_refused_here_before_the_site_is_contacted(remote: Remote):
    before = remote.server.accepted()
    done = remote.sft("model=tiny_llama", "lr=-1", "sweep_name=bad", *remote.args())
    assert done.returncode != 0 and "lr" in done.stderr
    assert remote.server.accepted() == before
    assert not (remote.site_runs / "bad").exists() and not (remote.laptop / "bad").exists()


def test_an_unreachable_site_is_named_and_nothing_is_recorded(remote: Remote):
    done = remote.sft("model=tiny_llama", "sweep_name=nowhere", *remote.args(host="site_down"))
    assert done.returncode != 0
    assert "cannot reach site slurm_local" in done.stderr, done.stderr
    assert not (remote.laptop / "nowhere").exists() and not (remote.site_runs / "nowhere").exists()


def test_a_grid_on_the_second_cluster_runs_there_and_is_read_from_here(remote: Remote):
    """site_b's commands reach the second cluster (its SLURM_CONF, sent by its Host entry as a site's own
    /etc/slurm would be): the cell's job is that cluster's, never ci's, and status reads it back over ssh."""
    cell, job_id = remote.one_cell_on_b("on_b", "model=tiny_llama", "global_batch_size=4", "micro_batch_size=2")
    wait_done([cell])
    on_b = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "Cluster,JobName,State"],
        env=site_b_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert on_b.startswith("siteb|sft_grid-"), on_b  # (its job may still be ending: the cell's files said done)
    # the same id on ci, if it exists at all, is another job
    on_ci = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobName"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": "/etc/slurm/slurm.conf"},
    ).stdout
    assert on_b.split("|")[1] not in on_ci
    status, connections = remote.cli("status", "on_b")
    assert status.returncode == 0 and connections == 1, status.stderr
    assert "completed" in status.stdout, status.stdout


def test_cancel_from_here_stops_a_queued_cell_on_the_site(remote: Remote):
    cell, job_id = remote.one_cell_on_b("held_b", "model=tiny_qwen3", "+cluster.sbatch_extra.hold=true")
    cancel, connections = remote.cli("cancel", "held_b")
    assert cancel.returncode == 0 and connections == 1, cancel.stderr
    assert "1 cell(s) cancelled" in cancel.stdout, cancel.stdout
    assert state_of(cell).state is State.CANCELLED
    deadline = time.monotonic() + 60
    while subprocess.run(
        ["squeue", "-h", "-j", job_id], env=site_b_env(), capture_output=True, text=True
    ).stdout.strip():
        assert time.monotonic() < deadline, "the cancelled job is still in site_b's queue"
        time.sleep(0.2)


def test_a_dirty_checkout_is_refused_before_the_site_is_contacted(remote: Remote, tmp_path: Path):
    checkout = make_checkout(tmp_path / "checkout")
    conf = checkout / "sft_grid" / "conf" / "model" / "tiny_llama.yaml"
    conf.write_text(conf.read_text() + "# an edit not committed\n")
    env = {**os.environ, "PYTHONPATH": str(checkout), "SFT_GRID_RUNS": str(remote.laptop)}
    env.pop(SHIP_ENV, None)
    before = remote.server.accepted()
    argv = [sys.executable, "-m", "sft_grid", "model=tiny_llama", "sweep_name=dirty", *remote.args()]
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "conf/model/tiny_llama.yaml" in done.stderr, done.stderr
    assert remote.server.accepted() == before
    assert not (remote.site_runs / "dirty").exists() and not (remote.laptop / "dirty").exists()
