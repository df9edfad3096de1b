"""Bad input, fourth round (b): cases a tester found unclear or silent. A sweep named without -m; sweep files Hydra
would misread (no header, empty, a list, axes written as YAML lists or naming no key); the adaptive block's recipes
(a key that names nothing, recipes given as numbers); fixes that could not be applied (a sweep_name of dots, prune
rungs); a remote site's folders and messages. Each is refused before anything is written or queued, naming the key,
the value and a fix that can be applied. No training, no Slurm, no ssh connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from sft_grid.core import project
from sft_grid.core.problems import GRID

from .conftest import run_sft

HEADER = "# @package _global_\n"
BODY = "sweep_name: mine\nmax_steps: 4\nhydra:\n  sweeper:\n    params:\n      model: tiny_llama,tiny_qwen3\n"


def _conf(tmp_path: Path, **sweeps: str) -> Path:
    """A team's config folder with these sweep files (name -> text)."""
    conf = tmp_path / "team" / "conf"
    (conf / "sweep").mkdir(parents=True)
    for name, text in sweeps.items():
        (conf / "sweep" / f"{name}.yaml").write_text(text)
    return conf


def _sweep_problems(monkeypatch, conf: Path, name: str):
    from sft_grid.planning.sweep_files import problems as sweep_file_problems

    monkeypatch.setenv(project.CONF_ENV, str(conf))
    return sweep_file_problems(["-m", f"+sweep={name}", "dry_run=true"])


# -- 1: a sweep named without -m -------------------------------------------------------------------------------


def test_a_sweep_without_m_is_refused_naming_its_axes_and_both_fixes(tmp_path):
    proc = run_sft("+sweep=smoke", "dry_run=true", f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "the sweep 'smoke' sweeps model, lr" in proc.stderr and "[sweep-without-m]" in proc.stderr
    assert "add -m" in proc.stderr and "sft-grid run -m +sweep=smoke" in proc.stderr
    assert "model=tiny_llama lr=1e-3" in proc.stderr  # one value per axis: one cell, as its rerun line composes it
    assert not (tmp_path / "runs").exists()


def test_a_sweep_without_m_with_every_axis_set_is_one_cell_as_a_rerun_composes_it():
    from sft_grid.planning.sweep_files import unswept

    axes = {"model": "tiny_llama,tiny_qwen3", "lr": "1e-3,5e-4"}
    assert unswept(["model=tiny_llama", "lr=0.001", "+sweep=smoke"], axes) is None
    refused = unswept(["model=tiny_llama", "+sweep=smoke"], axes)
    assert refused is not None and refused.rule == "sweep-without-m" and "sweeps lr" in refused.message


# -- 2 and 3: sweep files Hydra would misread ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said", "fix"),
    [
        (BODY, "does not start with # @package _global_", "make # @package _global_ the file's first line"),
        ("# mine: a grid\n" + HEADER + BODY, "does not start with # @package _global_", "first line"),
        ("", "the sweep file is empty", "# @package _global_, then sweep_name: mine"),
        ("# only a comment\n", "the sweep file is empty", "# @package _global_, then sweep_name: mine"),
        ("- a\n- b\n", "the sweep file is a YAML list, not a mapping", "no '- ' items at the top"),
        (HEADER + "- a\n- b\n", "the sweep file is a YAML list, not a mapping", "no '- ' items at the top"),
    ],
)
def test_a_sweep_file_without_its_header_or_not_a_mapping_is_named(tmp_path, monkeypatch, text, said, fix):
    conf = _conf(tmp_path, mine=text)
    (p,) = _sweep_problems(monkeypatch, conf, "mine")
    assert (p.cell, p.key, p.value, p.rule) == (GRID, "+sweep", "mine", "sweep-file")
    assert str(conf / "sweep" / "mine.yaml") in p.message and said in p.message and fix in p.fix


@pytest.mark.parametrize(
    ("params", "key", "said", "fix"),
    [
        ("    params:\n      - model: tiny_llama\n", "hydra.sweeper.params", "not a YAML list", "without '- '"),
        ("    params:\n      lr: [1e-3, 2e-3]\n", "hydra.sweeper.params.lr", "not a YAML list", "lr: 1e-3,2e-3"),
        ("    params:\n      lr: {a: 1}\n", "hydra.sweeper.params.lr", "not a YAML mapping", "lr: a,b"),
    ],
)
def test_axes_that_are_not_comma_strings_say_how_an_axis_is_written(tmp_path, monkeypatch, params, key, said, fix):
    conf = _conf(tmp_path, mine=HEADER + "sweep_name: mine\nhydra:\n  sweeper:\n" + params)
    (p,) = _sweep_problems(monkeypatch, conf, "mine")
    assert p.key == key and said in p.message and fix in p.fix


