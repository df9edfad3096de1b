"""The stages a cell waits for (staging, model prep, tokenize once), in a grid spread over several sites: each is
queued on the site of the cells that wait for it, and every Slurm dependency names a job of its own cluster.

Fast: the plan of a grid placed over two sites (facts built here, as `observe` would see two idle clusters),
from the flow's own `plan`. The real run on the two local clusters is the last test (markers `slurm`, `backend`,
`sites`)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from sft_grid.analysis.view import read_view
from sft_grid.checks.preflight import check_prepared, check_staged, check_tokenized
from sft_grid.cli.present import plan_lines
from sft_grid.core import events, gate
from sft_grid.core.cellfiles import Check
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures import FailureClass, RemedyKind, classify
from sft_grid.core.failures.cell import missing_input
from sft_grid.core.layout import SUBMITIT_DIR, iter_cell_dirs
from sft_grid.core.paths import REPO_ROOT
from sft_grid.core.state import JobState, SchedulerView
from sft_grid.core.submission import Role, SlurmJob, SubmissionPlan
from sft_grid.core.tokenized import MARKER, tokenized_complete
from sft_grid.grid import flow
from sft_grid.grid.jobs import build
from sft_grid.planning.cells import Cell, dirs_of
from sft_grid.planning.inputs import prep_complete, preps
from sft_grid.sites.placement import SiteFacts, profiles
from sft_grid.stages import once, tokenize
from sft_grid.stages.staging import StagingPlan
from sft_grid.stages.staging.in_job import StageWork

from .conftest import run_sft
from .helpers import cancel_jobs_of
from .test_sites_remote import site_b_jobs, wait_done

SITES = "sites=[slurm_local,slurm_siteb]"


def spread_plan(cells: Sequence[Cell], jobs: Sequence[JobState] = ()) -> flow.GridPlan:
    """The flow's plan of these cells over the two local sites (of a grid without sites: on its cluster), both idle
    (each one node), as a dry run plans it; `jobs`: what the scheduler says of the jobs the ledgers name."""
    dirs = dirs_of(cells)
    sites, problems = profiles(cells)
    assert not problems
    inputs = flow.Inputs(
        cells=tuple(cells),
        dirs=tuple(dirs),
        dry_run=True,
        staging=StagingPlan(),
        preps=MappingProxyType({p: tuple(users) for p, users in preps(cells).items()}),
        tokens=MappingProxyType(tokenize.plan(cells)),
        sites=MappingProxyType(sites),
    )
    stage_dirs = [p.dir for p in inputs.preps] + sorted({t.dir for t in inputs.tokens.values()})
    facts = tuple(SiteFacts(name=n, cluster=c, nodes=1) for n, c in sites.items())
    view = replace(read_view(dirs, stage_dirs, ask=False), scheduler=SchedulerView.of(jobs) if jobs else None)
    observed = flow.Observed(view=view, max_array_size=1001, checkout={}, sites=facts)
    return flow.plan(inputs, observed)


def where(job: SlurmJob) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The cluster a job goes to: its site and its Slurm client environment."""
    return job.request.site, job.request.client_env


def assert_dependencies_stay_on_their_cluster(plan: SubmissionPlan) -> None:
    by_name = {j.name: j for j in plan.slurm}
    for job in plan.slurm:
        if job.dependency is not None and job.dependency.planned:
            assert where(by_name[job.dependency.job]) == where(job), (job.name, job.role, job.dependency)


def test_a_tokenization_shared_by_cells_on_two_sites_is_queued_on_each_and_waited_for_there(make_cells):
    cells = make_cells(*[["model=tiny_llama", f"lr={lr}", "max_steps=2", SITES] for lr in ("1e-4", "2e-4")])
    grid = spread_plan(cells)
    placed = {d.cell.name: d.cell.spec.cluster.name for d in grid.decisions}
    assert sorted(placed.values()) == ["slurm_local", "slurm_siteb"], placed  # one cell a site
    assert len({t.dir for t in grid.tokenized.values()}) == 1  # the two cells share one tokenized dataset
    assert_dependencies_stay_on_their_cluster(grid.submission)
    tokenizing = [j for j in grid.submission.slurm if j.role is Role.TOKENIZE]
    assert sorted(j.request.site for j in tokenizing) == ["slurm_local", "slurm_siteb"]
    assert len({j.targets for j in tokenizing}) == 1  # the same dataset, built by whichever job comes first
    for train in [j for j in grid.submission.slurm if j.role is Role.TRAIN]:
        (tok,) = [j for j in tokenizing if train.dependency and j.name == train.dependency.job]
        assert where(tok) == where(train)
    # the dry run shows each stage job on its site
    lines = "\n".join(plan_lines(grid.submission))
    assert lines.count("tokenize once, 1 job, on site slurm_local") == 1, lines
    assert lines.count("tokenize once, 1 job, on site slurm_siteb") == 1, lines


