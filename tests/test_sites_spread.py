"""One grid across two real Slurm clusters on this machine: `ci` (slurm_local) and `siteb` (slurm_siteb,
scripts/slurm_site_up.sh; its clients told by SLURM_CONF). The 12-cell grid is the synthetic backend's (a simulator:
seeded loss curves through the real job, ledger and Slurm; seconds a cell), placed by the scheduler's own estimates;
its results equal the same grid's on one site (this machine's local executor), the site column aside.

A site that fails, on the real clusters: siteb's controller stopped for one look and back (its cells stay), stopped
long enough to be down (its cells move to ci, or, with nowhere else to go, wait and stay once it answers again), let
go by hand (its cells placed on ci and trained, or cancelled); the start estimates asked with the job's own request
(GPUs on ci held by other jobs: the estimate waits for them; siteb refuses GPUs: unknown, ranked last); two clones
launching one grid at once into one runs root (each cell placed once). Marker `sites` (the backend/Slurm set).

Every test that uses siteb is in one xdist group with the remote-site tests (`sites_remote`: one worker runs them in
order), because some stop its controller and the others start it (scripts/slurm_site_up.sh, outside the cluster's
lock); `whole_cluster` (the `ci` cluster alone, its own group) only where ci must be idle around this test's jobs."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sft_grid.core import gate
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import PACKAGE_CONF, REPO_ROOT
from sft_grid.core.schema import ClusterConf
from sft_grid.core.submission import SlurmRequest
from sft_grid.schedulers import slurm
from sft_grid.sites import facts
from sft_grid.sites.placement import Need, place

from .conftest import run_sft
from .helpers import cancel_jobs_of, ledger, wait_for
from .test_sites_remote import SITE_B_CONF, site_b_jobs, wait_done
from .test_snapshot import make_checkout

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


UP = ["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")]
TWO = ["-m", "+sweep=synthetic_delphi", "vars.model=delphi-3e18", "cluster=slurm_local"]  # 2 cells
FOUR = ["-m", "+sweep=synthetic_delphi", "vars.model=delphi-3e18,delphi-9e18", "cluster=slurm_local"]
QUICK = "siteb_quick"  # siteb, called down after 5 s of silence, one try a look (quick_conf)


def quick_conf(tmp_path: Path) -> dict[str, str]:
    """A config folder of the team's (SFT_GRID_CONF) with siteb's profile as `siteb_quick`: one sinfo a look, down
    after 5 s of silence (the shipped profile's defaults: 3 tries, 600 s)."""
    conf = tmp_path / "conf" / "cluster"
    conf.mkdir(parents=True)
    text = (PACKAGE_CONF / "cluster" / "slurm_siteb.yaml").read_text().replace("name: slurm_siteb", f"name: {QUICK}")
    (conf / f"{QUICK}.yaml").write_text(text + "site_answer_tries: 1\nsite_down_after_s: 5\n")
    return {"SFT_GRID_CONF": str(conf.parent)}


def _node() -> str:
    return _site_b("sinfo", "-h", "-N", "-o", "%N").split()[0]


def _stop_b() -> None:
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_down.sh"), "--controller"], check=True)


def _start_b_controller() -> None:
    """siteb's controller back, its queue as it was and its node still drained (slurm_site_up.sh would resume it)."""
    subprocess.run(["/usr/sbin/slurmctld", "-f", SITE_B_CONF], env=SITE_B, check=True, capture_output=True)

    def up() -> bool:
        ping = subprocess.run(["scontrol", "ping"], env=SITE_B, capture_output=True, text=True)
        return "UP" in ping.stdout

    wait_for(up, "siteb's controller to answer", deadline_s=60)


def _resume_b(node: str) -> None:
    """siteb's drained node back in service, once its controller knows it again (a restarted controller holds it
    UNKNOWN until its slurmd registers, and refuses to resume it meanwhile)."""
    wait_for(lambda: "UNKNOWN" not in _site_b("scontrol", "show", "node", node), "siteb's node to register")
    _site_b("scontrol", "update", f"nodename={node}", "state=resume")


def _queued_on_b(root: Path, grid: list[str], site: str, env: dict[str, str] | None = None) -> list[Path]:
    """The grid's cells queued on siteb (its node drained: they wait there), under `site`'s name."""
    run_sft(*grid, f"sites=[{site}]", f"runs_root={root}", check=True, env=env)
    cells = list(iter_cell_dirs(root / "synthetic_delphi"))
    kinds = [[e["event"] for e in ledger(c)] for c in cells]
    assert cells and all("job" in k and "running" not in k for k in kinds), kinds
    return cells


def _sites(cell: Path) -> list[str]:
    return [e["site"] for e in ledger(cell) if e["event"] == "submitted"]


def _cleanup(*roots: Path, node: str) -> None:
    subprocess.run(UP, check=False, capture_output=True)
    subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=resume"], env=SITE_B, check=False, capture_output=True
    )
    for root in roots:
        cancel_jobs_of(root)
        ids = site_b_jobs(root)
        if ids:
            subprocess.run(["scancel", *ids], env=SITE_B, check=False)


