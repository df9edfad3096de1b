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
from pathlib import Path

import pytest

from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import REPO_ROOT

from .conftest import run_sft
from .helpers import cancel_jobs_of, ledger
from .test_sites_remote import SITE_B_CONF, site_b_jobs, wait_done

pytestmark = [pytest.mark.sites, pytest.mark.slurm]

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
