"""The grid's decisions, one by one, against fake sbatch/sacct/squeue/scancel/scontrol on PATH (tests/fakeslurm.py)
that record their calls: new cells are queued once, in-flight and completed ones are skipped, failed ones rerun
only when asked, force moves the old output aside, completed cells with pending post stages get only those, and an
orchestrator killed mid-submit is recovered. A dry run decides the same and calls nothing that changes anything.

Everything here is in-process and needs no backend: the cells name hub ids (not in this machine's Hugging Face
cache, no Hub to stage them from, on a cluster whose compute nodes reach the Hub) and a site virtual environment
that is not here, so every input check is deferred to the job. The real
Slurm tests (tests/test_slurm*.py) run the same flow against a real cluster.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sft_grid.cli.present import normalise_ids
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import LEDGER_FILE, SUBMITIT_DIR, iter_cell_dirs
from sft_grid.core.state import State
from sft_grid.grid import flow
from sft_grid.grid.decide import Action
from sft_grid.planning.compose import GridComposer

from . import fakeslurm
from .helpers import kinds, ledger

# compute nodes with internet: inputs this machine cannot stage (no Hub here) are left to the jobs; each cell
# tokenizes in its own job (the decisions here are about cells; tokenize-once plans: tests/test_tokenize_plan.py)
BASE = [
    "cluster=slurm_local",
    "model=qwen3_8b",
    "dataset=magpie",
    "max_steps=2",
    "cluster.internet_on_compute=true",
    "tokenize_once=false",
]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    fake_dir = tmp_path / "fake_slurm"
    fake_dir.mkdir()
    fakeslurm.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(fake_dir))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hf_cache"))
    return fake_dir


@pytest.fixture
def grid(hydra_loader, tmp_path):
    runs = tmp_path / "runs"

    def run(*extra: str, seeds=(1, 2, 3)) -> flow.GridResult:
        composer = GridComposer(hydra_loader, "config")
        composed, errors = composer.compose_all([[*BASE, f"seed={s}", f"runs_root={runs}", *extra] for s in seeds])
        assert not errors, [e.message for e in errors]
        return flow.run(composed, errors)

    run.runs = runs
    return run


def cells(runs: Path) -> list[Path]:
    return list(iter_cell_dirs(runs / "default"))


def complete(cell: Path, stages_done: bool = True) -> None:
    """The cell's output as a finished training leaves it (and, optionally, its post stages recorded done)."""
    out = cell / "output"
    out.mkdir(exist_ok=True)
    (out / "model.safetensors").write_bytes(b"w")
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": []}))
    if stages_done:
        events.append(cell, Event(Kind.STAGE, stage="tokenizer", state="completed"))


def job_of(cell: Path) -> str:
    job = events.last(events.read(cell), Kind.JOB)
    assert job is not None
    return job.job_id


def snapshot(root: Path) -> dict[str, str]:
    """Every ledger and every file of the submitit folders under root, by content."""
    files = [*root.rglob(LEDGER_FILE), *[p for p in root.rglob("*") if SUBMITIT_DIR in p.parts and p.is_file()]]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def test_new_cells_are_queued_as_one_array_and_a_post_array_after_it(fake, grid):
    result = grid()
    sbatches = fakeslurm.calls(fake, "sbatch")
    assert len(sbatches) == 2 and [j.role.value for j in result.plan.slurm] == ["train", "post"]
    train, _post = result.plan.slurm
    assert f"--job-name={train.name}" in sbatches[0]["script"] and "--array=0-2" in sbatches[0]["script"]
    assert "#SBATCH --dependency=aftercorr:100" in sbatches[1]["script"]
    for index, cell in enumerate(cells(grid.runs)):
        submitted = events.last(events.read(cell), Kind.SUBMITTED)
        assert (submitted.executor, submitted.array, submitted.index) == ("slurm", train.name, index)
        assert job_of(cell) == f"100_{index}"
        assert events.last(events.read(cell), Kind.POST_JOB).post_job_id == f"101_{index}"


