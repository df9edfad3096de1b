"""Shared fixtures, and how the backend/Slurm set runs on two workers (tests/README.md: the suite's shape).

Tests marked `backend` use a real backend's virtual environment or the tiny local assets (built on first use by
project code: `sft-grid venv build llamafactory`, `sft-grid assets build`; the tiny models
are written by LLaMA-Factory's environment). A test that asks for the `tiny_assets` or `axolotl_env` fixture is
marked `backend` here, whatever its file says, so the fast set
(`-m "not backend and not slurm and not mirror and not proxy"`) never builds a virtual environment. Everything else
is pure or reads only small local files.

Two workers (pytest-xdist, `--dist loadgroup`) share the machine and its local Slurm cluster:
- a test marked `slurm` holds the cluster shared: its jobs carry names of their own (content hashes of cells
  under the test's own runs root), so two such tests do not see each other's jobs;
- a test marked `whole_cluster` holds it alone (a node set down, preemption, an idle cluster expected): it waits
  for the shared holders to finish, and they wait for it. The lock is a file outside the run (CLUSTER_LOCK), so
  two test runs on one machine take turns too;
- what is expensive and read-only is built once per run, whatever the number of workers (`built_once`): the
  first worker that needs it builds it under a lock, the others wait for it and read it;
- tests that share a module-scoped fixture are one `xdist_group` (the group runs on one worker, in order);
- the tests that mostly wait (those that take the cluster alone, then the time-limit grids, which hold it shared
  while their legs run, minutes, then the sites tests on the two clusters) are one group (WAITING), collected
  first: one worker runs them, in that order, while the other runs first the tests that need no cluster, then the
  Slurm tests; so no test waits long for the cluster, no wait runs beside another, and a lock is never held across
  tests by a worker that could ask for it alone later (xdist keeps this order with `--no-loadscope-reorder`: its
  default sorts groups by their number of tests);
- the heaviest tests are collected first (HEAVY_FIRST), so the two workers end close together.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from sft_grid.core.paths import PACKAGE_CONF, REPO_ROOT
from sft_grid.planning.cells import Cell, plan_cell
from sft_grid.planning.compose import GridComposer
from sft_grid.planning.resolvers import register

register()
# Slurm grids queue a snapshot of the checkout's commit and refuse a checkout with uncommitted changes
# (sft_grid/sites/snapshot.py): the suite runs from working trees being edited, so its grids ship the changes (a
# clean clone, as CI's, ships nothing); tests/test_snapshot.py unsets it to see the refusal
os.environ.setdefault("SFT_GRID_SHIP_DIRTY", "1")


# The files whose tests take longest, heaviest first (measured: `make test` prints the 25 slowest): collected
# first, so that neither worker is left with a long test at the end. Order only; a file missing here runs after.
HEAVY_FIRST = (
    "test_time_limits.py",
    "test_eval_grid.py",
    "test_axolotl.py",
    "test_post.py",
    "test_report_tiny_grid.py",
    "test_delphi.py",
    "test_train.py",
    "test_tokenize_train.py",
    "test_triage_faults.py",
    "test_slurm_faults.py",
    "test_stage_offline.py",
    "test_stage_train.py",
    "test_slurm.py",
    "test_sites_remote.py",
)
# One lock file for the machine's local Slurm cluster, shared by every test run on it.
CLUSTER_LOCK = Path(os.environ.get("SFT_GRID_TEST_CLUSTER_LOCK", "/tmp/sft_grid-tests-slurm-cluster.lock"))


# the groups whose tests mostly wait: on the cluster alone (preemption, idle nodes expected, a node set down), on
# a time limit's legs, on the second cluster's controller stopped and started, on an ssh connection gone silent. One
# worker runs them all in a row (xdist names a test with several groups by all of them: one group), the whole_cluster
# tests first, while the other runs the CPU-bound tests: a wait beside a wait leaves a core idle (CI's timeline: 15%
# of the set idle while the sites tests waited beside the Slurm tests' own waits, at the end)
WAITING = ("cluster_alone", "sites_remote")


@pytest.hookimpl(tryfirst=True)  # before xdist's own (its workers name a test's group from its marks, in theirs)
def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if {"tiny_assets", "axolotl_env"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.backend)
        if item.get_closest_marker("whole_cluster"):
            item.add_marker(pytest.mark.slurm)
            if not _groups(item):
                item.add_marker(pytest.mark.xdist_group("cluster_alone"))
        if _groups(item) & set(WAITING):
            for name in set(WAITING) - _groups(item):
                item.add_marker(pytest.mark.xdist_group(name))
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    on_slurm = {_group(item) for item in items if item.get_closest_marker("slurm")} - {None}

    def order(item: Any) -> tuple[int, int, int]:
        # the waiting tests, whole_cluster first (one worker runs them, in this order, xdist given
        # --no-loadscope-reorder); meanwhile the other worker runs what needs no cluster, then the Slurm tests that
        # share it: so neither waits long for the cluster's lock, and no wait runs beside another
        group = _group(item)
        if _groups(item) & set(WAITING):
            first = 0 if item.get_closest_marker("whole_cluster") else 1
        else:
            first = 3 if item.get_closest_marker("slurm") or group in on_slurm else 2
        # among the rest, a group first: one worker runs it end to end, so started early it does not end last
        return first, 0 if group else 1, rank.get(Path(str(item.fspath)).name, len(rank))

    items.sort(key=order)  # stable: the order within a file is kept


def _groups(item: Any) -> set[str]:
    return {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}


def _group(item: Any) -> str | None:
    """The test's xdist group as xdist names it (several groups: their names joined); None: none."""
    return "_".join(sorted(_groups(item))) or None


