"""What a grid evaluates (pure): each cell's suites, each task's settings and score id, and the base models.

- `eval` is not part of a cell's identity, so `eval=a,b` as an axis composes cells that train the same model;
  `merge_eval_axis` makes them one cell with both suites (validation runs first, on each composed cell, so a bad
  setting of either suite is reported with its own values).
- A score's identity is (the target's identity key, the task's settings, the harness==version), core/scores.py.
  The settings are the task's own (harness task name, few-shot, limit, generation settings, chat template, few-shot
  as turns), the suite's dtype and seed, and for the project's tiny tasks a digest of their content.
- A base model (the `model.path` or `model.hub_id` the cells start from) is evaluated once per grid, under
  `<sweep dir>/_base/<model slug>-<key>/`, for every cell whose suite asks for `base_models`. A base model whose
  saved tokenizer (readable here) has no chat template is scored without one, and its settings say so.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from sft_grid.core.saved_template import effective_template
from sft_grid.core.layout import OUTPUT_DIR
from sft_grid.core.scores import BASE_DIR, EvalFile, ScoreSpec, score_id
from sft_grid.planning.cells import HASH_LEN, Cell, slugify
from sft_grid.planning.eval_tasks import TINY_TASKS, content_digest
from sft_grid.planning.venvs import VenvSpec, site_venvs

# harness (conf/harness/<name>.yaml) -> its package on PyPI, which names its version in a score's identity
HARNESS_PACKAGES = {"lm_eval": "lm-eval"}


def suites_of(cell: Cell) -> tuple[Any, ...]:
    """The evaluation suites of a cell (none when it evaluates nothing)."""
    if cell.suites:
        return cell.suites
    return (cell.spec.eval,) if cell.spec.eval.tasks else ()


def _without_eval(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "eval"}


def same_training(a: Cell, b: Cell) -> bool:
    """Two cells of one grid that differ only in their evaluation suite: one trained model."""
    return (a.key == b.key and a.spec.sweep_name == b.spec.sweep_name
            and _without_eval(a.config) == _without_eval(b.config))


def merge_eval_axis(cells: Sequence[Cell]) -> list[Cell]:
    """The grid's cells with those that differ only in `eval` merged into the first of them, with every suite."""
    out: list[Cell] = []
    first: dict[tuple[str, str], int] = {}
    for cell in cells:
        i = first.get((cell.spec.sweep_name, cell.key))
        if i is not None and same_training(out[i], cell):
            merged = list(suites_of(out[i]))
            merged += [s for s in suites_of(cell) if s not in merged]
            out[i] = replace(out[i], suites=tuple(merged))
            continue
        first.setdefault((cell.spec.sweep_name, cell.key), len(out))
        out.append(cell)
    return out


# -- the harness ------------------------------------------------------------------------------------------------


@functools.cache
def _managed(harness: str) -> tuple[Path, str]:
    """(the managed environment of a harness, its pinned "package==version"): read once a process."""
    spec, package = VenvSpec.load(harness), HARNESS_PACKAGES[harness]
    return spec.path, next((p for p in spec.packages if p.split("==")[0] == package), package)


def harness_venv(cell: Cell, suite: Any) -> tuple[Path, bool]:
    """(the harness environment a cell's evaluation runs in, whether it is the site's own): the cluster's
    backend_venvs.<harness> when it names one (where vllm is, on GPU sites), else the managed one."""
    own = site_venvs(cell.spec.cluster).get(suite.harness)
    if own:
        return Path(own).expanduser(), True
    return _managed(suite.harness)[0], False


def harness_version(cell: Cell, suite: Any) -> str:
    """"lm-eval==0.4.13": the managed environment's pin, or what a site's environment has installed ("" when it
    cannot be read here)."""
    package = HARNESS_PACKAGES[suite.harness]
    venv, own = harness_venv(cell, suite)
    if not own:
        return _managed(suite.harness)[1]
    dist = package.replace("-", "_")
    found = sorted(venv.glob(f"lib/python3*/site-packages/{dist}-*.dist-info"))
    return f"{package}=={found[-1].name[len(dist) + 1:-len('.dist-info')]}" if found else ""


# -- scores -------------------------------------------------------------------------------------------------------


def task_settings(suite: Any, label: str, task: Any, chat_template: bool = True) -> dict[str, Any]:
    """A task's part of its scores' identity (written back verbatim as a score file's `settings`)."""
    name = task.task or label
    limit = task.limit
    if limit is not None and float(limit).is_integer():
        limit = int(limit)
    chat = bool(task.apply_chat_template and chat_template)
    return {"task": name, "num_fewshot": task.num_fewshot, "limit": limit, "gen_kwargs": dict(task.gen_kwargs),
            "apply_chat_template": chat, "fewshot_as_multiturn": bool(task.fewshot_as_multiturn and chat),
            "dtype": suite.dtype, "seed": suite.seed,
            "version": content_digest(name) if name in TINY_TASKS else None}


def device_of(suite: Any) -> str:
    return "cuda" if suite.resources.gpus else "cpu"


