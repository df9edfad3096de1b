"""The local Slurm cluster that scripts/slurm_up.sh starts (`make slurm-up`) is a real cluster.

Two virtual nodes n1 and n2 with 4 fake GPUs each, accounting through slurmdbd, and a `high` partition whose
jobs preempt and requeue `debug` jobs. These tests check what sft_grid's Slurm tests rely on: batch jobs,
multi-node steps, arrays, sacct and the configured limits (preemption, for real: the preempted cell of
tests/test_slurm.py).

Every test stops by itself: each waits against a deadline (never an unbounded sleep) and every Slurm
command has a timeout. Every job it submits carries a name unique to the test and is cancelled by that name
afterwards, even when the test fails. Deselect them with `-m 'not slurm'` where there is no cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

pytestmark = pytest.mark.slurm

NODES = {"n1", "n2"}
GPUS_PER_NODE = 4
MAX_ARRAY_SIZE = 1001  # set explicitly by scripts/slurm_up.sh
# a test's own waits: a job may queue behind other tests' jobs on the two nodes, on a machine three times slower
TEST_BUDGET_S = 600
CLEANUP_WAIT_S = 10

T = TypeVar("T")

# Variables that sbatch/srun read as defaults (SBATCH_PARTITION, SLURM_JOB_ID of an enclosing job...)
# would change what these tests submit; only the config path is kept.
_SLURM_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
SLURM_ENV = {k: v for k, v in os.environ.items() if not k.startswith(_SLURM_ENV_PREFIXES) or k == "SLURM_CONF"}


def slurm(*args: str, timeout: float = 30) -> str:
    """Run a Slurm command; its stdout, or an AssertionError that shows stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=max(timeout, 1), env=SLURM_ENV)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


class Deadline:
    """A test's time budget: every wait in the test draws on it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.0)

    def wait_for(self, probe: Callable[[], T | None], what: str, interval: float = 0.2) -> T:
        """Poll `probe` until it returns something truthy; fail saying what was awaited when time runs out."""
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() >= self.end:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(min(interval, self.left()))


class Jobs:
    """Submits this test's jobs under one unique name, into tmp_path; cancels them all at the end."""

    def __init__(self, tmp_path: Path, deadline: Deadline) -> None:
        self.name = f"sftgrid-test-{uuid.uuid4().hex[:8]}"
        self.dir = tmp_path
        self.deadline = deadline

    def sbatch(self, *args: str, output: str = "%j.out") -> str:
        """Submit; the job's output goes to tmp_path/<output> (an sbatch filename pattern)."""
        out = slurm(
            "sbatch",
            "--parsable",
            f"--job-name={self.name}",
            f"--chdir={self.dir}",
            f"--output={self.dir / output}",
            *args,
            timeout=min(30, self.deadline.left()),
        )
        return out.strip().split(";")[0]  # "<id>[;<cluster>]"

    def srun(self, *args: str) -> str:
        return slurm("srun", f"--job-name={self.name}", f"--chdir={self.dir}", *args, timeout=self.deadline.left())

    def cancel_all(self) -> None:
        """scancel by name (it catches sruns killed by a timeout too), then wait a little for the queue."""
        subprocess.run(["scancel", f"--name={self.name}"], capture_output=True, timeout=15, env=SLURM_ENV)
        end = time.monotonic() + CLEANUP_WAIT_S
        while time.monotonic() < end:
            queued = subprocess.run(
                ["squeue", "-h", f"--name={self.name}"], capture_output=True, text=True, timeout=15, env=SLURM_ENV
            )
            if queued.returncode == 0 and not queued.stdout.strip():
                return
            time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def cluster_up() -> None:
    try:
        up = "is UP" in slurm("scontrol", "ping", timeout=15)
    except (OSError, AssertionError, subprocess.TimeoutExpired) as exc:
        up, why = False, str(exc)
    else:
        why = "scontrol ping: controller not UP"
    if not up:
        pytest.fail(
            f"no local Slurm cluster ({why.strip()}): run `make slurm-up` first, "
            "or deselect these tests with -m 'not slurm'",
            pytrace=False,
        )


