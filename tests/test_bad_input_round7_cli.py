"""Bad input, seventh round, the command line: Hydra's own launcher, sweeper and output folders, several sweep files
at once, a --flag for a cell's key, sbatch options that are not one value, a repository inside another, an empty
or misplaced grid or cell, and commands whose errors went to stdout or named another command. Each is refused
naming what was given and the fix, with no traceback and nothing written."""

from __future__ import annotations

import pytest

from sft_grid.planning import site_rules

from .conftest import run_sft


def _refused(tmp_path, *args: str, code: int | None = None) -> str:
    """Run the grid command in an empty folder and return what it said, asserting that it failed, without a
    traceback, and wrote nothing there (no multirun/, .hydra/ or runs/)."""
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft(*args, "dry_run=true", f"runs_root={here / 'runs'}", cwd=here)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 if code is None else proc.returncode == code, said
    assert "Traceback" not in said, said
    assert list(here.iterdir()) == [], said
    return said


# -- 1. Hydra's launcher, sweeper and output folders -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("hydra/launcher=basic", ["[hydra-own]", "its own hydra/launcher (sft_grid)", "drop hydra/launcher=basic"]),
        ("hydra/sweeper=basic", ["[hydra-own]", "its own hydra/sweeper (sft_grid)"]),
        ("hydra.launcher._target_=x.Y", ["[hydra-own]", "hydra/launcher"]),
        ("hydra.output_subdir=.hydra", ["[hydra-output]", "only under its runs_root", "runs_root=<folder>"]),
        ("hydra.run.dir=/tmp/elsewhere", ["[hydra-output]", "runs_root=/tmp/elsewhere"]),
        ("hydra.sweep.dir=out", ["[hydra-output]", "runs_root=out"]),
    ],
)
def test_hydras_own_launcher_sweeper_and_output_folders_are_refused_before_hydra_runs(tmp_path, override, says):
    # a token on the same line: the basic sweeper wrote it into multirun/.../multirun.yaml before any refusal
    said = _refused(tmp_path, "-m", override, "model=tiny_llama,tiny_qwen3", "+extra.hub_token=hf_abcdefghijklmnop")
    assert "found by reading the command line; nothing was submitted" in said, said
    for words in says:
        assert words in said, said
    assert not (tmp_path / "elsewhere").exists()


def test_hydras_own_keys_the_project_documents_still_work(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft("-m", "model=tiny_llama", "hydra.verbose=true", "dry_run=true", f"runs_root={here}/runs", cwd=here)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- 2. several sweep files at once ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sweep", ["smoke,smoke_eval", "glob(smoke*)"])
def test_several_sweep_files_in_one_grid_are_refused(tmp_path, sweep):
    said = _refused(tmp_path, "-m", f"+sweep={sweep}")
    assert f"+sweep='{sweep}'" in said and "[one-sweep]" in said and "one grid is one sweep file" in said, said
    if "," in sweep:
        assert "sft-grid run -m +sweep=smoke; sft-grid run -m +sweep=smoke_eval" in said, said


# -- 3. a --flag for a cell's key; each command's own usage ----------------------------------------------------------


def test_a_flag_for_a_cells_key_says_the_override(tmp_path):
    said = _refused(tmp_path, "-m", "model=tiny_llama", "--dry-run")
    assert "hint: --dry-run is no option of sft-grid run" in said and "use dry_run=true" in said, said


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["stage", "--revision", "main"], ["usage: sft-grid stage", "required: --repo"]),
        (["check", "--format", "xml"], ["usage: sft-grid check", "sft-grid check: error: unrecognized arguments"]),
    ],
)
def test_check_and_stage_usage_errors_name_their_own_command(tmp_path, args, says):
    proc = run_sft(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for words in says:
        assert words in proc.stderr, proc.stderr
    assert "sft-grid run" not in proc.stderr, proc.stderr


def test_run_version_is_sft_grids(tmp_path):
    proc = run_sft("run", "--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("sft_grid "), proc.stdout + proc.stderr
    assert "Hydra" not in proc.stdout


# -- 4. sbatch options that are not one value; Slurm names -----------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("+cluster.sbatch_extra.mail-type=[END,FAIL]", ["is a list", "+cluster.sbatch_extra.mail-type=END,FAIL"]),
        ("+cluster.sbatch_extra.comment={a: 1}", ["is a mapping", "a scalar"]),
        ("+cluster.sbatch_extra.nodelist=null", ["--nodelist=None", "~cluster.sbatch_extra.nodelist"]),
    ],
)
def test_an_sbatch_extra_value_that_is_not_one_value_is_refused_before_anything_is_written(tmp_path, override, says):
    said = _refused(tmp_path, "model=tiny_llama", "cluster=slurm_local", override)
    key = override.split("=", 1)[0].lstrip("+")
    assert f"{key}=" in said and "[sbatch-extra-value]" in said and "unhashable" not in said, said
    for words in says:
        assert words in said, said


@pytest.mark.parametrize("partition", ["debug gpu", "debug; rm -rf ~"])
def test_a_partition_with_spaces_or_a_semicolon_is_refused(make_cells, partition):
    (cell,) = make_cells(["model=tiny_llama", "cluster=slurm_local", f"cluster.partition='{partition}'"])
    (p,) = site_rules.slurm_names(cell)
    assert (p.key, p.value, p.rule) == ("cluster.partition", partition, "slurm-name")
    assert "cluster.partition=debug" in p.fix


