"""Bad input, third round: the newer features (sites, steering, scores along training, `stage`), the same mistake
over many cells, and settings that train but not as meant. Each class is tried in at least two wordings; each is
refused before anything is written or queued, in one problem naming the cell (or the grid), the key, the value and
the fix, or, for the settings that train, warned about in the dry run. The read side on damaged files is
tests/test_damaged.py; the failure triage's wordings, tests/test_triage.py."""

from __future__ import annotations

import pytest

from sft_grid.planning.validate import validate

from .conftest import run_sft


def rules_of(problems):
    return {p.rule for p in problems}


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, f"not one {rule} problem in {[p.render() for p in problems]}"
    return found[0]


# -- the same mistake over many cells: told once ---------------------------------------------------------------


@pytest.mark.parametrize(
    "axes",
    [
        ["seed=range(0,300)", "lr=inf"],
        ["seed=range(0,120)", "micro_batch_size=3", "global_batch_size=16"],
    ],
)
def test_one_mistake_over_many_cells_is_told_once_with_the_count_and_a_few_names(tmp_path, axes):
    proc = run_sft("-m", *axes, "dry_run=true", f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 6, proc.stderr
    assert any(" cells: " in line and " more" in line for line in lines), proc.stderr
    assert not (tmp_path / "runs").exists()


# -- what a cell asks of its site ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+cluster.sbatch_extra.reservaton=maint", "did you mean reservation"),
        ("+cluster.sbatch_extra.gpus_per_nod=2", "did you mean gpus_per_node"),
        ("+cluster.sbatch_extra.time=99:00:00", "set time (checked against cluster.max_time)"),
        ("+cluster.sbatch_extra.partition=big", "set cluster.partition"),
        ("+cluster.sbatch_extra.t=10", "set time"),
        ("+cluster.sbatch_extra.mem=300M cluster.mem_gb=4", "set cluster.mem_gb alone"),
    ],
)
def test_an_sbatch_option_that_sbatch_does_not_know_or_sft_grid_sets_is_refused(make_cells, override, said):
    (cell,) = make_cells(["cluster=slurm_local", *override.split()])
    p = only(validate([cell]), "sbatch-extra")
    assert p.key.startswith("cluster.sbatch_extra.") and said in p.fix


def test_an_sbatch_option_the_cluster_leaves_unset_is_the_jobs(make_cells):
    (cell,) = make_cells(["cluster=slurm_local", "+cluster.sbatch_extra.mem=300M"])
    assert "sbatch-extra" not in rules_of(validate([cell]))


def test_the_known_sbatch_options_cover_sbatchs_own_list():
    """sbatch's own usage text as the oracle (where Slurm is installed): every long option it prints is known."""
    import re
    import shutil
    import subprocess

    from sft_grid.planning.site_rules import SBATCH_OPTIONS

    if not shutil.which("sbatch"):
        pytest.skip("sbatch is not installed here (make slurm-up)")
    text = subprocess.run(["sbatch", "--help"], capture_output=True, text=True, timeout=30).stdout
    listed = set(re.findall(r"--([a-z][a-z0-9-]+)", text)) - {"help", "usage", "version"}
    assert len(listed) > 50
    assert listed <= SBATCH_OPTIONS, sorted(listed - SBATCH_OPTIONS)


@pytest.mark.parametrize("account", [" proj123", "proj123 ", "\tproj123"])
def test_an_account_with_spaces_around_it_is_refused(make_cells, account):
    """As a profile writes it (quoted YAML keeps the spaces a copy-paste brought; Hydra's grammar keeps them quoted)."""
    (cell,) = make_cells(["cluster=slurm_local", f"cluster.account='{account}'"])
    p = only(validate([cell]), "slurm-name")
    assert p.fix == "cluster.account=proj123"


@pytest.mark.parametrize("sites", ["[slurm_local,slurm_local]", "[slurm_local,slurm_siteb,slurm_local]"])
def test_a_site_listed_twice_is_refused(make_cells, sites):
    (cell,) = make_cells(["cluster=slurm_local", f"sites={sites}"])
    p = only(validate([cell]), "sites-twice")
    assert "slurm_local" in p.message


