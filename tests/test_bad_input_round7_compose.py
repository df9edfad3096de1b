"""Bad input, seventh round: a team's option files and Hydra's composition. A model without params_b, a value of the
wrong shape in an option file (a string for a list, a list for a mapping, a file that is a list), an `${oc.env:X}`
whose variable is unset, a defaults list that goes round in a circle, a sweep's axes without `params:`, an option
saved as .yml or in a plural folder: each is refused naming the file, the key, the value and the fix, with no
traceback and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_sft

MODEL = "hub_id: Qwen/Qwen3-8B\ntokenizer_family: qwen3\ntemplate: qwen3\n"


def _team(tmp_path: Path, files: dict[str, str]) -> dict[str, str]:
    """A folder of the team's configs (group/option.yaml: text), named by $SFT_GRID_CONF."""
    conf = tmp_path / "team" / "conf"
    for name, text in files.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(text)
    conf.mkdir(parents=True, exist_ok=True)
    return {"SFT_GRID_CONF": str(conf)}


def _refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the grid command in an empty folder and return what it said, asserting that it failed, without a
    traceback, and wrote nothing."""
    here = tmp_path / "here"
    here.mkdir()
    root = [] if any(a.startswith("runs_root=") for a in args) else [f"runs_root={here / 'runs'}"]
    proc = run_sft("run", *args, "dry_run=true", *root, cwd=here, env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "Traceback" not in said, said
    assert list(here.iterdir()) == [], said
    return said


# -- 1. a model without params_b ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [f"name: nop\n{MODEL}", ""])
def test_a_model_without_params_b_is_the_required_rule_not_a_crash(tmp_path, text):
    said = _refused(tmp_path, "model=nop", env=_team(tmp_path, {"model/nop.yaml": text}))
    assert "model.params_b=None: has no value" in said and "[required]" in said, said
    assert "TypeError" not in said and "can't multiply" not in said, said


def test_the_size_of_a_model_without_params_b_is_zero_not_a_crash():
    from sft_grid.core.schema import ModelConf, exact_params

    assert exact_params(ModelConf(name="m")) == 0  # params_b is `???`: the required rule refuses the cell
    assert exact_params(ModelConf(name="m", params_b=1.5)) == 1_500_000_000


# -- 2. a value of the wrong shape in an option file ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "args", "says"),
    [
        (
            {"model/ns.yaml": f"name: ns\nparams_b: 8\n{MODEL}needs: zero3\n"},
            ["model=ns"],
            ["model/ns.yaml: needs holds one value, zero3", "model.needs takes a list: needs: [zero3]"],
        ),
        (
            {"cluster/cs.yaml": "defaults:\n  - local\n  - _self_\nname: cs\nsetup: module load cuda\n"},
            ["model=tiny_llama", "cluster=cs"],
            ["cluster/cs.yaml: setup holds one value", "cluster.setup takes a list: setup: [module load cuda]"],
        ),
        (
            {"cluster/ce.yaml": "defaults:\n  - local\n  - _self_\nname: ce\nenv:\n  - HF_HUB_OFFLINE=1\n"},
            ["model=tiny_llama", "cluster=ce"],
            ["cluster/ce.yaml: env holds a list", "cluster.env takes a mapping: env: {HF_HUB_OFFLINE: '1'}"],
        ),
        (
            {"model/tl.yaml": "- name: tl\n- params_b: 8\n"},
            ["model=tl"],
            ["model/tl.yaml is a YAML list", "one a line with no '- ' before it (name: tl, params_b: 8)"],
        ),
        (
            {"dataset/flat.yaml": "source: /data/x.jsonl\nformatting: alpaca\n"},
            ["model=tiny_llama", "dataset=flat"],
            ["dataset/flat.yaml holds a dataset's keys (source, formatting) at its top", "flat: then source:"],
        ),
        (  # a group's option set as a key of a sweep file: the defaults list or an axis, not a model's keys
            {"sweep/sg.yaml": "# @package _global_\nsweep_name: sg\nmodel: tiny_llama\n"},
            ["-m", "+sweep=sg"],
            ["sweep/sg.yaml: model holds 'tiny_llama', and model is a config group", "override /model: tiny_llama"],
        ),
        (
            {"sweep/sp.yaml": "# @package _global_\nsweep_name: sp\nprune: [4, 0.3]\n"},
            ["-m", "model=tiny_llama", "+sweep=sp"],
            ["sweep/sp.yaml: prune holds a list, [4, 0.3]", "prune takes a mapping"],
        ),
    ],
)
def test_a_value_of_the_wrong_shape_names_the_file_the_key_and_the_shape(tmp_path, files, args, says):
    said = _refused(tmp_path, *args, env=_team(tmp_path, files))
    for words in says:
        assert words in said, said


# -- 3. ${oc.env:X} with X unset ------------------------------------------------------------------------------------


@pytest.mark.parametrize("multirun", [False, True])
def test_an_unset_oc_env_variable_names_the_key_the_variable_and_the_fix(tmp_path, multirun):
    said = _refused(
        tmp_path, *(["-m"] if multirun else []), "model=tiny_llama", "runs_root=${oc.env:SCRATCH_R7_UNSET}/runs"
    )
    assert "runs_root reads ${oc.env:SCRATCH_R7_UNSET}" in said, said
    assert "export SCRATCH_R7_UNSET=<value>" in said and "${oc.env:SCRATCH_R7_UNSET,/fallback}" in said, said
    assert "runs_root=${oc.env:SCRATCH_R7_UNSET}/runs" in said, said  # the cell as written, not Hydra's escapes
    assert "InterpolationResolutionError" not in said and "--cfg job" not in said, said


# -- 4. a defaults list that goes round, a sweep's axes without params: ---------------------------------------------


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        (
            {
                "sweep/c1.yaml": "# @package _global_\ndefaults:\n  - c2\nsweep_name: c1\n",
                "sweep/c2.yaml": "# @package _global_\ndefaults:\n  - c1\nsweep_name: c2\n",
            },
            "sweep/c1 -> sweep/c2 -> sweep/c1",
        ),
        (
            {"sweep/c1.yaml": "# @package _global_\ndefaults:\n  - c1\n  - _self_\nsweep_name: c1\n"},
            "sweep/c1 -> sweep/c1",
        ),
    ],
)
def test_a_defaults_cycle_is_one_refusal_naming_it(tmp_path, files, cycle):
    said = _refused(tmp_path, "-m", "model=tiny_llama", "+sweep=c1", env=_team(tmp_path, files))
    assert f"go round in a circle ({cycle})" in said and "[defaults-cycle]" in said, said
    assert "fix: remove c1 from the defaults of" in said and "RecursionError" not in said, said
    assert len(said.splitlines()) < 20, said


@pytest.mark.parametrize(
    ("sweeper", "says"),
    [
        ("    model: tiny_llama,tiny_qwen3\n", ["'model' is no key of the sweeper", "params: model: tiny_llama"]),
        ("    parms:\n      lr: 1e-3,1e-4\n", ["(did you mean 'params'?)", "rename parms: to params:"]),
        ("    params:\n      lr:\n", ["the axis 'lr' has no values", "lr: a,b"]),
    ],
)
def test_a_sweep_file_s_axes_out_of_place_or_empty_are_named(tmp_path, sweeper, says):
    text = f"# @package _global_\nsweep_name: sx\nhydra:\n  sweeper:\n{sweeper}"
    said = _refused(tmp_path, "-m", "model=tiny_llama", "+sweep=sx", env=_team(tmp_path, {"sweep/sx.yaml": text}))
    for words in says:
        assert words in said, said
    assert "SftGridSweeperConf" not in said and "is not Optional" not in said, said


def test_the_sweeper_keys_sweep_files_knows_are_the_sweeper_s():
    from dataclasses import fields

    from hydra_plugins.sft_grid_plugins import SftGridSweeperConf
    from sft_grid.planning.sweep_files import SWEEPER_KEYS

    assert set(SWEEPER_KEYS) == {f.name for f in fields(SftGridSweeperConf)}


# -- 5. an option Hydra does not read: .yml, a plural folder --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("model/mym.yml", "model/mym.yml exists: an option's file must end in .yaml (rename it mym.yaml)"),
        ("models/mym.yaml", "models/ is not a config group: did you mean"),
    ],
)
def test_an_option_hydra_does_not_read_says_where_it_is(tmp_path, name, says):
    env = _team(tmp_path, {name: f"name: mym\nparams_b: 8\n{MODEL}", "model/other.yaml": f"name: o\n{MODEL}"})
    said = _refused(tmp_path, "model=mym", env=env)
    assert says in said, said


def test_a_sweep_files_own_hydra_settings_are_held_to_the_command_lines_rules(tmp_path):
    """A sweep file is its command line written down: its defaults' `override /hydra/launcher` and its hydra:
    block's output folders would take the grid out of sft_grid's hands as the command line's would."""
    elsewhere = tmp_path / "elsewhere"
    sweep = (
        "# @package _global_\ndefaults:\n  - override /hydra/launcher: basic\nsweep_name: hy\n"
        f"hydra:\n  run:\n    dir: {elsewhere}\n  output_subdir: .hydra\n  sweeper:\n    params:\n"
        "      model: tiny_llama\n      lr: 1e-5,2e-5\n"
    )
    said = _refused(tmp_path, "-m", "+sweep=hy", env=_team(tmp_path, {"sweep/hy.yaml": sweep}))
    assert "3 problem(s)" in said and "reading the sweep files" in said, said
    assert "hydra/launcher='basic'" in said and "sft_grid needs its own hydra/launcher" in said, said
    assert f"hydra.run.dir='{elsewhere}'" in said and f"runs_root={elsewhere}" in said, said
    assert "hydra.output_subdir='.hydra'" in said, said
    assert not elsewhere.exists()


def test_two_model_options_under_one_name_are_refused_one_option_swept_is_not(tmp_path):
    """A model option copied by hand that kept its `name:` would read as the other model in the results and fits."""
    copy = f"name: tiny_qwen3\nparams_b: 8\n{MODEL}"
    env = _team(tmp_path, {"model/mine.yaml": copy})
    said = _refused(tmp_path, "-m", "model=tiny_qwen3,mine", env=env)
    assert "model.name='tiny_qwen3': names another model (Qwen/Qwen3-8B, model=mine)" in said, said
    assert "[model-name-shared]" in said and "name: mine in conf/model/mine.yaml" in said, said
    runs = f"runs_root={tmp_path / 'runs'}"
    swept = run_sft("-m", "model=mine", "model.hub_id=Qwen/Qwen3-8B,Qwen/Qwen3-4B", "dry_run=true", runs, env=env)
    out = swept.stdout + swept.stderr
    assert "grid of 2 cell(s)" in out and "model-name-shared" not in out, out
