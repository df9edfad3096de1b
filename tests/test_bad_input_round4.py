"""Bad input, fourth round: what a tester found crashing with a traceback instead of being refused. A typo in the
layout (`layout.offload=cpu`), a runs root on the kernel's file systems (/proc, /sys, where root's os.access says
yes), the wrong kind of file in the runs tree (a file where a directory goes, a directory where a file goes), a
shipped config file that is not YAML, and `SFT_GRID_RUNS=` set but empty. Each is refused in one clear problem,
naming the key or the path, the value and the fix, before anything is written."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sft_grid.core import project
from sft_grid.planning.validate import validate

from .conftest import REPO_ROOT, run_sft


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, f"not one {rule} problem in {[p.render() for p in problems]}"
    return found[0]


def tree(root: Path) -> list[tuple[str, int]]:
    """What is under root (names, sizes, -1 for a directory): a refused run leaves it as it was."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def refused(proc: subprocess.CompletedProcess[str], *says: str, rc: int = 1) -> str:
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr
    for text in says:
        assert text in proc.stderr, proc.stderr
    return proc.stderr


# -- a typo in the layout: the value rule, not a crash in the layout chooser ----------------------------------

LAYOUT_TYPOS = {
    "layout.offload": ("cpu", "use one of auto, none, optimizer, all"),
    "layout.sharding": ("zero9", "use one of auto, none, zero2, zero3 (did you mean 'zero3'?)"),
}


@pytest.mark.parametrize("cluster", ["local", "slurm_local"])
@pytest.mark.parametrize("key", sorted(LAYOUT_TYPOS))
def test_a_layout_typo_is_refused_as_a_value_on_every_cluster(make_cells, key, cluster):
    """The layout is chosen while the other rules run (a batch that divides reads the chosen nodes); a value the
    chooser does not know is chosen as auto there, so the schema's value rule is what the user reads, alone."""
    value, fix = LAYOUT_TYPOS[key]
    (cell,) = make_cells([f"cluster={cluster}", f"{key}={value}"])
    problems = validate([cell])
    p = only(problems, "choice")
    assert p.key == key and p.value == value and p.fix == fix
    assert len(problems) == 1, [q.render() for q in problems]


def test_a_layout_typo_stops_the_command_in_one_problem(tmp_path):
    runs = tmp_path / "runs"
    proc = run_sft("-m", "layout.offload=cpu", "layout.sharding=zero9", "dry_run=true", f"runs_root={runs}")
    refused(proc, "layout.offload='cpu': not a value", "layout.sharding='zero9': not a value", "use one of")
    assert not runs.exists()


# -- a runs root on the kernel's file systems -----------------------------------------------------------------


def _mounted(path: str, fstype: str) -> bool:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if fields[4] == path and fields[fields.index("-") + 1] == fstype:
            return True
    return False


@pytest.mark.parametrize(
    "root, fstype",
    [("/sys/nope", "sysfs"), ("/proc/nope", "proc"), ("/sys/kernel/nope", "sysfs"), ("/sys/kernel", "sysfs")],
)
def test_a_runs_root_on_the_kernels_file_systems_is_refused(make_cells, root, fstype):
    """As root, os.access says every directory there is writable; mkdir then fails (EPERM under /sys, ENOENT under
    /proc) in the grid's lock, after the checks."""
    top = "/" + root.split("/")[1]
    if not _mounted(top, fstype):
        pytest.skip(f"{top} is not {fstype} here")
    (cell,) = make_cells([f"runs_root={root}"])
    p = only(validate([cell]), "runs-root")
    assert p.key == "runs_root" and p.value == root
    assert f"on the kernel's {fstype} file system" in p.message and "runs_root=" in p.fix


def test_a_runs_root_under_sys_stops_the_command_in_one_problem():
    if not _mounted("/sys", "sysfs"):
        pytest.skip("/sys is not sysfs here")
    proc = run_sft("-m", "runs_root=/sys/nope", "dry_run=true")
    refused(proc, "runs_root='/sys/nope'", "/sys is on the kernel's sysfs file system", "fix: runs_root=")
    assert not Path("/sys/nope").exists()


def test_a_runs_root_on_an_ordinary_directory_passes(make_cells, tmp_path):
    (cell,) = make_cells([f"runs_root={tmp_path / 'runs'}"])
    assert "runs-root" not in {p.rule for p in validate([cell])}


# -- the wrong kind of file in the runs tree ------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_cell(tmp_path_factory) -> str:
    """The default cell's directory name, as a dry run writes it."""
    runs = tmp_path_factory.mktemp("default") / "runs"
    run_sft("-m", "dry_run=true", f"runs_root={runs}", check=True)
    (cell_dir,) = (runs / "default").iterdir()
    return cell_dir.name


def _file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory")