@pytest.fixture
def deadline() -> Deadline:
    return Deadline(TEST_BUDGET_S)


@pytest.fixture
def jobs(tmp_path: Path, deadline: Deadline) -> Iterator[Jobs]:
    js = Jobs(tmp_path, deadline)
    try:
        yield js
    finally:
        js.cancel_all()


def sacct_states(job_id: str, *, duplicates: bool = False) -> dict[str, list[str]]:
    """Accounting states per job id (array tasks as `<id>_<i>`), oldest first; the first word only
    ("CANCELLED by 0" -> "CANCELLED"). With `duplicates`, a requeued job lists each of its runs."""
    args = ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State"]
    if duplicates:
        args.append("--duplicates")
    states: dict[str, list[str]] = {}
    for line in slurm(*args).splitlines():
        jid, _, state = line.partition("|")
        if jid:
            states.setdefault(jid, []).append(state.split()[0] if state.strip() else "")
    return states


FINAL_BAD = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def completed(job_id: str, expected_ids: set[str]) -> Callable[[], bool]:
    """A probe: True once every expected job id is COMPLETED in sacct; fails at once on a bad final state."""

    def probe() -> bool:
        states = {jid: s[-1] for jid, s in sacct_states(job_id).items()}
        bad = {jid: s for jid, s in states.items() if s in FINAL_BAD}
        assert not bad, f"job {job_id} ended badly: {bad}"
        return set(states) == expected_ids and all(s == "COMPLETED" for s in states.values())

    return probe


@pytest.mark.whole_cluster  # no other test's job on the nodes
def test_two_idle_nodes_with_four_gpus_each(deadline: Deadline) -> None:
    expected = {f"{n}|idle|gpu:{GPUS_PER_NODE}" for n in NODES}
    seen: list[set[str]] = []

    def nodes() -> bool:
        # One line per node and partition: the set folds the partitions together.
        seen.append(set(slurm("sinfo", "-h", "-N", "-o", "%N|%t|%G").split()))
        return seen[-1] == expected

    try:
        deadline.wait_for(nodes, "both nodes idle with their GPUs")
    except AssertionError:
        raise AssertionError(f"sinfo shows {seen[-1] if seen else 'nothing'}, expected {expected}") from None


def test_batch_job_completes_in_sacct(jobs: Jobs, deadline: Deadline) -> None:
    job = jobs.sbatch("--wrap", 'echo "hello from $SLURMD_NODENAME"')
    deadline.wait_for(completed(job, {job}), f"job {job} COMPLETED in sacct")
    words = (jobs.dir / f"{job}.out").read_text().split()
    assert words[:2] == ["hello", "from"] and words[2] in NODES


def test_srun_runs_one_task_on_each_node(jobs: Jobs) -> None:
    out = jobs.srun("-N2", "--ntasks-per-node=1", "bash", "-c", 'echo "$SLURMD_NODENAME $(hostname)"')
    lines = [line.split() for line in out.splitlines()]
    assert sorted(node for node, _ in lines) == sorted(NODES)
    # Both virtual nodes are this machine.
    assert {host for _, host in lines} == {socket.gethostname()}


def test_array_job_runs_four_tasks(jobs: Jobs, deadline: Deadline) -> None:
    job = jobs.sbatch("--array=0-3", "--wrap", 'echo "$SLURM_ARRAY_TASK_ID"', output="%A_%a.out")
    tasks = {f"{job}_{i}" for i in range(4)}
    deadline.wait_for(completed(job, tasks), f"array {job} tasks 0-3 COMPLETED in sacct")
    outputs = {int(p.read_text()) for p in jobs.dir.glob(f"{job}_*.out")}
    assert outputs == {0, 1, 2, 3}


def test_config_reports_max_array_size() -> None:
    config = dict(line.split("=", 1) for line in slurm("scontrol", "show", "config").splitlines() if " = " in line)
    config = {k.strip(): v.strip() for k, v in config.items()}
    assert config["MaxArraySize"] == str(MAX_ARRAY_SIZE)
