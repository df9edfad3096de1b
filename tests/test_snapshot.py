"""The code a queued job runs is the commit its grid was launched from (sft_grid/sites/snapshot.py).

Fast: a checkout's uncommitted changes found and refused (or shipped and recorded), the plan pinned to the snapshot
(sbatch --chdir and PYTHONPATH, launch.sh naming the snapshot's package), the snapshot extracted once. The real
Slurm run (a commit after submission changes no queued cell): tests/test_snapshot_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid.core.paths import PACKAGE_DIR, REPO_ROOT
from sft_grid.core.problems import GridError
from sft_grid.core.state import CellState, State
from sft_grid.grid.decide import Action, Decision
from sft_grid.grid.jobs import build
from sft_grid.grid.render import render
from sft_grid.schedulers import slurm
from sft_grid.sites import snapshot
from sft_grid.sites.snapshot import DECIDING, MARKER, SHIP_ENV


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def make_checkout(dest: Path) -> Path:
    """A git checkout of this project's deciding paths as they are in this working tree, committed once (the
    user's local clone)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z", "--", *DECIDING],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for rel in filter(None, listed):
        source = REPO_ROOT / rel
        if source.is_symlink():  # a link in git is kept a link
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(os.readlink(source))
        elif source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "the grid's code")
    return dest


