"""A grid on a remote site, launched and read from here over a real sshd (issue 25, item 1; sft_grid/sites/remote.py).

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
from dataclasses import dataclass
from pathlib import Path

import pytest

from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import cache_root
from sft_grid.core.state import State, state_of
from sft_grid.sites.remote import RECORD
from sft_grid.sites.snapshot import MARKER

from . import sshd
from .conftest import run_sft
from .helpers import cancel_jobs_of, ledger

pytestmark = [pytest.mark.slurm, pytest.mark.backend, pytest.mark.sites, pytest.mark.xdist_group("sites_remote")]

CLI = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"  # sft-grid, from this tree
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
        return [
            "cluster=slurm_local",
            f"cluster.remote.host={host}",
            f"cluster.remote.root={self.site_root}",
            f"cluster.remote.ssh_config={self.server.config}",
            f"cluster.remote.python={sys.executable}",
            f"runs_root={self.site_runs}",
        ]

    def sft(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_sft(*args, env={"SFT_GRID_RUNS": str(self.laptop)})

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
    server = sshd.start(base / "sshd", env={"SFT_GRID_CACHE": str(cache_root())})
    site_root, laptop = base / "site_a", base / "laptop"
    r = Remote(server, site_root, site_root / "runs", laptop, subprocess.CompletedProcess([], 0), 0)
    try:
        before = server.accepted()
        r.launch = r.sft("-m", *TINY, "sweep_name=far", *r.args())
        r.launch_connections = server.accepted() - before
        assert r.launch.returncode == 0, r.launch.stdout + r.launch.stderr
        yield r
    finally:
        cancel_jobs_of(r.site_runs)
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
