"""The tiny local evaluation tasks sft_grid ships for its tests and demo, written by code into a directory.

No test machine reaches the Hugging Face Hub, so the evaluation stage is exercised on tasks built here and found
by lm-evaluation-harness through its include path: the evaluation job writes them (``write_tiny_tasks``) into
``<cache root>/eval_tasks/tiny-<digest>/`` when a suite names one of them, and planning puts each task's content
digest into its settings, so a changed question is a new score. They ask what the tiny
models are trained on (the tiny datasets are arithmetic chats: "What is 12 plus 7?" -> "The answer is 19.",
"What is 40 minus 3?" -> "The answer is 37."), so a trained cell can score above chance where an untrained one
does not:

    tiny_mc    multiple_choice: the question, four "The answer is N." choices; metric acc
    tiny_gen   generate_until (at most 16 new tokens, stops at a newline); metric exact_match of the number,
               under two filters as lm-eval's gsm8k has them: strict-match ("The answer is N.") and
               flexible-extract (the first integer in the answer)

Each task has a test split (the scored rows) and a small train split (where few-shot examples come from).

Invariants: content is a pure function of the seeds below, so two builds are byte-identical; task YAMLs name
their data by absolute path (``dataset_path: json`` with ``data_files``), so loading them needs no network and no
working directory; every file is written to a temporary name and renamed, so a reader never sees half a task.
A task's settings (planning/evals.py) carry a digest of its content and not its path: the same task built
anywhere scores under the same identity, and a change of questions is a new identity.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

TINY_TASKS = ("tiny_mc", "tiny_gen")
TEST_ROWS = 40
TRAIN_ROWS = 8
# Past "The answer is 100." in the tiny tokenizers, with room to spare: the answers are short on purpose.
GEN_MAX_TOKENS = 16
_SEEDS = {"tiny_mc": 11, "tiny_gen": 12}


def _question(rng: random.Random) -> tuple[str, int]:
    """One question as the tiny datasets ask it (addition, or subtraction with a non-negative answer)."""
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    if rng.random() < 0.5:
        return f"What is {a} plus {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} minus {b}?", a - b


def _answer(value: int) -> str:
    return f"The answer is {value}."


def mc_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Multiple-choice rows: the right answer among three near misses, at a seeded position."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, value = _question(rng)
        wrong = rng.sample([v for v in range(max(0, value - 6), value + 7) if v != value], 3)
        choices = [_answer(v) for v in wrong]
        label = rng.randrange(4)
        choices.insert(label, _answer(value))
        rows.append({"question": question, "choices": choices, "label": label})
    return rows


def gen_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Generation rows: the question and the number the answer must contain."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, value = _question(rng)
        rows.append({"question": question, "answer": str(value)})
    return rows


def _task_config(name: str, data: dict[str, str]) -> dict[str, Any]:
    """The lm-eval task YAML of one tiny task, its data files given as {split: path}."""
    common = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": data},
        "test_split": "test",
        "fewshot_split": "train",
        "doc_to_text": "{{question}}",
        "metadata": {"version": 1.0},
    }
    if name == "tiny_mc":
        return {**common, "output_type": "multiple_choice", "doc_to_choice": "{{choices}}", "doc_to_target": "label",
                "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    number = r"(-?[0-9]+)"
    return {
        **common,
        "output_type": "generate_until",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": GEN_MAX_TOKENS, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "filter_list": [
            {"name": "strict-match", "filter": [
                {"function": "regex", "regex_pattern": r"The answer is " + number + r"\."},
                {"function": "take_first"}]},
            {"name": "flexible-extract", "filter": [
                {"function": "regex", "regex_pattern": number, "group_select": 0},
                {"function": "take_first"}]},
        ],
    }


def _rows(name: str) -> dict[str, list[dict[str, Any]]]:
    make = mc_rows if name == "tiny_mc" else gen_rows
    # One stream per task: the train rows come after the test rows, so few-shot examples are other questions.
    rows = make(TEST_ROWS + TRAIN_ROWS, _SEEDS[name])
    return {"test": rows[:TEST_ROWS], "train": rows[TEST_ROWS:]}


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def _yaml(config: dict[str, Any]) -> str:
    # JSON is YAML: the task file needs no YAML library here, and lm-eval's loader reads it as is.
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def content_digest(name: str) -> str:
    """A digest of one task's rows and YAML with its data paths left out: the task's identity wherever it is built."""
    splits = _rows(name)
    config = _task_config(name, {split: f"<{split}>" for split in splits})
    blob = json.dumps({"config": config, "rows": splits}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_tiny_tasks(dest: str | Path) -> dict[str, Path]:
    """Write every tiny task (data + YAML) under ``dest``; return {task name: its YAML}. Idempotent."""
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for name in TINY_TASKS:
        data = {}
        for split, rows in _rows(name).items():
            path = dest / f"{name}.{split}.jsonl"
            _write(path, _jsonl(rows))
            data[split] = str(path)
        written[name] = dest / f"{name}.yaml"
        _write(written[name], _yaml(_task_config(name, data)))
    return written


def tasks_digest() -> str:
    """One digest of every tiny task: the name of the directory they are written to."""
    return hashlib.sha256("".join(content_digest(n) for n in TINY_TASKS).encode()).hexdigest()[:12]
