"""Bad input, sixth round: what Hydra's composition crashed on or quietly misread. A range that never ends, a harness
that does not exist, a required config group removed or set to null, a list for a group that takes one option, an
empty runs root, a $SFT_GRID_CONF that names no folder: each is refused naming the key, the value and the fix, with
no traceback and nothing written."""

from __future__ import annotations

import pytest

from .conftest import run_sft


def _refused(tmp_path, *args: str, env: dict[str, str] | None = None, code: int | None = None) -> str:
    """Run the grid command in an empty folder (so that a default runs/ would show there) and return what it said,
    asserting that it failed, without a traceback, and wrote nothing."""
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft(*args, "dry_run=true", f"runs_root={here / 'runs'}", cwd=here, env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 if code is None else proc.returncode == code, said
    assert "Traceback" not in said, said
    assert list(here.iterdir()) == [], said  # nothing written, here or under runs/
    return said


# -- 1. swept ranges and intervals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("axis", "rule", "says"),
    [
        ("seed=range(1,3,0)", "[axis-step]", ["a step of 0 never gets there", "seed=range(1,3,1)", "seed=range(1,3)"]),
        ("seed=range(3,1,0)", "[axis-step]", ["seed=range(3,1,-1)"]),
        ("seed=range(1,3,-1)", "[axis-empty]", ["a negative step counts down", "seed=range(3,1,-1)"]),
        ("seed=range(3,1)", "[axis-empty]", ["a positive step counts up", "seed=range(1,3)"]),
        ("seed=interval(1,3)", "[axis-continuous]", ["seed=1,2,3,", "seed=range(1,4) (seed takes whole numbers"]),
        ("lr=interval(1e-5,1e-4)", "[axis-continuous]", ["lr=1e-05,3.16e-05,0.0001"]),
    ],
)
def test_a_swept_range_or_interval_that_gives_no_values_is_refused_with_values_that_work(tmp_path, axis, rule, says):
    said = _refused(tmp_path, "-m", "model=tiny_llama", axis)
    key, value = axis.split("=", 1)
    assert f"{key}='{value}'" in said and rule in said, said
    for words in says:
        assert words in said, said
    assert "needs a < b" not in said and "ValueError" not in said, said
    if key == "seed":
        assert "1e-5" not in said, said  # a float example for an integer key


# -- 2. a harness that does not exist ------------------------------------------------------------------------------


@pytest.mark.parametrize("multirun", [False, True])
def test_an_unknown_harness_is_a_value_problem_not_a_key_error(tmp_path, multirun):
    said = _refused(tmp_path, *(["-m"] if multirun else []), "model=tiny_llama", "eval=tiny", "eval.harness=foo")
    assert "eval.harness='foo'" in said and "fix: use one of lm_eval" in said, said
    assert "KeyError" not in said and "unknown virtual environment" not in said, said


# -- 3. a required config group removed ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "group", "option"),
    [
        (["~model"], "model", "tiny_llama"),
        (["-m", "~model"], "model", "tiny_qwen3"),
        (["model=tiny_llama", "~cluster"], "cluster", "slurm_local"),
        (["-m", "model=tiny_llama", "~backend"], "backend", "llamafactory"),
    ],
)
def test_removing_a_required_group_is_refused_with_its_options(tmp_path, args, group, option):
    said = _refused(tmp_path, *args)
    assert f"{group}='~{group}'" in said and "cannot be removed [group-required]" in said, said
    assert f"fix: choose one of its options instead, {group}=<option>:" in said and option in said, said
    assert "AttributeError" not in said and "TypeError" not in said, said


def test_removing_the_datasets_says_the_cell_trains_on_none(tmp_path):
    said = _refused(tmp_path, "model=tiny_llama", "~dataset")
    assert "the cell trains on no dataset [dataset-empty]" in said and "dataset=[a,b]" in said, said


# -- 4. a config group set to null (or a number) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "group", "option"),
    [
        (["model=null"], "model", "tiny_llama"),
        (["-m", "model=null"], "model", "tiny_llama"),
        (["model=tiny_llama", "backend=null"], "backend", "axolotl"),
        (["model=tiny_llama", "eval=null"], "eval", "eval=none runs no evaluation"),
        (["model=1"], "model", "tiny_qwen3"),
    ],
)
def test_a_group_given_no_options_name_is_refused_with_its_options(tmp_path, args, group, option):
    said = _refused(tmp_path, *args)
    value = args[-1].split("=", 1)[1]
    assert f"{group}='{value}'" in said and "[group-option]" in said, said
    assert f"takes the name of one of its options, not {'null' if value == 'null' else value}" in said, said
    assert f"fix: {group}=<option>" in said and option in said, said
    assert "must be a string or a list" not in said, said


# -- 5. a list for a group that takes one option -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["-m", "model=[tiny_llama,tiny_qwen3]"], "-m model=tiny_llama,tiny_qwen3 (one cell each), or pick one"),
        (["model=[tiny_llama,tiny_qwen3]"], "-m model=tiny_llama,tiny_qwen3"),
        (["model=tiny_llama", "cluster=[local,slurm_local]"], "-m cluster=local,slurm_local"),
        (["-m", "model=tiny_llama", "eval=[tiny,none]"], "-m eval=tiny,none"),
    ],
)
def test_a_list_for_a_single_choice_group_is_refused(tmp_path, args, fix):
    said = _refused(tmp_path, *args)
    group, value = args[-1].split("=", 1)
    assert f"{group}='{value}'" in said and "[group-one]" in said, said
    assert f"{group} takes one option: a list of them is merged into one cell" in said, said
    assert f"fix: sweep them with {fix}" in said, said


