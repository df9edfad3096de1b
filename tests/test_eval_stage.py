"""The evaluation stage's parts: the tiny local tasks, the train == serve template check, the in-venv script's spec
and results (pure), the stage runner against a stand-in harness (fast: the score files, a task's own failure, a
tampered template), and the real harness's failures in its own environment (backend).

The whole flow, trained and evaluated for real through the orchestrator, is tests/test_eval_grid.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.paths import IN_VENV_DIR, PACKAGE_CONF
from sft_grid.core.scores import EvalFile, ScoreSpec, read_scores, score_path
from sft_grid.core.templates import effective_template, template_digest, template_matches
from sft_grid.planning import evaluation
from sft_grid.stages import evaluate as stage
from sft_grid.stages.evaluate import state_of

from .helpers import SCORE_KEYS

EVALUATE = IN_VENV_DIR / "lm_eval_run.py"


def load_evaluate_module():
    """The in-env script as a module: it imports only the standard library until it evaluates."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sft_grid_in_venv_evaluate", EVALUATE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


# ---- tiny tasks ------------------------------------------------------------------------------------------------


def _read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _value_of(question: str) -> int:
    _, _, a, op, b = question.rstrip("?").split()
    return int(a) + int(b) if op == "plus" else int(a) - int(b)


def test_tiny_tasks_are_local_lm_eval_configs(tmp_path: Path) -> None:
    written = evaluation.write_tiny_tasks(tmp_path / "tasks")
    assert set(written) == {"tiny_mc", "tiny_gen"}
    for name, path in written.items():
        config = yaml.safe_load(path.read_text())
        assert config["task"] == name and config["dataset_path"] == "json"
        files = config["dataset_kwargs"]["data_files"]
        assert set(files) == {"test", "train"}
        assert all(Path(f).is_absolute() and Path(f).is_file() for f in files.values())
        assert len(_read_jsonl(files["test"])) == evaluation.TEST_ROWS
        assert len(_read_jsonl(files["train"])) == evaluation.TRAIN_ROWS
    mc = yaml.safe_load(written["tiny_mc"].read_text())
    assert mc["output_type"] == "multiple_choice" and [m["metric"] for m in mc["metric_list"]] == ["acc"]
    gen = yaml.safe_load(written["tiny_gen"].read_text())
    assert gen["output_type"] == "generate_until" and gen["generation_kwargs"]["do_sample"] is False
    assert [f["name"] for f in gen["filter_list"]] == ["strict-match", "flexible-extract"]


def test_tiny_tasks_ask_what_the_tiny_models_learn(tmp_path: Path) -> None:
    written = evaluation.write_tiny_tasks(tmp_path)
    asked = re.compile(r"What is \d+ (plus|minus) \d+\?")
    mc = _read_jsonl(tmp_path / "tiny_mc.test.jsonl")
    for row in mc:
        assert asked.fullmatch(row["question"])
        assert len(row["choices"]) == len(set(row["choices"])) == 4
        assert row["choices"][row["label"]] == f"The answer is {_value_of(row['question'])}."
    assert {row["label"] for row in mc} == {0, 1, 2, 3}  # the right answer is not always in one place
    for row in _read_jsonl(tmp_path / "tiny_gen.test.jsonl"):
        assert asked.fullmatch(row["question"]) and row["answer"] == str(_value_of(row["question"]))
    strict = yaml.safe_load(written["tiny_gen"].read_text())["filter_list"][0]["filter"][0]["regex_pattern"]
    assert re.findall(strict, "The answer is 19.") == ["19"]


def test_tiny_tasks_are_deterministic_and_identified_by_content(tmp_path: Path, monkeypatch) -> None:
    a = evaluation.write_tiny_tasks(tmp_path / "a")
    evaluation.write_tiny_tasks(tmp_path / "b")
    for name in a:
        for split in ("test", "train"):
            file = f"{name}.{split}.jsonl"
            assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    evaluation.write_tiny_tasks(tmp_path / "a")  # rewriting in place is harmless and leaves no temp files
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
    before = {n: evaluation.content_digest(n) for n in evaluation.TINY_TASKS}
    monkeypatch.setitem(evaluation._SEEDS, "tiny_gen", 99)
    assert evaluation.content_digest("tiny_gen") != before["tiny_gen"]
    assert evaluation.content_digest("tiny_mc") == before["tiny_mc"]