def test_in_flight_cells_are_skipped_and_nothing_is_sent(fake, grid):
    grid()
    before = len(fakeslurm.calls(fake, "sbatch"))
    again = grid()
    assert len(fakeslurm.calls(fake, "sbatch")) == before
    assert [d.action for d in again.decisions] == [Action.SKIP] * 3
    assert all(d.why.startswith("submitted (job 100_") for d in again.decisions)
    # the first invocation had nothing to ask about; the second asks once for the whole grid
    assert len(fakeslurm.calls(fake, "sacct")) == 1


def test_completed_cells_are_skipped_and_pending_post_stages_run_alone(fake, grid):
    grid()
    first, second, third = cells(grid.runs)
    fakeslurm.set_state(fake, "100", "COMPLETED")
    fakeslurm.set_state(fake, "101", "FAILED")  # the post jobs ended without recording their stages
    complete(first)
    complete(second)
    complete(third, stages_done=False)
    again = grid()
    assert [d.action for d in again.decisions] == [Action.SKIP, Action.SKIP, Action.POST]
    assert "post stages to run: tokenizer" in again.decisions[2].why
    (post,) = again.plan.slurm
    assert post.role.value == "post" and post.targets == (third,) and post.dependency is None
    assert len(fakeslurm.calls(fake, "sbatch")) == 3


def test_failed_cells_wait_for_rerun_failed_and_then_go_alone_under_a_new_name(fake, grid):
    first_run = grid()
    fakeslurm.set_state(fake, "100_1", "FAILED", "NonZeroExitCode")
    skipped = grid()
    assert skipped.decisions[1].action is Action.SKIP
    # triaged from the scheduler's record (the fake keeps no log): class, evidence, and how to rerun it
    why = skipped.decisions[1].why
    assert why.startswith("failed [unknown]") and "100_1 State=FAILED" in why and "rerun_failed=true" in why, why
    rerun = grid("rerun_failed=true")
    assert [d.action for d in rerun.decisions] == [Action.SKIP, Action.RUN, Action.SKIP]
    train = rerun.plan.slurm[0]
    assert train.targets == (cells(grid.runs)[1],) and train.name != first_run.plan.slurm[0].name
    assert kinds(cells(grid.runs)[1]).count("submitted") == 2


def _node_fails(fake: Path, cell: Path, node: str) -> None:
    """The cell's latest job ends NODE_FAIL, its job log naming the node (as srun writes it)."""
    history = events.read(cell)
    job_id = job_of(cell)
    submitted = events.last(history, Kind.SUBMITTED)
    assert submitted is not None
    array = submitted.array
    log = cell.parent / SUBMITIT_DIR / array / f"{job_id}_0_log.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        f"srun: error: Node failure on {node}\nslurmstepd: error: *** JOB {job_id} ON {node} CANCELLED"
        " AT 2026-11-30T10:00:00 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )
    fakeslurm.set_state(fake, job_id, "NODE_FAIL", "NodeDown")


def test_a_transient_failure_is_requeued_by_its_policy_avoiding_the_node_until_its_budget_is_spent(fake, grid):
    grid(seeds=(1,))
    (cell,) = cells(grid.runs)
    for attempt, node in enumerate(["n2", "n1"], 1):
        _node_fails(fake, cell, node)
        again = grid(seeds=(1,))
        (d,) = again.decisions
        assert d.action is Action.RUN and d.exclude == (node,), d  # no rerun_failed=true needed
        script = fakeslurm.calls(fake, "sbatch")[-2]["script"]  # the training array (then its post array)
        assert f"#SBATCH --exclude={node}" in script
        failed = [e for e in ledger(cell) if e["event"] == "failed"]
        assert failed[-1]["class"] == "node_failure" and failed[-1]["action"] == "requeue"
        assert failed[-1]["nodes"] == node and f"requeue {attempt} of 2" in failed[-1]["note"]
        submitted = [e for e in ledger(cell) if e["event"] == "submitted"]
        assert len(submitted) == attempt + 1 and submitted[-1]["note"] == "requeue: node_failure"
    _node_fails(fake, cell, "n2")
    stopped = grid(seeds=(1,))
    (d,) = stopped.decisions
    assert d.action is Action.SKIP and d.why.startswith("failed [node_failure]"), d.why
    assert d.state.action == "stop" and "requeue budget 2 spent" in d.state.advice, d.state
    assert len(fakeslurm.calls(fake, "sbatch")) == 6  # three trainings and their post arrays, no fourth


