"""Bad input, sixth round: `sft-grid import` holds every value it carries to the schema's rules (the ones `sft-grid run`
holds a cell to: its type, its range, its value set), and tells every problem of the file at once, each with the
original's key, its value and the fix; an empty file or an empty argument (an unset shell variable) is said to be
empty. `init` and `cp` refuse an empty argument instead of setting up, or copying into, the current folder. Each
refusal writes nothing, exits non-zero and shows no traceback. The real CLI; no backend environment, no Slurm."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import run_sft

SAMPLES = Path(__file__).parent / "import_samples"
LF_SAMPLE = "lf_qwen3_8b_32k_zero3.yaml"
AX_SAMPLE = "axolotl_qwen3_4b_fft.yaml"


def repo(tmp_path: Path) -> Path:
    """A team's repository (git, conf/ groups) holding a copy of the real LLaMA-Factory and axolotl samples."""
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for group in ("cluster", "model", "dataset", "sweep"):
        (root / "conf" / group).mkdir(parents=True)
    shutil.copytree(SAMPLES, root / "originals")
    return root


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def sample_with(root: Path, name: str, **changed: object) -> Path:
    """A copy of a real sample with some of its keys changed, next to the original (its relative paths still hold)."""
    source = root / "originals" / name
    data = yaml.safe_load(source.read_text())
    data.update(changed)
    out = source.with_name(f"bad_{name}")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "Traceback" not in said, said
    for word in words:
        assert word in said, (word, said)
    return said


# -- every value is held to the schema's rules, every problem told at once -----------------------------------------


def test_a_llamafactory_config_with_values_a_run_refuses_is_refused_with_each_key_value_and_fix(tmp_path):
    root = repo(tmp_path)
    bad = sample_with(root, LF_SAMPLE, learning_rate="abc", num_train_epochs=-3, warmup_ratio=7, cutoff_len=-100)
    proc = run_sft("import", str(bad), "--cluster", "leonardo", "--nodes", "2", cwd=root)
    said = refused(
        proc,
        "nothing written: 4 problems",
        "learning_rate: abc: sft_grid's lr takes a number",
        "fix: set learning_rate to a number",
        "num_train_epochs: -3: sft_grid's epochs must be >= 0; fix: set num_train_epochs to a value >= 0",
        "warmup_ratio: 7: sft_grid's warmup_ratio must be >= 0 and < 1; fix: set warmup_ratio to a value >= 0 and < 1",
        "cutoff_len: -100: sft_grid's cutoff_len must be >= 1; fix: set cutoff_len to a value >= 1",
    )
    assert proc.stdout == "", said
    assert files(root / "conf") == []


def test_every_problem_of_the_file_is_told_at_once(tmp_path):
    """The template, the batch and the scheduler: one attempt, not one attempt each."""
    root = repo(tmp_path)
    bad = sample_with(
        root,
        LF_SAMPLE,
        template="mistral",
        per_device_train_batch_size=0,
        gradient_accumulation_steps=0,
        lr_scheduler_type="cosin",
        seed=1.5,
    )
    said = refused(
        run_sft("import", str(bad), cwd=root),
        "5 problems",
        "template: mistral: sft_grid knows the templates",
        "per_device_train_batch_size: 0: sft_grid's micro_batch_size must be >= 1",
        "gradient_accumulation_steps: 0: a whole number of at least 1",
        "lr_scheduler_type: cosin: sft_grid's scheduler is one of linear, cosine",
        "did you mean 'cosine'?",
        "fix: set lr_scheduler_type to one of them",
        "seed: 1.5: sft_grid's seed takes a whole number",
    )
    assert said.count("\n  - ") == 5, said
    assert files(root / "conf") == []