@pytest.mark.parametrize(
    "where, make, what",
    [
        ("default", _file, "a file, where the grid's directory"),
        ("default/{cell}", _file, "a file, where the cell's directory goes"),
        ("default/{cell}/cell.yaml", Path.mkdir, "a directory, where the cell's cell.yaml goes"),
        ("default/{cell}/events.jsonl", Path.mkdir, "a directory, where the cell's events.jsonl goes"),
        ("default/{cell}/launch.sh", Path.mkdir, "a directory, where the cell's launch.sh goes"),
        # a backend's own file: only its rendering names it, checked before the first file is written
        ("default/{cell}/train_config.yaml", Path.mkdir, "a directory, where the cell's train_config.yaml goes"),
        ("default/.sft_grid.lock", Path.mkdir, "a directory, where the grid's lock file goes"),
    ],
    ids=["sweep-is-a-file", "cell-is-a-file", "cell-yaml", "ledger", "launch", "backend-config", "lock"],
)
def test_the_wrong_kind_of_file_in_the_runs_tree_is_refused_before_anything_is_written(
    tmp_path, default_cell, where, make, what
):
    runs = tmp_path / "runs"
    path = runs / where.format(cell=default_cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    before = tree(tmp_path)
    proc = run_sft("-m", "dry_run=true", f"runs_root={runs}")
    err = refused(proc, f"{path} is {what}", "[runs-tree]", f"fix: move it away or remove it (rm -r {path})")
    assert err.count("[runs-tree]") == 1 and "1 problem(s)" in err, err
    assert tree(tmp_path) == before  # no launch.sh, no stray .cell.yaml.<pid>.tmp, no lock left


# -- a shipped config file that is not YAML -------------------------------------------------------------------

HEADER = "# @package _global_\n"
BROKEN_YAML = {
    "syntax": (HEADER + "sweep_name: x\nlr: [1e-5, 2e-5\nseed: 3\n", ":4:5: not valid YAML: expected ',' or ']'"),
    "tab": (HEADER + "sweep_name: x\nhydra:\n\tsweeper: {}\n", ":4:1: not valid YAML: found character '\\t'"),
    "duplicate": (HEADER + "sweep_name: x\nlr: 1e-5\nseed: 1\nlr: 2e-5\n", ":5:1: not valid YAML: found duplicate"),
}


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    """sft_grid and its Hydra plugins copied, so that a broken file is added to the shipped configs (package data,
    pkg://sft_grid.conf) without writing into the package under test."""
    root = tmp_path_factory.mktemp("package")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("sft_grid", "hydra_plugins"):
        shutil.copytree(REPO_ROOT / name, root / name, ignore=skip)
    return root


@pytest.mark.parametrize("kind", sorted(BROKEN_YAML))
def test_a_shipped_sweep_file_that_is_not_yaml_is_one_line_too(tmp_path, package_copy, kind):
    text, says = BROKEN_YAML[kind]
    broken = package_copy / "sft_grid" / "conf" / "sweep" / f"broken_{kind}.yaml"
    broken.write_text(text)
    try:
        work = tmp_path / "work"  # outside the repository: `python -m` imports the copy, not the checkout
        work.mkdir()
        proc = run_sft("-m", f"+sweep=broken_{kind}", "dry_run=true", cwd=work, env={"PYTHONPATH": str(package_copy)})
    finally:
        broken.unlink()
    err = refused(proc, f"{broken}{says}")
    assert len(err.strip().splitlines()) == 1, err
    assert list(work.iterdir()) == []


def test_a_shipped_group_file_that_is_not_yaml_is_one_line(tmp_path, package_copy):
    broken = package_copy / "sft_grid" / "conf" / "model" / "broken.yaml"
    broken.write_text("name: broken\npath: /models/x\nname: other\n")
    try:
        work = tmp_path / "work"
        work.mkdir()
        for models in ("broken", "tiny_llama,broken"):  # the first cell (Hydra) and a later one (the grid composer)
            proc = run_sft("-m", f"model={models}", "dry_run=true", cwd=work, env={"PYTHONPATH": str(package_copy)})
            refused(proc, f"{broken}:3:1: not valid YAML: found duplicate key name", "keep one of the two entries")
    finally:
        broken.unlink()
    assert list(work.iterdir()) == []


# -- SFT_GRID_RUNS set but empty --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_runs_variable_is_named_empty_and_nothing_is_written(tmp_path, value):
    """Read as a path it is the working directory: the grid's cells straight in it, `status` looking in ./runs."""
    says = ("environment variable SFT_GRID_RUNS is empty", "unset SFT_GRID_RUNS", "export SFT_GRID_RUNS=")
    for argv in (["run", "-m", "dry_run=true"], ["-m", "dry_run=true"], ["status", "default"]):
        proc = run_sft(*argv, cwd=tmp_path, env={"SFT_GRID_RUNS": value})
        err = refused(proc, *says, rc=2)
        assert len(err.strip().splitlines()) == 1, err
        assert list(tmp_path.iterdir()) == []


def test_the_default_runs_root_refuses_an_empty_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("SFT_GRID_RUNS", "")
    with pytest.raises(project.ProjectError, match="SFT_GRID_RUNS is empty"):
        project.default_runs(tmp_path)
    monkeypatch.setenv("SFT_GRID_RUNS", str(tmp_path / "runs"))
    assert project.default_runs(tmp_path) == tmp_path / "runs"
    monkeypatch.delenv("SFT_GRID_RUNS")
    assert project.default_runs(tmp_path) == project.runs_base(tmp_path) / "runs"
