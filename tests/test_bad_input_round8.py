"""Bad input, eighth round: what a dry run, a steered grid and a grid across sites did with what they were given. A
dry run over a grid that has finished cells, a steering round a dry run would have recorded, a recipes list given
as one string, a wall time a site could not read: each leaves the grid's record as it was, or is refused naming
the key, the value and the fix, with no traceback."""

from __future__ import annotations

import shutil

from sft_grid.core.layout import iter_cell_dirs

from .conftest import run_sft


def _files(cell):
    return {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()}


def test_a_dry_run_over_a_finished_grid_leaves_every_cells_record_as_it_was(tmp_path):
    """Before, each finished (skipped) cell's cell.yaml, launch.sh and backend config were rendered again in place,
    saying dry_run: true and whatever the new command changed."""
    runs = tmp_path / "runs"
    grid = ["-m", "backend=synthetic", "max_steps=3,4", f"runs_root={runs}"]
    run_sft(*grid, check=True, timeout=300)  # two finished cells (the simulator: a second each)
    cells = sorted(iter_cell_dirs(runs / "default"))
    before = {c.name: _files(c) for c in cells}
    dry = run_sft(*grid, "logging_steps=2", "dry_run=true", check=True, timeout=300)
    assert "would skip" in dry.stdout and ".dry_run/<cell>/" in dry.stdout, dry.stdout
    assert {c.name: _files(c) for c in cells} == before
    preview = runs / "default" / ".dry_run" / cells[0].name
    assert "dry_run: true" in (preview / "cell.yaml").read_text()  # what it would render, beside the record


def test_a_wall_time_a_site_cannot_read_is_a_refusal_not_a_traceback(make_cells):
    """Before, placing a grid across sites crashed on `time=1h` (validation names it, with its fix, once the cells
    are placed) and on a site profile's `max_time: forever`."""
    import dataclasses

    from sft_grid.sites import placement

    (cell,) = make_cells(["model=tiny_llama", "time=1h"])
    need = placement.need_of(cell)
    assert need.minutes == 0  # unknown: the time-format rule refuses the cell
    site = placement.SiteFacts(name="far", cluster=dataclasses.replace(cell.spec.cluster, max_time="forever"))
    (cell,) = make_cells(["model=tiny_llama"])
    assert placement.refusal(placement.need_of(cell), site) == (
        "sites",
        "far",
        "far's profile has max_time 'forever', which is not a wall time",
    )


STEERED = [
    "-m",
    "model=tiny_llama",
    "max_steps=2,4,8,16",
    "lr=1e-3,1e-4",
    "+adaptive.question=gap",
    "+adaptive.recipes=[1e-3,1e-4]",
    "+adaptive.recipe_key=lr",
    "+adaptive.size_key=max_steps",
    "+adaptive.at=64",
]


def test_a_dry_run_records_no_round_even_where_the_round_leaves_no_cell(tmp_path):
    """Before, a round that chose no cell (a budget that affords none) left the grid with no cell to say it was a
    dry run, and its round was recorded: a later real run replayed that empty choice for good. Such a budget is now
    refused before any round (it affords less than the seed design), and still nothing is written."""
    runs = tmp_path / "runs"
    dry = run_sft(*STEERED, "+adaptive.budget_gpu_hours=1e-9", "dry_run=true", f"runs_root={runs}")
    said = dry.stdout + dry.stderr
    assert dry.returncode == 1 and "adaptive.budget_gpu_hours=1e-09: affords less than" in said, said
    assert not runs.exists() or not [p for p in runs.rglob("*") if p.is_file()]


def test_a_round_recorded_under_another_adaptive_block_is_chosen_again_and_the_same_block_replays(tmp_path):
    runs = f"runs_root={tmp_path / 'runs'}"
    synthetic = [*STEERED, "backend=synthetic"]  # the simulator: round 1's cells train in a second each
    run_sft(*synthetic, "+adaptive.budget_cells=6", runs, check=True, timeout=300)  # records and runs round 1
    for cell in iter_cell_dirs(tmp_path / "runs" / "default"):  # as if the orchestrator died after recording it
        shutil.rmtree(cell)
    changed = run_sft(*synthetic, "+adaptive.budget_cells=7", "dry_run=true", runs, check=True)
    said = changed.stdout + changed.stderr
    assert "the adaptive: block differs from round 1's" in said, said
    assert "budget_cells: 6 -> 7; chosen again" in said, said
    assert "already recorded" not in said, said
    same = run_sft(*synthetic, "+adaptive.budget_cells=6", "dry_run=true", runs, check=True)
    assert "round 1 already recorded" in same.stdout + same.stderr, same.stdout + same.stderr


def test_recipes_given_as_one_string_or_twice_are_told_so(tmp_path):
    """Before, `recipes: magpie, wildchat` was read letter by letter ("names a recipe twice: [' ', ',', 'a', ...]")."""
    as_text = run_sft(
        *STEERED[:5],
        "+adaptive.recipes='1e-3,1e-4'",
        *STEERED[6:],
        "+adaptive.budget_cells=4",
        "dry_run=true",
        cwd=tmp_path,
    )
    said = as_text.stdout + as_text.stderr
    assert as_text.returncode == 1 and "adaptive.recipes='1e-3,1e-4': must be a list of recipes, not one string" in said
    assert "'+adaptive.recipes=[1e-3,1e-4]'" in said and "two or more recipes" not in said, said