def _silent_for(root: Path, site: str, seconds: float) -> None:
    """Until the grid's record says `site` has been silent `seconds` (the down bound of its profile)."""
    since = facts.read_record(root / "synthetic_delphi")[site]["silent_since"]
    time.sleep(max(0.0, since + seconds - time.time()))


def test_a_controller_that_misses_answers_and_comes_back_keeps_its_cells(tmp_path: Path, tiny_assets: Path):
    """siteb's node drained, 2 cells queued there; its controller stopped; the next run of the grid asks it three times
    (the shipped profile), records the silence and moves nothing (not down before 600 s); the controller back, the run
    after ends the silence: the cells never left siteb, and train there once its node is back."""
    subprocess.run(UP, check=True, capture_output=True)
    root, node = tmp_path / "runs", _node()
    try:
        _site_b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        cells = _queued_on_b(root, TWO, "slurm_siteb")
        jobs = _first_ids(cells)
        _stop_b()
        silent = run_sft(*TWO, SITES, f"runs_root={root}", check=True)
        assert "slurm_siteb has not answered" in silent.stdout and "not down until 600 s" in silent.stdout, (
            silent.stdout
        )
        record = facts.read_record(root / "synthetic_delphi")["slurm_siteb"]
        assert record["looks"] == 1 and "3 tries" in record["error"], record
        for cell in cells:
            assert _sites(cell) == ["slurm_siteb"] and not (cell / "move.json").exists(), ledger(cell)
            assert not list(cell.glob("gate.*"))
        _start_b_controller()
        back = run_sft(*TWO, SITES, f"runs_root={root}", check=True)
        assert "has not answered" not in back.stdout, back.stdout
        assert "slurm_siteb" not in facts.read_record(root / "synthetic_delphi")
        _resume_b(node)
        wait_done(cells, deadline_s=600)
        for cell, job in zip(cells, jobs, strict=True):
            assert _sites(cell) == ["slurm_siteb"] and [e["event"] for e in ledger(cell)].count("running") == 1
            assert gate.read(cell, gate.key("slurm_siteb", job)) == gate.STARTED  # its first job trained it
    finally:
        _cleanup(root, node=node)


def test_a_move_off_a_down_site_is_undone_when_it_answers_before_the_cell_is_queued_elsewhere(
    tmp_path: Path, tiny_assets: Path
):
    """A grid of siteb alone: its controller silent past its down bound, the run moves its 2 cells as far as it can
    (gates claimed, moves confirmed) but no other site can take them: they wait, named, and the grid is not refused.
    The controller back before they are queued elsewhere: the next run undoes the moves (each job held, its gate
    removed, released) and the cells stay; they train there, once."""
    subprocess.run(UP, check=True, capture_output=True)
    root, node, env = tmp_path / "runs", _node(), quick_conf(tmp_path)
    only_b = f"sites=[{QUICK}]"
    try:
        _site_b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        cells = _queued_on_b(root, TWO, QUICK, env)
        jobs = _first_ids(cells)
        _stop_b()
        first = run_sft(*TWO, only_b, f"runs_root={root}", check=True, env=env)  # one silent look: not down
        assert not any((c / "move.json").exists() for c in cells), first.stdout
        _silent_for(root, QUICK, 5)
        down = run_sft(*TWO, only_b, f"runs_root={root}", check=True, env=env)
        assert down.stdout.count("waiting (it leaves siteb_quick): no site of the grid can take it now") == 2, (
            down.stdout
        )
        for cell, job in zip(cells, jobs, strict=True):
            assert json.loads((cell / "move.json").read_text())["step"] == "confirmed"
            assert gate.read(cell, gate.key(QUICK, job)) == gate.MOVED
        _start_b_controller()
        back = run_sft(*TWO, only_b, f"runs_root={root}", check=True, env=env)
        assert "waiting" not in back.stdout, back.stdout
        for cell, job in zip(cells, jobs, strict=True):
            assert not (cell / "move.json").exists() and gate.read(cell, gate.key(QUICK, job)) is None
            assert _sites(cell) == [QUICK]
        assert "JobHeldAdmin" not in _site_b("squeue", "-h", "-o", "%r")  # every hold released
        _resume_b(node)
        wait_done(cells, deadline_s=600)
        for cell, job in zip(cells, jobs, strict=True):
            assert [e["event"] for e in ledger(cell)].count("running") == 1
            assert gate.read(cell, gate.key(QUICK, job)) == gate.STARTED
    finally:
        _cleanup(root, node=node)


