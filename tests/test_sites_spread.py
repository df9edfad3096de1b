"""One grid across two real Slurm clusters on this machine (issue 25, items 3 and 5): `ci` (slurm_local) and
`siteb` (slurm_siteb, scripts/slurm_site_up.sh; its clients told by SLURM_CONF). The 12-cell grid is the synthetic
backend's (a simulator: seeded loss curves through the real job, ledger and Slurm; seconds a cell), placed by the
scheduler's own estimates; its results equal the same grid's on one site (this machine's local executor), the site
column aside. Marker `sites` (the backend/Slurm set)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sft_grid.core import gate
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import REPO_ROOT

from .conftest import run_sft
from .helpers import cancel_jobs_of, ledger
from .test_sites_remote import SITE_B_CONF, site_b_jobs, wait_done

# one worker runs these and the remote-site tests one after the other: one of them stops siteb's controller
pytestmark = [pytest.mark.sites, pytest.mark.slurm, pytest.mark.xdist_group("sites_remote")]
SITE_B = {"SLURM_CONF": SITE_B_CONF, "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}

# 6 sizes x 2 recipes of sweeps/synthetic_delphi.yaml
TWELVE = [
    "-m",
    "+sweep=synthetic_delphi",
    "vars.model=delphi-3e18,delphi-9e18,delphi-2e19,delphi-3e19,delphi-9e19,delphi-2e20",
]
SITES = "sites=[slurm_local,slurm_siteb]"


def _cli(*args: str) -> str:
    code = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _csv(text: str, drop: str = "site") -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k != drop} for row in csv.DictReader(io.StringIO(text))]


def test_a_grid_spread_over_two_clusters_trains_each_cell_once_and_equals_one_site(tmp_path: Path, tiny_assets: Path):
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")], check=True, capture_output=True)
    spread, one = tmp_path / "spread", tmp_path / "one"
    try:
        launch = run_sft(*TWELVE, "cluster=slurm_local", SITES, f"runs_root={spread}", check=True)
        assert "on site slurm_local" in launch.stdout and "on site slurm_siteb" in launch.stdout, launch.stdout
        cells = list(iter_cell_dirs(spread / "synthetic_delphi"))
        assert len(cells) == 12
        wait_done(cells, deadline_s=900)
        sites = {}
        for cell in cells:
            submitted = [e for e in ledger(cell) if e["event"] == "submitted"]
            trained = [e for e in ledger(cell) if e["event"] == "running"]
            assert len(submitted) == 1 and len(trained) == 1, (cell.name, submitted, trained)  # exactly once
            sites[cell.name] = submitted[0]["site"]
            want = {"slurm_siteb": {"SLURM_CONF": SITE_B_CONF}, "slurm_local": {}}[submitted[0]["site"]]
            assert submitted[0]["slurm_env"] == want
        assert set(sites.values()) == {"slurm_local", "slurm_siteb"}, sites
        # the siteb cells' jobs were siteb's: its accounting knows them by the job ids their ledgers record
        b_ids = {e["job_id"].split("_")[0] for c in cells for e in ledger(c) if e["event"] == "job"}
        known_b = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID", "--starttime=now-1days"],
            env={"SLURM_CONF": SITE_B_CONF, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        ).stdout
        assert any(i in known_b for i in b_ids)
        status = _cli("status", "synthetic_delphi", "--runs-root", str(spread))
        assert "site" in status.splitlines()[0] and status.count("slurm_siteb") == list(sites.values()).count(
            "slurm_siteb"
        ), status
        # the same grid on one site: this machine (the local executor); the results, the site column aside, equal
        run_sft(*TWELVE, "cluster=local", f"runs_root={one}", check=True)
        spread_csv = _cli("results", "synthetic_delphi", "--runs-root", str(spread), "--format", "csv")
        one_csv = _cli("results", "synthetic_delphi", "--runs-root", str(one), "--format", "csv")
        assert "site" in spread_csv.splitlines()[0] and "site" not in one_csv.splitlines()[0]
        strip = ("gpu_hours",)  # wall time differs; everything a cell trained is the same
        a = [{k: v for k, v in r.items() if k not in strip} for r in _csv(spread_csv)]
        b = [{k: v for k, v in r.items() if k not in strip} for r in _csv(one_csv)]
        assert sorted(a, key=lambda r: r["cell"]) == sorted(b, key=lambda r: r["cell"])
        # once more: every cell completed, nothing queued again on either site
        again = run_sft(*TWELVE, "cluster=slurm_local", SITES, f"runs_root={spread}", check=True)
        assert "12 completed - nothing to run" in again.stdout, again.stdout
    finally:
        cancel_jobs_of(spread)
        ids = site_b_jobs(spread)
        if ids:
            subprocess.run(["scancel", *ids], env={"SLURM_CONF": SITE_B_CONF, "PATH": "/usr/bin:/bin"}, check=False)


def _site_b(*argv: str) -> str:
    return subprocess.run(list(argv), env=SITE_B, capture_output=True, text=True, check=True).stdout


def test_a_stopped_sites_queued_cells_move_once_and_its_jobs_train_nothing_later(tmp_path: Path, tiny_assets: Path):
    """siteb's only node drained, 4 cells queued there; its controller stopped; the next invocation of the grid
    command moves them to ci (each: gate claimed, confirmed by the silence, queued on ci); siteb restarted, its old
    jobs start and end at their gates: every cell trained exactly once, on ci."""
    up = ["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")]
    subprocess.run(up, check=True, capture_output=True)
    root = tmp_path / "runs"
    four = ["-m", "+sweep=synthetic_delphi", "vars.model=delphi-3e18,delphi-9e18", "cluster=slurm_local"]
    node = _site_b("sinfo", "-h", "-N", "-o", "%N").split()[0]
    try:
        _site_b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        run_sft(*four, "sites=[slurm_siteb]", f"runs_root={root}", check=True)
        cells = list(iter_cell_dirs(root / "synthetic_delphi"))
        kinds = [[e["event"] for e in ledger(c)] for c in cells]
        assert len(cells) == 4 and all("job" in k and "running" not in k for k in kinds), kinds
        subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_down.sh"), "--controller"], check=True)
        first = run_sft(*four, SITES, f"runs_root={root}", check=True)  # refresh 1: the moves, queued on ci
        assert "on site slurm_local" in first.stdout, first.stdout
        for cell in cells:
            sites = [e["site"] for e in ledger(cell) if e["event"] == "submitted"]
            assert sites == ["slurm_siteb", "slurm_local"], (cell.name, sites)
            assert (cell / "move.json").is_file()  # confirmed; ended by the next observation
        wait_done(cells, deadline_s=900)
        second = run_sft(*four, SITES, f"runs_root={root}", check=True)  # refresh 2: nothing moves again
        assert "4 completed - nothing to run" in second.stdout, second.stdout
        assert not any((c / "move.json").exists() for c in cells)
        # siteb back: its four old jobs start and end at their gates, training nothing (their post-training job there,
        # after them, is cancelled by Slurm: they failed)
        subprocess.run(up, check=True, capture_output=True)  # its controller back, its drained node resumed
        old = _b_ids(cells)
        t0 = time.monotonic()
        while not _ended_on_b(old):  # each old job started there and ended (at its gate)
            assert time.monotonic() - t0 < 600, _site_b(
                "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(old)
            )
            time.sleep(1)
        assert len(old) == 4 and all(
            gate.read(c, gate.key("slurm_siteb", j)) == gate.MOVED
            for c, j in zip(cells, _first_ids(cells), strict=True)
        )
        ended = _site_b("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(sorted(old)))
        assert "COMPLETED" not in ended, ended  # each failed at its gate: its post-training job there never ran
        for cell in cells:
            assert [e["event"] for e in ledger(cell)].count("running") == 1, ledger(cell)
            # nothing of the old jobs in the ledger but their ids (no running, no completed, no post stage there)
            assert not [e for e in ledger(cell) if e.get("job_id") in old and e["event"] != "job"], ledger(cell)
    finally:
        subprocess.run(up, check=False, capture_output=True)
        subprocess.run(
            ["scontrol", "update", f"nodename={node}", "state=resume"], env=SITE_B, check=False, capture_output=True
        )
        cancel_jobs_of(root)
        ids = site_b_jobs(root)
        if ids:
            subprocess.run(["scancel", *ids], env=SITE_B, check=False)


def _first_ids(cells: list[Path]) -> list[str]:
    """The job ids of the cells' first submissions (on siteb)."""
    return [next(e["job_id"] for e in ledger(c) if e["event"] == "job") for c in cells]


def _b_ids(cells: list[Path]) -> set[str]:
    return set(_first_ids(cells))


def _ended_on_b(ids: set[str]) -> bool:
    try:
        out = _site_b("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(sorted(ids)))
    except subprocess.CalledProcessError:
        return False  # the controller is still coming back
    states = dict(line.split("|")[:2] for line in out.splitlines() if "|" in line)
    return len(states) >= len(ids) and all(s.split()[0] in ("FAILED", "COMPLETED") for s in states.values())