def test_a_list_of_datasets_is_still_a_mix(tmp_path):
    proc = run_sft("run", "--cfg", "job", "model=tiny_llama", "dataset=[tiny_messages,tiny_sharegpt]", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "  tiny_messages:" in proc.stdout and "  tiny_sharegpt:" in proc.stdout, proc.stdout


# -- 6. an empty runs root -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["model=tiny_llama", "runs_root="],
        ["-m", "model=tiny_llama,tiny_qwen3", "runs_root="],
        ["model=tiny_llama", "cluster.runs_root="],
    ],
)
def test_an_empty_runs_root_is_refused_like_an_empty_sft_grid_runs(tmp_path, args):
    key = args[-1].rstrip("=")
    # no runs_root of the test's own: the empty one is the last word, and a default runs/ would land in tmp_path
    proc = run_sft(*args[:-1], "dry_run=true", args[-1], cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in said, said
    assert f"{key}='': {key} is empty: it names where grids are (the runs root)" in said and "[runs-root]" in said, said
    assert f"or give one: {key}=<directory>" in said, said
    assert list(tmp_path.iterdir()) == [], said


# -- 7. $SFT_GRID_CONF that names no folder ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "file", "empty", "colon"])
def test_sft_grid_conf_that_names_no_folder_is_refused_as_config_dir_is(tmp_path, case):
    (tmp_path / "a_file").write_text("")
    value = {"missing": str(tmp_path / "nope"), "file": str(tmp_path / "a_file"), "empty": "", "colon": ":"}[case]
    said = _refused(tmp_path, "model=tiny_llama", env={"SFT_GRID_CONF": value}, code=2)
    assert "environment variable SFT_GRID_CONF" in said, said
    if case in ("missing", "file"):
        what = "does not exist" if case == "missing" else "is a file"
        assert f"names {value!r}, which {what}" in said and "export SFT_GRID_CONF=<folder>" in said, said
    elif case == "empty":
        assert "SFT_GRID_CONF is empty" in said and "unset SFT_GRID_CONF" in said, said
    else:
        assert "SFT_GRID_CONF is ':', naming no folder" in said, said
    # the other commands ask the same question first
    status = run_sft("status", cwd=tmp_path, env={"SFT_GRID_CONF": value})
    assert status.returncode == 2 and "environment variable SFT_GRID_CONF" in status.stderr, status.stderr


def test_a_sweep_files_group_axis_is_held_to_the_command_lines_rules(tmp_path):
    """The same group rules in a sweep file's axes (hydra.sweeper.params): a list for one option, and null."""
    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    (tmp_path / "conf" / "sweep" / "g.yaml").write_text(
        "# @package _global_\nsweep_name: g\nhydra:\n  sweeper:\n    params:\n"
        "      model: tiny_llama,[tiny_llama,tiny_qwen3]\n      backend: null\n      lr: 1e-5,2e-5\n"
    )
    runs = tmp_path / "runs"
    proc = run_sft("--config-dir", str(tmp_path / "conf"), "-m", "+sweep=g", "dry_run=true", f"runs_root={runs}")
    said = proc.stderr
    assert proc.returncode == 1 and "Traceback" not in said, said
    assert "hydra.sweeper.params.model='tiny_llama,[tiny_llama,tiny_qwen3]'" in said, said
    assert "it would train tiny_qwen3 alone" in said and "[sweep-file]" in said, said
    assert "hydra.sweeper.params.backend=None" in said and "not null" in said, said
    assert not runs.exists()


# -- an empty mapping that clears nothing ----------------------------------------------------------------------------


@pytest.mark.parametrize("multirun", [False, True])
def test_an_empty_mapping_is_refused_where_it_would_clear_nothing_and_its_fix_works(tmp_path, multirun):
    """Hydra merges `eval.tasks={}` into the suite's tasks: every task would still be scored."""
    m = ["-m"] if multirun else []
    said = _refused(tmp_path, *m, "model=tiny_llama", "eval=tiny", "eval.tasks={}")
    assert "eval.tasks='{}'" in said and "an empty mapping clears nothing" in said, said
    assert "~eval.tasks.tiny_gen ~eval.tasks.tiny_mc" in said and "eval=none" in said, said
    fixed = run_sft(
        *m,
        "model=tiny_llama",
        "eval=tiny",
        "~eval.tasks.tiny_gen",
        "dry_run=true",
        f"runs_root={tmp_path / 'runs'}",
        cwd=tmp_path,
    )
    assert fixed.returncode == 0 and "1 cell(s) x 1 task(s)" in fixed.stdout + fixed.stderr, fixed.stderr


def test_an_empty_mapping_is_left_alone_where_there_is_nothing_to_clear(make_cells):
    from sft_grid.planning.axes import empty_mappings

    (bare, later, before) = make_cells(
        ["model=tiny_llama", "extra={}"],
        ["model=tiny_llama", "extra={}", "+extra.ddp_timeout=60"],  # what it holds comes after it: the user's own
        ["model=tiny_llama", "+extra.ddp_timeout=60", "extra={}"],
    )
    assert list(empty_mappings(bare)) == [] and list(empty_mappings(later)) == []
    (p,) = empty_mappings(before)
    assert (p.key, p.rule, p.fix) == ("extra", "empty-mapping", "remove its entries one by one: ~extra.ddp_timeout")