def test_sbatch_extra_text_across_lines_is_refused_and_a_scalar_passes(make_cells):
    (cell,) = make_cells(["model=tiny_llama", "cluster=slurm_local", "+cluster.sbatch_extra.comment='a\nb'"])
    assert [p.rule for p in site_rules.sbatch_extra(cell)] == ["sbatch-extra-value"]
    (fine,) = make_cells(["model=tiny_llama", "cluster=slurm_local", "+cluster.sbatch_extra.mail-type='END,FAIL'"])
    assert list(site_rules.sbatch_extra(fine)) == [] and list(site_rules.slurm_names(fine)) == []


# -- 5. init inside a repository -------------------------------------------------------------------------------------


def test_init_inside_a_repository_is_refused_naming_it(tmp_path):
    run_sft("init", str(tmp_path / "team"), check=True)
    inner = tmp_path / "team" / "conf" / "model"
    before = sorted(inner.iterdir())
    for args, cwd in ((["init", str(inner)], tmp_path), (["init"], inner)):
        proc = run_sft(*args, cwd=cwd)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert f"inside the experiment repository at {tmp_path / 'team'}" in proc.stderr, proc.stderr
        assert sorted(inner.iterdir()) == before


def test_init_on_a_file_says_so_on_stderr(tmp_path):
    (tmp_path / "f").write_text("")
    proc = run_sft("init", str(tmp_path / "f"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and "is a file, not a folder" in proc.stderr


# -- 6. grids and cells as the other commands take them --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", ""], "GRID is empty"),
        (["post", ""], "TARGET is empty"),
        (["release", "g", "--site", ""], "--site is empty"),
        (["logs", "g", ""], "CELL is empty"),
    ],
)
def test_an_empty_grid_cell_or_site_is_refused(tmp_path, args, says):
    proc = run_sft(*args, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr and "unset shell variable" in proc.stderr, proc.stderr


def _grid(tmp_path):
    cell = tmp_path / "runs" / "g" / "a_cell-12345678"
    cell.mkdir(parents=True)
    (cell / "cell.yaml").write_text("{}\n")
    return cell


def test_status_of_a_cell_directory_names_its_grid(tmp_path):
    cell = _grid(tmp_path)
    proc = run_sft("status", str(cell), cwd=tmp_path)
    assert proc.returncode == 1 and "it is a cell's directory, not a grid's" in proc.stderr, proc.stderr
    assert "name its grid, " in proc.stderr and "sft-grid logs" in proc.stderr, proc.stderr


def test_post_takes_a_grids_name_as_the_other_commands_do(tmp_path):
    _grid(tmp_path)
    proc = run_sft("post", "g", "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert f"under {tmp_path / 'runs' / 'g'}" in proc.stderr, proc.stderr  # the grid, not ./g
    proc = run_sft("post", "nosuch", "--runs-root", str(tmp_path / "runs"), cwd=tmp_path)
    assert "there is no grid 'nosuch'" in proc.stderr and "(the grids under" in proc.stderr, proc.stderr


def test_a_runs_root_that_is_a_file_is_said_to_be_one(tmp_path):
    (tmp_path / "afile").write_text("")
    proc = run_sft("status", "g", "--runs-root", str(tmp_path / "afile"), cwd=tmp_path)
    assert proc.returncode == 1 and "the runs root" in proc.stderr and "is a file, not a folder" in proc.stderr


# -- 7. small ones ---------------------------------------------------------------------------------------------------


def test_cancel_without_arguments_names_only_grid_as_required(tmp_path):
    proc = run_sft("cancel", cwd=tmp_path)
    assert proc.returncode == 2 and "required: grid" in proc.stderr and "CELL" not in proc.stderr.splitlines()[-1]


def test_cp_refuses_to_hide_another_shipped_option_unless_forced(tmp_path):
    args = ("cp", "model/tiny_qwen3", "tiny_llama", "--to", str(tmp_path / "conf"))
    proc = run_sft(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert "model/tiny_llama is a shipped option too" in proc.stderr and "--force" in proc.stderr, proc.stderr
    assert not (tmp_path / "conf").exists()
    assert run_sft(*args, "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "conf" / "model" / "tiny_llama.yaml").is_file()


def test_cp_errors_go_to_stderr(tmp_path):
    proc = run_sft("cp", "nosuch/x", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and "is not GROUP/OPTION" in proc.stderr


@pytest.mark.parametrize("name", ["bad name", "../evil"])
def test_import_refuses_a_name_cp_refuses(tmp_path, name):
    (tmp_path / "lf.yaml").write_text("model_name_or_path: Qwen/Qwen3-8B\n")
    proc = run_sft("import", str(tmp_path / "lf.yaml"), "--name", name, "--out", str(tmp_path / "conf"), cwd=tmp_path)
    assert proc.returncode == 2 and f"--name {name!r} is not an option name" in proc.stderr, proc.stderr
    assert not (tmp_path / "conf").exists()
