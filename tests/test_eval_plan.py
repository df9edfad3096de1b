"""What a grid evaluates, decided before anything runs (fast: no backend, no cluster).

- `eval` is never part of a cell's identity (checked against Hydra's own composition), and `eval=a,b` as an axis is
  one cell evaluated with both suites;
- a score's identity is (cell key, the task's settings, harness==version): re-invoking evaluates nothing that has a
  score, adding a task evaluates that task only, a failed evaluation is retried alone and never the training;
- on Slurm the evaluation is an array of its own (the suite's resources) whose tasks each wait for their cell's post
  task, and the base models are one array that waits for nothing (fake sbatch/sacct on PATH, tests/fakeslurm.py);
- bad suites and task settings are refused before anything is written, naming the cell, the key, the value, the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sft_grid.cli.cmd_status import rows
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.scores import BASE_DIR, EVAL_FILE, EvalFile, score_id, write_score
from sft_grid.grid.decide import Action
from sft_grid.planning.cells import identity_key, plan_cell, slug_for
from sft_grid.planning.evaluation import cell_scores, merge_eval_axis, suites_of
from sft_grid.planning.validate import validate

from . import fakeslurm
from .conftest import hydra_plain, run_sft
from .test_grid_decisions import cells, complete, fake, grid  # noqa: F401 (fixtures)

TINY_LLAMA = ["model=tiny_llama", "max_steps=4"]


@pytest.fixture
def site_harness(tmp_path: Path) -> str:
    """A site's own harness environment (what a GPU site names for vllm): a real virtualenv whose python runs, with a
    stand-in `lm_eval` package at the harness's version (the planning reads its version and that it imports; no
    harness runs here)."""
    import subprocess
    import sys

    venv = tmp_path / "site_lm_eval"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "lm_eval-0.4.13.dist-info").mkdir()
    metadata = "Metadata-Version: 2.1\nName: lm_eval\nVersion: 0.4.13\n"
    (site / "lm_eval-0.4.13.dist-info" / "METADATA").write_text(metadata)
    (site / "lm_eval").mkdir()
    (site / "lm_eval" / "__init__.py").write_text('__version__ = "0.4.13"\n')
    return f"cluster.backend_venvs.lm_eval={venv}"


@pytest.fixture
def fake_grid(request: pytest.FixtureRequest) -> tuple[Path, Any]:
    """tests/test_grid_decisions.py's fake Slurm directory and grid (by name: the imports stay unshadowed)."""
    return request.getfixturevalue("fake"), request.getfixturevalue("grid")


# ---- identity -------------------------------------------------------------------------------------------------


def test_the_suite_is_not_part_of_a_cells_identity_as_hydra_composes_it(hydra_loader, make_cells):
    variants = [[], ["eval=tiny"], ["eval=reasoning_small"], ["eval=tiny", "eval.tasks.tiny_mc.num_fewshot=2"]]
    hydra = [hydra_plain([*TINY_LLAMA, *v]) for v in variants]
    assert hydra[1]["eval"]["tasks"]["tiny_mc"]["num_fewshot"] == 0
    assert hydra[3]["eval"]["tasks"]["tiny_mc"]["num_fewshot"] == 2
    assert len({identity_key(c) for c in hydra}) == 1
    assert len({slug_for([*TINY_LLAMA, *v], c) for v, c in zip(variants, hydra, strict=True)}) == 1
    composed = make_cells(*[[*TINY_LLAMA, *v] for v in variants])
    for cell, reference in zip(composed, hydra, strict=True):
        assert {k: v for k, v in cell.config.items() if k != "runs_root"} == {
            k: v for k, v in reference.items() if k != "runs_root"
        }
        assert cell.key == identity_key(reference)
    # what does change the identity still does
    assert identity_key(hydra_plain([*TINY_LLAMA, "eval=tiny", "lr=1e-3"])) != identity_key(hydra[1])


def test_a_sweep_file_names_its_suite_and_the_command_line_overrides_it(make_cells):
    (named,) = make_cells(["+sweep=smoke_eval"])
    (overridden,) = make_cells(["+sweep=smoke_eval", "eval=none"])
    (smoke,) = make_cells(["+sweep=smoke"])
    assert [s.name for s in suites_of(named)] == ["tiny"] and suites_of(overridden) == ()
    assert named.key == overridden.key and named.spec.sweep_name == "smoke_eval"
    assert {k: v for k, v in named.config.items() if k not in ("eval", "sweep_name")} == {
        k: v for k, v in smoke.config.items() if k not in ("eval", "sweep_name")
    }