def commit_all(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return git(root, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkout(tmp_path_factory.mktemp("checkout"))


@pytest.fixture
def clean(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The module's checkout with nothing uncommitted (each test's edits undone), shipping not asked."""
    git(checkout, "checkout", "-q", "--", ".")
    git(checkout, "clean", "-q", "-fdx", "--", *DECIDING)
    monkeypatch.delenv(SHIP_ENV, raising=False)
    return checkout


def slurm_cells(make_cells, *extra: str):
    return make_cells(["model=tiny_llama", "cluster=slurm_local", *extra])


def test_a_clean_checkout_is_snapshotted_by_its_commit(clean, make_cells):
    (cell,) = slurm_cells(make_cells)
    code = snapshot.find([cell], dry_run=False, root=clean)
    head = git(clean, "rev-parse", "HEAD").strip()
    assert code is not None and code.commit == head and code.key == head
    assert code.dir == cell.runs_root / ".code" / head and not code.shipped


def test_local_cells_need_no_snapshot(clean, make_cells):
    (cell,) = make_cells(["model=tiny_llama"])
    (clean / "sft_grid" / "conf" / "scratch.yaml").write_text("x: 1\n")
    assert snapshot.find([cell], dry_run=False, root=clean) is None


def test_uncommitted_and_untracked_changes_are_refused_naming_the_files(clean, make_cells):
    (cell,) = slurm_cells(make_cells)
    (clean / "sft_grid" / "job" / "entries.py").write_text("# edited\n")
    (clean / "sft_grid" / "conf" / "sweep" / "mine.yaml").write_text("# @package _global_\nsweep_name: mine\n")
    (clean / "README.md").write_text("not a deciding path\n")
    with pytest.raises(GridError) as raised:
        snapshot.find([cell], dry_run=False, root=clean)
    text = str(raised.value)
    assert "sft_grid/job/entries.py" in text and "sft_grid/conf/sweep/mine.yaml" in text and "README.md" not in text
    assert "ship_dirty=true" in text and "commit" in text
    # a dry run queues nothing: it names the commit instead of refusing
    code = snapshot.find([cell], dry_run=True, root=clean)
    assert code is not None and not code.shipped


@pytest.mark.parametrize(
    ("said", "ships"), [("1", True), ("yes", True), ("0", False), ("false", False), ("off", False)]
)
def test_the_ship_variable_says_yes_or_no_and_anything_else_is_refused(clean, make_cells, monkeypatch, said, ships):
    """SFT_GRID_SHIP_DIRTY=false once shipped the changes (any value but "" and "0" did): its words are read as
    said, and a value that says neither is refused, in a dry run too."""
    (cell,) = slurm_cells(make_cells)
    (clean / "sft_grid" / "job" / "entries.py").write_text("# edited\n")
    monkeypatch.setenv(SHIP_ENV, said)
    if ships:
        code = snapshot.find([cell], dry_run=False, root=clean)
        assert code is not None and code.shipped == ("sft_grid/job/entries.py",)
    else:
        with pytest.raises(GridError, match="uncommitted or untracked changes"):
            snapshot.find([cell], dry_run=False, root=clean)
    monkeypatch.setenv(SHIP_ENV, "maybe")
    for dry_run in (False, True):
        with pytest.raises(GridError) as raised:
            snapshot.find([cell], dry_run=dry_run, root=clean)
        text = str(raised.value)
        assert f"{SHIP_ENV}='maybe': is neither yes nor no" in text and f"export {SHIP_ENV}=1" in text, text


def test_shipped_changes_get_their_own_key_and_are_recorded(clean, make_cells):
    (cell,) = slurm_cells(make_cells, "ship_dirty=true")
    (clean / "sft_grid" / "job" / "entries.py").write_text("# edited\n")
    (clean / "sft_grid" / "conf" / "model" / "tiny_llama.yaml").unlink()
    code = snapshot.find([cell], dry_run=False, root=clean)
    head = git(clean, "rev-parse", "HEAD").strip()
    assert code is not None and code.commit == head and code.key.startswith(head + "-")
    assert code.shipped == ("sft_grid/conf/model/tiny_llama.yaml", "sft_grid/job/entries.py")
    assert code.record()["shipped"] == list(code.shipped) and len(code.shipped_sha) == 64
    # another edit: another snapshot
    (clean / "sft_grid" / "job" / "entries.py").write_text("# edited again\n")
    again = snapshot.find([cell], dry_run=False, root=clean)
    assert again is not None and again.key != code.key
    # extracted: the shipped file as edited, the deleted one absent, the rest as committed
    assert snapshot.materialize(again)
    assert (again.dir / "sft_grid" / "job" / "entries.py").read_text() == "# edited again\n"
    assert not (again.dir / "sft_grid" / "conf" / "model" / "tiny_llama.yaml").exists()
    assert (again.dir / "sft_grid" / "conf" / "model" / "tiny_qwen3.yaml").is_file()
    assert json.loads((again.dir / MARKER).read_text())["shipped"] == list(again.shipped)


def test_the_snapshot_is_extracted_once_and_is_the_commit_not_the_working_tree(clean, make_cells):
    (cell,) = slurm_cells(make_cells)
    code = snapshot.find([cell], dry_run=False, root=clean)
    assert code is not None
    assert snapshot.materialize(code) is True
    entries = code.dir / "sft_grid" / "job" / "entries.py"
    assert entries.read_text() == (clean / "sft_grid" / "job" / "entries.py").read_text()
    # the checkout moves on: the snapshot of the first commit stays what it was, and is not extracted again
    (clean / "sft_grid" / "job" / "entries.py").write_text("# a later commit\n")
    later = commit_all(clean, "later")
    assert snapshot.materialize(code) is False
    assert entries.read_text() != "# a later commit\n"
    assert not list(code.dir.parent.glob(".incoming.*"))
    # its package imports on its own: the jobs' python finds sft_grid there first
    out = subprocess.run(
        [sys.executable, "-c", "import sft_grid.job.entries as e; print(e.__file__)"],
        cwd=code.dir,
        env={**os.environ, "PYTHONPATH": str(code.dir)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == str(entries)
    git(clean, "reset", "-q", "--hard", "HEAD~1")
    assert later


def test_the_plan_runs_the_snapshot_not_the_checkout(make_cells, tmp_path):
    cells = make_cells(*[["model=tiny_llama", f"seed={s}", "cluster=slurm_local"] for s in (1, 2)])
    decisions = [
        Decision(cell=c, dir=c.sweep_dir / c.name, state=CellState(state=State.PLANNED), action=Action.RUN)
        for c in cells
    ]
    writes = [render(d.cell, d.dir, []) for d in decisions]
    plan = build(decisions, {}, None, 1001, writes=writes, provenance={d.dir: {"sft_grid": "x"} for d in decisions})
    code = snapshot.CodeSnapshot("a" * 40, "a" * 40, tmp_path / ".code" / ("a" * 40), REPO_ROOT)
    pinned = snapshot.pin(plan, code)
    assert pinned.code == code
    for job in pinned.slurm:
        script = slurm.sbatch_script(job, None)
        assert f"#SBATCH --chdir={code.dir}" in script
        assert f"export PYTHONPATH={code.dir}${{PYTHONPATH:+:$PYTHONPATH}}" in script
    for files in pinned.writes:
        launch = str(files.files["launch.sh"])
        assert str(code.dir / "sft_grid" / "in_venv") in launch and str(PACKAGE_DIR) + "/" not in launch
    for d in decisions:
        assert pinned.provenance[d.dir]["code"] == {"commit": "a" * 40, "snapshot": str(code.dir)}
    # the names of its jobs are the plan's: a dry run and the real run name them alike
    assert [j.name for j in pinned.slurm] == [j.name for j in plan.slurm]
    assert snapshot.pin(plan, None) is plan


def test_a_launch_from_a_dirty_checkout_is_refused_before_anything_is_written(clean, tmp_path):
    """`python -m sft_grid` run from the user's checkout (its own package imported) with an edited runner."""
    runner = clean / "sft_grid" / "job" / "runner.py"
    runner.write_text(runner.read_text() + "# edited\n")
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(clean)}
    env.pop(SHIP_ENV, None)
    argv = [sys.executable, "-m", "sft_grid", "model=tiny_llama", "cluster=slurm_local", f"runs_root={runs}"]
    proc = subprocess.run(argv, cwd=clean, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "sft_grid/job/runner.py" in out and "ship_dirty=true" in out, out
    assert not runs.exists() or not any(runs.rglob("*")), sorted(runs.rglob("*"))