# ---- train == serve --------------------------------------------------------------------------------------------

TRAINED = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
OTHER = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"


def _model_dir(tmp_path: Path, jinja: str | None = None, config: object = None) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 64} | ({"chat_template": config} if config is not None else {}))
    )
    if jinja is not None:
        (model / "chat_template.jinja").write_text(jinja)
    return model


def test_effective_template_prefers_the_jinja_file_and_reads_named_ones(tmp_path: Path) -> None:
    assert effective_template(_model_dir(tmp_path, jinja=TRAINED, config=OTHER)) == TRAINED
    (tmp_path / "model" / "chat_template.jinja").unlink()
    assert effective_template(tmp_path / "model") == OTHER
    named = [{"name": "tool_use", "template": OTHER}, {"name": "default", "template": TRAINED}]
    assert effective_template(_model_dir(tmp_path, config=named)) == TRAINED
    (tmp_path / "bare").mkdir()
    assert effective_template(tmp_path / "bare") is None


def test_template_digest_ignores_only_a_trailing_newline() -> None:
    assert template_digest(TRAINED) == template_digest(TRAINED + "\n")
    assert template_digest(TRAINED) != template_digest(TRAINED + " ")
    assert template_digest(TRAINED) != template_digest(OTHER)


def test_template_check_passes_only_when_every_saved_copy_is_the_trained_one(tmp_path: Path) -> None:
    trained = template_digest(TRAINED)
    ok, message = template_matches(_model_dir(tmp_path, jinja=TRAINED + "\n", config=TRAINED), trained)
    assert ok, message
    ok, message = template_matches(_model_dir(tmp_path, jinja=OTHER, config=TRAINED), trained)
    assert not ok and "chat_template.jinja has digest " + template_digest(OTHER)[:12] in message and "Fix:" in message
    # transformers would load the .jinja, but a server that reads only tokenizer_config.json sees the other one
    ok, message = template_matches(_model_dir(tmp_path, jinja=TRAINED, config=OTHER), trained)
    assert not ok and "tokenizer_config.json has digest" in message and "chat_template.jinja has" not in message
    (tmp_path / "model" / "chat_template.jinja").unlink()
    ok, message = template_matches(_model_dir(tmp_path), trained)
    assert not ok and "no chat template" in message


# ---- the shipped suites ----------------------------------------------------------------------------------------


def test_every_suite_names_a_harness_and_tasks_with_their_settings() -> None:
    suites = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((PACKAGE_CONF / "eval").glob("*.yaml"))}
    assert set(suites) >= {"none", "tiny", "reasoning_small"} and suites["none"]["tasks"] == {}
    for name, suite in suites.items():
        assert suite["name"] == name
        assert (PACKAGE_CONF / "harness" / f"{suite.get('harness', 'lm_eval')}.yaml").is_file()
    assert set(suites["tiny"]["tasks"]) == set(evaluation.TINY_TASKS) and suites["tiny"]["resources"]["gpus"] == 0
    assert suites["reasoning_small"]["resources"]["gpus"] == 1
    assert all(task["datasets"] for task in suites["reasoning_small"]["tasks"].values())  # staged for offline nodes


# ---- the in-venv script's own logic (stdlib until it evaluates) ------------------------------------------------


def _spec(tmp_path: Path, **over: object) -> dict:
    tasks: list[dict[str, Any]] = [
        {
            "name": n,
            "id": f"id-{n}",
            "num_fewshot": 0,
            "limit": None,
            "gen_kwargs": {},
            "apply_chat_template": True,
            "fewshot_as_multiturn": False,
        }
        for n in evaluation.TINY_TASKS
    ]
    return {
        "model": str(tmp_path / "model"),
        "tasks": tasks,
        "include_path": [str(tmp_path / "tasks")],
        "engine": "hf",
        "batch_size": 4,
        "device": "cpu",
        "dtype": "float32",
        "output_dir": str(tmp_path / "out"),
        "seed": 7,
    } | over