def test_force_moves_a_completed_output_aside_and_runs_it_again(fake, grid):
    grid(seeds=(1,))
    (cell,) = cells(grid.runs)
    fakeslurm.set_state(fake, "100", "COMPLETED")
    complete(cell)
    forced = grid("force=true", seeds=(1,))
    assert forced.decisions[0].action is Action.RUN and forced.decisions[0].archive
    archived = events.last(events.read(cell), Kind.ARCHIVED)
    assert (cell / archived.path / "model.safetensors").is_file() and not (cell / "output").exists()
    assert len(fakeslurm.calls(fake, "sbatch")) == 4  # training + post, twice


def _killed_mid_submit(fake: Path, grid, pickle: str | None) -> tuple[Path, str, Path]:
    """A cell whose orchestrator died right after sbatch: its ledger has the array's name and no job id, and the
    fake queue holds a running job of that name; `pickle`: 'submitted' (submitit moved it in place), 'orphan'
    (left under its temporary name) or None (gone)."""
    from submitit.core.utils import DelayedSubmission

    from sft_grid.schedulers import slurm
    from sft_grid.schedulers.entry import CheckpointableEntry

    grid(seeds=(5,))
    (cell,) = cells(grid.runs)
    name = "sft_grid-killedmidsub"
    (cell / LEDGER_FILE).write_text("")
    events.append(cell, Event.here(Kind.SUBMITTED, executor="slurm", array=name, index=0, pid=999999))
    with fakeslurm.state() as data:
        data["tasks"]["300_0"] = {"name": name, "state": "RUNNING", "reason": "None"}
    folder = cell.parent / SUBMITIT_DIR / name
    folder.mkdir(parents=True)
    target = slurm.submission_file(folder, "300_0")
    if pickle is not None:
        path = target if pickle == "submitted" else folder / "0123abcd.pkl"
        path.parent.mkdir(parents=True, exist_ok=True)
        DelayedSubmission(CheckpointableEntry("sft_grid.job.entries:train", str(cell))).dump(path)
    return cell, "300_0", target


def test_a_job_whose_pickle_is_in_place_is_adopted(fake, grid):
    cell, job_id, _ = _killed_mid_submit(fake, grid, "submitted")
    sent = len(fakeslurm.calls(fake, "sbatch"))
    result = grid(seeds=(5,))
    assert result.decisions[0].action is Action.SKIP and job_of(cell) == job_id
    assert len(fakeslurm.calls(fake, "sbatch")) == sent and not fakeslurm.calls(fake, "scancel")


def test_a_pickle_left_under_its_temporary_name_is_put_in_place(fake, grid):
    cell, job_id, target = _killed_mid_submit(fake, grid, "orphan")
    grid(seeds=(5,))
    assert target.is_file() and job_of(cell) == job_id and not fakeslurm.calls(fake, "scancel")


def test_a_job_that_never_got_its_pickle_is_cancelled_and_the_cell_queued_again(fake, grid):
    cell, job_id, _ = _killed_mid_submit(fake, grid, None)
    sent = len(fakeslurm.calls(fake, "sbatch"))
    result = grid(seeds=(5,))
    assert [c["argv"] for c in fakeslurm.calls(fake, "scancel")] == [["scancel", job_id]]
    assert result.decisions[0].action is Action.RUN and len(fakeslurm.calls(fake, "sbatch")) == sent + 2
    assert "planned" in kinds(cell)