def test_a_wait_is_hh_mm_ss_not_a_bare_number_nor_parts_of_60_or_more():
    """Before, move_after=3600 (meant as seconds) waited 3600 minutes, and 25:99:99 was 26:40:39."""
    from sft_grid.planning.site_rules import _wait_problem

    assert "a bare number, which would be read as 3600 minutes (60:00:00), not seconds" in _wait_problem("3600")
    assert "minutes or seconds of 60 or more" in _wait_problem("25:99:99")
    assert "a zero wait" in _wait_problem("00:00:00")
    assert "not a wall time" in _wait_problem("1h")
    assert _wait_problem("02:00:00") is None and _wait_problem("1-12:00:00") is None


def test_a_key_left_empty_in_a_sweep_file_is_named_with_what_to_write(tmp_path):
    """`adaptive:` with only comments under it, `lr:` with nothing after: OmegaConf's "not Optional" and
    "Incompatible value 'None'", now the file, the key and the fix."""
    conf = tmp_path / "conf" / "sweep"
    conf.mkdir(parents=True)
    head = "# @package _global_\nsweep_name: e\n"
    axes = "hydra:\n  sweeper:\n    params:\n      model: tiny_llama\n"
    (conf / "blk.yaml").write_text(head + "adaptive:\n  # question: gap\n" + axes)
    (conf / "val.yaml").write_text(head + "lr:\n" + axes)
    env = {"SFT_GRID_CONF": str(tmp_path / "conf")}
    runs = f"runs_root={tmp_path / 'runs'}"
    for name, said in [
        (
            "blk",
            "blk.yaml: adaptive is empty (YAML's null: nothing after its colon, or only comments under it):"
            " delete the line `adaptive:`",
        ),
        ("val", "val.yaml: lr is empty (YAML's null: nothing after its colon, or only comments under it): give it"),
    ]:
        proc = run_sft("-m", f"+sweep={name}", "dry_run=true", runs, env=env, cwd=tmp_path)
        assert proc.returncode == 1 and said in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_cells_directory_or_name_given_to_run_says_how_a_cell_is_rerun(tmp_path):
    runs = tmp_path / "runs"
    run_sft("-m", "backend=synthetic", "max_steps=3", f"runs_root={runs}", check=True, timeout=300)
    (cell,) = iter_cell_dirs(runs / "default")
    by_dir = run_sft("run", str(cell), cwd=tmp_path)
    assert by_dir.returncode != 0 and f"{cell} is a cell's directory, not an override" in by_dir.stderr
    assert "backend=synthetic max_steps=3" in by_dir.stderr and "force=true" in by_dir.stderr, by_dir.stderr
    by_name = run_sft("run", cell.name, cwd=tmp_path)
    assert by_name.returncode != 0 and f"{cell.name} looks like a cell's name" in by_name.stderr, by_name.stderr


def test_a_site_profile_is_held_to_the_schema_as_cluster_is(tmp_path):
    """Before, a profile named only in sites=[...] skipped the ranges (max_nodes: 0 took cells) and its unknown key
    was told without the key ("object_type=ClusterConf ... fix the profile")."""
    from pathlib import Path

    shipped = (
        Path(__file__).resolve().parent.parent / "sft_grid" / "conf" / "cluster" / "slurm_siteb.yaml"
    ).read_text()
    conf = tmp_path / "conf" / "cluster"
    conf.mkdir(parents=True)
    kept = "\n".join(line for line in shipped.splitlines() if not line.startswith(("max_nodes:", "site_answer_tries:")))
    (conf / "zero.yaml").write_text(kept + "\nmax_nodes: 0\nsite_answer_tries: 0\n")
    (conf / "typo.yaml").write_text(shipped + "\ngpu_mem: 80\n")
    env = {"SFT_GRID_CONF": str(tmp_path / "conf")}
    grid = ["-m", "model=tiny_llama", "cluster=slurm_local", "dry_run=true", f"runs_root={tmp_path / 'runs'}"]
    zero = run_sft(*grid, "sites=[slurm_local,zero]", env=env, cwd=tmp_path)
    said = zero.stdout + zero.stderr
    assert zero.returncode == 1 and "sites.zero.max_nodes=0: must be >= 1 [range]" in said, said
    assert "sites.zero.site_answer_tries=0: must be >= 1" in said and f"in {conf / 'zero.yaml'}" in said, said
    typo = run_sft(*grid, "sites=[slurm_local,typo]", env=env, cwd=tmp_path)
    said = typo.stdout + typo.stderr
    assert "sites.typo.gpu_mem=80:" in said and "Key 'gpu_mem' not in 'ClusterConf'" in said, said
    assert "(did you mean 'gpu_mem_gb'?)" in said and "Traceback" not in said, said
    assert not (tmp_path / "runs").exists()