@contextmanager
def holding_cluster(alone: bool) -> Iterator[None]:
    """Hold the local Slurm cluster: shared with other tests that queue only their own jobs, or alone."""
    CLUSTER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(CLUSTER_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True)
def _cluster_hold(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every Slurm test holds the cluster while it runs (module fixtures that queue jobs hold it themselves)."""
    if request.node.get_closest_marker("whole_cluster"):
        with holding_cluster(alone=True):
            yield
    elif request.node.get_closest_marker("slurm"):
        with holding_cluster(alone=False):
            yield
    else:
        yield


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this test run shares (one run's workers have one parent basetemp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(run_dir: Path, name: str, build: Callable[[Path], None]) -> Path:
    """`<run_dir>/<name>`, built by `build(directory)` once per test run, whatever the number of workers: the first
    worker to ask builds it under a lock; the others wait for it, then read it. A failed build is built again by the
    next one to ask (and fails again, saying why, in that test too)."""
    target = run_dir / name
    with open(run_dir / f".{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if not (target / ".built").is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / ".built").write_text(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "")}))
    return target


@pytest.fixture
def hydra_loader() -> Iterator[Any]:
    """Hydra initialised on conf/, as `python -m sft_grid` sees it; yields its config loader."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base=None):
        yield GlobalHydra.instance().config_loader()
    GlobalHydra.instance().clear()


def hydra_plain(overrides: Sequence[str]) -> dict[str, Any]:
    """What stock `hydra.compose` gives for these overrides, resolved, without the hydra node."""
    return cast(
        dict[str, Any], OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)
    )


@pytest.fixture
def make_cells(hydra_loader: Any, tmp_path: Path):
    """Compose and plan cells from override lists (runs_root in a tmp dir unless given)."""

    def make(*cells: Sequence[str]) -> list[Cell]:
        composer = GridComposer(hydra_loader, "config")
        composed, errors = composer.compose_all(
            [
                [*c] if any(o.startswith("runs_root=") for o in c) else [*c, f"runs_root={tmp_path / 'runs'}"]
                for c in cells
            ]
        )
        assert not errors, [e.message for e in errors]
        return [plan_cell(c.overrides, c.config) for c in composed]

    return make


def run_sft(
    *args: str, cwd: Path | None = None, check: bool = False, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m sft_grid <args>` as a user runs it (with `env` added to this process's environment)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", *args],
        cwd=cwd or REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"sft_grid {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def no_backend_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No backend environment on this machine (an empty sft_grid cache, as on a login node that has none): the checks
    that run in one wait for the job. Tests of staging use it; they start no backend."""
    monkeypatch.setenv("SFT_GRID_CACHE", str(tmp_path / "no-environments"))


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    from sft_grid.stages import tiny_assets
    from sft_grid.stages.venv_build import build

    build("llamafactory")
    return tiny_assets.build()


@pytest.fixture(scope="session")
def axolotl_env(tiny_assets: Path) -> Path:
    """The managed axolotl environment (built on first use, about 3-5 minutes), with the tiny tiny_assets."""
    from sft_grid.stages.venv_build import build

    return build("axolotl")


# One axolotl grid trained for every test that reads what such a grid leaves (tests/test_axolotl.py,
# tests/test_tokenize_train.py): an interleaved mix of the two tiny datasets (axolotl cannot interleave: the grid's
# tokenize job writes the mix, then `axolotl preprocess`), two cells that share one tokenization, checkpoints every
# 4 of 8 steps, a constant lr (the lr=1e-3 cell is the parity test's axolotl side). Each axolotl process costs
# about 27 s of imports on 2 cores: this grid is trained once per run.
AXOLOTL_MIX = [
    "backend=axolotl",
    "model=tiny_llama",
    "dataset=[tiny_messages,tiny_sharegpt]",
    "mix.strategy=interleave_under",
    "mix.probs=[0.7,0.3]",
    "global_batch_size=4",
    "micro_batch_size=2",
    "cutoff_len=128",
    "max_steps=8",
    "save_steps=4",
    "scheduler=constant",
]
AXOLOTL_MIX_LRS = "lr=1e-3,5e-4"


@dataclass(frozen=True)
class TrainedGrid:
    root: Path  # the runs root
    first: str  # what the command that trained it printed
    again: str  # what the same command printed when run again


@pytest.fixture(scope="session")
def axolotl_mix_grid(run_dir: Path, axolotl_env: Path) -> TrainedGrid:
    def build(target: Path) -> None:
        args = ["-m", *AXOLOTL_MIX, AXOLOTL_MIX_LRS, f"runs_root={target / 'runs'}"]
        (target / "first.out").write_text(run_sft(*args, check=True, timeout=1800).stdout)
        (target / "again.out").write_text(run_sft(*args, check=True).stdout)

    built = built_once(run_dir, "axolotl_mix_grid", build)
    return TrainedGrid(built / "runs", (built / "first.out").read_text(), (built / "again.out").read_text())


@pytest.fixture
def runs_root(tmp_path: Path, tiny_assets: Path) -> Iterator[Path]:
    """A test's runs_root on the local Slurm cluster; afterwards every array its cells name is cancelled."""
    from .helpers import cancel_jobs_of

    root = tmp_path / "runs"
    root.mkdir()
    try:
        yield root
    finally:
        cancel_jobs_of(root)


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/receiver.py), shut down after the test."""
    from .receiver import Receiver

    r = Receiver()
    yield r
    r.close()