def scores_for(key: str, cell: Cell, suites: Sequence[Any], chat_template: bool = True) -> tuple[ScoreSpec, ...]:
    """The scores of a target (identity `key`) for these suites, once each."""
    out: dict[str, ScoreSpec] = {}
    for suite in suites:
        harness = harness_version(cell, suite)
        for label, task in suite.tasks.items():
            settings = task_settings(suite, label, task, chat_template)
            sid = score_id(key, settings, harness)
            out.setdefault(sid, ScoreSpec(sid, suite.name, settings["task"], settings, suite.engine,
                                          suite.batch_size, device_of(suite)))
    return tuple(out.values())


def cell_scores(cell: Cell) -> tuple[ScoreSpec, ...]:
    return scores_for(cell.key, cell, suites_of(cell))


# -- base models ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseTarget:
    """A base model evaluated once per grid: the scores its cells' suites ask of it."""

    name: str
    source: str  # a local directory or a hub id
    key: str
    dir: Path
    cell: Cell  # the first cell that trains from it (its cluster and harness)
    suites: tuple[Any, ...]
    scores: tuple[ScoreSpec, ...]


def base_source(cell: Cell) -> str:
    return cell.spec.model.path or cell.spec.model.hub_id or ""


def base_key(cell: Cell) -> str:
    model = cell.spec.model
    ident = model.hub_id or Path(str(model.path)).name
    return hashlib.sha256(json.dumps({"model": ident}).encode()).hexdigest()[:HASH_LEN]


def _hub_snapshot(hub_id: str, env: Mapping[str, str]) -> Path | None:
    """The newest local copy of a hub model in the Hugging Face cache the jobs use, if any."""
    home = env.get("HF_HOME") or os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    for root in (env.get("HF_HUB_CACHE") or os.environ.get("HF_HUB_CACHE"), str(Path(home) / "hub")):
        snapshots = Path(root).expanduser() / f"models--{hub_id.replace('/', '--')}" / "snapshots" if root else None
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots and snapshots.is_dir() else []
        if found:
            return found[-1]
    return None


def base_has_template(cell: Cell) -> bool:
    """Whether the base model's saved tokenizer has a chat template; True when it cannot be read here (the job's
    evaluation then says so if it has none)."""
    model = cell.spec.model
    local = Path(model.path).expanduser() if model.path else _hub_snapshot(model.hub_id or "", cell.spec.cluster.env)
    if local is None or not (local / "tokenizer_config.json").is_file():
        return True
    return effective_template(local) is not None


def base_targets(cells: Sequence[Cell]) -> list[BaseTarget]:
    """Each base model the grid's suites ask to evaluate, with every score any of its cells' suites asks of it."""
    found: dict[Path, BaseTarget] = {}
    for cell in cells:
        suites = tuple(s for s in suites_of(cell) if s.base_models)
        if not suites or not base_source(cell):
            continue
        key = base_key(cell)
        where = cell.sweep_dir / BASE_DIR / f"{slugify(cell.spec.model.name)}-{key}"
        known = found.get(where)
        merged = known.suites + tuple(s for s in suites if s not in known.suites) if known else suites
        first = known.cell if known else cell
        scores = scores_for(key, first, merged, base_has_template(first))
        found[where] = BaseTarget(cell.spec.model.name, base_source(first), key, where, first, merged, scores)
    return list(found.values())


# -- eval.json ------------------------------------------------------------------------------------------------------


def _eval_file(cell: Cell, target: str, base: bool, model_path: str, suites: Sequence[Any],
               scores: Sequence[ScoreSpec]) -> EvalFile:
    first = suites[0]
    includes = tuple(dict.fromkeys(str(Path(s.include_path).expanduser()) for s in suites if s.include_path))
    return EvalFile(target=target, base=base, model_path=model_path, harness=harness_version(cell, first),
                    python=str(harness_venv(cell, first)[0] / "bin" / "python"), include_paths=includes,
                    variables=dict(cell.spec.cluster.env), in_train_job=cell.spec.cluster.executor == "local",
                    scores=tuple(scores))


def cell_eval_file(cell: Cell, cell_dir: Path) -> EvalFile | None:
    """A cell's eval.json (None when it evaluates nothing): its trained output, scored on its suites' tasks."""
    suites = suites_of(cell)
    if not suites:
        return None
    return _eval_file(cell, cell.name, False, str(cell_dir / OUTPUT_DIR), suites, cell_scores(cell))


def base_eval_file(target: BaseTarget) -> EvalFile:
    return _eval_file(target.cell, target.name, True, target.source, target.suites, target.scores)


@dataclass(frozen=True)
class EvalInputs:
    """What a grid's evaluation jobs read from the Hugging Face cache, offline: to stage with the grid's inputs."""

    datasets: tuple[str, ...]  # each task's `datasets` (hub dataset ids)
    models: tuple[str, ...]  # the base models that are hub ids


def eval_inputs(cells: Sequence[Cell]) -> EvalInputs:
    datasets = [d for c in cells for s in suites_of(c) for t in s.tasks.values() for d in t.datasets]
    models = [t.source for t in base_targets(cells) if not t.cell.spec.model.path]
    return EvalInputs(tuple(dict.fromkeys(datasets)), tuple(dict.fromkeys(models)))
