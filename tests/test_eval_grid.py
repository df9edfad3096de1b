"""A tiny grid trained and evaluated for real through the orchestrator: LLaMA-Factory trains on the CPU, then
lm-evaluation-harness scores the cell and its base model in the harness's own environment, offline, on the project's
tiny tasks; locally (the cell's own job) and on the local Slurm cluster (an evaluation array after the post array
after the training array).

Locally, one grid is invoked five times: it trains and evaluates (the base model once); invoked again it evaluates
nothing; with a task added it evaluates that task alone (one per cell, one for the base model); with the saved
tokenizer's template changed the evaluation fails the train == serve check, and the training stays completed;
with the template put back it is retried alone, never the training.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sft_grid.cli.cmd_status import base_dirs, rows
from sft_grid.core import events
from sft_grid.core.events import Kind
from sft_grid.core.layout import LEDGER_FILE, iter_cell_dirs
from sft_grid.core.scores import BASE_DIR, read_scores
from sft_grid.stages.evaluate import TRAINED_TEMPLATE

from .conftest import run_sft
from .helpers import SCORE_KEYS, kinds, ledger

log = logging.getLogger(__name__)

pytestmark = pytest.mark.backend

TINY = ["model=tiny_llama", "max_steps=4", "global_batch_size=4", "micro_batch_size=2", "eval=tiny"]


@pytest.fixture(scope="module")
def harness_env() -> Path:
    from sft_grid.stages.venv_build import build

    started = time.monotonic()
    env = build("lm_eval")
    log.info("harness environment %s ready in %.0f s", env, time.monotonic() - started)
    return env


def grid(root: Path, *extra: str, timeout: float = 1200) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = run_sft("-m", *TINY, *extra, f"runs_root={root}", timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, time.monotonic() - started


def scores_by_task(target: Path) -> dict[tuple[str, Any], dict]:
    return {(s["task"], s["settings"]["limit"]): s for s in read_scores(target).values()}


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and (p.name == LEDGER_FILE or p.parent.name == "eval")
    }


def test_a_local_grid_is_evaluated_once_per_score_and_a_failure_is_retried_alone(tmp_path, tiny_assets, harness_env):
    root = tmp_path / "runs"
    one_task = "~eval.tasks.tiny_gen"
    _first, seconds = grid(root, one_task)
    log.info("train + evaluate (one task) + base model: %.0f s", seconds)
    (cell,) = iter_cell_dirs(root / "default")
    (base,) = base_dirs(root / "default")
    assert base.parent.name == BASE_DIR and base.name.startswith("tiny_llama-")
    trained = events.last(events.read(cell), Kind.COMPLETED).details[TRAINED_TEMPLATE]
    for target, model in ((cell, cell.name), (base, "tiny_llama")):
        (score,) = read_scores(target).values()
        assert set(score) == SCORE_KEYS | ({"base"} if target == base else set())
        assert (score["task"], score["suite"], score["model"], score["harness"]) == (
            "tiny_mc",
            "tiny",
            model,
            "lm-eval==0.4.13",
        )
        assert 0 <= score["metrics"]["acc"] <= 1 and 0 < score["metrics"]["acc_stderr"] < 0.5
        assert score["settings"]["apply_chat_template"] is True and score["template_digest"] == trained
    assert read_scores(base)[next(iter(read_scores(base)))]["base"] is True
    table = rows([cell], [base])
    assert [r[6] for r in table] == ["done (1)", "done (1)"] and table[0][1] == "completed"

    # invoked again: nothing is evaluated (no ledger line, no score file touched)
    before = snapshot(root)
    again, seconds = grid(root, one_task)
    log.info("second invocation: %.1f s", seconds)
    assert "nothing to run" in again.stdout and snapshot(root) == before

    # the suite's other task added: that task alone, for the cell and for the base model
    _added, seconds = grid(root)
    log.info("one task added, evaluated for the cell and the base model: %.0f s", seconds)
    unchanged = {k: v for k, v in snapshot(root).items() if k in before and "/eval/" in k}
    assert unchanged == {k: v for k, v in before.items() if "/eval/" in k}  # tiny_mc's scores: never again
    for target in (cell, base):
        scored = scores_by_task(target)
        assert sorted(scored) == [("tiny_gen", None), ("tiny_mc", None)]
        last_run = [e for e in events.read(target) if e.kind is Kind.EVAL and e.state == "running"][-1]
        assert last_run.details["scores"] == [scored[("tiny_gen", None)]["score_id"]]
    gen = scores_by_task(cell)[("tiny_gen", None)]["metrics"]
    assert set(gen) == {
        "exact_match/strict-match",
        "exact_match/strict-match_stderr",
        "exact_match/flexible-extract",
        "exact_match/flexible-extract_stderr",
    }
    assert kinds(cell).count("running") == 1

    # the saved tokenizer's template changed: train == serve fails the evaluation of a new setting, not the cell
    output = cell / "output"
    shutil.copytree(output, tmp_path / "saved", ignore=shutil.ignore_patterns("checkpoint-*", "*.safetensors"))
    template = (output / "chat_template.jinja").read_text()
    (output / "chat_template.jinja").write_text(template.replace("<|eot_id|>", "<|end|>"))
    grid(root, "eval.tasks.tiny_mc.limit=10")
    status = rows([cell], [base])
    # (the suite now asks for tiny_gen and tiny_mc with limit 10: the score without a limit stays on disk)
    assert status[0][1] == "completed" and status[0][6] == "failed (1/2)" and status[1][6] == "done (2)"
    assert "train == serve" in status[0][8] and "chat_template.jinja has digest" in status[0][8]
    assert ("tiny_mc", 10) not in scores_by_task(cell) and ("tiny_mc", 10) in scores_by_task(base)

    # the template put back: the evaluation is retried alone, never the training
    shutil.copyfile(tmp_path / "saved" / "chat_template.jinja", output / "chat_template.jinja")
    retried, seconds = grid(root, "eval.tasks.tiny_mc.limit=10")
    log.info("failed evaluation retried alone: %.0f s", seconds)
    assert "evaluation to run again: 1 score(s)" in retried.stdout
    assert rows([cell])[0][6] == "done (2)" and kinds(cell).count("running") == 1 and len(read_scores(cell)) == 3
    assert scores_by_task(cell)[("tiny_mc", 10)]["metrics"]["acc"] is not None


def test_checkpoints_are_scored_once_each_and_shown_along_training(tmp_path, tiny_assets, harness_env):
    """Scores along training for real: LLaMA-Factory saves two checkpoints (save_steps=2 of 4 steps), lm-eval scores
    each once beside the final model (locally: in the cell's job, after its training), `sft-grid results --along`
    shows both with their loss and tokens, and a second invocation scores nothing."""
    root = tmp_path / "runs"
    along = ("save_steps=2", "eval.along=checkpoint", "eval.base_models=false", "~eval.tasks.tiny_gen")
    _first, seconds = grid(root, *along)
    log.info("train + score the final model and two checkpoints: %.0f s", seconds)
    (cell,) = iter_cell_dirs(root / "default")
    scores = read_scores(cell)
    steps = sorted((s["settings"].get("step") or 0, s["model_path"]) for s in scores.values())
    assert steps == [
        (0, str(cell / "output")),
        (2, str(cell / "output" / "checkpoint-2")),
        (4, str(cell / "output" / "checkpoint-4")),
    ]
    trained = events.last(events.read(cell), Kind.COMPLETED).details[TRAINED_TEMPLATE]
    assert all(s["template_digest"] == trained and 0 <= s["metrics"]["acc"] <= 1 for s in scores.values())
    # each score computed once: one evaluation, one `completed` line per score
    done = [e.score_id for e in events.read(cell) if e.kind is Kind.EVAL and e.score_id and e.state == "completed"]
    assert sorted(done) == sorted(scores) and kinds(cell).count("running") == 1
    assert rows([cell])[0][6] == "done (3)"
    shown = run_sft("results", "default", "--runs-root", str(root), "--along", "--format", "json", check=True)
    points = json.loads(shown.stdout)["points"]
    assert [(p["cell"], p["step"]) for p in points] == [(cell.name, 2), (cell.name, 4)]
    assert all(p["loss"] > 0 and p["tokens"] > 0 and p["scores"]["tiny_mc/acc"]["value"] is not None for p in points)
    assert points[1]["tokens"] == 2 * points[0]["tokens"]
    table = run_sft("results", "default", "--runs-root", str(root), "--format", "json", check=True)
    (row,) = json.loads(table.stdout)["cells"]  # the table's score is the final model's
    final = next(s for s in scores.values() if "step" not in s["settings"])
    assert row["scores"]["tiny_mc/acc"]["value"] == final["metrics"]["acc"]
    # invoked again: nothing is scored again (no ledger line, no score file touched)
    before = snapshot(root)
    again, _ = grid(root, *along)
    assert "nothing to run" in again.stdout and snapshot(root) == before


def _arrays(root: Path) -> set[str]:
    return {
        e["name"]
        for p in root.rglob(LEDGER_FILE)
        for e in ledger(p.parent)
        if e.get("event") in ("submitted", "post_job", "eval_job") and e.get("name")
    }


def _sacct(job_ids: list[str]) -> dict[str, tuple[str, str, str]]:
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--format=JobID,State,Start,End", f"--jobs={','.join(job_ids)}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return {p[0]: (p[1], p[2], p[3]) for p in (line.split("|") for line in out.splitlines()) if len(p) >= 4}


@pytest.mark.slurm
def test_on_slurm_each_cell_is_evaluated_by_an_array_after_its_post_and_training_tasks(
    tmp_path, tiny_assets, harness_env
):
    root = tmp_path / "runs"
    try:
        queued, _ = grid(root, "lr=1e-3,5e-4", "cluster=slurm_local", timeout=300)
        assert "evaluation of 2 cell(s): array sft_grid-" in queued.stdout and ", after aftercorr" in queued.stdout
        assert "evaluation of 1 base model(s)" in queued.stdout
        cells = list(iter_cell_dirs(root / "default"))
        (base,) = base_dirs(root / "default")
        deadline = time.monotonic() + 1200
        eval_jobs = [events.last(events.read(t), Kind.EVAL_JOB).eval_job_id for t in (*cells, base)]
        while not (
            all(len(read_scores(t)) == 2 for t in (*cells, base))
            and all(state == "COMPLETED" for state, _, _ in _sacct(eval_jobs).values())
        ):
            failed = [r for r in rows(cells, [base]) if r[1] in ("failed", "cancelled") or r[6].startswith("failed")]
            assert not failed and time.monotonic() < deadline, rows(cells, [base])
            time.sleep(2)
        for cell in cells:
            history = events.read(cell)
            train, post = events.last(history, Kind.JOB).job_id, events.last(history, Kind.POST_JOB)
            evaluation = events.last(history, Kind.EVAL_JOB)
            # the same task index in the training, post and evaluation arrays (aftercorr pairs them)
            assert evaluation.after == post.post_job_id.split("_")[0]
            assert evaluation.index == post.index == events.last(history, Kind.SUBMITTED).index
            jobs = _sacct([train, post.post_job_id, evaluation.eval_job_id])
            assert all(state == "COMPLETED" for state, _, _ in jobs.values()), jobs
            # each evaluation task started once its post task, started after its training task, had ended
            assert jobs[evaluation.eval_job_id][1] >= jobs[post.post_job_id][2] >= jobs[train][2]
            assert {s["task"] for s in read_scores(cell).values()} == {"tiny_mc", "tiny_gen"}
        script = next((root / "default" / ".submitit").glob(f"{evaluation.array}/*.sh")).read_text()
        assert "#SBATCH --cpus-per-task=2" in script and "#SBATCH --time=20" in script
        again, _ = grid(root, "lr=1e-3,5e-4", "cluster=slurm_local", timeout=300)
        assert "nothing to run" in again.stdout and "evaluation of" not in again.stdout
        assert [kinds(c).count("eval_job") for c in cells] == [1, 1]
    finally:
        for name in sorted(_arrays(root)):
            subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)


@pytest.mark.slurm
def test_on_slurm_a_cancelled_cells_checkpoints_are_scored_by_a_job_that_waits_for_nothing(
    tmp_path, tiny_assets, harness_env
):
    """A cell trains on the local Slurm cluster and is cancelled once it has saved checkpoint-20: the next invocation
    does not train it again, and queues one evaluation job for its checkpoints at multiples of 20 steps, which waits
    for nothing; each is scored once, and the invocation after that queues nothing."""
    root = tmp_path / "runs"
    args = [
        "-m",
        "model=tiny_llama",
        "max_steps=60",
        "global_batch_size=4",
        "micro_batch_size=2",
        "save_steps=10",
        "eval=tiny",
        "eval.along=20",
        "eval.base_models=false",
        "~eval.tasks.tiny_gen",
        "cluster=slurm_local",
        f"runs_root={root}",
    ]
    try:
        first = run_sft(*args, timeout=300)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        (cell,) = iter_cell_dirs(root / "default")
        saved = cell / "output" / "checkpoint-20" / "trainer_state.json"
        deadline = time.monotonic() + 900
        while not saved.is_file():
            assert time.monotonic() < deadline and rows([cell])[0][1] in ("submitted", "running"), rows([cell])
            time.sleep(0.2)
        train = events.last(events.read(cell), Kind.JOB).job_id
        subprocess.run(["scancel", train], check=True, timeout=60)
        while (state := rows([cell])[0][1]) != "cancelled":
            # (60 steps: the cancel lands long before the last; a cell that completed first fails here, at once)
            assert time.monotonic() < deadline and state in ("submitted", "running"), rows([cell])
            time.sleep(1)
        second = run_sft(*args, timeout=300)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert "evaluation of 1 cell(s) (their checkpoints): array sft_grid-" in second.stdout
        assert "queued" not in second.stdout, second.stdout  # its training is not submitted again
        scoring = events.last(events.read(cell), Kind.EVAL_JOB)
        assert scoring.after == "" and events.last(events.read(cell), Kind.JOB).job_id == train
        steps = [s for s in (20, 40, 60) if (cell / "output" / f"checkpoint-{s}" / "trainer_state.json").is_file()]
        while (state := _sacct([scoring.eval_job_id]).get(scoring.eval_job_id, ("PENDING",))[0]) != "COMPLETED":
            assert time.monotonic() < deadline and state in ("PENDING", "RUNNING", "COMPLETING"), state
            time.sleep(1)
        scored = sorted(s["settings"]["step"] for s in read_scores(cell).values())
        assert scored == steps, (scored, steps)
        done = [e.score_id for e in events.read(cell) if e.kind is Kind.EVAL and e.score_id and e.state == "completed"]
        assert sorted(done) == sorted(read_scores(cell))
        before = snapshot(root)
        third = run_sft(*args, timeout=300)
        assert third.returncode == 0 and "evaluation of" not in third.stdout, third.stdout[-3000:]
        assert snapshot(root) == before
    finally:
        for name in sorted(_arrays(root)):
            subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)


def test_an_eval_axis_on_the_command_line_renders_one_cell_in_the_directory_of_the_cell_without_it(
    tmp_path, tiny_assets
):
    plain = run_sft("-m", "model=tiny_llama", "dry_run=true", f"runs_root={tmp_path / 'a'}", timeout=600)
    axis = run_sft(
        "-m", "model=tiny_llama", "eval=tiny,none", "dry_run=true", f"runs_root={tmp_path / 'b'}", timeout=600
    )
    assert plain.returncode == axis.returncode == 0, axis.stderr[-3000:]
    ((one,), (other,)) = (list(iter_cell_dirs(tmp_path / r / "default")) for r in ("a", "b"))
    assert one.name == other.name and "dry run: 1 cell(s) rendered" in axis.stdout
    assert not (one / "eval.json").exists() and [
        s["task"] for s in json.loads((other / "eval.json").read_text())["scores"]
    ] == ["tiny_mc", "tiny_gen"]
    assert "evaluation suite tiny: 1 cell(s) x 2 task(s)" in axis.stdout and "evaluation" not in plain.stdout


def test_an_eval_task_the_harness_does_not_know_stops_the_grid_before_anything_is_written(
    tmp_path, tiny_assets, harness_env
):
    """lm-eval's own task index, asked in the harness's environment, is the oracle: a misspelt task stops the dry run
    (which cell, which key, what value, the names it meant), where the job would have failed after training; a task
    of the team's own YAMLs (include_path) passes, and an edit there is seen at once."""
    from sft_grid.planning.evaluation import write_tiny_tasks

    team = tmp_path / "team_tasks"
    source = write_tiny_tasks(tmp_path / "tiny")["tiny_mc"]
    config = json.loads(source.read_text())  # the tiny tasks' YAML is JSON: a real lm-eval task config
    team.mkdir()
    (team / "team_arith.yaml").write_text(json.dumps({**config, "task": "team_arith"}))
    suite = ["model=tiny_llama", "eval=reasoning_small", "eval.resources.gpus=0", "dry_run=true"]

    typo = run_sft(*suite, "eval.tasks.gsm8k.task=gsm8kk", f"runs_root={tmp_path / 'a'}", timeout=900)
    said = typo.stdout + typo.stderr
    assert typo.returncode != 0, said[-3000:]
    assert "eval.tasks.gsm8k.task='gsm8kk': not a task, group or tag of lm-eval" in said, said[-3000:]
    assert "did you mean gsm8k?" in said and "nothing was submitted" in said
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").rglob("cell.yaml"))

    own = [f"eval.include_path={team}", "eval.tasks.gsm8k.task=team_arith"]
    ok = run_sft(*suite, *own, f"runs_root={tmp_path / 'b'}", timeout=900)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "dry run: 1 cell(s) rendered" in ok.stdout

    (team / "team_arith.yaml").write_text(json.dumps({**config, "task": "team_arith2"}))
    gone = run_sft(*suite, *own, f"runs_root={tmp_path / 'c'}", timeout=900)
    said = gone.stdout + gone.stderr
    assert gone.returncode != 0 and "eval.tasks.gsm8k.task='team_arith': not a task, group or tag" in said, said
    assert f"nor under include_path {team}" in said and "did you mean team_arith2?" in said
