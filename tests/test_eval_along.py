"""Scores along training, decided before anything runs (fast: no backend; Slurm is tests/fakeslurm.py's fake).

A suite's `along` (null, "checkpoint", or every N steps) also scores each saved checkpoint of a cell, under an id of
its own that names the step: which checkpoints get a score, that each is computed once (a second invocation, a
resumed or requeued cell finds the earlier ones), that on Slurm the job scoring them waits for nothing and nothing
waits for it, and that a bad `along` is refused naming the cell, the key, the value and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sft_grid.core import events
from sft_grid.core.events import Kind
from sft_grid.core.scores import EvalFile, ScoreSpec, along, along_steps, checkpoint_steps, write_score
from sft_grid.grid.decide import Action
from sft_grid.planning.evaluation import along_scores, cell_scores
from sft_grid.planning.validate import validate

from . import fakeslurm
from .test_eval_plan import site_harness  # noqa: F401 (fixture)
from .test_grid_decisions import cells, complete, fake, grid  # noqa: F401 (fixtures)

TINY_LLAMA = ["model=tiny_llama", "max_steps=4", "save_steps=2"]


def checkpoint(cell: Path, step: int, whole: bool = True) -> None:
    """A checkpoint as the trainer leaves it: its trainer state is written last (absent: still being written)."""
    ckpt = cell / "output" / f"checkpoint-{step}"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "model.safetensors").write_bytes(b"w")
    if whole:
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))


def score_missing(target: Path) -> list[str]:
    """What an evaluation job does to the target's scores (the harness left out): every missing one written."""
    plan = EvalFile.load(target)
    assert plan is not None
    written = []
    for spec in plan.todo(target):
        write_score(target, {"score_id": spec.score_id, "task": spec.task, "settings": dict(spec.settings)})
        written.append(spec.score_id)
    return written


def test_which_checkpoints_a_suite_scores():
    assert along_steps(None, [2, 4]) == []
    assert along_steps("checkpoint", [4, 2, 6]) == [2, 4, 6]
    assert along_steps(4, [2, 4, 6, 8]) == [4, 8]
    final = ScoreSpec(score_id="a" * 12, suite="tiny", task="tiny_mc", settings={"task": "tiny_mc"}, along="checkpoint")
    scores = along(
        [final, ScoreSpec(score_id="b" * 12, suite="tiny", task="tiny_gen", settings={"task": "tiny_gen"})], [4, 2]
    )
    # the suite without `along` scores no checkpoint; each checkpoint's score has its own id, the step in its settings
    assert [(s.task, s.step, s.settings["step"]) for s in scores] == [("tiny_mc", 2, 2), ("tiny_mc", 4, 4)]
    ids = [s.score_id for s in scores]
    assert len({*ids, final.score_id}) == 3 and ids == [s.score_id for s in along([final], [2, 4])]


def test_only_whole_checkpoints_count(tmp_path):
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4, whole=False)
    (tmp_path / "output" / "checkpoint-x").mkdir()
    assert checkpoint_steps(tmp_path / "output") == (2,)


def test_a_cells_checkpoint_scores_come_from_its_suites(make_cells):
    plain, every, each4 = make_cells(
        [*TINY_LLAMA, "eval=tiny"],
        [*TINY_LLAMA, "eval=tiny", "eval.along=checkpoint"],
        [*TINY_LLAMA, "eval=tiny", "eval.along=4"],
    )
    assert along_scores(plain, [2, 4]) == ()
    # the final model's score ids do not change when a suite scores along training
    assert [s.score_id for s in cell_scores(plain)] == [s.score_id for s in cell_scores(every)]
    assert [(s.task, s.step) for s in along_scores(every, [2, 4])] == [
        ("tiny_mc", 2),
        ("tiny_gen", 2),
        ("tiny_mc", 4),
        ("tiny_gen", 4),
    ]
    assert [s.step for s in along_scores(each4, [2, 4])] == [4, 4]


