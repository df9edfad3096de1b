"""Bad input, sixth round: values that passed and failed later, or trained otherwise than asked (an empty dataset
source read as a Hub id, a steering seed numpy refuses rounds later, a fractional rung step read as the step below).
Each is refused before anything is written, naming the key, the value and the fix."""

from __future__ import annotations

import pytest

from .conftest import run_sft

ADAPTIVE = ["+sweep=synthetic_delphi", "+adaptive.at=9714698752", "+adaptive.budget_cells=8", "dry_run=true"]
PRUNED = ["model=tiny_llama", "lr=1e-4,2e-4,3e-4", "max_steps=10", "dry_run=true"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["model=tiny_llama", "dataset.tiny_messages.source=", "dry_run=true"],
            "dataset.tiny_messages.source='': is empty: a dataset's source is a Hub id or a local path"
            " [dataset-source]",
        ),
        ([*ADAPTIVE, "+adaptive.seed=-3"], "adaptive.seed=-3: must be a whole number >= 0"),
        # the needs as set, and nothing the schema object keeps beside them (its cached fingerprint)
        (["model=tiny_llama", "site_needs.cpu_arch=risc", "dry_run=true"], "site_needs={'cpu_arch': 'risc'}: "),
        (["model=tiny_llama", "move_after=00:00:00", "dry_run=true"], "move_after='00:00:00': a zero wait: every"),
        ([*ADAPTIVE, "+adaptive.levl=0.9"], "adaptive.levl=0.9: not a key of adaptive (did you mean 'level'?)"),
        (
            [*PRUNED, "+prune={kep: 0.3, rungs: [4], guard: position}"],
            "prune.kep=0.3: not a key of prune (did you mean 'keep'?) [prune-block]",
        ),
        (
            [*PRUNED, "+prune={rungs: [4.5, 6], keep: 0.3, guard: position}"],
            "prune.rungs=[4.5, 6]: are steps, and a step is a whole number [prune-block]\n"
            "      fix: e.g. rungs: [4, 6]",
        ),
    ],
)
def test_a_value_that_would_fail_or_train_otherwise_later_is_refused_with_nothing_written(tmp_path, args, said):
    proc = run_sft("-m", *args, f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode == 1 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_whole_rungs_in_steps_and_any_rung_in_tokens_still_pass(tmp_path):
    steps = run_sft("-m", *PRUNED, "+prune={rungs: [4, 6], keep: 0.3, guard: position}", f"runs_root={tmp_path / 'a'}")
    assert steps.returncode == 0 and "rungs at steps [4, 6]" in steps.stdout, steps.stdout[-2000:] + steps.stderr
    tokens = run_sft(
        "-m",
        *PRUNED,
        "+prune={rungs: [1000.5], unit: tokens, keep: 0.3, guard: position}",
        f"runs_root={tmp_path / 'b'}",
    )
    assert tokens.returncode == 0, tokens.stderr[-2000:]


def test_a_model_directory_that_cannot_load_is_one_problem_under_its_own_key(tmp_path):
    """An empty model directory: no config.json (the model check) is the cause; its missing tokenizer is not told
    again as the template's problem (model.template='<the directory>')."""
    empty = tmp_path / "empty_model"
    empty.mkdir()
    proc = run_sft("model=tiny_llama", f"model.path={empty}", "dry_run=true", f"runs_root={tmp_path / 'runs'}")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"model.path='{empty}': no config.json in {empty}" in said, said[-3000:]
    assert "1 problem(s) in 1 cell(s)" in said and "model.template=" not in said, said[-3000:]
    assert not (tmp_path / "runs").exists()