def test_evaluate_spec_parsing_rejects_nonsense(tmp_path: Path) -> None:
    ev = load_evaluate_module()
    spec = ev.EvalSpec.parse(_spec(tmp_path))
    assert [(t.name, t.id) for t in spec.tasks] == [("tiny_mc", "id-tiny_mc"), ("tiny_gen", "id-tiny_gen")]
    bad: list[tuple[dict[str, Any], str]] = [
        ({"engine": "tgi"}, "unknown engine"),
        ({"batch_size": 0}, "batch_size"),
        ({"tasks": [{"name": "tiny_mc", "num_fewshot": -1}]}, "num_fewshot"),
        ({"tasks": [{"name": "tiny_mc", "fewshot_as_multiturn": True}]}, "needs apply_chat_template"),
        ({"tasks": [{"name": "tiny_mc"}, {"name": "tiny_mc"}]}, "listed twice"),
        ({"tasks": [{"name": "tiny_mc", "id": "../x"}]}, "plain file name"),
        ({"output_dir": ""}, "lacks output_dir"),
    ]
    for override, words in bad:
        with pytest.raises(ev.EvalError, match=words):
            ev.EvalSpec.parse(_spec(tmp_path, **override))


def test_evaluate_turns_lm_eval_results_into_flat_metrics(tmp_path: Path) -> None:
    ev = load_evaluate_module()
    spec = ev.EvalSpec.parse(_spec(tmp_path))
    results = {
        "results": {
            "tiny_gen": {
                "alias": "tiny_gen",
                "exact_match,strict-match": 0.25,
                "exact_match_stderr,strict-match": 0.07,
                "exact_match,flexible-extract": 0.5,
                "exact_match_stderr,flexible-extract": "N/A",
            }
        },
        "n-samples": {"tiny_gen": {"original": 40, "effective": 40}},
    }
    record = ev.task_record(spec.tasks[1], results, spec, "0.4.13", 1.23456)
    assert record == {
        "task": "tiny_gen",
        "n_samples": 40,
        "harness_version": "0.4.13",
        "seconds": 1.235,
        "metrics": {
            "exact_match/strict-match": 0.25,
            "exact_match/strict-match_stderr": 0.07,
            "exact_match/flexible-extract": 0.5,
            "exact_match/flexible-extract_stderr": None,
        },
    }
    assert ev.task_metrics({"acc,none": 0.5, "acc_stderr,none": 0.1}) == {"acc": 0.5, "acc_stderr": 0.1}
    with pytest.raises(ev.EvalError, match="ran tiny_gen 0-shot, not the 3-shot"):
        ev.task_record(
            ev.TaskSpec.parse({"name": "tiny_gen", "num_fewshot": 3}),
            results | {"n-shot": {"tiny_gen": 0}},
            spec,
            "0.4.13",
            1.0,
        )
    with pytest.raises(ev.EvalError, match="no metrics"):
        ev.task_record(spec.tasks[0], {"results": {"tiny_mc": {"alias": "x"}}}, spec, "0.4.13", 1.0)


def test_evaluate_fails_in_one_line_before_loading_anything(tmp_path: Path, capsys) -> None:
    # as a program, with the orchestrator's python (no lm_eval): the spec alone shows what is wrong
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_spec(tmp_path)))
    proc = subprocess.run([sys.executable, str(EVALUATE), str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"lm_eval_run.py: error: model directory {tmp_path / 'model'} does not exist"
    ]
    ev = load_evaluate_module()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "tokenizer_config.json").write_text("{}")
    assert ev.main([str(path)]) == 1
    assert "apply_chat_template is set for tiny_mc, tiny_gen" in capsys.readouterr().err
    path.write_text(json.dumps(_spec(tmp_path, tasks=[{"name": "tiny_mc"}])))
    assert ev.main([str(path)]) == 1 and "include_path" in capsys.readouterr().err
    assert ev.main([]) == 2 and "usage" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- the stage runner, against a stand-in harness --------------------------------------------------------------

