"""Faults on sft_grid's Slurm path, for real: the local cluster of scripts/slurm_up.sh (`make slurm-up`),
the CLI as users run it, the real sbatch/sacct/scontrol.

- a transient sbatch failure is retried with backoff and queues every cell once;
- an orchestrator killed right after sbatch (before it records the job ids) is recovered by the array's
  name on the next invocation, never resubmitted; one killed before sbatch leaves planned cells;
- two invocations of one grid at once queue each cell once;
- a node lost mid-job: the cell is requeued and completes, or fails with a reason;
- paths with spaces, quotes, `;` and `$(...)` go through every file and script as data;
- secrets in the orchestrator's environment are never written under runs_root (with the transient failure).

Faults are injected with a fake `sbatch` first on PATH (a bash script in tmp_path that wraps the real
one). Every test stops by itself: each wait has a deadline, and every job a test queued (found by the
array names in its cells' ledgers) is cancelled at the end, even when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sft_grid.core.layout import checkpoints, iter_cell_dirs, output_complete, progress
from sft_grid.core.paths import REPO_ROOT
from sft_grid.core.state import CellState, SchedulerView, State, state_of
from sft_grid.schedulers import slurm

from .conftest import holding_cluster, run_sft
from .helpers import array_names, cancel_jobs_of, states_of, triaged_states, wait_for
from .helpers import ledger as ledger_of

pytestmark = [pytest.mark.slurm, pytest.mark.backend]


# the training array is the grid's first sbatch (no tokenize-once job before it): what these faults are about
TINY = [
    "cluster=slurm_local",
    "model=tiny_llama",
    "max_steps=2",
    "global_batch_size=4",
    "micro_batch_size=2",
    "tokenize_once=false",
]
SEEDS = "seed=1,2"
N_CELLS = 2
FINAL = {"completed", "failed", "cancelled"}
WAIT_S = 1200  # any one wait for cells to finish (~1 min here; a busy machine, several times slower, shared)
REAL_SBATCH = shutil.which("sbatch") or "/usr/bin/sbatch"
TRANSIENT_ERROR = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"


# -- helpers --------------------------------------------------------------------------------------------


def cmd(*argv: str, timeout: float = 30, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def cell_dirs(root: Path, sweep: str = "default") -> list[Path]:
    return list(iter_cell_dirs(root / sweep))


def states(root: Path, sweep: str = "default") -> dict[Path, CellState]:
    """Each cell's state as `sft-grid status` derives it: ledger + output + one sacct call."""
    return states_of(cell_dirs(root, sweep))