def test_each_sites_stage_job_runs_a_script_with_its_own_clusters_environment(make_cells, tmp_path, monkeypatch):
    """The tokenize job that each site queues for one shared dataset runs the script written for its own site: siteb's
    has siteb's environment (its Slurm config, as its profile's `env` sets it), ci's has not."""
    cells = make_cells(*[["model=tiny_llama", f"lr={lr}", "max_steps=2", SITES] for lr in ("1e-4", "2e-4")])
    grid = spread_plan(cells)
    (tok_dir,) = {t.dir for t in grid.tokenized.values()}
    (files,) = [f.files for f in grid.submission.scripts if f.dir == tok_dir]
    local, siteb = (str(files[once.site_script(tokenize.SCRIPT, s)]) for s in ("slurm_local", "slurm_siteb"))
    assert "export SLURM_CONF=/etc/slurm-siteb/slurm.conf" in siteb, siteb
    assert "/etc/slurm-siteb/slurm.conf" not in local, local
    assert tokenize.SCRIPT in files  # the one a person runs by hand (the first cell's)
    # a job picks its site's own by the site its sbatch names (core/gate.py SITE_ENV), else the common one
    for name, text in files.items():
        if name.endswith(".sh"):
            (tmp_path / name).write_text(str(text))
    monkeypatch.setenv(gate.SITE_ENV, "slurm_siteb")
    assert once.script_for(tmp_path, tokenize.SCRIPT).read_text() == siteb
    monkeypatch.setenv(gate.SITE_ENV, "a_site_with_no_script")
    assert once.script_for(tmp_path, tokenize.SCRIPT).name == tokenize.SCRIPT
    monkeypatch.delenv(gate.SITE_ENV)
    assert once.script_for(tmp_path, tokenize.SCRIPT).name == tokenize.SCRIPT


def test_each_site_chains_its_own_staging_prep_and_tokenization(make_cells, tmp_path):
    """A Delphi model (a prep) whose Hub inputs a staging job fetches: each site queues staging -> prep ->
    tokenize on its own cluster, and its cell waits for the last of them there."""
    cells = make_cells(*[["model=tiny_delphi", f"lr={lr}", "max_steps=2", SITES] for lr in ("1e-4", "2e-4")])
    grid = spread_plan(cells)
    # the staging job as a site that stages on a transfer partition needs it: the grid's own cluster (the cells'
    # before their placement), every cell waiting for it
    work = StageWork(
        dir=tmp_path / "runs" / "_staging" / "abc",
        pins=(),
        cells=frozenset(d.dir for d in grid.decisions),
        cluster=cells[0].spec.cluster,
    )
    plan = build(grid.decisions, {}, None, 1001, staging=work, tokenized=grid.tokenized)
    assert_dependencies_stay_on_their_cluster(plan)
    by_name = {j.name: j for j in plan.slurm}
    trains = [j for j in plan.slurm if j.role is Role.TRAIN]
    assert sorted(j.request.site for j in trains) == ["slurm_local", "slurm_siteb"]
    for train in trains:
        chain = []
        job: SlurmJob | None = train
        while job is not None and job.dependency is not None:
            job = by_name[job.dependency.job]
            chain.append((job.role, job.request.site))
        site = train.request.site
        assert chain == [(Role.TOKENIZE, site), (Role.PREP, site), (Role.STAGE, site)], chain
    # each prep wait a cell's ledger records names its own site's prep job
    assert {w.job.job for w in plan.waits} == {j.name for j in plan.slurm if j.role is Role.PREP}
    for wait in plan.waits:
        (train,) = [j for j in trains if wait.cell_dir in j.targets]
        assert by_name[wait.job.job].request.site == train.request.site
    # the dry run's plan: each of them once on each site
    lines = plan_lines(plan)
    for site in ("slurm_local", "slurm_siteb"):
        for what in ("staging of the Hub inputs", "model prep", "tokenize once"):
            assert len([x for x in lines if f": {what}, 1 job" in x and x.endswith(f"on site {site}")]) == 1, lines