def test_an_axolotl_config_is_held_to_the_same_rules(tmp_path):
    root = repo(tmp_path)
    bad = sample_with(
        root, AX_SAMPLE, learning_rate="abc", num_epochs=-3, warmup_ratio=7, sequence_len=-100, lr_scheduler="cosin"
    )
    refused(
        run_sft("import", str(bad), "--cluster", "leonardo", cwd=root),
        "5 problems",
        "learning_rate: abc: sft_grid's lr takes a number",
        "num_epochs: -3: sft_grid's epochs must be >= 0; fix: set num_epochs to a value >= 0",
        "warmup_ratio: 7: sft_grid's warmup_ratio must be >= 0 and < 1",
        "sequence_len: -100: sft_grid's cutoff_len must be >= 1; fix: set sequence_len to a value >= 1",
        "lr_scheduler: cosin: sft_grid's scheduler is one of",
    )
    assert files(root / "conf") == []


def test_the_old_launchers_flags_are_held_to_the_same_rules_and_named_as_flags(tmp_path):
    root = repo(tmp_path)
    config = root / "originals" / LF_SAMPLE
    proc = run_sft(
        "import",
        "--",
        *("python", "-m", "hpc.launch", "--train_config_path", str(config)),
        *("--learning_rate", "abc", "--global_batch_size", "0", "--mix_strategy", "interleave_under"),
        *("--interleave_probs", "a,0.5"),
        cwd=root,
    )
    refused(
        proc,
        "--learning_rate: abc: sft_grid's lr takes a number",
        "fix: set --learning_rate to a number",
        "--global_batch_size: 0: sft_grid's global_batch_size must be >= 1",
        "--interleave_probs: a,0.5: sft_grid's mix.probs takes a number",
    )
    assert files(root / "conf") == []


def test_a_value_that_is_not_finite_is_refused(tmp_path):
    root = repo(tmp_path)
    bad = sample_with(root, LF_SAMPLE, learning_rate=float("inf"))
    refused(
        run_sft("import", str(bad), cwd=root),
        "cannot import, nothing written: learning_rate: .inf: sft_grid's lr must be a finite number > 0",
    )
    assert files(root / "conf") == []


# -- empty input is said to be empty --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"], ids=["empty", "a comment", "a document marker"])
def test_an_empty_file_is_said_to_be_empty(tmp_path, text):
    root = repo(tmp_path)
    (root / "empty.yaml").write_text(text)
    said = refused(run_sft("import", "empty.yaml", cwd=root), "empty.yaml: the file is empty (no keys)")
    assert "NoneType" not in said and len(said.strip().splitlines()) == 1, said
    assert files(root / "conf") == []


@pytest.mark.parametrize(
    "args, words",
    [
        (["", "--cluster", "leonardo"], "FILE is empty (an unset shell variable?): name the training YAML"),
        (["  "], "FILE is empty"),
        (["originals/" + LF_SAMPLE, "--out", ""], "--out is empty (an unset shell variable?)"),
        (["originals/" + LF_SAMPLE, "--name", ""], "--name is empty"),
        (["originals/" + LF_SAMPLE, "--cluster", ""], "--cluster is empty"),
    ],
    ids=["FILE", "FILE blank", "--out", "--name", "--cluster"],
)
def test_an_empty_argument_to_import_is_refused_as_empty(tmp_path, args, words):
    root = repo(tmp_path)
    said = refused(run_sft("import", *args, cwd=root), words)
    assert "a folder" not in said, said
    assert files(root / "conf") == []


# -- init and cp: an empty argument is not the current folder --------------------------------------------------------


def test_init_with_an_empty_dir_sets_up_nothing(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft("init", "", cwd=here)
    refused(proc, "DIR is empty (an unset shell variable?)", "give no DIR to set up the current one")
    assert proc.returncode == 2 and files(here) == []


@pytest.mark.parametrize(
    "args, words",
    [
        (["model/tiny_llama", ""], "NAME is empty (an unset shell variable?); nothing copied"),
        (["model/tiny_llama", "--to", ""], "--to is empty"),
        ([""], "GROUP/OPTION is empty"),
    ],
    ids=["NAME", "--to", "GROUP/OPTION"],
)
def test_cp_with_an_empty_argument_copies_nothing(tmp_path, args, words):
    root = repo(tmp_path)
    (root / "sft_grid.yaml").write_text("conf: conf\n")
    before = files(root)
    proc = run_sft("cp", *args, cwd=root)
    refused(proc, words)
    assert proc.returncode == 2 and files(root) == before