def test_a_stopped_sites_queued_cells_move_once_and_its_jobs_train_nothing_later(tmp_path: Path, tiny_assets: Path):
    """siteb's only node drained, 4 cells queued there; its controller stopped; the first run after records the
    silence and moves nothing; once it has lasted the profile's down bound (5 s) the next moves them to ci (each: gate
    claimed, confirmed by the silence, queued on ci); siteb restarted, its old jobs start and end at their gates:
    every cell trained exactly once, on ci."""
    subprocess.run(UP, check=True, capture_output=True)
    root, node, env = tmp_path / "runs", _node(), quick_conf(tmp_path)
    both = f"sites=[slurm_local,{QUICK}]"
    try:
        _site_b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        cells = _queued_on_b(root, FOUR, QUICK, env)
        assert len(cells) == 4
        _stop_b()
        silent = run_sft(*FOUR, both, f"runs_root={root}", check=True, env=env)  # one look: silent, not down
        assert all(_sites(c) == [QUICK] for c in cells), silent.stdout
        _silent_for(root, QUICK, 5)
        first = run_sft(*FOUR, both, f"runs_root={root}", check=True, env=env)  # down: the moves, queued on ci
        assert "on site slurm_local" in first.stdout, first.stdout
        for cell in cells:
            assert _sites(cell) == [QUICK, "slurm_local"], (cell.name, _sites(cell))
            assert (cell / "move.json").is_file()  # confirmed; ended by the next observation
            assert (
                next(e for e in ledger(cell) if e["event"] == "submitted" and e["site"] == "slurm_local")[
                    "expected_start_s"
                ]
                != "unknown"
            )
        wait_done(cells, deadline_s=900)
        second = run_sft(*FOUR, both, f"runs_root={root}", check=True, env=env)  # refresh 2: nothing moves again
        assert "4 completed - nothing to run" in second.stdout, second.stdout
        assert not any((c / "move.json").exists() for c in cells)
        # siteb back: its four old jobs start and end at their gates, training nothing (their post-training job there,
        # after them, is cancelled by Slurm: they failed)
        subprocess.run(UP, check=True, capture_output=True)  # its controller back, its drained node resumed
        _ended_at_gates(cells, QUICK)
    finally:
        _cleanup(root, node=node)


