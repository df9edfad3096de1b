"""`python -m sft_grid` as users type it: Hydra's CLI, dry runs, and bad input refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from sft_grid.core.paths import CONF_DIR

from .conftest import run_sft


def cell_dirs(root: Path, sweep: str = "default") -> list[Path]:
    return sorted(p for p in (root / sweep).glob("*") if (p / "cell.yaml").is_file())


def test_help_shows_usage_and_groups():
    proc = run_sft("--help", check=True)
    assert "python -m sft_grid -m +sweep=smoke" in proc.stdout
    assert "model: delphi, qwen3_32b" in proc.stdout and "sweep: " in proc.stdout


def test_cfg_job_prints_a_composed_cell():
    proc = run_sft("--cfg", "job", "model=qwen3_8b", "dataset=magpie", check=True)
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["model"]["hub_id"] == "Qwen/Qwen3-8B" and cfg["dataset"]["magpie"]["tags"]["assistant_tag"] == "gpt"


def test_users_command_dry_runs_here_with_hub_checks_deferred(tmp_path, tiny_assets):
    proc = run_sft("-m", "model=qwen3_8b,delphi", "lr=2e-5", "dry_run=true", f"runs_root={tmp_path}", check=True)
    assert "qwen3_8b_lr2e-05-" in proc.stdout and "delphi_lr2e-05-" in proc.stdout
    assert "deferred to the job's first step" in proc.stdout and "Qwen/Qwen3-8B" in proc.stdout
    dirs = cell_dirs(tmp_path)
    assert len(dirs) == 2
    delphi, qwen = dirs
    # the data is local; the loss-mask check of its data needs the hub tokenizer too
    # and, first thing in its job, that the grid's shared tokenized dataset (built before it) was built
    expected = {("template_tokens", "model.template"), ("loss_mask", "dataset.tiny_messages"), ("tokenized", "tokenized")}
    deferred = json.loads((qwen / "preflight.json").read_text())["deferred"]
    assert {(d["kind"], d["key"]) for d in deferred} == expected
    # a Delphi cell also checks, first thing in its job, that its model's prep (run before it) succeeded
    deferred = json.loads((delphi / "preflight.json").read_text())["deferred"]
    assert {(d["kind"], d["key"]) for d in deferred} == expected | {("prepared", "model")}
    assert not (delphi / "events.jsonl").exists()  # a dry run submits nothing: the ledger starts at submission


def test_hydra_sweep_grammar(tmp_path, tiny_assets):
    proc = run_sft("-m", "model=glob(tiny_*)", "seed=range(1,3)", "lr=choice(1e-4,2e-4)", "dry_run=true",
                   f"runs_root={tmp_path}", check=True)
    models = len(list((CONF_DIR / "model").glob("tiny_*.yaml")))  # tiny_llama, tiny_qwen3, tiny_delphi
    assert len(cell_dirs(tmp_path)) == models * 4, proc.stdout
    assert f"{models * 4} cell(s) rendered" in proc.stdout


def test_dry_run_table_has_what_users_check(tmp_path, tiny_assets):
    proc = run_sft("-m", "+sweep=smoke", "dry_run=true", f"runs_root={tmp_path}", check=True)
    header = proc.stdout.splitlines()[0].split()
    assert header == ["cell", "model", "template", "length", "lr", "grad_acc", "data[role/user/assistant]",
                      "push_to_hub", "output"]
    assert "tiny_messages:messages[role/user/assistant]" in proc.stdout and "4 steps" in proc.stdout
    assert len(cell_dirs(tmp_path, "smoke")) == 4


def test_bad_input_is_refused_with_every_problem_and_nothing_written(tmp_path):
    proc = run_sft("-m", "model=tiny_llama,delphi", "model.template=qwen3", "global_batch_size=10",
                   "micro_batch_size=4", "time=30:00:00", f"runs_root={tmp_path}")
    assert proc.returncode == 1
    err = proc.stderr
    assert "problem(s) in 2 cell(s)" in err and "nothing was submitted" in err
    for text in ("batch-divisible", "template-tokenizer", "time-max", "fix: model.template=llama3"):
        assert text in err
    assert not tmp_path.exists() or not any(tmp_path.rglob("cell.yaml"))


def test_unknown_key_lists_valid_keys(tmp_path):
    proc = run_sft("-m", "lrr=1e-5", "model=tiny_llama,tiny_qwen3", f"runs_root={tmp_path}")
    assert proc.returncode == 1
    assert "Key 'lrr' not in 'CellConf'" in proc.stderr
    assert "hint: valid keys of CellConf:" in proc.stderr and "did you mean 'lr'?" in proc.stderr


def test_unknown_option_suggests_the_closest(tmp_path):
    proc = run_sft("-m", "model=tiny_llama,tiny_qwn3", f"runs_root={tmp_path}")
    assert proc.returncode == 1
    assert "did you mean 'tiny_qwen3'?" in proc.stderr
    assert not any(tmp_path.rglob("cell.yaml"))