def wait_final(root: Path, n: int, sweep: str = "default", deadline_s: float = WAIT_S) -> dict[Path, CellState]:
    """Poll until all n cells are completed/failed/cancelled; fail with the status table at the deadline."""
    seen: dict[Path, CellState] = {}

    def probe() -> dict[Path, CellState] | None:
        seen.clear()
        seen.update(states(root, sweep))
        return dict(seen) if len(seen) == n and all(s.state.value in FINAL for s in seen.values()) else None

    try:
        return wait_for(probe, f"{n} cells to finish", deadline_s, interval=2)
    except AssertionError:
        status = subprocess.run(
            [sys.executable, "-m", "sft_grid", "status", sweep, "--runs-root", str(root)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        raise AssertionError(f"cells not finished after {deadline_s} s:\n{status.stdout}{status.stderr}") from None


def events(cell: Path, kind: str | None = None) -> list[dict]:
    """The cell's training events (the post-training chain's own are tested in test_post.py)."""
    return [
        e
        for e in ledger_of(cell)
        if (kind is None or e.get("event") == kind) and e.get("event") not in ("stage", "post_job")
    ]


def sacct_by_name(names: set[str]) -> list[tuple[str, str, str]]:
    """(job id, name, state) of every job with one of these names, from accounting (-X: one line a task)."""
    if not names:
        return []
    out = cmd(
        "sacct",
        "-X",
        "-n",
        "-P",
        "--starttime=now-1days",
        "--name=" + ",".join(sorted(names)),
        "--format=JobID,JobName,State",
    )
    return [tuple(line.split("|")[:3]) for line in out.splitlines() if line.count("|") >= 2]  # type: ignore[misc]


def one_task_per_cell(names: set[str], n: int) -> list[tuple[str, str, str]]:
    """sacct's tasks of these arrays once each has its own record (not a pending `<id>_[a-b]` line)."""

    def probe() -> list[tuple[str, str, str]] | None:
        rows = sacct_by_name(names)
        return rows if rows and not any("[" in r[0] for r in rows) and len(rows) >= n else None

    return wait_for(probe, "every array task in sacct", 60, interval=1)


def array_id(job_id: str) -> str:
    return job_id.split("_", maxsplit=1)[0]


def fake_sbatch(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bash `sbatch` first on PATH for the orchestrator; $REAL is the real one, $COUNTER counts calls."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    counter = tmp_path / "sbatch_calls"
    script = bin_dir / "sbatch"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"REAL={REAL_SBATCH}\nCOUNTER={counter}\n"
        'n=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$COUNTER"\n' + body
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return counter


def grid(root: Path, *extra: str, seeds: str = SEEDS) -> list[str]:
    return ["-m", *TINY, seeds, f"runs_root={root}", *extra]


def assert_all_completed(final: dict[Path, CellState], steps: int = 2) -> None:
    bad = {c.name: (s.state.value, s.reason) for c, s in final.items() if s.state is not State.COMPLETED}
    assert not bad, bad
    for cell in final:
        assert json.loads((cell / "output" / "trainer_state.json").read_text())["global_step"] == steps


def assert_queued_once_then_completed(runs_root: Path) -> None:
    """Every cell was submitted once, as one array task, and completed."""
    cells = cell_dirs(runs_root)
    assert len(cells) == N_CELLS
    for cell in cells:
        assert len(events(cell, "submitted")) == 1 and len(events(cell, "job")) == 1, events(cell)
    final = wait_final(runs_root, N_CELLS)
    assert_all_completed(final)
    assert len({array_id(s.job_id) for s in final.values()}) == 1
    assert len(sacct_by_name(array_names(runs_root))) == N_CELLS


@pytest.fixture(scope="module", autouse=True)
def cluster_up() -> None:
    try:
        up = "is UP" in cmd("scontrol", "ping", timeout=15)
    except (OSError, AssertionError, subprocess.TimeoutExpired):
        up = False
    if not up:
        pytest.fail("no local Slurm cluster: run `make slurm-up` first, or deselect with -m 'not slurm'", pytrace=False)


# -- 1. a transient sbatch failure ----------------------------------------------------------------------


SECRETS = {"HF_TOKEN": "hf_secret_TEST123", "WANDB_API_KEY": "wandb_secret_TEST456"}


def test_transient_sbatch_failure_is_retried_and_queues_each_cell_once_and_no_secret_is_written(
    runs_root, tmp_path, monkeypatch
):
    """The grid's secrets are in the orchestrator's environment: none of them reaches a file under runs_root (the
    cells' files, submitit's pickles and logs, the training logs)."""
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    counter = fake_sbatch(
        tmp_path,
        (f'if [ "$n" -eq 1 ]; then echo "{TRANSIENT_ERROR}" >&2; exit 1; fi\nexec "$REAL" "$@"\n'),
        monkeypatch,
    )
    started = time.monotonic()
    proc = run_sft(*grid(runs_root), timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"queued {N_CELLS} cell(s) as sft_grid-" in proc.stdout, proc.stdout
    assert counter.read_text().strip() == "3"  # one failure, one retry, then the post-training array
    assert took >= 2, "the retry came without backoff"
    assert_queued_once_then_completed(runs_root)
    files = [p for p in runs_root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(".submitit" in p.parts for p in files) and any(p.name == "train.log" for p in files)
    leaks = {
        str(p.relative_to(runs_root)): [k for k, v in SECRETS.items() if v.encode() in p.read_bytes()] for p in files
    }
    assert not {p: ks for p, ks in leaks.items() if ks}, leaks


# -- 2. the orchestrator killed around sbatch -----------------------------------------------------------

KILL_AFTER_SBATCH = (
    'out=$("$REAL" "$@"); rc=$?\n'
    'echo "$out"\n'
    "kill -9 $PPID\n"  # the orchestrator dies with the job queued and its id not yet recorded
    "exit $rc\n"
)


def _killed_after_sbatch(
    runs_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
    *args: str,
) -> set[str]:
    fake_sbatch(tmp_path, body, monkeypatch)
    killed = run_sft(*args, timeout=120)
    assert killed.returncode != 0, killed.stdout + killed.stderr
    monkeypatch.undo()  # the real sbatch from here on
    names = array_names(runs_root)
    assert len(names) == 1
    for cell in cell_dirs(runs_root):
        assert not events(cell, "job"), "the job id was recorded before the kill: nothing to recover"
    return names


def _assert_recovered_once(runs_root: Path, rerun: subprocess.CompletedProcess[str], n: int, rerun_at: str) -> None:
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "queued" not in rerun.stdout and f"{n} cell(s): 0 to run" in rerun.stdout, rerun.stdout
    cells = cell_dirs(runs_root)
    for cell in cells:
        assert len(events(cell, "submitted")) == 1, events(cell)
        recovered = [e for e in events(cell, "job") if e.get("note") == "recovered by the array's name"]
        done_before = [e for e in events(cell, "completed") if e["time"] <= rerun_at]
        assert len(recovered) == 1 or done_before, events(cell)
    final = wait_final(runs_root, n)
    assert_all_completed(final)
    tasks = sacct_by_name(array_names(runs_root))
    assert len(tasks) == n, tasks  # one sbatch for the grid, whatever the invocations
    assert len({array_id(s.job_id) for s in final.values()}) == 1
    assert {array_id(t[0]) for t in tasks} == {array_id(s.job_id) for s in final.values()}


def test_killed_after_sbatch_rerun_recovers_the_array_by_name(runs_root, tmp_path, monkeypatch):
    """The rerun comes once the array's tasks have their own records in sacct (they were scheduled)."""
    names = _killed_after_sbatch(runs_root, tmp_path, monkeypatch, KILL_AFTER_SBATCH, *grid(runs_root))
    one_task_per_cell(names, N_CELLS)
    rerun_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rerun = run_sft(*grid(runs_root), timeout=120)
    _assert_recovered_once(runs_root, rerun, N_CELLS, rerun_at)


def test_killed_after_sbatch_rerun_while_the_array_is_pending_recovers_by_name(runs_root, tmp_path, monkeypatch):
    """The usual case on a busy cluster: the user reruns while the array still waits in the queue. The
    array is held (sbatch --hold) to keep it pending for as long as the rerun takes, then released."""
    body = KILL_AFTER_SBATCH.replace('"$REAL" "$@"', '"$REAL" --hold "$@"')
    names = _killed_after_sbatch(runs_root, tmp_path, monkeypatch, body, *grid(runs_root))
    (name,) = names
    held = cmd("squeue", "-h", "-o", "%F|%T|%r", "-n", name).split()
    assert held and all(h.endswith("|PENDING|JobHeldUser") for h in held), held
    rerun_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rerun = run_sft(*grid(runs_root), timeout=120)
    for first in {h.split("|")[0] for h in held}:
        cmd("scontrol", "release", first)
    _assert_recovered_once(runs_root, rerun, N_CELLS, rerun_at)


def test_killed_after_sbatch_one_cell_rerun_recovers_by_name(runs_root, tmp_path, monkeypatch):
    names = _killed_after_sbatch(runs_root, tmp_path, monkeypatch, KILL_AFTER_SBATCH, *grid(runs_root, seeds="seed=1"))
    wait_for(lambda: [r for r in sacct_by_name(names) if r[2] in ("RUNNING", "COMPLETED")], "the job to run", 600)
    rerun_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rerun = run_sft(*grid(runs_root, seeds="seed=1"), timeout=120)
    _assert_recovered_once(runs_root, rerun, 1, rerun_at)


def test_killed_before_sbatch_rerun_submits_the_planned_cells_once(runs_root, tmp_path, monkeypatch):
    counter = fake_sbatch(tmp_path, "kill -9 $PPID\nexit 1\n", monkeypatch)
    killed = run_sft(*grid(runs_root), timeout=120)
    assert killed.returncode != 0
    assert counter.read_text().strip() == "1"
    monkeypatch.undo()
    (dead_name,) = array_names(runs_root)
    status = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(runs_root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"{N_CELLS} cell(s): {N_CELLS} planned" in status.stdout, status.stdout + status.stderr
    rerun = run_sft(*grid(runs_root), timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"{N_CELLS} cell(s): {N_CELLS} to run" in rerun.stdout
    assert rerun.stdout.count("queued ") == 1
    for cell in cell_dirs(runs_root):
        assert len(events(cell, "job")) == 1, events(cell)
    final = wait_final(runs_root, N_CELLS)
    assert_all_completed(final)
    assert not sacct_by_name({dead_name})
    tasks = sacct_by_name(array_names(runs_root))
    assert len(tasks) == N_CELLS and len({array_id(t[0]) for t in tasks}) == 1, tasks


# -- 3. two invocations at once -------------------------------------------------------------------------


def test_two_invocations_at_once_queue_each_cell_once(runs_root):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-m", "sft_grid", *grid(runs_root)]
    procs = [
        subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120))
        finally:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    queued = [o for o, _ in outs if "queued" in o]
    assert len(queued) == 1, outs  # one of them submitted, the other saw the cells in flight (or done)
    assert_queued_once_then_completed(runs_root)


# -- 4. a node lost mid-job -----------------------------------------------------------------------------

# ~17 steps/s here: 600 steps is ~35 s of training, a checkpoint every 100 steps
SLOW_STEPS = 600
SLOW = [
    "cluster=slurm_local",
    "model=tiny_llama",
    f"max_steps={SLOW_STEPS}",
    "save_steps=100",
    "global_batch_size=16",
    "micro_batch_size=1",
]


def node_state(node: str) -> str:
    return cmd("sinfo", "-h", "-N", "-n", node, "-o", "%T").split()[0]


def squeue_state(job_id: str) -> str:
    """The controller's view of a job ('' once it left the queue)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() if out.returncode == 0 else ""


@pytest.fixture(scope="module")
def node_loss(tmp_path_factory: pytest.TempPathFactory, tiny_assets: Path) -> Iterator[dict]:
    """One cell mid-training on the node that is then set DOWN; what sft_grid and Slurm said, until the job
    left the queue. Shared by the tests below (the scenario takes a minute or two, the cluster held alone: a node
    set down would end other tests' jobs too)."""
    with holding_cluster(alone=True):
        seen = _node_loss(tmp_path_factory.mktemp("node_loss") / "runs")
    yield seen  # the tests read what was seen; the cluster is free again


def _node_loss(root: Path) -> dict:
    root.mkdir()
    seen: dict = {"root": root}
    node = ""
    try:
        run_sft(*SLOW, f"runs_root={root}", check=True, timeout=120)
        (cell,) = cell_dirs(root)
        seen["cell"] = cell
        out = cell / "output"

        def training() -> str | None:
            st = states(root)[cell]
            log = out / "trainer_log.jsonl"
            ok = st.state is State.RUNNING and log.is_file() and log.stat().st_size and checkpoints(out)
            return st.job_id if ok else None

        job_id = wait_for(training, "the cell RUNNING with a trainer log and a first checkpoint", 600)
        node = cmd("squeue", "-h", "-j", job_id, "-o", "%N").strip()
        assert node in ("n1", "n2"), node
        seen.update(
            job_id=job_id,
            node=node,
            first_pid=int(events(cell, "running")[-1]["pid"]),
            step=progress(out).step,
            checkpoint=checkpoints(out)[-1].name,
        )
        cmd("scontrol", "update", f"nodename={node}", "state=down", "reason=sftgrid-test")
        # from the loss until Slurm runs the job again or lets it go: what sft_grid makes of each record accounting
        # gives meanwhile, beside what the controller says (a requeued job waits in the queue for a few seconds)
        polls: list[tuple[CellState, str]] = []
        seen["polls"] = polls
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end:
            view = SchedulerView.of(slurm.query([job_id]))
            polls.append((state_of(cell, view), squeue_state(job_id)))
            queued = polls[-1][1]
            if not queued or (queued == "RUNNING" and any(q not in ("", "RUNNING") for _, q in polls)):
                break
            time.sleep(0.2)
        seen["node_fail"] = "NODE_FAIL" in cmd("sacct", "--duplicates", "-X", "-n", "-P", "-j", job_id, "-o", "State")

        def gone_and_final() -> CellState | None:
            st = states(root)[cell]
            return st if not squeue_state(job_id) and st.state.value in FINAL else None

        seen["final"] = wait_for(gone_and_final, "the job out of the queue and the cell finished", WAIT_S, 2)
        seen["history"] = cmd("sacct", "--duplicates", "-X", "-n", "-P", "-j", job_id, "-o", "State,NodeList").split()
        print(
            f"\nnode {node} lost at step {seen['step']} ({seen['checkpoint']} saved); until requeued, sft_grid/squeue "
            f"said {[(st.state.value, q) for st, q in polls]}; sacct --duplicates: {seen['history']}; "
            f"ledger: {[e['event'] for e in events(cell)]}; final: {seen['final']}"
        )
    except Exception as exc:  # the tests below report it
        seen["error"] = exc
    finally:
        # ReturnToService=2 may already have brought the node back when its slurmd re-registered
        if node and any(s in node_state(node).lower() for s in ("down", "drain", "fail")):
            cmd("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        cancel_jobs_of(root)
    return seen


def _scenario(seen: dict) -> dict:
    if "error" in seen:
        raise seen["error"]
    return seen


@pytest.mark.xdist_group("cluster_alone")
def test_node_lost_mid_job_cell_is_requeued_and_completes_or_fails_with_a_reason(node_loss):
    seen = _scenario(node_loss)
    cell, st = seen["cell"], seen["final"]
    assert seen["node_fail"], seen["history"]
    kinds = [e["event"] for e in events(cell)]
    # the lost run's processes are gone: never two trainings writing one output
    with pytest.raises(ProcessLookupError):
        os.kill(seen["first_pid"], 0)
    if st.state is State.COMPLETED:  # never completed without the output
        assert output_complete(cell / "output")
        assert json.loads((cell / "output" / "trainer_state.json").read_text())["global_step"] == SLOW_STEPS
        assert kinds.count("running") >= 2 and kinds[-1] == "completed", kinds  # ran again after the loss
        assert kinds.count("submitted") == 1, kinds  # requeued by Slurm, not resubmitted
        resumed = [e["checkpoint"] for e in events(cell, "resumed")]
        assert resumed and int(resumed[0].split("-")[1]) >= int(seen["checkpoint"].split("-")[1]), kinds
    else:  # the requeue budget was spent: a node failure, named as such, with the node
        (st,) = triaged_states([cell]).values()
        assert st.state is State.FAILED and st.failure_class == "node_failure", st
        assert seen["node"] in st.evidence or seen["node"] in st.reason, st


@pytest.mark.xdist_group("cluster_alone")
def test_node_lost_status_never_reads_failed_while_slurm_requeues_the_job(node_loss):
    seen = _scenario(node_loss)
    polls = seen["polls"]
    waiting = [(st, q) for st, q in polls if q not in ("", "RUNNING")]
    if not waiting:
        pytest.skip(f"Slurm let the job go at NODE_FAIL, it never waited to be requeued (squeue: {polls})")
    # every poll while the controller still held the job, the requeue's wait included, reads in flight
    assert all(st.state.in_flight for st, q in polls if q), polls


# -- 5. paths that a shell would mangle -----------------------------------------------------------------


def hydra_quoted(value: str) -> str:
    """A Hydra override value as a single-quoted string (backslash and quote escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def test_paths_with_spaces_quotes_and_shell_syntax_train_on_slurm(runs_root, tmp_path, tiny_assets):
    marker = f"PWNED_{uuid.uuid4().hex[:8]}"
    model_dir = tmp_path / 'my model\'s dir "x"'
    shutil.copytree(tiny_assets / "models" / "tiny-llama3", model_dir)
    data_src = tiny_assets / "data" / "tiny_messages.jsonl"
    data_dir = tmp_path / f"data dir; $(touch {marker}) `touch {marker}b` & x"
    data_dir.mkdir()
    data_file = data_dir / f"tiny; $(touch {marker}c).jsonl"
    shutil.copy(data_src, data_file)
    run_sft(*TINY, f"model.path={hydra_quoted(str(model_dir))}", f"runs_root={runs_root}", check=True, timeout=120)
    run_sft(
        *TINY,
        f"dataset.tiny_messages.source={hydra_quoted(str(data_file))}",
        f"runs_root={runs_root}",
        check=True,
        timeout=120,
    )
    final = wait_final(runs_root, 2)
    assert_all_completed(final)
    configs = "\n".join((c / "train_config.yaml").read_text() + (c / "dataset_info.json").read_text() for c in final)
    assert "my model's dir" in configs and f"$(touch {marker}c)" in configs  # the paths as given, as data
    # where a `touch` run by a shell would land: the cwd of the orchestrator, of the job, of slurmd, ...
    spool = Path("/var/spool/slurm")
    places = [REPO_ROOT, Path.home(), Path("/tmp"), Path("/"), spool, *(spool.glob("*/*") if spool.is_dir() else [])]
    stray = [p for d in places if d.is_dir() for p in d.glob(f"{marker}*")] + list(tmp_path.rglob(f"{marker}*"))
    assert not stray, stray