@pytest.mark.parametrize("delay", ["2h", "00:00:00", "soon"])
def test_a_move_delay_slurm_could_not_read_is_refused_not_raised(make_cells, delay):
    (cell,) = make_cells(["cluster=slurm_local", f"+move_after={delay}"])
    p = only(validate([cell]), "time-format")
    assert p.key == "move_after" and "move_after=02:00:00" in p.fix


@pytest.mark.parametrize(
    "need", ["site_needs.gpu_type=H100", "site_needs.internet=true", "site_needs.cpu_arch=aarch64"]
)
def test_site_needs_without_sites_that_the_cells_cluster_does_not_meet_are_refused(make_cells, need):
    (cell,) = make_cells(["cluster=slurm_local", need])
    p = only(validate([cell]), "site-needs")
    assert "sites=[" in p.fix and "slurm_local" in p.message


def test_site_needs_the_cluster_meets_pass(make_cells):
    (cell,) = make_cells(["cluster=slurm_local", "site_needs.cpu_arch=x86_64"])
    assert "site-needs" not in rules_of(validate([cell]))


@pytest.mark.parametrize("python", ["''", "' '"])
def test_an_empty_remote_python_is_refused_not_read_as_a_dead_site(make_cells, python):
    (cell,) = make_cells(
        [
            "cluster=slurm_local",
            "cluster.remote.host=site",
            "cluster.remote.root=/srv",
            f"cluster.remote.python={python}",
        ]
    )
    assert only(validate([cell]), "remote-python").key == "cluster.remote.python"


@pytest.mark.parametrize("extra", [[], ["cluster.staging.partition=null"]])
def test_a_staging_job_on_compute_nodes_without_internet_is_refused(make_cells, extra):
    (cell,) = make_cells(["cluster=slurm_local", "cluster.staging.where=job", *extra])
    p = only(validate([cell]), "staging-site")
    assert "staging.partition" in p.fix and "staging.where=login" in p.fix


def test_a_staging_job_on_a_named_transfer_partition_passes(make_cells):
    (cell,) = make_cells(["cluster=slurm_local", "cluster.staging.where=job", "cluster.staging.partition=debug"])
    assert "staging-site" not in rules_of(validate([cell]))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--repo", "org/a/b"], "more than one '/'"),
        (["--repo", "bad--name"], "'--' and '..' are not allowed"),
        (["--repo", "org/ok", "--revision", "a b"], "not a branch, tag or commit sha"),
        (["--repo", "org/ok", "--revision", "../x"], "not a branch, tag or commit sha"),
    ],
)
def test_stage_holds_one_repository_to_the_rules_a_grid_is_held_to(tmp_path, args, said):
    proc = run_sft("stage", *args, "--cache", str(tmp_path / "cache"))
    assert proc.returncode == 1 and said in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "cache").exists()


# -- scores along training -------------------------------------------------------------------------------------


@pytest.mark.parametrize("along", ["checkpoint", "10"])
def test_scores_along_training_without_a_suite_are_refused(make_cells, along):
    (cell,) = make_cells([f"+eval.along={along}"])
    assert only(validate([cell]), "eval-along").key == "eval.along"


@pytest.mark.parametrize(
    "overrides", [["max_steps=10", "save_steps=100"], ["max_steps=20", "save_steps=20"], ["+extra.save_strategy=no"]]
)
def test_scores_along_training_that_no_checkpoint_will_feed_are_refused(make_cells, overrides):
    (cell,) = make_cells(["eval=tiny", "eval.along=checkpoint", *overrides])
    p = only(validate([cell]), "eval-along-checkpoints")
    assert "no checkpoint is saved before the end" in p.message


# -- steering that can never work ------------------------------------------------------------------------------