def _ended_at_gates(cells: list[Path], site: str) -> None:
    """Each cell's first job (on siteb) started there and ended at its gate: "moved", nothing trained by it."""
    old = _b_ids(cells)
    t0 = time.monotonic()
    while not _ended_on_b(old):  # each old job started there and ended (at its gate)
        assert time.monotonic() - t0 < 600, _site_b("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(old))
        time.sleep(1)
    assert all(gate.read(c, gate.key(site, j)) == gate.MOVED for c, j in zip(cells, _first_ids(cells), strict=True))
    ended = _site_b("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(sorted(old)))
    assert "COMPLETED" not in ended, ended  # each failed at its gate: its post-training job there never ran
    for cell in cells:
        # nothing of the old jobs in the ledger but their ids (no running, no completed, no post stage there)
        found = [e for e in ledger(cell) if e.get("job_id") in old and e["event"] != "job" and not e.get("let_go")]
        assert not found, found


def test_a_site_let_go_has_its_cells_trained_on_the_other_cluster_or_cancelled(tmp_path: Path, tiny_assets: Path):
    """siteb's node drained, 2 cells of two grids (two runs roots) queued there, its controller stopped: `sft-grid
    release` at once (no waiting for its down bound), each cell named. The first grid's next run places its cells on
    ci, where they train; the second's (--cancel) records them cancelled and queues nothing. siteb back: the old
    jobs start and end at their gates, training nothing."""
    subprocess.run(UP, check=True, capture_output=True)
    moved, cancelled, node = tmp_path / "moved", tmp_path / "cancelled", _node()
    try:
        _site_b("scontrol", "update", f"nodename={node}", "state=drain", "reason=sft_grid-test")
        to_move = _queued_on_b(moved, TWO, "slurm_siteb")
        to_cancel = _queued_on_b(cancelled, TWO, "slurm_siteb")
        _stop_b()
        released = run_sft(
            "release", "synthetic_delphi", "--site", "slurm_siteb", "--runs-root", str(moved), check=True
        )
        assert released.stdout.count(": let go: its site slurm_siteb was let go") == 2, released.stdout
        assert "site slurm_siteb let go: 2 cell(s) placed on another site by the next run" in released.stdout
        gone = run_sft(
            "release",
            "synthetic_delphi",
            "--site",
            "slurm_siteb",
            "--cancel",
            "--runs-root",
            str(cancelled),
            check=True,
        )
        assert "2 cell(s) cancelled" in gone.stdout, gone.stdout
        assert len(facts.read_record(moved / "synthetic_delphi")["slurm_siteb"]["let_go"]["cells"]) == 2
        run_sft(*TWO, SITES, f"runs_root={moved}", check=True)
        again = run_sft(*TWO, SITES, f"runs_root={cancelled}", check=True)
        assert "2 cancelled" in again.stdout, again.stdout
        for cell in to_move:
            assert _sites(cell) == ["slurm_siteb", "slurm_local"], ledger(cell)
            history = ledger(cell)
            # the let-go in its ledger (the site named), then its submission on ci
            let = next(i for i, e in enumerate(history) if e["event"] == "planned" and e.get("let_go") == "slurm_siteb")
            assert [e["event"] for e in history[let:]].count("submitted") == 1, history
        for cell in to_cancel:
            assert _sites(cell) == ["slurm_siteb"] and ledger(cell)[-1]["event"] == "cancelled", ledger(cell)
        wait_done(to_move, deadline_s=600)
        subprocess.run(UP, check=True, capture_output=True)  # siteb back, its node resumed
        _ended_at_gates([*to_move, *to_cancel], "slurm_siteb")
        for cell in to_move:
            assert [e["event"] for e in ledger(cell)].count("running") == 1
        for cell in to_cancel:
            assert "running" not in [e["event"] for e in ledger(cell)]
    finally:
        _cleanup(moved, cancelled, node=node)


def _sbatch_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`sbatch` on PATH logs each argv (and the SLURM_CONF it is given) before it runs the real one."""
    log = tmp_path / "argv.log"
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "${{SLURM_CONF:-ci}} $*" >> {log}\nexec /usr/bin/sbatch "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    return log


def _queue() -> list[str]:
    """ci's queue, a line a job: id, state, partition, nodes, time limit, reason or nodes."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T %P %D %l %R"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


GPU = ClusterConf(
    name="ci_gpu",
    executor="slurm",
    partition="debug",
    cpus_per_node=1,
    gpus_per_node=4,
    gpu_type="H100",
    gpu_directive="gres",
)
GPU_NEED = Need(cell="c0", nodes=1, minutes=30, gpu_type="H100")


@pytest.mark.whole_cluster  # ci's GPUs held by this test's jobs: an idle ci expected around them
def test_the_start_is_estimated_for_the_cells_own_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two jobs hold all of ci's GPUs (gpu:4 on each node) for 5 minutes. A cell that asks for 4 GPUs a node is
    asked about with its own request (the argv sbatch got: `--gres=gpu:4`, partition, nodes, time), and ci expects it
    after them, minutes from now; the bare (nodes, time) the estimate used to be asked for would start at once."""
    log = _sbatch_logged(tmp_path, monkeypatch)
    # the premise, made true rather than assumed: nothing else on ci (the test before may leave a job ending, its
    # post-training stage or a requeued run; a job left for an hour would make every estimate below an hour)
    wait_for(lambda: not _queue(), "ci's queue to empty before this test's jobs", 300, 1)
    blockers = [
        subprocess.run(
            [
                "/usr/bin/sbatch",
                "--parsable",
                "-N1",
                "-c1",
                "--gres=gpu:4",
                "--time=5",
                "-o",
                "/dev/null",
                "--wrap=sleep 300",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    try:

        def running() -> bool:
            queue = subprocess.run(
                ["squeue", "-h", "-j", ",".join(blockers), "-o", "%T"], capture_output=True, text=True
            )
            return queue.stdout.split().count("RUNNING") == 2

        wait_for(running, "the two jobs that hold ci's GPUs to run")
        (ci,) = facts.observe({"ci_gpu": GPU}, [GPU_NEED])
        (argv,) = log.read_text().splitlines()
        assert {"--test-only", "--gres=gpu:4", "--partition=debug", "--nodes=1", "--time=30"} <= set(argv.split())
        assert ci.starts[(1, 30)] > 120, ci  # after the jobs that hold the GPUs
        bare = SlurmRequest((("cpus_per_task", 1), ("nodes", 1), ("partition", "debug"), ("time", 30)), 0)
        # what was asked before: a job without GPUs starts at once
        assert (slurm.test_only(bare) or 0.0) < 60, f"ci's queue: {_queue()}"
    finally:
        subprocess.run(["scancel", *blockers], check=False)


def test_a_site_that_refuses_the_request_is_unknown_and_ranks_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The same GPU cell asked of siteb (no GPUs: it refuses `--gres=gpu:4`) and of ci: siteb's answer is no
    estimate, unknown, and the cell goes to ci though siteb is named first (before, a refused request counted as
    starting at once, and the site that could not run it won)."""
    subprocess.run(UP, check=True, capture_output=True)
    log = _sbatch_logged(tmp_path, monkeypatch)
    b = replace(GPU, name="siteb_gpu", client_env={"SLURM_CONF": SITE_B_CONF})
    seen = facts.observe({"siteb_gpu": b, "ci_gpu": GPU}, [GPU_NEED])
    by = {f.name: f for f in seen}
    assert any(a.startswith(SITE_B_CONF) and "--gres=gpu:4" in a for a in log.read_text().splitlines())
    assert by["siteb_gpu"].reachable and not by["siteb_gpu"].starts  # it answered sinfo, and refused the request
    assert (1, 30) in by["ci_gpu"].starts
    placed = place([GPU_NEED], seen)
    assert placed.sites == {"c0": "ci_gpu"} and placed.starts["c0"] == by["ci_gpu"].starts[(1, 30)]
    assert place([GPU_NEED], [by["siteb_gpu"]]).starts == {"c0": None}  # unknown only: placed, its start "unknown"


def test_two_clones_launching_one_grid_at_once_place_each_cell_once(tmp_path: Path, tiny_assets: Path):
    """Two checkouts of this project (as two people's clones), each launching the same 4-cell grid across both
    clusters into one runs root at the same moment: the record (each cell's ledger) and the decision are made under
    the grid's lock both see, so each cell is submitted once, on one site, and trains once."""
    subprocess.run(UP, check=True, capture_output=True)
    root = tmp_path / "runs"
    clones = [make_checkout(tmp_path / f"clone{i}") for i in (1, 2)]
    try:
        launches = [
            subprocess.Popen(
                [sys.executable, "-m", "sft_grid", *FOUR, SITES, f"runs_root={root}"],
                cwd=clone,
                env={**os.environ, "PYTHONPATH": str(clone)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for clone in clones
        ]
        outputs = [p.communicate(timeout=600)[0] for p in launches]
        assert all(p.returncode == 0 for p in launches), outputs
        cells = list(iter_cell_dirs(root / "synthetic_delphi"))
        assert len(cells) == 4
        for cell in cells:
            assert len(_sites(cell)) == 1, (cell.name, ledger(cell))  # submitted once, on one site
        # one decided and queued them; the other, waiting for the grid's lock, found them queued
        assert sorted("4 cell(s): 4 to run" in out for out in outputs) == [False, True], outputs
        wait_done(cells, deadline_s=600)
        for cell in cells:
            assert [e["event"] for e in ledger(cell)].count("running") == 1
    finally:
        _cleanup(root, node=_node())


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