def test_a_tokenization_already_built_is_queued_on_no_site(make_cells):
    """The sites share the runs root's file system: a tokenized dataset complete there is loaded, not built."""
    cells = make_cells(*[["model=tiny_llama", f"lr={lr}", "max_steps=2", SITES] for lr in ("1e-4", "2e-4")])
    (tok,) = {t.dir: t for t in tokenize.plan(cells).values()}.values()
    tok.dir.mkdir(parents=True)
    (tok.dir / MARKER).write_text(json.dumps({"key": tok.data.key}) + "\n")
    grid = spread_plan(cells)
    assert {d.cell.spec.cluster.name for d in grid.decisions} == {"slurm_local", "slurm_siteb"}
    assert not [j for j in grid.submission.slurm if j.role is Role.TOKENIZE]
    assert all(j.dependency is None for j in grid.submission.slurm if j.role is Role.TRAIN)
    assert [t.dir for t in grid.tokenized.values()] == [tok.dir, tok.dir]  # each cell loads it


def test_a_job_queued_before_is_waited_for_in_a_grid_of_one_cluster_only(make_cells):
    """An earlier invocation's tokenize job, still queued: a grid of one cluster waits for it (the scheduler's job of
    the recorded id and name); a grid across sites queues a job of its own on each site (the ledger does not say
    which cluster's job it is); a job of another name under that id is another cluster's, never waited for."""
    variants = [["model=tiny_llama", f"lr={lr}", "max_steps=2", "cluster=slurm_local"] for lr in ("1e-4", "2e-4")]
    (tok,) = {t.dir: t for t in tokenize.plan(make_cells(*variants)).values()}.values()
    tok.dir.mkdir(parents=True)
    events.append(tok.dir, Event.here(Kind.SUBMITTED, executor="slurm", array="sft_grid-0123456789ab", index=0))
    events.append(tok.dir, Event(Kind.JOB, job_id="55_0"))
    queued = JobState("PENDING", name="sft_grid-0123456789ab", job_id="55_0")

    def tokenize_jobs(plan: SubmissionPlan) -> list[SlurmJob]:
        return [j for j in plan.slurm if j.role is Role.TOKENIZE]

    one = spread_plan(make_cells(*variants), [queued]).submission
    assert not tokenize_jobs(one)
    (train,) = [j for j in one.slurm if j.role is Role.TRAIN]
    assert train.dependency is not None and (train.dependency.job, train.dependency.planned) == ("55_0", False)
    other = replace(queued, name="sft_grid-ba9876543210")
    assert len(tokenize_jobs(spread_plan(make_cells(*variants), [other]).submission)) == 1
    spread = spread_plan(make_cells(*[[*v, SITES] for v in variants]), [queued]).submission
    assert sorted(j.request.site for j in tokenize_jobs(spread)) == ["slurm_local", "slurm_siteb"]
    assert_dependencies_stay_on_their_cluster(spread)


def test_the_jobs_of_one_tokenization_on_two_sites_build_it_once(tmp_path, monkeypatch):
    """What a tokenize job runs (its Slurm entry), twice at once in one directory, as the jobs of two sites do: one
    runs the script, the other waits for it and finds the dataset built; a third, later, runs nothing either."""
    tok_dir = tmp_path / "_tokenized" / "llamafactory-abc"
    tok_dir.mkdir(parents=True)
    (tok_dir / tokenize.IDENTITY).write_text(json.dumps({"key": "abc"}))
    count = tmp_path / "ran"
    script = f"echo run >> {count}; sleep 1; mkdir -p data; echo '{{}}' > data/dataset_dict.json\n"
    (tok_dir / tokenize.SCRIPT).write_text(script)
    monkeypatch.setenv("SFT_GRID_SITE", "slurm_siteb")
    start = threading.Barrier(2)

    def job() -> str:
        start.wait()
        return tokenize.run(tok_dir)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: job(), range(2)))
    assert results == ["completed", "completed"]
    assert count.read_text().splitlines() == ["run"]
    assert tokenize.run(tok_dir) == "completed" and count.read_text().splitlines() == ["run"]
    (running,) = [e for e in events.read(tok_dir) if e.kind is Kind.RUNNING]
    assert running.details["site"] == "slurm_siteb"  # the ledger says which site built it


def check_message(kind: str, target: str) -> str:
    """The verdict's message of a deferred check as the job's first step finds its input missing."""
    run = {"tokenized": check_tokenized, "prepared": check_prepared, "staged": check_staged}[kind]
    verdict = run(Check(kind, kind, target))
    assert not verdict.ok and verdict.unreachable
    return verdict.message