def test_each_axis_that_names_no_key_is_named_once_with_its_value(tmp_path, monkeypatch):
    axes = "    params:\n      modell: tiny_llama,tiny_qwen3\n      lrr: 1e-3,2e-3\n      +extra.x: 1,2\n"
    conf = _conf(tmp_path, mine=HEADER + "sweep_name: mine\nhydra:\n  sweeper:\n" + axes)
    found = {p.key: p for p in _sweep_problems(monkeypatch, conf, "mine")}
    assert set(found) == {"hydra.sweeper.params.modell", "hydra.sweeper.params.lrr"}  # `+` adds a key: validated
    assert found["hydra.sweeper.params.modell"].value == "tiny_llama,tiny_qwen3"
    assert "did you mean 'model'?" in found["hydra.sweeper.params.modell"].fix
    assert "did you mean 'lr'?" in found["hydra.sweeper.params.lrr"].fix


def test_a_sweep_file_without_header_is_refused_by_the_command_in_a_team_repository(tmp_path):
    conf = _conf(tmp_path, nohdr=BODY)
    proc = run_sft("-m", "+sweep=nohdr", "dry_run=true", f"runs_root={tmp_path / 'runs'}", cwd=conf.parent)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "Key 'sweep' not in" not in proc.stderr and "does not start with # @package _global_" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_shipped_sweeps_pass_the_sweep_file_check(monkeypatch):
    from sft_grid.planning.sweep_files import problems as sweep_file_problems

    monkeypatch.delenv(project.CONF_ENV, raising=False)
    names = project.options("sweep")
    assert names and sweep_file_problems([f"+sweep={n}" for n in names]) == []


def test_a_key_hydra_could_not_compose_is_shown_with_its_value():
    from sft_grid.planning.hydra_errors import composition_problem

    message = "Could not override 'modell'.\nKey 'modell' not in 'CellConf'"
    p = composition_problem(["modell=tiny_llama", "lrr=0.001"], message)
    assert p.key == "modell" and p.value == "tiny_llama"


# -- 4: adaptive recipes ---------------------------------------------------------------------------------------

ADAPTIVE = ["+sweep=synthetic_delphi", "+adaptive.at=9714698752", "+adaptive.budget_cells=8", "dry_run=true"]


def test_a_recipe_key_that_names_nothing_is_named_not_an_empty_recipe(tmp_path):
    proc = run_sft(
        "-m",
        *ADAPTIVE,
        "+adaptive.recipe_key=lrr",
        "+adaptive.question=gap",
        "+adaptive.recipes=[a,b]",
        f"runs_root={tmp_path / 'runs'}",
    )
    assert proc.returncode == 1, proc.stderr
    assert "adaptive.recipe_key='lrr': 'lrr' names no key of the cells" in proc.stderr
    assert "one of ['']" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_recipes_given_as_numbers_name_the_recipes_of_those_values():
    from sft_grid.adaptive.spec import parse_adaptive

    block = {"at": 1e9, "budget_cells": 8, "question": "gap", "recipe_key": "lr"}
    for given in ([0.001, 0.002], [1e-3, 2e-3], ["1e-3", "0.002"]):
        spec, problems = parse_adaptive({**block, "recipes": given}, ["0.001", "0.002"])
        assert not problems and spec is not None and spec.recipes == ("0.001", "0.002"), problems
    _, (p,) = parse_adaptive({**block, "recipes": [0.001, 0.003]}, ["0.001", "0.002"])
    assert "names no recipe of the grid: 0.003" in p.message and "lr holds 0.001, 0.002" in p.message
    assert p.fix.startswith("recipes: [0.001, 0.002]") and "'0.001'" not in p.fix


