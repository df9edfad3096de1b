"""The Hub datasets an evaluation reads (each task's `datasets`) are staged with the grid's inputs, and the
evaluation job, offline, loads each from its staged snapshot.

- the staging plan lists them under `eval.tasks.<label>.datasets` while a score of the cell (or of its base model)
  is missing, even once its training is complete (a unit test, fast set);
- for real: a dataset repository in the shape of a Hub eval dataset (parquet under a config folder, a README with
  the `configs:` header, as openai/gsm8k is laid out) served by olah on loopback, staged by sft_grid's staging into
  a cache, then a task that names it by its hub id evaluated offline (no server) by the evaluation stage and
  in_venv/lm_eval_run.py, in the harness environment, on the tiny model (markers mirror and backend).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from sft_grid.core.layout import OUTPUT_DIR, TRAINER_STATE
from sft_grid.core.scores import score_path
from sft_grid.planning.cells import dirs_of
from sft_grid.planning.evaluation import base_targets, cell_eval_file, cell_scores

pytest_plugins = ["tests.hub_fixtures", "tests.olah_mirror"]  # fixtures: hf_env; olah

staging_plan = importlib.import_module("sft_grid.stages.staging.plan")  # the package names its function `plan`

SUITE = ["model=qwen3_8b", "eval=reasoning_small"]
EVAL_KEYS = {
    ("openai/gsm8k", "eval.tasks.gsm8k.datasets"),
    ("allenai/ai2_arc", "eval.tasks.arc_challenge.datasets"),
    ("cais/mmlu", "eval.tasks.mmlu_stem.datasets"),
    ("google/IFEval", "eval.tasks.ifeval.datasets"),
}


def listed(cells, dirs) -> set[tuple[str, str]]:
    """(repo id, key) of each input the staging plan lists (no request: nothing is resolved)."""
    plan = staging_plan.plan_staging(cells, dirs, dry_run=True)
    return {(i.wanted.repo_id, key) for i in plan.items for _, key in i.users}


def write_scores(target: Path, scores) -> None:
    for s in scores:
        path = score_path(target, s.score_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")


def test_eval_datasets_are_staged_until_the_cell_and_its_base_model_are_scored(make_cells, monkeypatch):
    monkeypatch.setattr(staging_plan, "_resolve", lambda items, dry_run, into: None)
    cells = make_cells(SUITE)
    dirs = dirs_of(cells)
    assert listed(cells, dirs) == {("Qwen/Qwen3-8B", "model.hub_id"), *EVAL_KEYS}

    out = dirs[0] / OUTPUT_DIR  # trained: the model is no longer needed, the evaluation still is
    out.mkdir(parents=True)
    (out / TRAINER_STATE).write_text("{}")
    (out / "model.safetensors").write_bytes(b"")
    assert listed(cells, dirs) == EVAL_KEYS

    write_scores(dirs[0], cell_scores(cells[0]))  # the cell scored, its base model not yet
    assert listed(cells, dirs) == EVAL_KEYS
    (base,) = base_targets(cells)
    write_scores(base.dir, base.scores)
    assert listed(cells, dirs) == set()


def test_an_eval_dataset_that_is_no_hub_id_is_refused_with_the_list_it_takes(make_cells):
    """A task's `datasets` are what staging fetches: a Hub web address gets its id (in the list's own form), a local
    file or a malformed id is told to go (a local file is the task YAML's own), before anything is queued."""
    from sft_grid.planning.validate import validate

    wrong = "https://huggingface.co/datasets/openai/gsm8k,data/x.jsonl,bad id"
    (cell,) = make_cells([*SUITE, f"+eval.tasks.gsm8k.datasets=[{wrong}]"])
    told = {str(p.value): p for p in validate([cell]) if p.key == "eval.tasks.gsm8k.datasets"}
    assert set(told) == set(wrong.split(",")), told
    url, local, _ = wrong.split(",")
    assert told[url].fix.startswith("eval.tasks.gsm8k.datasets=[openai/gsm8k,")
    assert "not a Hub dataset's id" in told[local].message and f"drop {local!r}" in told[local].fix
    assert "letters, digits" in told["bad id"].message


def test_the_eval_file_maps_each_pinned_task_dataset_to_its_snapshot(make_cells, tmp_path):
    from sft_grid.core.hubcache import Pin
    from sft_grid.core.scores import EvalFile

    (cell,) = make_cells(SUITE)
    sha = "a" * 40
    pinned = replace(cell, pins=(Pin("dataset", "openai/gsm8k", "main", sha, tmp_path / "cache"),))
    plan = cell_eval_file(pinned, tmp_path / "cell")
    assert plan is not None
    snapshot = str(tmp_path / "cache" / "datasets--openai--gsm8k" / "snapshots" / sha)
    assert plan.datasets == {"openai/gsm8k": snapshot}  # the others not pinned: their job fetches them
    (tmp_path / "cell").mkdir()
    (tmp_path / "cell" / "eval.json").write_text(plan.dumps())
    assert EvalFile.load(tmp_path / "cell") == plan
    unpinned = cell_eval_file(cell, tmp_path / "cell")
    assert unpinned is not None and "datasets" not in json.loads(unpinned.dumps())


# -- for real: staged from a Hub server, evaluated offline --------------------------------------------------------
PARQUET = """
import io, json, sys
import pyarrow as pa, pyarrow.parquet as pq
out = {}
for split, rows in json.loads(sys.stdin.read()).items():
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    out[split] = buf.getvalue().hex()
print(json.dumps(out))
"""
CARD = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
---
# arithmetic, laid out as openai/gsm8k is
"""


def eval_repo_files(python: Path) -> dict[str, bytes]:
    """A dataset repository as the Hub's eval datasets are laid out: parquet under a config folder, and the card's
    `configs:` header naming it (parquet written by the harness environment's pyarrow)."""
    rows = {
        "train": [{"question": f"What is {a} plus 1?", "answer": str(a + 1)} for a in range(2)],
        "test": [{"question": f"What is {a} plus 2?", "answer": str(a + 2)} for a in range(5)],
    }
    made = subprocess.run(
        [str(python), "-c", PARQUET], input=json.dumps(rows), capture_output=True, text=True, check=True, timeout=120
    )
    parquet = {split: bytes.fromhex(data) for split, data in json.loads(made.stdout).items()}
    files = {f"main/{split}-00000-of-00001.parquet": data for split, data in parquet.items()}
    return {"README.md": CARD.encode(), ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n", **files}


def team_task(root: Path, repo: str) -> Path:
    """A team's include_path with one generation task that reads the dataset by its hub id and config."""
    tasks = root / "team_tasks"
    tasks.mkdir()
    task = {
        "task": "team_staged_arith",
        "dataset_path": repo,
        "dataset_name": "main",
        "output_type": "generate_until",
        "test_split": "test",
        "fewshot_split": "train",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 4, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    (tasks / "team_staged_arith.yaml").write_text(json.dumps(task, indent=2))
    return tasks


@pytest.fixture(scope="module")
def harness_env() -> Path:
    from sft_grid.stages.venv_build import build

    return build("lm_eval")


@pytest.mark.mirror
@pytest.mark.backend
def test_an_eval_dataset_staged_from_the_hub_is_read_offline_by_the_evaluation_job(
    make_cells, tmp_path, monkeypatch, hf_env, olah, tiny_assets, harness_env
):
    from sft_grid.core.hubcache import is_complete
    from sft_grid.planning.evaluation import base_eval_file
    from sft_grid.stages import evaluate
    from tests.hubtools import run_stage

    repo = f"org/arith-{uuid.uuid4().hex[:8]}"
    sha = olah.commit(repo, eval_repo_files(harness_env / "bin" / "python"), "dataset", lfs=True)
    cache = tmp_path / "hub-cache"
    overrides = [
        "model=tiny_llama",
        "eval=tiny",
        f"eval.include_path={team_task(tmp_path, repo)}",
        "~eval.tasks.tiny_mc",
        # the suite's tiny_gen entry, given the team's task (Hydra adds no new entry to a typed map of tasks)
        "eval.tasks.tiny_gen.task=team_staged_arith",
        f"eval.tasks.tiny_gen.datasets=[{repo}]",
        "eval.tasks.tiny_gen.num_fewshot=1",
        "eval.tasks.tiny_gen.apply_chat_template=false",
        f"cluster.hf_cache={cache}",
        "cluster.internet_on_compute=false",
        f"runs_root={tmp_path / 'runs'}",
    ]

    # the grid's inputs staged from the server, as `sft-grid run` stages them before anything is queued
    monkeypatch.setenv("HF_ENDPOINT", olah.url)
    staged = run_stage("-m", *overrides)
    assert staged.returncode == 0, staged.stdout[-3000:] + staged.stderr[-3000:]
    assert is_complete(cache, repo, "dataset", sha, checksums=True)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", olah.url)  # this process's client: read at import
    cells = make_cells(overrides)
    plan = staging_plan.plan_staging(cells, dirs_of(cells), dry_run=True)
    assert [(i.wanted.repo_id, i.complete, i.users) for i in plan.items] == [
        (repo, True, [(cells[0].name, "eval.tasks.tiny_gen.datasets")])
    ]
    cell = replace(cells[0], pins=plan.pins[cells[0].name])
    (base,) = base_targets([cell])

    # the base model's evaluation, as its job runs it: offline, with no server at all
    olah.stop()
    for var, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(var, value)
    base.dir.mkdir(parents=True)
    plan_file = base_eval_file(base)
    assert plan_file.datasets == {repo: str(cache / f"datasets--{repo.replace('/', '--')}" / "snapshots" / sha)}
    (base.dir / "eval.json").write_text(plan_file.dumps())
    done = evaluate.run(base.dir)
    log = (base.dir / "logs" / evaluate.EVAL_LOG).read_text()
    assert done, log[-4000:]
    (score,) = (json.loads(p.read_text()) for p in (base.dir / "eval").glob("*.json"))
    assert score["task"] == "team_staged_arith" and "exact_match" in score["metrics"], score
    assert f"dataset {repo}: loaded from its staged snapshot" in log