def test_an_eval_axis_is_one_cell_evaluated_with_each_suite(make_cells):
    tiny, reasoning, none = make_cells(
        [*TINY_LLAMA, "eval=tiny"], [*TINY_LLAMA, "eval=reasoning_small"], [*TINY_LLAMA, "eval=none"]
    )
    assert [p.rule for p in validate([tiny, reasoning, none]) if p.rule == "identity-unique"] == []
    (merged,) = merge_eval_axis([tiny, reasoning, none])
    assert merged.key == tiny.key and [s.name for s in suites_of(merged)] == ["tiny", "reasoning_small"]
    assert {s.task for s in cell_scores(merged)} == {
        "tiny_mc",
        "tiny_gen",
        "gsm8k",
        "arc_challenge",
        "mmlu_stem",
        "ifeval",
    }
    # cells that differ in something else that is not identity (nodes, the cluster) are still one model twice
    one, two = make_cells([*TINY_LLAMA, "eval=tiny"], [*TINY_LLAMA, "eval=none", "micro_batch_size=2"])
    assert len(merge_eval_axis([one, two])) == 2
    assert [p.rule for p in validate([one, two])] == ["identity-unique"]


def test_a_score_is_identified_by_cell_task_settings_and_harness(make_cells, site_harness, tmp_path):
    base, fewshot, relabelled = make_cells(
        [*TINY_LLAMA, "eval=tiny"],
        [*TINY_LLAMA, "eval=tiny", "eval.tasks.tiny_gen.num_fewshot=2"],
        [*TINY_LLAMA, "eval=tiny", "eval.name=renamed", "eval.batch_size=2", "eval.resources.cpus=1"],
    )
    ids = {s.task: s.score_id for s in cell_scores(base)}
    changed = {s.task: s.score_id for s in cell_scores(fewshot)}
    assert changed["tiny_mc"] == ids["tiny_mc"] and changed["tiny_gen"] != ids["tiny_gen"]
    # how a score is computed (suite name, batch size, resources) is not what it is
    assert {s.task: s.score_id for s in cell_scores(relabelled)} == ids
    (other,) = make_cells([*TINY_LLAMA, "eval=tiny", "lr=1e-3"])
    assert not set(ids.values()) & {s.score_id for s in cell_scores(other)}
    # the harness's version, not where it is installed: a site's environment with the same lm-eval scores alike
    (site,) = make_cells([*TINY_LLAMA, "eval=tiny", site_harness])
    assert {s.task: s.score_id for s in cell_scores(site)} == ids
    newer = Path(site_harness.split("=", 1)[1]) / "lib" / "python3.11" / "site-packages"
    (newer / "lm_eval-0.4.13.dist-info").rename(newer / "lm_eval-0.4.14.dist-info")
    (site,) = make_cells([*TINY_LLAMA, "eval=tiny", site_harness])
    assert not set(ids.values()) & {s.score_id for s in cell_scores(site)}
    settings = cell_scores(base)[0].settings
    assert score_id(base.key, settings, "lm-eval==0.4.14") == cell_scores(site)[0].score_id
    assert settings["version"] and settings["dtype"] == "float32" and settings["apply_chat_template"] is True


# ---- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key, value, fix",
    [
        ("eval.tasks.tiny_mc.num_fewshot=-1", "eval.tasks.tiny_mc.num_fewshot", -1, ">= 0"),
        ("eval.tasks.tiny_mc.limit=2.5", "eval.tasks.tiny_mc.limit", 2.5, "eval.tasks.tiny_mc.limit=2"),
        (
            "eval.tasks.tiny_mc.fewshot_as_multiturn=true eval.tasks.tiny_mc.apply_chat_template=false",
            "eval.tasks.tiny_mc.fewshot_as_multiturn",
            True,
            "apply_chat_template=true",
        ),
        ("+eval.tasks.tiny_mc.shots=2", "eval.tasks.tiny_mc.shots", 2, "num_fewshot"),
        ("eval.tasks.tiny_mc.task=tiny_nope", "eval.tasks.tiny_mc.task", "tiny_nope", "tiny_mc, tiny_gen"),
        ("eval.batch_size=0", "eval.batch_size", 0, "eval.batch_size=auto"),
        ("eval.engine=vllm", "eval.engine", "vllm", "cluster.backend_venvs.lm_eval"),
        ("eval.dtype=fp8", "eval.dtype", "fp8", "float32"),
        ("eval.resources.gpus=1", "eval.resources.gpus", 1, "eval.resources.gpus=0"),
        ("eval.resources.time=48:00:00", "eval.resources.time", "48:00:00", "24:00:00"),
    ],
)
def test_a_bad_task_setting_names_the_cell_the_key_the_value_and_the_fix(make_cells, override, key, value, fix):
    (cell,) = make_cells([*TINY_LLAMA, "eval=tiny", "dry_run=true", *override.split()])
    found = [p for p in validate([cell]) if p.key == key]
    assert len(found) == 1, [p.render() for p in validate([cell])]
    assert found[0].cell == cell.name and found[0].value == value and fix in found[0].fix


