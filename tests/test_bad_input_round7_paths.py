"""Bad input, seventh round: local paths and the environment variables that name folders. A relative model path or
dataset file (taken from the team repository's root, written absolute into the cell's files), a local file named
like a Hub id, a shell variable in a path setting, an unset ${user_env:X} inside a longer path, and a cache or
Hugging Face folder that is a file or relative: each is planned right or refused naming the key or the variable, the
value and the fix, with no traceback and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .conftest import run_sft


def _refused(here: Path, *args: str, env: dict[str, str] | None = None, code: int | None = None) -> str:
    """Run the grid command (a dry run) in `here` and return what it said, asserting that it failed without a
    traceback and wrote nothing there."""
    before = sorted(p.relative_to(here) for p in here.rglob("*"))
    proc = run_sft(*args, "dry_run=true", cwd=here, env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 if code is None else proc.returncode == code, said
    assert "Traceback" not in said, said
    assert sorted(p.relative_to(here) for p in here.rglob("*")) == before, said  # nothing written
    return said


@pytest.fixture
def here(tmp_path: Path) -> Path:
    folder = tmp_path / "here"
    folder.mkdir()
    return folder


# -- 1. a relative local path is the team repository's, from every folder of it ----------------------------------


def test_a_relative_model_path_and_data_file_are_taken_from_the_repository_root_in_every_folder(
    make_cells, tmp_path, monkeypatch
):
    from sft_grid.planning.cells import plan_cell
    from sft_grid.planning.inputs import dataset_source, model_source

    repo = tmp_path / "team"
    (repo / "conf" / "model").mkdir(parents=True)
    (repo / "sft_grid.yaml").write_text("conf: conf\n")
    (repo / "notebooks").mkdir()
    (cell,) = make_cells(["model=tiny_llama"])
    config = dict(cell.config)
    config["model"] = {**config["model"], "path": "./models/tiny"}
    config["dataset"] = {name: {**ds, "source": "./data/tiny.jsonl"} for name, ds in config["dataset"].items()}
    planned = {}
    for folder in (repo, repo / "notebooks"):
        monkeypatch.chdir(folder)
        planned[folder] = plan_cell(cell.overrides, config)
    at_root, in_sub = planned.values()
    assert at_root.config == in_sub.config and at_root.key == in_sub.key  # the same cell from every folder
    assert in_sub.config["model"]["path"] == str(repo / "models" / "tiny")
    assert model_source(in_sub) == str(repo / "models" / "tiny")  # what train_config.yaml loads
    name = next(iter(in_sub.config["dataset"]))
    assert in_sub.config["dataset"][name]["source"] == str(repo / "data" / "tiny.jsonl")
    assert dataset_source(in_sub, name) == str(repo / "data" / "tiny.jsonl")  # dataset_info.json's file_name
    # the identity names a local input by its file name: the same as the absolute path's, wherever the repo is
    absolute = dict(config)
    absolute["model"] = {**config["model"], "path": "/elsewhere/models/tiny"}
    absolute["dataset"] = {n: {**ds, "source": "/elsewhere/data/tiny.jsonl"} for n, ds in config["dataset"].items()}
    assert plan_cell(cell.overrides, absolute).key == in_sub.key
    assert plan_cell(cell.overrides, absolute).config["model"]["path"] == "/elsewhere/models/tiny"  # kept as is


# -- 2. a local file named like a Hub id ---------------------------------------------------------------------------


@pytest.mark.parametrize("present", [True, False])
def test_a_dataset_file_without_dot_slash_is_not_read_as_a_hub_id(here, present):
    if present:
        (here / "data").mkdir()
        (here / "data" / "tiny.jsonl").write_text('{"messages": []}\n')
    said = _refused(here, "model=tiny_llama", "dataset.tiny_messages.source=data/tiny.jsonl", f"runs_root={here}/runs")
    assert "dataset.tiny_messages.source='data/tiny.jsonl'" in said and "[local-not-hub]" in said, said
    assert "dataset.tiny_messages.source=./data/tiny.jsonl" in said, said
    assert ("is a local file here" in said) is present, said
    assert "not resolved" not in said, said


def test_a_model_hub_id_that_names_a_local_folder_says_model_path(here):
    (here / "models" / "tiny").mkdir(parents=True)
    said = _refused(here, "model=tiny_llama", "model.path=null", "model.hub_id=models/tiny", f"runs_root={here}/runs")
    assert "model.hub_id='models/tiny'" in said and "is a local folder here" in said, said
    assert "model.path=./models/tiny model.hub_id=null" in said, said


# -- 3. a shell variable in a path setting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "fixed"),
    [
        ("runs_root=$SCRATCH/sft_runs", "runs_root", "${user_env:SCRATCH}/sft_runs"),
        ("model.path=$HOME/models/tiny", "model.path", "${user_env:HOME}/models/tiny"),
        ("cluster.hf_cache=$SCRATCH/hf", "cluster.hf_cache", "${user_env:SCRATCH}/hf"),
    ],
)
def test_a_shell_variable_in_a_path_setting_is_refused_with_the_resolver(here, override, key, fixed):
    extra = [] if key == "runs_root" else [f"runs_root={here}/runs"]
    said = _refused(here, "model=tiny_llama", override, *extra, env={"SCRATCH": str(here / "scratch")})
    value = override.split("=", 1)[1]
    assert f"{key}='{value}'" in said and "[path-shell-variable]" in said, said
    assert f"'{key}={fixed}'" in said, said
    assert "no such file" not in said and "a relative path" not in said, said  # one problem, the right one


def test_a_shell_variable_in_a_cluster_file_runs_root_writes_no_dollar_folder(here):
    (here / "conf" / "cluster").mkdir(parents=True)
    (here / "sft_grid.yaml").write_text("conf: conf\n")
    local = Path(__file__).resolve().parent.parent / "sft_grid" / "conf" / "cluster" / "local.yaml"
    text = local.read_text().replace("name: local", "name: mine")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("runs_root:"))
    (here / "conf" / "cluster" / "mine.yaml").write_text(text + "\nruns_root: $SCRATCH/sft_runs\n")
    said = _refused(here, "cluster=mine")
    assert "cluster.runs_root='$SCRATCH/sft_runs'" in said and "runs_root: ${user_env:SCRATCH}/sft_runs" in said, said


# -- 4. an unset ${user_env:X} inside a longer path ----------------------------------------------------------------


def test_an_unset_user_env_inside_a_longer_value_is_a_placeholder_the_checks_see(monkeypatch):
    from sft_grid.planning import resolvers

    resolvers.register()
    monkeypatch.delenv("SFT_GRID_R7_UNSET", raising=False)
    inside = OmegaConf.create({"runs_root": "${user_env:SFT_GRID_R7_UNSET}/sft_runs"})
    assert inside.runs_root == "<SFT_GRID_R7_UNSET>/sft_runs"
    assert resolvers.placeholder_var(inside.runs_root) == "SFT_GRID_R7_UNSET"  # the dry run's, as the whole one is
    assert resolvers.placeholder_var("<SFT_GRID_R7_UNSET>") == "SFT_GRID_R7_UNSET"
    assert resolvers.placeholder_var("/scratch/<not a variable read>/x") is None
    monkeypatch.setenv("SFT_GRID_R7_UNSET", "/scratch/me")
    assert inside.runs_root == "/scratch/me/sft_runs"


def test_an_unset_user_env_inside_runs_root_renders_under_the_local_runs_and_a_real_run_is_refused(here, monkeypatch):
    """Before, the dry run wrote into a folder called <SFT_GRID_R7_UNSET>, and a real run would have too."""
    monkeypatch.delenv("SFT_GRID_R7_UNSET", raising=False)
    (here / "conf").mkdir()
    (here / "sft_grid.yaml").write_text("conf: conf\n")
    runs = "runs_root=${user_env:SFT_GRID_R7_UNSET}/sft_runs"
    dry = run_sft("model=tiny_llama", runs, "dry_run=true", cwd=here)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "export SFT_GRID_R7_UNSET=" in dry.stdout + dry.stderr
    assert sorted(p.name for p in here.iterdir()) == ["conf", "runs", "sft_grid.yaml"]  # the local runs/, no <X>
    real = run_sft("model=tiny_llama", runs, cwd=here)
    said = real.stdout + real.stderr
    assert real.returncode == 1 and "Traceback" not in said, said
    assert sorted(p.name for p in here.iterdir()) == ["conf", "runs", "sft_grid.yaml"], said  # nothing more
    assert "runs_root='<SFT_GRID_R7_UNSET>/sft_runs': environment variable SFT_GRID_R7_UNSET is not set" in said
    assert "[site-variable]" in said and "export SFT_GRID_R7_UNSET=" in said, said


# -- 5 and 6. the folders the environment names --------------------------------------------------------------------


@pytest.mark.parametrize("var", ["SFT_GRID_CACHE", "SFT_GRID_PREFLIGHT_CACHE", "HF_HOME", "HF_HUB_CACHE"])
def test_a_folder_variable_that_names_a_file_is_refused_at_start(here, tmp_path, var):
    afile = tmp_path / "afile"
    afile.write_text("")
    said = _refused(here, "model=tiny_llama", f"runs_root={here}/runs", env={var: str(afile)}, code=2)
    assert f"environment variable {var} is '{afile}', which is a file, not a directory" in said, said
    assert f"export {var}=<an absolute directory>, or `unset {var}`" in said, said
    assert "NotADirectoryError" not in said and "no such file" not in said, said


def test_a_relative_sft_grid_cache_is_refused_at_start(here):
    said = _refused(here, "model=tiny_llama", f"runs_root={here}/runs", env={"SFT_GRID_CACHE": "relcache"}, code=2)
    assert "environment variable SFT_GRID_CACHE is 'relcache', a relative path" in said, said
    assert f"export SFT_GRID_CACHE={here / 'relcache'}" in said, said
    assert "not a Hub repository id" not in said, said


def test_a_check_cache_that_cannot_be_written_costs_the_cache_not_the_run(tmp_path):
    from sft_grid.checks import venv_facts

    afile = tmp_path / "afile"
    afile.write_text("")
    venv_facts._store(afile / "venv_facts" / "answer.json", {"modules": {}})  # no NotADirectoryError
    assert afile.read_text() == ""