def test_a_dry_run_changes_no_ledger_no_pickle_and_calls_no_sbatch_or_scancel(fake, grid):
    _cell, _job_id, target = _killed_mid_submit(fake, grid, "orphan")
    grid(seeds=(6, 7))  # two more cells queued, in flight
    before = snapshot(grid.runs)
    sent = len(fakeslurm.calls(fake, "sbatch"))
    dry = grid("dry_run=true", seeds=(5, 6, 7, 8))
    assert snapshot(grid.runs) == before and not target.is_file()
    assert len(fakeslurm.calls(fake, "sbatch")) == sent and not fakeslurm.calls(fake, "scancel")
    # what it would do: restore the orphaned pickle, skip the cells in flight, queue the new one
    assert [r.action for r in dry.plan.recoveries] == ["restore"]
    assert [d.action for d in dry.decisions] == [Action.SKIP, Action.SKIP, Action.SKIP, Action.RUN]
    assert {d.state.state for d in dry.decisions[:3]} == {State.RUNNING, State.SUBMITTED}


def test_a_dry_runs_sbatch_scripts_are_what_the_real_run_sends(fake, grid):
    from sft_grid.schedulers import slurm

    dry = grid("dry_run=true")
    previews = [slurm.sbatch_script(j, j.dependency.text() if j.dependency else None) for j in dry.plan.slurm]
    real = grid()
    assert [j.name for j in real.plan.slurm] == [j.name for j in dry.plan.slurm]
    sent = [c["script"] for c in fakeslurm.calls(fake, "sbatch")]
    assert [normalise_ids(s) for s in sent] == [normalise_ids(p) for p in previews]


def test_sbatch_refusal_leaves_the_cells_planned_and_says_how_many(fake, grid, monkeypatch):
    monkeypatch.setenv("FAKE_SLURM_REFUSE", "Batch job submission failed: Invalid partition name specified")
    result = grid()
    assert result.refused is not None
    assert result.refused.not_queued == 3 and "Invalid partition" in result.refused.detail
    monkeypatch.delenv("FAKE_SLURM_REFUSE")
    assert all(kinds(c) == ["submitted"] for c in cells(grid.runs))
    # that process is gone: the cells read as planned, and the next run queues them once
    for cell in cells(grid.runs):
        (cell / LEDGER_FILE).write_text(json.dumps({**ledger(cell)[0], "pid": 999999}) + "\n")
    again = grid()
    assert [d.action for d in again.decisions] == [Action.RUN] * 3


