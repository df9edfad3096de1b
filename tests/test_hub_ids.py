"""Hub ids a cell names are checked with the Hub client's own rule before anything is staged or queued: the rule
(core/hubcache.py repo_id_problem) against huggingface_hub's validate_repo_id as the oracle, the cells' problems
(which cell, which key, what value, the fix), and the grid command and `sft-grid stage`, which refuse a
bad id in one clear line, never with a traceback, and write nothing."""

from __future__ import annotations

import itertools
import random

import pytest
from huggingface_hub.utils import HFValidationError, validate_repo_id

from sft_grid.core.hubcache import repo_id_problem
from sft_grid.planning.validate import validate

from .conftest import run_sft

SAMPLES = [
    "Qwen/Qwen3-8B",
    "gpt2",
    "a/b",
    "org/x.y_z-1",
    "bad id",
    "a/b/c",
    "/abs",
    "org/",
    "/name",
    "-org/x",
    "org/x-",
    "org/.x",
    "org/x.",
    "org/x--y",
    "org/x..y",
    "org/x.git",
    "org/" + "n" * 96,
    "org/" + "n" * 97,
    "o" * 200 + "/n",
    "",
    "ü/ß",
    "org/x y",
    "org\\x",
    "org/x\n",
    "org/x:y",
    "org/ab",
    "_/_",
    "a.b/c.d",
    "org/x.gitx",
    "datasets/org/x",
]
ALPHABET = "aZ9-_./ ü:"


def _client_accepts(repo_id: str) -> bool:
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True


def test_the_rule_is_the_clients_own():
    rng = random.Random(7)
    generated = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    short = ["".join(p) for n in (1, 2, 3) for p in itertools.product("a-./", repeat=n)]
    for repo_id in [*SAMPLES, *generated, *short]:
        assert (repo_id_problem(repo_id) is None) == _client_accepts(repo_id), repr(repo_id)


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        (["model=qwen3_8b", "model.hub_id='bad id'"], "model.hub_id", "bad id"),
        (["model=qwen3_8b", "model.hub_id=a/b/c"], "model.hub_id", "a/b/c"),
        (["dataset=magpie", "dataset.magpie.source=data.jsonl/x/y"], "dataset.magpie.source", "data.jsonl/x/y"),
        (["dataset=magpie", "dataset.magpie.source=org/x--y"], "dataset.magpie.source", "org/x--y"),
    ],
)
def test_a_bad_hub_id_is_a_problem_of_its_cell_and_key(make_cells, overrides, key, value):
    (cell,) = make_cells(overrides)
    (problem,) = [p for p in validate([cell]) if p.rule == "hub-repo-id"]
    assert (problem.cell, problem.key, problem.value) == (cell.name, key, value)
    assert "not a Hub repository id" in problem.message and "local path" in problem.fix


def test_good_ids_and_local_paths_are_no_problem(make_cells, tmp_path):
    (cell,) = make_cells(["model=qwen3_8b", "dataset=magpie", f"dataset.magpie.source={tmp_path}/x.jsonl"])
    assert [p for p in validate([cell]) if p.rule == "hub-repo-id"] == []


def test_upload_ids_follow_the_same_rule_and_need_an_org(make_cells):
    for bad in ("x", "org/x--y", "org/x.git", "a/b/c"):
        (cell,) = make_cells(["push_to_hub=true", f"hub_model_id={bad}"])
        assert [p.key for p in validate([cell]) if p.rule == "hub-id"] == ["hub_model_id"], bad


def test_the_grid_command_refuses_a_bad_id_before_writing_anything(tmp_path):
    proc = run_sft("model=qwen3_8b", "model.hub_id=a/b/c", "dry_run=true", f"runs_root={tmp_path / 'runs'}")
    assert proc.returncode != 0
    assert "model.hub_id" in proc.stderr and "a/b/c" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_stage_command_refuses_a_bad_id_in_one_line(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "stage", "--repo", "bad id", "--cache", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "'bad id' is not a Hub repository id" in proc.stderr and "Fix:" in proc.stderr
    assert not (tmp_path / "c").exists()