def test_an_input_not_built_when_the_cell_starts_is_the_grids_fault_naming_the_input_and_its_job(tmp_path):
    """The real first step's words (checks/preflight.py) of a tokenized dataset, a prepared model and a staged
    repository not there yet: `missing_input`, not `backend_error`; the summary names the input and the job that
    should have built it (as its ledger records it) and the cell's site; the policy stops with the rerun."""
    cell_dir = tmp_path / "runs" / "default" / "tiny_llama_lr0.0002-9512fa73"
    cell_dir.mkdir(parents=True)
    events.append(
        cell_dir,
        Event.here(Kind.SUBMITTED, executor="slurm", array="sft_grid-d40c82a55565", details={"site": "slurm_siteb"}),
    )
    tok_dir = tmp_path / "runs" / "_tokenized" / "llamafactory-460df74d8a1c"
    tok_dir.mkdir(parents=True)
    events.append(tok_dir, Event.here(Kind.SUBMITTED, executor="slurm", array="sft_grid-9bc094b5e0c3", index=0))
    events.append(tok_dir, Event(Kind.JOB, job_id="773_0"))
    message = check_message("tokenized", str(tok_dir))
    assert message == f"the tokenized dataset {tok_dir} is not built yet; it is built before the cell"
    found = missing_input(cell_dir, "tokenized", str(tok_dir), message)
    assert found is not None
    failure, remedy = found
    assert failure.klass is FailureClass.MISSING_INPUT and remedy.kind is RemedyKind.STOP
    assert str(tok_dir) in failure.summary and "tokenize job 773_0 (sft_grid-9bc094b5e0c3)" in failure.summary
    assert "the cell ran on site slurm_siteb" in failure.summary and "rerun_failed=true" in remedy.message
    # the same check as the runner's reason words it, read from a log by the grid's triage: the same class
    assert classify([], f"sft_grid.job.runner.CellFailed: preflight: x: {message}").klass is FailureClass.MISSING_INPUT
    # a model prep's prepared copy, with no job queued for it; a staged repository
    prep_dir = tmp_path / "runs" / "_prepared" / "tiny_delphi-3f1c9a2b"
    found = missing_input(cell_dir, "prepared", str(prep_dir), check_message("prepared", str(prep_dir)))
    assert found is not None and found[0].klass is FailureClass.MISSING_INPUT
    assert (
        f"{prep_dir}/model is not there yet" in found[0].summary and "no model prep job was queued" in found[0].summary
    )
    snapshot = tmp_path / "hub" / "models--org--delphi" / "snapshots" / ("ab" * 20)
    found = missing_input(cell_dir, "staged", str(snapshot), check_message("staged", str(snapshot)))
    assert found is not None and found[0].klass is FailureClass.MISSING_INPUT
    assert "model org/delphi@abababababab is not staged" in found[0].summary and "staging" in found[0].summary
    # the config or the data refused: not the grid's fault, the runner's backend_error
    assert missing_input(cell_dir, "path", "/x", "no such file or directory") is None
    failed = f"its tokenized dataset was not built: tokenize job exited with 1: KeyError: 'messages' (log: {tok_dir})"
    assert missing_input(cell_dir, "tokenized", str(tok_dir), failed) is None


# -- on the two local clusters ------------------------------------------------------------------------------------

# 2 LLaMA-Factory cells, then 2 axolotl cells, all of the Delphi stand-in (one model prep for the four), each pair
# sharing one tokenized dataset. The placement (earliest expected start, ties to the first named, the work this
# placement put on a site spread over its nodes: siteb has 1, ci more) puts the first cell on one site and the second
# on the other, whatever else either site runs (within the cells' 4 hours): the prep and the LLaMA-Factory dataset
# are waited for on both sites; the axolotl cells go where the placement puts them
REAL = [
    "-m",
    "backend=llamafactory,axolotl",
    "model=tiny_delphi",
    "lr=1e-4,2e-4",
    "max_steps=1",
    "global_batch_size=2",
    "micro_batch_size=2",
    "cutoff_len=128",
    "cluster=slurm_local",
    "sites=[slurm_siteb,slurm_local]",
]
SITE_ENV = {"slurm_local": {}, "slurm_siteb": {"SLURM_CONF": "/etc/slurm-siteb/slurm.conf"}}


def sacct(site: str, job_id: str) -> list[tuple[str, str, str, str]]:
    """(name, state, start, end) of each task of a job of a site, as its cluster's accounting has it."""
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", **SITE_ENV[site]}
    argv = ["sacct", "-X", "-n", "-P", "--starttime=now-1days", "-o", "JobName,State,Start,End", "-j", job_id]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    return [(a, b, c, d) for a, b, c, d in (line.split("|") for line in out.splitlines() if line)]