PRUNED = ["backend=synthetic", "max_steps=90", "save_steps=1000", "dry_run=true"]
RUNG = "+prune={rungs: [10, 30], keep: 0.5}"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["lr=1e-4,2e-4", RUNG, "+prune.by=[vars.modle]"], "'vars.modle' names no key of the cells"),
        (["lr=1e-4,2e-4", RUNG, "+prune.by=[lrr]"], "'lrr' names no key of the cells"),
        (["lr=1e-4", RUNG], "no bracket has two cells"),
        (["lr=1e-4,2e-4", RUNG, "+prune.by=[lr]"], "no bracket has two cells"),
        (["lr=1e-4,2e-4", "model=tiny_llama,tiny_qwen3", RUNG], "mixes models"),
        (["lr=1e-4,2e-4", "model=tiny_llama,tiny_qwen3", RUNG, "+prune.by=[seed]"], "mixes models"),
        (["lr=1e-4,2e-4", "+prune={rungs: [1e9], unit: tokens, keep: 0.5}"], "not before this cell's last step"),
        (
            ["lr=1e-4,2e-4", "max_steps=20,90", "+prune={rungs: [10, 30], keep: 0.5, by: [max_steps]}"],
            "cell's last step",
        ),
    ],
)
def test_a_pruned_grid_that_cannot_work_is_refused_with_nothing_written(tmp_path, args, said):
    proc = run_sft("-m", *PRUNED, *args, f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1 and said in proc.stderr and "[prune-block]" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_bad_steering_block_is_named_with_every_other_problem_of_the_grid(tmp_path):
    """The prune: block's problems are the flow's check's, reported with every other rule's in one run."""
    bad = ["lr=1e-4,2e-4", "+prune={rungs: [10, 30], keep: 1.5}", "warmup_ratio=2"]
    proc = run_sft("-m", *PRUNED, *bad, f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1, proc.stderr
    assert "prune.keep=1.5" in proc.stderr and "[prune-block]" in proc.stderr, proc.stderr
    assert "warmup_ratio=2.0" in proc.stderr and "[range]" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


ADAPTIVE = ["+sweep=synthetic_delphi", "+adaptive.at=9714698752", "+adaptive.budget_cells=8", "dry_run=true"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["+adaptive.holdout=[delphi-1e23]"], "delphi-1e23 names no model of the grid"),
        (["+adaptive.holdout=[delphi-1e22,9.7B]"], "9.7B names no model of the grid"),
        (["+adaptive.recipe_key=vars.recipy"], "'vars.recipy' names no key of the cells"),
        (["lr=1e-4,2e-4"], "differ in lr"),
        (["seed=1,2"], "differ in seed"),
        (["vars.model=delphi-3e18,delphi-9e18"], "at least 3 model sizes"),
        (["vars.model=delphi-3e18,delphi-9e18,delphi-1e22", "+adaptive.holdout=[delphi-1e22]"], "at least 3 model"),
        # a gap's decision needs every recipe's band: under a race, four sizes, one more than a fit; a ladder's
        # band, three (its foot, rung and top)
        (
            [
                "vars.model=delphi-3e18,delphi-9e18,delphi-2e19",
                "+adaptive.question=gap",
                "+adaptive.design=race",
                "+adaptive.recipes=[magpie,wildchat]",
            ],
            "question gap needs at least 4 model sizes",
        ),
        (
            ["vars.model=delphi-3e18,delphi-9e18", "+adaptive.question=gap", "+adaptive.recipes=[magpie,wildchat]"],
            "question gap needs at least 3 model sizes per recipe besides the holdouts (a ladder's band needs a foot",
        ),
    ],
)
def test_an_adaptive_grid_that_cannot_answer_is_refused_with_nothing_written(tmp_path, args, said):
    proc = run_sft("-m", *ADAPTIVE, *args, f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1 and said in proc.stderr and "[adaptive-block]" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_a_ladder_answers_a_gap_from_three_sizes_per_recipe(tmp_path):
    """Three sizes per recipe are a ladder's foot, rung and top: the grid the race refuses (above) is steered."""
    three = ["vars.model=delphi-3e18,delphi-9e18,delphi-2e19", "+adaptive.question=gap"]
    proc = run_sft("-m", *ADAPTIVE, *three, "+adaptive.recipes=[magpie,wildchat]", f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 0 and "[adaptive-block]" not in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dry run:" in proc.stdout


# -- settings that train, but not as meant: warned in the dry run ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["max_steps=10", "+extra.warmup_steps=20"], "is not shorter than the run (10 steps)"),
        (["max_steps=10", "+extra.warmup_steps=10"], "is not shorter than the run (10 steps)"),
        (["scheduler=constant", "warmup_ratio=0.1"], "the warmup asked for is ignored"),
        (["scheduler=constant", "+extra.warmup_steps=5"], "the warmup asked for is ignored"),
    ],
)
def test_a_schedule_that_is_not_what_its_keys_ask_for_is_warned_in_the_dry_run(tmp_path, args, said):
    proc = run_sft("-m", "backend=synthetic", "lr=1e-4,2e-4", *args, "dry_run=true", f"runs_root={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "2 cells" in warnings[0] and said in warnings[0], proc.stdout


# -- a data directory whose files do not share one schema -----------------------------------------------------

TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
SHAREGPT = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]


