"""The team's own repository: where its configs are found (sft_grid/core/project.py), what `init` and `cp` lay out,
and the one-line refusals when a project cannot be used. The installed wheel's run from such a repository is
tests/test_wheel.py; these run this checkout's `python -m sft_grid`, as a user would, from temporary repositories."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sft_grid.core import project
from sft_grid.core.paths import PACKAGE_CONF

from .conftest import run_sft


def repo(tmp_path: Path, *files: str, project_file: str | None = None) -> Path:
    root = tmp_path / "team"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text((PACKAGE_CONF / "model" / "tiny_llama.yaml").read_text().replace("tiny_llama", "ours"))
    if project_file is not None:
        (root / project.PROJECT_FILE).write_text(project_file)
    return root


def test_a_conf_folder_with_groups_makes_a_project_found_from_below_it(tmp_path, monkeypatch):
    monkeypatch.delenv(project.CONF_ENV, raising=False)
    root = repo(tmp_path, "conf/model/ours.yaml")
    (root / "deep" / "er").mkdir(parents=True)
    found = project.find(root / "deep" / "er")
    assert found is not None and found.root == root and found.conf == root / "conf"
    assert project.find_option("model", "ours", root / "deep") == root / "conf" / "model" / "ours.yaml"
    assert project.find_option("model", "tiny_llama", root) == PACKAGE_CONF / "model" / "tiny_llama.yaml"
    assert {"ours", "tiny_llama"} <= set(project.options("model", root))
    assert project.runs_base(root / "deep") == root


def test_the_search_stops_at_the_repository_root_and_at_folders_without_groups(tmp_path, monkeypatch):
    monkeypatch.delenv(project.CONF_ENV, raising=False)
    outer = repo(tmp_path, "conf/model/ours.yaml")
    inner = outer / "vendored"
    subprocess.run(["git", "init", "-q", str(inner)], check=True)
    assert project.find(inner) is None  # another repository: the outer project is not its
    (inner / "conf" / "notes").mkdir(parents=True)
    assert project.find(inner) is None  # a conf/ without any group is not a config folder


def test_the_project_file_names_the_config_folder_and_env_folders_come_first(tmp_path, monkeypatch):
    root = repo(tmp_path, "configs/model/ours.yaml", project_file="conf: configs\n")
    extra = tmp_path / "shared"
    (extra / "model").mkdir(parents=True)
    (extra / "model" / "ours.yaml").write_text("name: shared\n")
    monkeypatch.setenv(project.CONF_ENV, str(extra))
    assert project.user_dirs(root) == [extra, root / "configs"]
    assert project.find_option("model", "ours", root) == extra / "model" / "ours.yaml"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("conf: [a, b]\n", "is not a folder"),
        ("conf: nowhere\n", "is not a folder; create it"),
        ("conf: conf\nruns: elsewhere\n", "unknown key(s) runs"),
        ("- conf\n", "expected a mapping"),
        ("conf: {unclosed\n", "not readable as YAML"),
    ],
)
def test_a_project_file_that_cannot_be_used_is_refused_in_one_line_before_anything(tmp_path, text, said):
    root = repo(tmp_path, "conf/model/ours.yaml", project_file=text)
    for args in (["-m", "model=ours", "dry_run=true"], ["status", "g"]):
        proc = run_sft(*args, cwd=root)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and said in lines[0] and project.PROJECT_FILE in lines[0], proc.stderr
    assert not (root / "runs").exists()


def test_config_dir_joins_the_teams_folders_and_the_rerun_line_carries_it(tmp_path):
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "ours.yaml").write_text(
        (PACKAGE_CONF / "model" / "tiny_llama.yaml").read_text().replace("name: tiny_llama", "name: ours")
    )
    runs = tmp_path / "runs"
    for flag in (["--config-dir", str(mine)], [f"--config-dir={mine}"], ["-cd", str(mine)]):
        proc = run_sft(*flag, "model=ours", "dry_run=true", f"runs_root={runs}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    (cell,) = runs.glob("default/*/cell.yaml")
    assert f"# Rerun this cell: SFT_GRID_CONF={mine} python -m sft_grid model=ours" in cell.read_text()
    missing = run_sft("--config-dir", str(tmp_path / "nope"), "model=ours", "dry_run=true", cwd=tmp_path)
    assert missing.returncode != 0 and "is not a folder" in missing.stderr


def test_hydra_searchpath_still_adds_a_folder_after_the_shipped_ones(tmp_path):
    mine = tmp_path / "mine"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "tiny_llama.yaml").write_text("name: shadowed\n")  # the shipped option of this name wins
    (mine / "model" / "ours.yaml").write_text(
        (PACKAGE_CONF / "model" / "tiny_llama.yaml").read_text().replace("name: tiny_llama", "name: ours")
    )
    path = f"hydra.searchpath=[file://{mine}]"
    shipped = run_sft("--cfg", "job", path, cwd=tmp_path)
    assert shipped.returncode == 0 and "name: tiny_llama" in shipped.stdout
    ours = run_sft("--cfg", "job", "model=ours", path, cwd=tmp_path)
    assert ours.returncode == 0 and "name: ours" in ours.stdout


def test_init_lays_out_a_repository_once_and_keeps_what_is_there(tmp_path):
    root = tmp_path / "exp"
    root.mkdir()
    (root / ".gitignore").write_text("*.pyc\n")
    first = run_sft("init", str(root), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (root / "sft_grid.yaml").is_file() and (root / "conf" / "sweep" / "example.yaml").is_file()
    assert all((root / "conf" / g).is_dir() for g in ("cluster", "model", "dataset", "sweep"))
    assert (root / ".gitignore").read_text() == "*.pyc\nruns/\n"
    again = run_sft("init", str(root), cwd=tmp_path)
    assert again.returncode == 0 and "already an experiment repository" in again.stdout
    assert (root / ".gitignore").read_text() == "*.pyc\nruns/\n"
    # the example grid composes and renders from inside it, under its runs/
    dry = run_sft("-m", "+sweep=example", "dry_run=true", cwd=root / "conf")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert len(list((root / "runs" / "example").glob("*/cell.yaml"))) == 4


def test_cp_copies_a_shipped_option_in_and_refuses_what_it_cannot_do(tmp_path):
    root = tmp_path / "exp"
    assert run_sft("init", str(root), cwd=tmp_path).returncode == 0
    ok = run_sft("cp", "model/qwen3_8b", "qwen3_8b_long", cwd=root)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    copied = (root / "conf" / "model" / "qwen3_8b_long.yaml").read_text()
    assert "\nname: qwen3_8b_long\n" in copied and "Qwen/Qwen3-8B" in copied
    assert run_sft("cp", "dataset/magpie", "mag", cwd=root).returncode == 0
    assert (root / "conf" / "dataset" / "mag.yaml").read_text().count("\nmag:\n") == 1
    refusals = {
        ("cp", "model/qwen3_8b", "qwen3_8b_long"): "is already there",
        ("cp", "model/nope"): "no shipped option model/nope",
        ("cp", "widgets/qwen3_8b"): "is not GROUP/OPTION",
        ("cp", "model"): "is not GROUP/OPTION",
        ("cp", "model/qwen3_8b", "bad name"): "is not an option name",
    }
    for args, said in refusals.items():
        proc = run_sft(*args, cwd=root)
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.stderr)
    assert (root / "conf" / "model" / "qwen3_8b_long.yaml").read_text() == copied
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    subprocess.run(["git", "init", "-q", str(outside)], check=True)
    proc = run_sft("cp", "model/qwen3_8b", cwd=outside)
    assert proc.returncode == 2 and "sft-grid init" in proc.stderr and not (outside / "conf").exists()


def test_a_grid_of_the_teams_configs_is_not_sent_to_a_remote_site(tmp_path):
    root = repo(tmp_path, "conf/model/ours.yaml")
    proc = run_sft(
        "model=ours",
        "cluster=slurm_local",
        "cluster.remote.host=site",
        "cluster.remote.root=/srv/sft",
        "dry_run=true",
        cwd=root,
    )
    assert proc.returncode != 0
    assert "remote-configs" in proc.stdout + proc.stderr and str(root / "conf") in proc.stdout + proc.stderr
    assert not (root / "runs").exists()


@pytest.mark.parametrize(
    "steering",
    [["+prune={rungs: [10], keep: 0.5}"], ["+adaptive.at=1e9", "+adaptive.budget_cells=2"]],
)
def test_a_steered_grid_across_remote_sites_is_refused_in_one_line(tmp_path, steering):
    root = repo(tmp_path, "conf/model/ours.yaml")
    (root / "conf" / "cluster").mkdir()
    for name in ("ra", "rb"):
        text = (PACKAGE_CONF / "cluster" / "slurm_local.yaml").read_text().replace("name: slurm_local", f"name: {name}")
        text = text.replace("runs_root: ${oc.env:SFT_GRID_RUNS,runs}", "runs_root: /srv/runs")
        (root / "conf" / "cluster" / f"{name}.yaml").write_text(text + f"remote:\n  host: {name}\n  root: /srv/sft\n")
    proc = run_sft(
        "-m",
        "backend=synthetic",
        "max_steps=90",
        "save_steps=1000",
        "lr=1e-4,2e-4",
        "sites=[ra,rb]",
        *steering,
        "dry_run=true",
        cwd=root,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "steer-remote" in said, said
    assert "each site would decide from its share alone" in said
    assert not (root / "runs").exists()