def test_status_shows_a_running_cell_in_its_data_step(fake, grid):
    """A running cell with no step logged yet, whose job's data step (in_venv/data_step.py's record) started and has
    not ended: status's progress column says so, and says nothing once the step ended."""
    import time

    from sft_grid.cli.cmd_status import rows
    from sft_grid.core.layout import DATA_STEP_FILE

    grid(seeds=(1,))
    (cell,) = cells(grid.runs)
    fakeslurm.set_state(fake, job_of(cell), "RUNNING")
    events.append(cell, Event.here(Kind.RUNNING, job_id=job_of(cell)))
    start = {"event": "start", "what": "get_dataset", "rank": 0, "pid": 4242, "time": time.time()}
    (cell / DATA_STEP_FILE).write_text(json.dumps(start) + "\n")
    (row,) = rows([cell])
    assert row[1] == "running" and row[4].startswith("data step: get_dataset on rank 0, started "), row
    with (cell / DATA_STEP_FILE).open("a") as fh:
        fh.write(json.dumps({**start, "event": "end", "ok": True, "cpu_s": 1.0, "wall_s": 1.0}) + "\n")
    (row,) = rows([cell])
    assert row[1] == "running" and row[4] == "", row


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under root: its size and modification time (ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_planning_twice_over_one_observation_writes_nothing_and_sends_nothing(
    fake, hydra_loader, tmp_path, receiver, monkeypatch
):
    """A failure the scheduler ended, its class in the job's log, not yet triaged: planning over an observation
    that saw it, twice, writes no file (no triage recorded), sends no notification, starts no process and gives the
    same plan. Observing for real then records the triage and notifies the cell's end, once; planning over that
    observation changes nothing either."""
    import subprocess
    import sys

    monkeypatch.setenv("SFT_GRID_TEST_HOOK", receiver.url("/hook"))
    sink = tmp_path / "notified.jsonl"
    script = tmp_path / "notify.py"
    script.write_text("import sys\nopen(sys.argv[1], 'a').write(sys.stdin.read().strip() + '\\n')\n")
    runs = tmp_path / "runs"
    notify = ["notify.webhook_env=SFT_GRID_TEST_HOOK", f"notify.command=[{sys.executable},{script},{sink}]"]
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all([[*BASE, f"seed={s}", f"runs_root={runs}", *notify] for s in (1, 2)])
    assert not errors, [e.message for e in errors]
    flow.run(composed, errors)
    failed = cells(runs)[1]
    job_id = job_of(failed)
    array = events.last(events.read(failed), Kind.SUBMITTED).array
    log = runs / "default" / SUBMITIT_DIR / array / f"{job_id}_0_log.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    fakeslurm.set_state(fake, job_id, "FAILED", "NonZeroExitCode")
    inputs = flow.check(composed, errors, flow.Observer())
    assert not inputs.dry_run

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"plan started a process: {args}")

    def plan_twice(observed: flow.Observed) -> flow.GridPlan:
        """The plan over this observation, made twice; asserts that it changed nothing."""
        before = _tree(tmp_path)  # the ledgers, the cells' files, the sink, the fake Slurm's record of its calls
        sent = len(receiver.requests)
        with monkeypatch.context() as m:
            m.setattr(subprocess.Popen, "__init__", no_process)
            first, second = flow.plan(inputs, observed), flow.plan(inputs, observed)
        assert first == second
        assert _tree(tmp_path) == before and len(receiver.requests) == sent
        return first

    seen = flow.observe(inputs, record=False)
    assert seen.view.state(failed).state is State.FAILED and not seen.view.state(failed).failure_class
    untriaged = plan_twice(seen)
    assert [e["event"] for e in ledger(failed)].count("failed") == 0 and not sink.exists()
    assert [d.action for d in untriaged.decisions] == [Action.SKIP, Action.SKIP]

    observed = flow.observe(inputs)
    # the observation recorded the triage (its class from the log) and sent the cell's end, once, both ways
    (triaged,) = [e for e in ledger(failed) if e["event"] == "failed"]
    assert triaged["class"] == "gpu_oom", triaged
    assert observed.view.state(failed).failure_class == "gpu_oom"
    assert len(sink.read_text().splitlines()) == 1 and len(receiver.requests) == 1
    assert json.loads(receiver.requests[0]["body"])["class"] == "gpu_oom"
    grid = plan_twice(observed)
    assert grid.decisions[1].why.startswith("failed [gpu_oom]"), grid.decisions[1].why
    assert len(sink.read_text().splitlines()) == 1

    # the view is immutable: nothing can add to what the plan read
    with pytest.raises(AttributeError):
        observed.view.histories[failed].append(None)
    with pytest.raises(TypeError):
        observed.view.histories[failed] = ()

    # observing again records and sends nothing more
    flow.observe(inputs)
    assert len(sink.read_text().splitlines()) == 1 and len(receiver.requests) == 1
    assert [e["event"] for e in ledger(failed)].count("failed") == 1