# Writes what in_venv/lm_eval_run.py writes: one result per task id, or (task "tiny_gen") that task's own error.
STAND_IN = textwrap.dedent("""\
    import json, sys
    from pathlib import Path
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["output_dir"]); out.mkdir(parents=True, exist_ok=True)
    for task in spec["tasks"]:
        if task["name"] == "tiny_gen":
            (out / f"{task['id']}.error.json").write_text(json.dumps({"task": "tiny_gen", "error": "boom in tiny_gen"}))
            continue
        record = {"task": task["name"], "metrics": {"acc": 0.5, "acc_stderr": 0.1}, "n_samples": 40,
                  "harness_version": "0.4.13", "seconds": 1.5}
        (out / f"{task['id']}.json").write_text(json.dumps(record))
    print("lm_eval_run.py: error: 1 of 2 task(s) failed", file=sys.stderr)
    sys.exit(1)
""")


def _settings(task: str, chat: bool = True) -> dict:
    return {
        "task": task,
        "num_fewshot": 0,
        "limit": None,
        "gen_kwargs": {},
        "apply_chat_template": chat,
        "fewshot_as_multiturn": False,
        "dtype": "float32",
        "seed": 1,
        "version": None,
    }


def _target(tmp_path: Path, template: str | None = TRAINED) -> tuple[Path, EvalFile]:
    """A trained cell's directory (its ledger records the template its trainer saved) and its eval.json."""
    cell = tmp_path / "cell-abc"
    model = cell / "output"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    events.append(cell, Event(Kind.COMPLETED, details={stage.TRAINED_TEMPLATE: template_digest(TRAINED)}))
    harness = tmp_path / "harness.py"
    harness.write_text(STAND_IN)
    launcher = tmp_path / "python"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {harness} "$2"\n')
    launcher.chmod(0o755)
    plan = EvalFile(
        target="cell-abc",
        base=False,
        model_path=str(model),
        harness="lm-eval==0.4.13",
        python=str(launcher),
        scores=(
            ScoreSpec(score_id="aaaaaaaaaaaa", suite="tiny", task="tiny_mc", settings=_settings("tiny_mc")),
            ScoreSpec(score_id="bbbbbbbbbbbb", suite="tiny", task="tiny_gen", settings=_settings("tiny_gen")),
        ),
    )
    (cell / "eval.json").write_text(plan.dumps())
    return cell, plan


def test_the_stage_writes_each_score_file_and_fails_only_the_task_that_failed(tmp_path: Path) -> None:
    cell, plan = _target(tmp_path)
    assert stage.run(cell) is False
    scores = read_scores(cell)
    assert list(scores) == ["aaaaaaaaaaaa"] and not score_path(cell, "bbbbbbbbbbbb").exists()
    score = scores["aaaaaaaaaaaa"]
    assert set(score) == SCORE_KEYS
    assert (score["task"], score["suite"], score["harness"], score["model"]) == (
        "tiny_mc",
        "tiny",
        "lm-eval==0.4.13",
        "cell-abc",
    )
    assert score["settings"] == _settings("tiny_mc") and score["template_digest"] == template_digest(TRAINED)
    assert score["metrics"] == {"acc": 0.5, "acc_stderr": 0.1} and score["model_path"] == plan.model_path
    outcomes = {(e.score_id, e.state, e.reason) for e in events.read(cell) if e.kind is Kind.EVAL and e.score_id}
    assert outcomes == {("aaaaaaaaaaaa", "completed", ""), ("bbbbbbbbbbbb", "failed", "boom in tiny_gen")}
    st = state_of(cell)
    assert (st.state, st.done, st.planned) == ("failed", 1, 2) and "tiny_gen: boom in tiny_gen" in st.reason
    # run again: only the missing score is asked of the harness
    assert stage.run(cell) is False
    (spec_file,) = sorted((cell / "logs" / "eval").glob("*-bbbbbbbbbbbb/spec.json"))
    assert [t["id"] for t in json.loads(spec_file.read_text())["tasks"]] == ["bbbbbbbbbbbb"]
    assert read_scores(cell)["aaaaaaaaaaaa"]["time"] == score["time"]  # never computed again