def post_ended(site: str, job_id: str, deadline_s: float = 600) -> list[tuple[str, str]]:
    """(name, state) of a post-training job of a site once it has ended: a cell is done when its training is, and its
    post-training job (consolidation, upload) may still be running then."""
    deadline = time.monotonic() + deadline_s
    while (tasks := [(n, st) for n, st, _, _ in sacct(site, job_id)]) and any(
        st in ("PENDING", "RUNNING", "COMPLETING") for _, st in tasks
    ):
        assert time.monotonic() < deadline, tasks
        time.sleep(1)
    return tasks


def waited_for(site: str, folder: Path, job_id: str, names: set[str]) -> str:
    """The job a job of a site (its submitit folder) waited for, by its sbatch's --dependency: one of `names` on the
    same cluster, ended before it started; its id."""
    script = (folder / f"{job_id.split('_', maxsplit=1)[0]}_submission.sh").read_text()
    after = re.search(r"--dependency=afterany:(\d+)", script)
    assert after, script
    before = sacct(site, after.group(1))
    started = min(start for _, _, start, _ in sacct(site, job_id))  # (each task of an array)
    assert before and all(name in names and state == "COMPLETED" for name, state, _, _ in before), (site, before)
    assert max(end for _, _, _, end in before) <= started, (site, before, started)
    return after.group(1)


def submitted(directory: Path) -> set[str]:
    """The names of the jobs queued for a stage's directory, on whichever site."""
    return {e.array for e in events.read(directory) if e.kind is Kind.SUBMITTED}


@pytest.mark.slurm
@pytest.mark.backend
@pytest.mark.sites
@pytest.mark.xdist_group("sites_remote")  # one worker runs the tests that use siteb, one after the other
def test_a_spread_grid_of_real_cells_waits_for_its_stages_on_each_cells_own_site(tmp_path, axolotl_env):
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "slurm_site_up.sh")], check=True, capture_output=True)
    root = tmp_path / "runs"
    try:
        run_sft(*REAL, f"runs_root={root}", check=True)
        cells = sorted(iter_cell_dirs(root / "default"))
        wait_done(cells, deadline_s=900)
        toks = sorted(t for t in (root / "_tokenized").iterdir() if not t.name.startswith("."))  # (.submitit)
        (prep,) = [p for p in (root / "_prepared").iterdir() if not p.name.startswith(".")]
        assert len(toks) == 2 and all(tokenized_complete(t) for t in toks)  # one a backend, each built once
        assert prep_complete(prep)
        tok_arrays, prep_arrays = set().union(*map(submitted, toks)), submitted(prep)
        assert len(tok_arrays) == len(prep_arrays) == 2  # one array a site
        users: dict[str, set[str]] = {t.name: set() for t in toks}
        for cell in cells:
            history = events.read(cell)
            assert [e.kind for e in history].count(Kind.RUNNING) == 1, cell.name  # trained once, completed
            site = events.submitted_site(history)[0]
            config = next(cell.glob("*_config.yaml")).read_text()  # the backend's: the dataset it loads
            (tok,) = [t.name for t in toks if str(t) in config]
            users[tok].add(site)
            # its job waited for the tokenize array of its own cluster, which waited for that cluster's prep array
            job_id = next(e.job_id for e in reversed(history) if e.kind is Kind.JOB)
            folder = cell.parent / SUBMITIT_DIR / events.last(history, Kind.SUBMITTED).array
            tok_job = waited_for(site, folder, job_id, tok_arrays)
            (tok_array,) = {name for name, _, _, _ in sacct(site, tok_job)}
            waited_for(site, root / "_tokenized" / SUBMITIT_DIR / tok_array, tok_job, prep_arrays)
            # its post-training job too, on its own cluster
            post = events.last(history, Kind.POST_JOB)
            assert post is not None and post.post_job_id, cell.name
            assert post_ended(site, post.post_job_id) == [(post.array, "COMPLETED")]
        # the LLaMA-Factory dataset was waited for on both sites (each site's job built it, or found it built)
        (lf,) = [t for t in users if t.startswith("llamafactory-")]
        assert users[lf] == set(SITE_ENV), users
    finally:
        cancel_jobs_of(root)
        ids = site_b_jobs(root)
        if ids:
            subprocess.run(["scancel", *ids], env={"PATH": "/usr/bin:/bin", **SITE_ENV["slurm_siteb"]}, check=False)