@pytest.mark.parametrize(
    ("override", "value", "fix"),
    [
        ("eval.along=sometimes", "sometimes", "eval.along=checkpoint"),
        ("eval.along=0", 0, "eval.along=<N steps>"),
        ("eval.along=3", 3, "a multiple of 2 (eval.along=4)"),
    ],
)
def test_a_bad_along_names_the_cell_the_key_the_value_and_the_fix(make_cells, override, value, fix):
    (cell,) = make_cells([*TINY_LLAMA, "eval=tiny", "dry_run=true", override])
    found = [p for p in validate([cell]) if p.key == "eval.along"]
    assert len(found) == 1, [p.render() for p in validate([cell])]
    assert found[0].cell == cell.name and found[0].value == value and fix in found[0].fix
    (good,) = make_cells([*TINY_LLAMA, "eval=tiny", "dry_run=true", "eval.along=4"])
    assert not [p for p in validate([good]) if p.key == "eval.along"]


def _scores(cell: Path) -> dict[str, Any]:
    return {p.name: p.stat().st_mtime_ns for p in sorted((cell / "eval").glob("*.json"))}


def test_checkpoints_are_scored_by_a_job_of_their_own_once_each(fake_grid_along):
    slurm_dir, run_grid = fake_grid_along
    first = run_grid()
    assert [j.role.value for j in first.plan.slurm] == ["train", "post", "eval", "eval"]
    dirs = cells(run_grid.runs)
    fakeslurm.set_state(slurm_dir, "100", "RUNNING")
    # while the cells train: one has saved a checkpoint, one is writing its first, one has none
    checkpoint(dirs[0], 2)
    checkpoint(dirs[1], 2, whole=False)
    during = run_grid()
    assert [d.action for d in during.decisions] == [Action.SKIP] * 3
    assert [d.evaluate for d in during.decisions] == [True, False, False]
    assert "checkpoint evaluation to run: 2 score(s)" in during.decisions[0].why
    (job,) = during.plan.slurm  # one evaluation array: its checkpoints, waiting for nothing; training is not touched
    assert job.role.value == "eval" and job.targets == (dirs[0],) and job.dependency is None
    queued = events.last(events.read(dirs[0]), Kind.EVAL_JOB)
    assert queued.after == "" and queued.eval_job_id == "104"
    # queued: not sent twice
    assert run_grid().plan.slurm == () and len(fakeslurm.calls(slurm_dir, "sbatch")) == 5
    fakeslurm.set_state(slurm_dir, "104", "COMPLETED")
    assert len(score_missing(dirs[0])) == 2
    scored = _scores(dirs[0])
    checkpoint(dirs[1], 2)
    later = run_grid()
    (job,) = later.plan.slurm
    assert job.targets == (dirs[1],)  # the first cell's checkpoint is not scored again
    fakeslurm.set_state(slurm_dir, "105", "COMPLETED")
    score_missing(dirs[1])
    # the cells end: the evaluation after the post stages scores the final models and the checkpoints left
    for cell in dirs:
        checkpoint(cell, 4)
        complete(cell)
        (cell / "output" / "config.json").write_text("{}")
    for job_id in ("100", "101", "102", "103"):
        fakeslurm.set_state(slurm_dir, job_id, "COMPLETED")
    plan = EvalFile.load(dirs[0])
    assert [(s.task, s.step) for s in plan.missing(dirs[0])] == [
        ("tiny_mc", None),
        ("tiny_gen", None),
        ("tiny_mc", 4),
        ("tiny_gen", 4),
    ]
    for target in [*dirs, first.plan.slurm[3].targets[0]]:
        score_missing(target)
    assert _scores(dirs[0]).items() >= scored.items()
    # a second run over the finished grid scores nothing again
    sent = len(fakeslurm.calls(slurm_dir, "sbatch"))
    done = run_grid()
    assert [(d.action, d.evaluate) for d in done.decisions] == [(Action.SKIP, False)] * 3
    assert done.plan.slurm == () and len(fakeslurm.calls(slurm_dir, "sbatch")) == sent
    assert all(not EvalFile.load(c).missing(c) for c in dirs)