def test_bad_suites_stop_the_grid_before_anything_is_written(tmp_path):
    proc = run_sft("-m", *TINY_LLAMA, "eval=tiny,reasoning_smal", f"runs_root={tmp_path}")
    assert (
        proc.returncode == 1
        and "eval is one of none, reasoning_small, tiny (did you mean 'reasoning_small'?)" in proc.stderr
    )
    proc = run_sft(
        "-m", *TINY_LLAMA, "eval=tiny", "eval.tasks.tiny_gen.limit=0", "eval.engine=vllm", f"runs_root={tmp_path}"
    )
    assert proc.returncode == 1
    for words in ("eval.tasks.tiny_gen.limit", "must be > 0", "eval.engine", "(suite tiny)"):
        assert words in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())


# ---- the plan on Slurm, and what a second invocation does ------------------------------------------------------


def test_cells_are_evaluated_by_an_array_after_their_post_array_and_base_models_once(fake_grid, site_harness):
    slurm_dir, run_grid = fake_grid
    result = run_grid("eval=tiny", site_harness)
    assert [j.role.value for j in result.plan.slurm] == ["train", "post", "eval", "eval"]
    _train, post, evaluation, base = result.plan.slurm
    dirs = cells(run_grid.runs)
    assert evaluation.targets == tuple(dirs) and evaluation.dependency.kind == "aftercorr"
    assert evaluation.dependency.job == post.name and base.dependency is None
    (base_dir,) = base.targets
    assert base_dir.parent == run_grid.runs / "default" / BASE_DIR and base_dir.name.startswith("qwen3_8b-")
    scripts = [c["script"] for c in fakeslurm.calls(slurm_dir, "sbatch")]
    assert "#SBATCH --dependency=aftercorr:101" in scripts[2] and "#SBATCH --array=0-2" in scripts[2]
    assert "#SBATCH --cpus-per-task=2" in scripts[2] and "#SBATCH --time=20" in scripts[2]
    assert "--dependency" not in scripts[3] and "--array" not in scripts[3]
    for index, cell in enumerate(dirs):
        queued = events.last(events.read(cell), Kind.EVAL_JOB)
        assert (queued.eval_job_id, queued.after, queued.array) == (f"102_{index}", "101", evaluation.name)
        plan = EvalFile.load(cell)
        assert plan is not None and not plan.in_train_job and plan.model_path == str(cell / "output")
        assert [s.task for s in plan.scores] == ["tiny_mc", "tiny_gen"] and plan.harness == "lm-eval==0.4.13"
    assert EvalFile.load(base_dir).base and EvalFile.load(base_dir).model_path == "Qwen/Qwen3-8B"
    assert rows([], [base_dir]) == [
        (f"_base/{base_dir.name}", "base model", "", "", "", "", "queued in job 103 (0/2)", "", "", "")
    ]
    again = run_grid("eval=tiny", site_harness)  # everything is queued: nothing is sent twice
    assert again.plan.slurm == () and len(fakeslurm.calls(slurm_dir, "sbatch")) == 4
    assert "evaluation waiting in Slurm (job 103)" in again.bases[0].why


def _score_all(target: Path) -> None:
    plan = EvalFile.load(target)
    assert plan is not None
    for spec in plan.missing(target):
        write_score(target, {"score_id": spec.score_id, "task": spec.task, "metrics": {"acc": 1.0}})


