"""`python -m sft_grid` as users type it: Hydra's CLI, dry runs, and bad input refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sft_grid.core.paths import PACKAGE_CONF

from .conftest import run_sft


def cell_dirs(root: Path, sweep: str = "default") -> list[Path]:
    return sorted(p for p in (root / sweep).glob("*") if (p / "cell.yaml").is_file())


def _groups_in_conf(*roots: Path) -> dict[str, set[str]]:
    """Every config group under these directories (a directory holding .yaml files, symlinks followed: conf/sweep is
    ../sweeps) and its options, read from the files themselves."""
    groups: dict[str, set[str]] = {}
    for root in roots:
        for path in root.rglob("*.yaml"):
            if path.parent != root:
                groups.setdefault(str(path.parent.relative_to(root)), set()).add(path.stem)
    for target in (p for root in roots for p in root.iterdir() if p.is_symlink() and p.is_dir()):
        groups.setdefault(target.name, set()).update(p.stem for p in target.resolve().glob("*.yaml"))
    return groups


def _groups_in_help(text: str) -> dict[str, set[str]]:
    section = text.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    lines = [line for line in section.splitlines()[2:] if line.strip()]
    return {g: set(o.split(", ")) for g, o in (line.split(": ", 1) for line in lines)}


def test_help_lists_every_group_and_option_and_hydras_sections():
    proc = run_sft("--help", check=True)
    assert proc.stdout.startswith("sft_grid: declarative SFT experiment grids.")  # conf/config.yaml's header
    assert "sft-grid run -m +sweep=smoke" in proc.stdout and "Run switches: dry_run" in proc.stdout  # footer
    assert "Compose your configuration from those groups (group=option)" in proc.stdout
    assert "== Config ==" in proc.stdout and "lr: 1.0e-05" in proc.stdout
    assert _groups_in_help(proc.stdout) == _groups_in_conf(PACKAGE_CONF)


def test_help_shows_an_option_file_added_since(tmp_path):
    """An option (and a group) added to the search path (--config-dir: Hydra's help lists the groups of the search
    path it starts with, not of a `hydra.searchpath` override) is in the help of the next invocation."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "zz_added.yaml").write_text("name: zz_added\n")
    (tmp_path / "extra_group").mkdir()
    (tmp_path / "extra_group" / "only.yaml").write_text("x: 1\n")
    proc = run_sft("--help", "--config-dir", str(tmp_path), check=True)
    expected = _groups_in_conf(PACKAGE_CONF)
    expected["model"].add("zz_added")
    expected["extra_group"] = {"only"}
    assert _groups_in_help(proc.stdout) == expected
    hydra_help = run_sft("--hydra-help", check=True).stdout
    assert "hydra/launcher: " in hydra_help and "sft_grid" in hydra_help.split("hydra/launcher: ", 1)[1]


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
    # the data is local; the loss-mask check of its data needs the hub tokenizer too (each cell, alone on its
    # tokenizer here, tokenizes in its own job: no shared tokenized dataset to check for)
    expected = {("template_tokens", "model.template"), ("loss_mask", "dataset.tiny_messages")}
    deferred = json.loads((qwen / "preflight.json").read_text())["deferred"]
    assert {(d["kind"], d["key"]) for d in deferred} == expected
    # a Delphi cell also checks, first thing in its job, that its model's prep (run before it) succeeded
    deferred = json.loads((delphi / "preflight.json").read_text())["deferred"]
    assert {(d["kind"], d["key"]) for d in deferred} == expected | {("prepared", "model")}
    assert not (delphi / "events.jsonl").exists()  # a dry run submits nothing: the ledger starts at submission


def test_hydra_sweep_grammar(tmp_path, tiny_assets):
    proc = run_sft(
        "-m",
        "model=glob(tiny_*)",
        "seed=range(1,3)",
        "lr=choice(1e-4,2e-4)",
        "dry_run=true",
        f"runs_root={tmp_path}",
        check=True,
    )
    models = len(list((PACKAGE_CONF / "model").glob("tiny_*.yaml")))  # tiny_llama, tiny_qwen3, tiny_delphi
    assert len(cell_dirs(tmp_path)) == models * 4, proc.stdout
    assert f"{models * 4} cell(s) rendered" in proc.stdout


def test_dry_run_table_has_what_users_check(tmp_path, tiny_assets):
    proc = run_sft("-m", "+sweep=smoke", "dry_run=true", f"runs_root={tmp_path}", check=True)
    header = proc.stdout.splitlines()[0].split()
    assert header == [
        "cell",
        "model",
        "template",
        "length",
        "lr",
        "grad_acc",
        "layout",
        "mem/GPU",
        "data[role/user/assistant]",
        "push_to_hub",
        "output",
    ]
    # a CPU grid: one node each, eager attention, no GPU memory to predict
    assert "1 node(s), CPU, eager" in proc.stdout
    assert "tiny_messages:messages[role/user/assistant]" in proc.stdout and "4 steps" in proc.stdout
    assert len(cell_dirs(tmp_path, "smoke")) == 4


def test_bad_input_is_refused_with_every_problem_and_nothing_written(tmp_path):
    proc = run_sft(
        "-m",
        "model=tiny_llama,delphi",
        "model.template=qwen3",
        "global_batch_size=10",
        "micro_batch_size=4",
        "time=30:00:00",
        f"runs_root={tmp_path}",
    )
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


@pytest.mark.parametrize(
    ("override", "good", "said"),
    [
        ("lr=abc", "1e-5", "lr takes a number (2e-05, 0.1, 3), not 'abc'"),
        ("packing=maybe", "true", "packing takes true or false, not 'maybe'"),
        (
            "eval.tasks.tiny_mc.num_fewshot=two",
            "0",
            "eval.tasks.tiny_mc.num_fewshot takes a whole number (4), not 'two'",
        ),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_and_what_it_takes(tmp_path, override, good, said):
    """OmegaConf's own refusal (Hydra composes, as the oracle), with the key, the value and what the key takes: one
    cell (Hydra's error, then the hint) and a swept grid (the problem of the cell, its key and value, the fix)."""
    one = run_sft("model=tiny_llama", "eval=tiny", override, f"runs_root={tmp_path}")
    assert one.returncode == 1 and f"hint: {said}" in one.stderr, one.stderr
    key, value = override.split("=")
    swept = run_sft("-m", "model=tiny_llama", "eval=tiny", f"{override},{good}", f"runs_root={tmp_path}")
    said_swept = swept.stdout + swept.stderr
    assert swept.returncode == 1 and f"{key}={value!r}: " in said_swept and f"fix: {said}" in said_swept, said_swept
    assert not any(tmp_path.rglob("cell.yaml"))


def test_unknown_option_suggests_the_closest(tmp_path):
    proc = run_sft("-m", "model=tiny_llama,tiny_qwn3", f"runs_root={tmp_path}")
    assert proc.returncode == 1
    assert "did you mean 'tiny_qwen3'?" in proc.stderr
    assert not any(tmp_path.rglob("cell.yaml"))