def test_a_resumed_cell_does_not_rescore_its_checkpoints(fake_grid_along):
    slurm_dir, run_grid = fake_grid_along
    run_grid(seeds=(1,))
    (cell,) = cells(run_grid.runs)
    checkpoint(cell, 2)
    fakeslurm.set_state(slurm_dir, "100", "FAILED")
    fakeslurm.set_state(slurm_dir, "101", "CANCELLED")
    fakeslurm.set_state(slurm_dir, "102", "CANCELLED")
    fakeslurm.set_state(slurm_dir, "103", "COMPLETED")
    # failed: its checkpoint is scored (alone, waiting for nothing), its training is not rerun
    failed = run_grid(seeds=(1,))
    (d,) = failed.decisions
    assert d.action is Action.SKIP and d.evaluate
    (job,) = [j for j in failed.plan.slurm if j.targets == (cell,)]
    assert job.role.value == "eval" and job.dependency is None
    fakeslurm.set_state(slurm_dir, job.name and "104", "COMPLETED")
    first = score_missing(cell)
    assert len(first) == 2
    # resumed (rerun_failed): it trains from checkpoint-2 to the end; the earlier scores are found, not redone
    resumed = run_grid("rerun_failed=true", seeds=(1,))
    assert resumed.decisions[0].action is Action.RUN
    checkpoint(cell, 4)
    complete(cell)
    missing = EvalFile.load(cell).missing(cell)
    assert not {s.score_id for s in missing} & set(first)
    assert sorted({s.step for s in missing}, key=str) == [4, None]


@pytest.fixture
def fake_grid_along(request: pytest.FixtureRequest, site_harness):  # noqa: F811
    slurm_dir, run = request.getfixturevalue("fake"), request.getfixturevalue("grid")

    def run_grid(*extra: str, seeds=(1, 2, 3)):
        # a checkpoint at every step: the cells train 2 steps, and scores along training need checkpoints to score
        return run("eval=tiny", "eval.along=checkpoint", "save_steps=1", site_harness, *extra, seeds=seeds)

    run_grid.runs = run.runs  # type: ignore[attr-defined]
    return slurm_dir, run_grid


def test_results_and_the_report_show_each_checkpoints_score_with_its_loss_and_tokens(make_cells, tmp_path):
    from sft_grid.analysis.page import render
    from sft_grid.analysis.report_data import build

    from . import grid_fixture as gf
    from .test_results import results

    cells = make_cells(*[["model=tiny_llama", f"lr={lr}", "sweep_name=g"] for lr in ("1e-5", "2e-5")])
    one, other = gf.render_cells(cells)
    for cell, floor in ((one, 1.5), (other, 1.4)):
        gf.run(cell, "completed", gf.curve(20, floor), 20, seconds=60.0)
        gf.estimate(cell, 2e5, 20000, 20, gpu_hours=0.01)  # 1000 tokens a step
        gf.score(cell, "tiny_mc", {"acc": 0.5, "acc_stderr": 0.05}, when="2026-12-01T00:00:00")
    for step, acc in ((10, 0.25), (20, 0.375)):  # one's checkpoints, scored after its final model
        path = gf.score(one, "tiny_mc", {"acc": acc}, score_id=f"ck{step}", when=f"2026-12-02T00:00:{step}")
        data = json.loads(path.read_text())
        data["settings"] = {**data["settings"], "step": step}
        path.write_text(json.dumps(data))
    runs = tmp_path / "runs"
    table = json.loads(results("g", "--runs-root", str(runs), "--format", "json").stdout)
    assert [c["scores"]["tiny_mc/acc"]["value"] for c in table["cells"]] == [0.5, 0.5]  # the final model's
    along = json.loads(results("g", "--runs-root", str(runs), "--along", "--format", "json").stdout)
    losses = dict(gf.curve(20, 1.5))
    assert [
        (p["cell"], p["step"], p["tokens"], p["loss"], p["scores"]["tiny_mc/acc"]["value"]) for p in along["points"]
    ] == [
        (one.name, 10, 10000.0, losses[10], 0.25),
        (one.name, 20, 20000.0, losses[20], 0.375),
    ]
    text = results("g", "--runs-root", str(runs), "--along").stdout
    assert "2 scored checkpoint(s) of 1 cell(s)" in text and "0.375" in text
    data = build(runs / "g", resamples=10)
    assert data["along_columns"] == ["tiny_mc/acc"] and [len(c["along"]) for c in data["cells"]] == [2, 0]
    page = render(data)
    assert "Scores along training" in page and "tiny_mc/acc vs step" in page and "tiny_mc/acc vs tokens seen" in page
    for step in (10, 20):
        (one / "eval" / f"ck{step}.json").unlink()
    none = results("g", "--runs-root", str(runs), "--along")
    assert none.returncode == 1 and "eval.along=checkpoint" in none.stderr
