"""The rules of a cell's evaluation suite (pure, like the other rules in validate.py): what the schema's ranges and
value sets cannot say. Each problem names the cell, the key under `eval`, the value, the suite and the fix, and is
reported before anything is written or queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from sft_grid.core.problems import Problem
from sft_grid.core.timefmt import parse_minutes
from sft_grid.planning.cells import Cell
from sft_grid.planning.eval_tasks import TINY_TASKS
from sft_grid.planning.evals import harness_venv, harness_version
from sft_grid.planning.venvs import is_ready


def _problem(cell: Cell, key: str, value: object, rule: str, message: str, fix: str) -> Problem:
    return Problem(cell.name, f"eval.{key}", value, rule, f"(suite {cell.spec.eval.name}) {message}", fix)


def _batch_size(cell: Cell, value: Any) -> Iterator[Problem]:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    yield _problem(cell, "batch_size", value, "eval-batch-size", "must be a count >= 1 or \"auto\"",
                   "set eval.batch_size=8 (say), or eval.batch_size=auto")


def _tasks(cell: Cell, suite: Any) -> Iterator[Problem]:
    for label, task in suite.tasks.items():
        name = task.task or label
        if task.limit is not None and task.limit >= 1 and not float(task.limit).is_integer():
            yield _problem(cell, f"tasks.{label}.limit", task.limit, "eval-limit",
                           "a limit is a count of documents (a whole number >= 1) or a fraction of them (< 1)",
                           f"set eval.tasks.{label}.limit={int(task.limit)}, or a fraction such as 0.5")
        if task.fewshot_as_multiturn and not task.apply_chat_template:
            yield _problem(cell, f"tasks.{label}.fewshot_as_multiturn", True, "eval-multiturn",
                           "few-shot examples as chat turns need the chat template",
                           f"set eval.tasks.{label}.apply_chat_template=true, or fewshot_as_multiturn=false")
        if name.startswith("tiny_") and name not in TINY_TASKS:
            yield _problem(cell, f"tasks.{label}.task" if task.task else "tasks", name, "eval-task",
                           "not one of the project's tiny tasks", f"use one of {', '.join(TINY_TASKS)}")


def _harness(cell: Cell, suite: Any) -> Iterator[Problem]:
    venv, own = harness_venv(cell, suite)
    cluster = cell.spec.cluster.name
    if suite.engine == "vllm" and not own:
        yield _problem(cell, "engine", "vllm", "eval-engine",
                       f"the managed {suite.harness} environment has no vllm, and cluster {cluster!r} names no"
                       f" {suite.harness} environment of its own",
                       f"name the site's environment with vllm: cluster.backend_venvs.{suite.harness}=<venv dir>"
                       f" (in conf/cluster/{cluster}.yaml), or eval.engine=hf")
    if own and not harness_version(cell, suite):
        yield _problem(cell, "harness", suite.harness, "eval-harness-version",
                       f"cannot read which version of the harness {venv} has (no dist-info of it there); the version"
                       " is part of every score's identity",
                       f"install the harness in {venv}, or drop cluster.backend_venvs.{suite.harness}")
    if not own and not cell.spec.dry_run and not is_ready(venv):
        yield _problem(cell, "harness", suite.harness, "eval-venv",
                       f"the {suite.harness} environment is not built ({venv})",
                       f"build it once: python -m sft_grid.venv build {suite.harness}")
    include = suite.include_path
    if include and cell.spec.cluster.executor == "local" and not Path(include).expanduser().is_dir():
        yield _problem(cell, "include_path", include, "eval-include-path", "is not a directory here",
                       "point eval.include_path at a directory of lm-eval task YAMLs, or set it to null")


def _resources(cell: Cell, suite: Any) -> Iterator[Problem]:
    res, cluster = suite.resources, cell.spec.cluster
    try:
        too_long = parse_minutes(res.time) > parse_minutes(cluster.max_time)
    except ValueError as exc:
        yield _problem(cell, "resources.time", res.time, "time-format", str(exc),
                       "write it as HH:MM:SS, e.g. eval.resources.time=01:00:00")
        return
    if too_long:
        yield _problem(cell, "resources.time", res.time, "time-max",
                       f"over cluster {cluster.name!r}'s maximum wall time {cluster.max_time}",
                       f"ask for at most eval.resources.time={cluster.max_time}")
    if res.gpus > cluster.gpus_per_node:
        yield _problem(cell, "resources.gpus", res.gpus, "eval-gpus",
                       f"cluster {cluster.name!r} has {cluster.gpus_per_node} GPU(s) per node",
                       f"eval.resources.gpus={cluster.gpus_per_node} (0: the CPU), or a suite for this cluster"
                       " (eval=tiny runs on the CPU)")


def eval_suite(cell: Cell) -> Iterator[Problem]:
    """The cell's own suite (validation runs before a grid's `eval` axis is merged: each suite is checked)."""
    suite = cell.spec.eval
    if not suite.tasks:
        return
    yield from _batch_size(cell, suite.batch_size)
    yield from _tasks(cell, suite)
    yield from _harness(cell, suite)
    yield from _resources(cell, suite)