def test_a_score_is_computed_once_and_a_new_task_or_a_failure_is_evaluated_alone(fake_grid, site_harness):
    slurm_dir, run_grid = fake_grid
    one_task = ("eval=tiny", site_harness, "~eval.tasks.tiny_gen")
    run_grid(*one_task)
    dirs = cells(run_grid.runs)
    for job in ("100", "101", "102", "103"):
        fakeslurm.set_state(slurm_dir, job, "COMPLETED")
    for cell in dirs:
        complete(cell)
    # the evaluation jobs ended without their scores: only the evaluations run again, never the training
    again = run_grid(*one_task)
    assert [d.action for d in again.decisions] == [Action.POST] * 3
    assert all(d.evaluate and not d.post and "evaluation to run: 1 score(s)" in d.why for d in again.decisions)
    assert [j.role.value for j in again.plan.slurm] == ["eval", "eval"]
    assert all(j.dependency is None for j in again.plan.slurm)
    assert all(events.read(c)[-1].kind is Kind.EVAL_JOB for c in dirs)
    for job in ("104", "105"):
        fakeslurm.set_state(slurm_dir, job, "COMPLETED")
    for target in [*dirs, again.plan.slurm[1].targets[0]]:
        _score_all(target)
    sent = len(fakeslurm.calls(slurm_dir, "sbatch"))
    done = run_grid(*one_task)
    assert [d.action for d in done.decisions] == [Action.SKIP] * 3 and done.plan.slurm == ()
    assert len(fakeslurm.calls(slurm_dir, "sbatch")) == sent
    assert [r[6] for r in rows(dirs)] == ["done (1)"] * 3
    # the suite's other task added: one score per cell (and per base model) to compute, nothing else
    added = run_grid("eval=tiny", site_harness)
    assert [j.role.value for j in added.plan.slurm] == ["eval", "eval"]
    assert [[s.task for s in EvalFile.load(c).missing(c)] for c in dirs] == [["tiny_gen"]] * 3
    assert [r[6] for r in rows(dirs)] == [f"queued in job 106_{i} (1/2)" for i in range(3)]
    # that evaluation fails for one cell: it says why, and the next invocation retries it alone
    fakeslurm.set_state(slurm_dir, "106", "COMPLETED")
    fakeslurm.set_state(slurm_dir, "107", "COMPLETED")
    for target in [*dirs[1:], added.plan.slurm[1].targets[0]]:
        _score_all(target)
    events.append(dirs[0], Event(Kind.EVAL, state="failed", reason="train == serve: the template differs"))
    assert rows(dirs)[0][6:9] == ("failed in job 106_0 (1/2)", "", "eval: train == serve: the template differs")
    retry = run_grid("eval=tiny", site_harness)
    assert [d.action for d in retry.decisions] == [Action.POST, Action.SKIP, Action.SKIP]
    assert "evaluation to run again: 1 score(s)" in retry.decisions[0].why
    (job,) = retry.plan.slurm
    assert job.role.value == "eval" and job.targets == (dirs[0],)


def test_a_cell_that_no_longer_evaluates_loses_its_eval_json_but_keeps_its_scores(fake_grid, site_harness):
    slurm_dir, run_grid = fake_grid
    run_grid("eval=tiny", site_harness, seeds=(1,))
    (cell,) = cells(run_grid.runs)
    fakeslurm.set_state(slurm_dir, "100", "FAILED")
    write_score(cell, {"score_id": "0" * 12, "task": "tiny_mc"})
    run_grid("rerun_failed=true", site_harness, seeds=(1,))
    assert not (cell / EVAL_FILE).exists() and (cell / "eval" / f"{'0' * 12}.json").is_file()
    assert rows([cell])[0][6] == ""


def test_a_base_model_without_a_chat_template_is_scored_without_one(make_cells, tmp_path):
    model = tmp_path / "plain-base"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    from sft_grid.planning.evaluation import base_targets

    (cell,) = make_cells([*TINY_LLAMA, "eval=tiny", f"model.path={model}"])
    (target,) = base_targets([cell])
    assert target.source == str(model) and {s.settings["apply_chat_template"] for s in target.scores} == {False}
    assert {s.settings["apply_chat_template"] for s in cell_scores(cell)} == {True}
    assert not {s.score_id for s in target.scores} & {s.score_id for s in cell_scores(cell)}
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (again,) = base_targets([cell])
    assert {s.settings["apply_chat_template"] for s in again.scores} == {True}
    assert plan_cell(cell.overrides, cell.config).key == cell.key


def test_what_offline_evaluation_jobs_read_is_named_for_staging(make_cells):
    from sft_grid.planning.inputs import hub_repos

    tiny, qwen = make_cells([*TINY_LLAMA, "eval=tiny"], ["model=qwen3_8b", "eval=reasoning_small"])
    assert hub_repos(tiny) == []  # local tasks, a local model
    found = [(key, repo.kind, repo.repo_id) for key, repo in hub_repos(qwen)]
    assert found == [
        ("model.hub_id", "model", "Qwen/Qwen3-8B"),
        ("eval.tasks.gsm8k.datasets", "dataset", "openai/gsm8k"),
        ("eval.tasks.arc_challenge.datasets", "dataset", "allenai/ai2_arc"),
        ("eval.tasks.mmlu_stem.datasets", "dataset", "cais/mmlu"),
        ("eval.tasks.ifeval.datasets", "dataset", "google/IFEval"),
    ]