# -- 5: fixes that can be applied ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fix"), [("..", "sweep_name=my_grid"), (".", "sweep_name=my_grid"), (".code", "sweep_name=code")]
)
def test_a_sweep_name_of_dots_is_refused_with_a_name_that_can_be_used(tmp_path, name, fix):
    proc = run_sft("-m", "model=tiny_llama", f"sweep_name={name}", "dry_run=true", f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1, proc.stderr
    assert f"sweep_name={name!r}" in proc.stderr and f"fix: {fix}" in proc.stderr, proc.stderr
    assert f"e.g. {name}" not in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["+sweep=smoke", "model=tiny_llama", "lr=1e-3", "sweep_name=.."], "sweep_name", "sweep_name=smoke"),
        (["model.name=.."], "model.name", "rename it, e.g. my_model"),
        (["model.name=.hidden"], "model.name", "rename it, e.g. hidden"),
    ],
)
def test_a_name_fix_is_a_name_that_passes_the_rule(make_cells, overrides, key, fix):
    """Every name the rule holds (the grid's, a model's, a dataset's) gets a fix that passes it: the name cleaned
    where something of it is left, else the sweep's own name or a plain one, never the refused value."""
    from sft_grid.planning.validate import safe_names

    (cell,) = make_cells(overrides)
    (p,) = safe_names(cell)
    assert (p.key, p.fix) == (key, fix), p.render()
    assert "a name starts with a letter or a digit" in p.message


PRUNE = ["-m", "model=tiny_llama", "backend=synthetic", "lr=1e-3,2e-3", "max_steps=8", "dry_run=true"]


@pytest.mark.parametrize(
    ("args", "fix", "not_said"),
    [
        (
            ["logging_steps=1", "+prune={rungs: [4], keep: 0.3, guard: extrapolate}"],
            "a first rung at step 5 or later, before the last step 8 (rungs: [5])",
            "logging_steps <=",
        ),
        (
            ["logging_steps=2", "+prune={rungs: [4], keep: 0.3, guard: extrapolate}"],
            "logging_steps=1 with a first rung at step 5 or later, before the last step 8",
            "step 10",
        ),
        (
            ["logging_steps=1", "+prune={rungs: [10], keep: 0.3, guard: extrapolate}"],
            "rungs below 8, e.g. rungs: [5]",
            "[0,",
        ),
        (["logging_steps=1", "+prune={rungs: [10], keep: 0.3}"], "rungs below 8, e.g. rungs: [1, 2]", "[0,"),
        (["logging_steps=10", "+prune={rungs: [4], keep: 0.3, guard: position}"], "fix: logging_steps=1", "[10]"),
    ],
)
def test_a_prune_fix_is_one_the_cells_can_take(tmp_path, args, fix, not_said):
    proc = run_sft(*PRUNE, *args, f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1 and "[prune-block]" in proc.stderr, proc.stderr
    assert fix in proc.stderr and not_said not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


# -- 6: a remote site ------------------------------------------------------------------------------------------


def test_a_remote_site_of_a_team_repository_names_the_host_as_the_value(make_cells, monkeypatch, tmp_path):
    from sft_grid.core.problems import GridError
    from sft_grid.sites import remote

    cells = make_cells(["cluster=slurm_local", "cluster.remote.host=no-such-host.invalid", "cluster.remote.root=/srv"])
    conf = _conf(tmp_path)
    monkeypatch.setenv(project.CONF_ENV, str(conf))
    with pytest.raises(GridError) as raised:
        remote.site_of(cells)
    (p,) = raised.value.problems
    assert (p.key, p.value, p.rule) == ("cluster.remote.host", "no-such-host.invalid", "remote-configs")
    assert str(conf) in p.message


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        (["cluster.remote.root=srv"], "cluster.remote.root", "srv"),
        (["cluster.remote.root=/srv", "runs_root=runs_there"], "runs_root", "runs_there"),
    ],
)
def test_a_remote_site_with_a_relative_folder_is_refused_before_connecting(tmp_path, overrides, key, value):
    proc = run_sft(
        "model=tiny_llama",
        "cluster=slurm_local",
        "cluster.remote.host=no-such-host.invalid",
        *(overrides if any(o.startswith("runs_root=") for o in overrides) else [*overrides, f"runs_root={tmp_path}"]),
        "dry_run=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert f"{key}={value!r}" in proc.stderr and "absolute path on the site" in proc.stderr, proc.stderr
    assert "cannot reach site" not in proc.stderr  # refused here: nothing tried the connection


def test_a_dry_run_that_cannot_reach_its_site_says_what_a_dry_run_does(tmp_path):
    proc = run_sft(
        "model=tiny_llama",
        "cluster=slurm_local",
        "cluster.remote.host=no-such-host.invalid",
        "cluster.remote.root=/srv",
        "cluster.remote.connect_timeout_s=5",
        f"runs_root={tmp_path / 'runs'}",
        "dry_run=true",
    )
    assert proc.returncode == 1 and "cannot reach site slurm_local" in proc.stderr, proc.stderr
    assert "the rest is submitted" not in proc.stderr and "a dry run" in proc.stderr and "queues nothing" in proc.stderr