def test_a_tampered_template_fails_the_evaluation_before_the_harness_runs(tmp_path: Path) -> None:
    cell, _ = _target(tmp_path, template=OTHER)
    assert stage.run(cell) is False
    assert not (cell / "logs" / "eval").exists() and read_scores(cell) == {}
    st = state_of(cell)
    assert st.state == "failed" and st.reason.startswith("train == serve: ") and "tokenizer_config.json" in st.reason


def test_a_harness_of_another_version_writes_no_score(tmp_path: Path) -> None:
    cell, plan = _target(tmp_path)
    (cell / "eval.json").write_text(EvalFile(**{**plan.__dict__, "harness": "lm-eval==0.4.99"}).dumps())
    assert stage.run(cell) is False and read_scores(cell) == {}
    assert "score's identity says lm-eval==0.4.99" in state_of(cell).reason


# ---- the real harness (its own environment) --------------------------------------------------------------------


@pytest.mark.backend
def test_the_real_harness_fails_in_one_line(tmp_path: Path) -> None:
    from sft_grid.stages.venv_build import build

    python = build("lm_eval") / "bin" / "python"
    evaluation.write_tiny_tasks(tmp_path / "tasks")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no weights, no tokenizer

    def last_line(**over: object) -> str:
        path = tmp_path / f"spec-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(_spec(tmp_path, **over)))
        proc = subprocess.run(
            [str(python), str(EVALUATE), str(path)],
            capture_output=True,
            text=True,
            timeout=900,
            env={"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf_home")},
        )
        assert proc.returncode == 1, proc.stderr[-3000:]
        return proc.stderr.strip().splitlines()[-1]

    plain = [{"name": "tiny_mc", "apply_chat_template": False}]
    assert last_line(tasks=[{"name": "tiny_nope"}]).startswith("lm_eval_run.py: error: unknown task tiny_nope")
    line = last_line(tasks=plain)  # lm-eval really tries to load it: no weights, no tokenizer
    assert line.startswith("lm_eval_run.py: error: ") and "Error" in line, line
    assert not (tmp_path / "out").exists()
    shutil.rmtree(tmp_path / "hf_home", ignore_errors=True)


def test_a_forced_rerun_moves_the_scores_aside_with_the_output_they_belong_to(tmp_path: Path) -> None:
    from sft_grid.job.runner import archive_output

    cell, _ = _target(tmp_path)
    stage.run(cell)
    moved = archive_output(cell, "force=true rerun of a completed cell")
    assert moved is not None and not (cell / "output").exists() and not (cell / "eval").exists()
    assert [p.name for p in (moved.parent / "eval").iterdir()] == ["aaaaaaaaaaaa.json"]
    assert state_of(cell).done == 0  # the new output has no score yet


def test_whatever_stops_the_stage_is_recorded_as_its_reason(tmp_path: Path) -> None:
    cell, _ = _target(tmp_path)
    (tmp_path / "harness.py").write_text(
        textwrap.dedent("""\
        import json, sys
        from pathlib import Path
        spec = json.loads(Path(sys.argv[1]).read_text())
        out = Path(spec["output_dir"]); out.mkdir(parents=True)
        (out / f"{spec['tasks'][0]['id']}.json").write_text("{torn")
    """)
    )
    assert stage.run(cell) is False and read_scores(cell) == {}
    st = state_of(cell)
    assert st.state == "failed" and st.reason.startswith("JSONDecodeError: ")
    assert {e.score_id for e in events.read(cell) if e.kind is Kind.EVAL and e.state == "failed"} == {
        "",
        "aaaaaaaaaaaa",
        "bbbbbbbbbbbb",
    }