def _data_dir(root, rows_by_file):
    import json

    root.mkdir(parents=True)
    for name, row in rows_by_file.items():
        (root / name).write_text(json.dumps(row) + "\n")
    return root


@pytest.mark.parametrize(
    "files",
    [
        {"part-000.jsonl": {"messages": TURNS}, "part-001.jsonl": {"conversations": SHAREGPT}},
        {"a.jsonl": {"messages": TURNS}, "b.jsonl": {"messages": TURNS, "system": "be brief"}},
        {"train-0.jsonl": {"messages": TURNS}, "train-1.jsonl": {"msgs": TURNS}, "test-0.jsonl": {"x": 1}},
    ],
)
def test_a_data_directory_whose_files_differ_in_columns_is_refused_before_anything(tmp_path, files):
    data = _data_dir(tmp_path / "data", files)
    proc = run_sft(
        "model=tiny_llama", f"dataset.tiny_messages.source={data}", "dry_run=true", f"runs_root={tmp_path / 'runs'}"
    )
    assert proc.returncode == 1 and "do not share one schema" in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_files_of_another_split_may_differ(tmp_path):
    from sft_grid.planning.readable import data_files, same_columns

    data = _data_dir(tmp_path / "data", {"train-0.jsonl": {"messages": TURNS}, "test-0.jsonl": {"other": 1}})
    same_columns(data, data_files(data), "train")  # no error: the test split is not trained


@pytest.mark.backend
def test_the_datasets_library_fails_where_the_check_refuses(tmp_path, tiny_assets):
    """The oracle: the datasets library of LLaMA-Factory's environment reads a directory's files as one table and
    fails on files that differ in columns, and reads files that share them."""
    import subprocess

    from sft_grid.planning.environments import VenvSpec

    python = VenvSpec.load("llamafactory").path / "bin" / "python"
    script = (
        "import sys, datasets\n"
        "try:\n"
        "    datasets.load_dataset('json', data_files=sorted(sys.argv[1:]), split='train')\n"
        "except Exception as exc:\n"
        "    print('FAILED', type(exc).__name__); sys.exit(3)\n"
        "print('READ')\n"
    )
    bad = _data_dir(tmp_path / "bad", {"a.jsonl": {"messages": TURNS}, "b.jsonl": {"conversations": SHAREGPT}})
    good = _data_dir(tmp_path / "good", {"a.jsonl": {"messages": TURNS}, "b.jsonl": {"messages": TURNS}})
    env = {"HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    for data, rc in ((bad, 3), (good, 0)):
        proc = subprocess.run(
            [str(python), "-c", script, *map(str, sorted(data.glob("*.jsonl")))],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert proc.returncode == rc, proc.stdout + proc.stderr


@pytest.mark.parametrize("damage", [b"\xc3\x28\n", b'{"event": "planned"}\n\xff\xfe\n'])
def test_a_run_over_a_grid_with_a_damaged_ledger_stops_in_one_line(tmp_path, damage):
    grid = ["-m", "model=tiny_llama", "lr=1e-4,2e-4", "backend=synthetic", "dry_run=true", f"runs_root={tmp_path}"]
    assert run_sft(*grid).returncode == 0
    ledger = sorted((tmp_path / "default").glob("*/"))[0] / "events.jsonl"
    with ledger.open("ab") as fh:
        fh.write(damage)
    proc = run_sft(*grid)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "damaged file" in ln]
    assert str(ledger) in line and "is not UTF-8" in line
