"""What an lm-eval task reads, asked of the harness's own environment (in_venv/env_facts.py, read as lm-eval's task
index reads its YAMLs, cached with the environment): each Hub dataset a suite's task reads (a group's members
included) must be in its `datasets`, the only ones staged for the offline evaluation job; every YAML under the
include_path must load (lm-eval skips one that does not without a word); and no team task takes a name lm-eval ships
(lm-eval's index takes the team's). Uses the local harness environment (built on first use) and its cached index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sft_grid.checks.preflight import _eval_checks, run

from .conftest import run_sft

pytestmark = pytest.mark.backend

SUITE = ["model=tiny_llama", "eval=reasoning_small", "eval.resources.gpus=0"]


@pytest.fixture(scope="module")
def harness_env() -> Path:
    from sft_grid.stages.venv_build import build

    return build("lm_eval")


def verdicts(cell) -> dict:
    return {c.key: run(c) for c in _eval_checks(cell)}


def team_tasks(root: Path) -> Path:
    """A team's include_path: a task of lm-eval's name, a YAML that does not parse, two YAMLs of one name, and a
    group of two team tasks (one with a !function, which lm-eval's loader takes) that read two Hub datasets."""
    team = root / "team"
    team.mkdir()
    task = {"dataset_name": "main", "output_type": "generate_until", "test_split": "test", "doc_to_text": "{{q}}"}
    (team / "gsm8k.yaml").write_text(json.dumps({**task, "task": "gsm8k", "dataset_path": "openai/gsm8k"}))
    (team / "broken.yaml").write_text('task: team_broken\ndataset_path: a/b\ndoc_to_text: "{{q}}\n')
    (team / "one.yaml").write_text(json.dumps({**task, "task": "team_one", "dataset_path": "myorg/one"}))
    (team / "one_again.yaml").write_text(json.dumps({**task, "task": "team_one", "dataset_path": "myorg/other"}))
    (team / "two.yaml").write_text("task: team_two\ndataset_path: myorg/two\nprocess_docs: !function utils.docs\n")
    (team / "mix.yaml").write_text("group: team_mix\ntask: [team_one, team_two]\n")
    return team


def test_a_task_reading_a_hub_dataset_not_in_its_datasets_is_refused_with_the_fix(make_cells, harness_env):
    """The shipped suite's lists are what lm-eval reads (mmlu_stem, a group, through its subjects); a task asked for
    under another label reads a dataset its list lacks: refused with the ids and the fix, as key and value."""
    (cell,) = make_cells([*SUITE, "eval.tasks.gsm8k.task=hellaswag"])
    found = verdicts(cell)
    assert all(found[f"eval.tasks.{t}.datasets"].ok for t in ("arc_challenge", "mmlu_stem", "ifeval")), found
    refused = found["eval.tasks.gsm8k.datasets"]
    assert not refused.ok and "lm-eval's hellaswag reads the Hub dataset(s) Rowan/hellaswag" in refused.message
    assert "'+eval.tasks.gsm8k.datasets=[openai/gsm8k,Rowan/hellaswag]'" in refused.fix, refused.fix


def test_an_include_path_is_read_as_lm_eval_reads_it(make_cells, harness_env, tmp_path):
    """A YAML that does not parse (its file and line), two YAMLs of one name (both files), a team task of lm-eval's
    name (both files) are refused together; a !function tag is lm-eval's and passes; a team group's datasets are
    its members' as lm-eval resolves them."""
    team = team_tasks(tmp_path)
    (cell,) = make_cells([*SUITE, f"eval.include_path={team}", "eval.tasks.gsm8k.task=team_mix"])
    found = verdicts(cell)
    include = found["eval.include_path"]
    assert not include.ok
    assert f"{team / 'broken.yaml'}: YAML error at line 4" in include.message, include.message
    assert f"team_one in {team / 'one.yaml'} and {team / 'one_again.yaml'}" in include.message
    assert f"gsm8k of {team / 'gsm8k.yaml'} over " in include.message
    assert "lm_eval/tasks/gsm8k/gsm8k.yaml" in include.message
    assert "two.yaml" not in include.message and "task: team_gsm8k" in include.fix
    mix = found["eval.tasks.gsm8k.datasets"]
    assert "reads the Hub dataset(s) myorg/one, myorg/two" in mix.message, mix.message


def test_the_dry_run_refuses_a_task_without_its_datasets(tmp_path, tiny_assets, harness_env):
    """The CLI says it, with the include_path's problem, before anything is written."""
    team = team_tasks(tmp_path)
    args = [*SUITE, "dry_run=true", f"eval.include_path={team}", "eval.tasks.arc_challenge.task=hellaswag"]
    proc = run_sft(*args, f"runs_root={tmp_path / 'runs'}", timeout=600)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said[-3000:]
    assert "eval.tasks.arc_challenge.datasets=['allenai/ai2_arc']: lm-eval's hellaswag reads" in said, said[-3000:]
    assert f"eval.include_path='{team}'" in said and "nothing was submitted" in said
    assert not any((tmp_path / "runs").rglob("cell.yaml"))
