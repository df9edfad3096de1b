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

- A suite's `along` (null, "checkpoint", or every N steps, N a multiple of the cell's save_steps) also scores the
  cell's saved checkpoints: each final score carries the rule, and `along_scores` gives the scores of the
  checkpoints that exist (core/scores.py keys each by its step).

Below: the rules of a cell's evaluation suite (pure, like validate.py's), and the tiny local tasks sft_grid ships for
its tests and demo (`write_tiny_tasks`: the tiny models' arithmetic, written by code, with a digest per task).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sft_grid.core.layout import OUTPUT_DIR
from sft_grid.core.problems import Problem
from sft_grid.core.schema import EvalConf, EvalTaskConf
from sft_grid.core.scores import (
    ALONG_EVERY,
    BASE_DIR,
    EvalFile,
    ScoreSpec,
    along,
    checkpoint_steps,
    has_score,
    score_id,
)
from sft_grid.core.templates import effective_template
from sft_grid.core.timefmt import parse_minutes
from sft_grid.planning.cells import HASH_LEN, Cell, slugify
from sft_grid.planning.environments import VenvSpec, is_ready, site_venvs
from sft_grid.planning.hydra_errors import did_you_mean

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
    return (
        a.key == b.key and a.spec.sweep_name == b.spec.sweep_name and _without_eval(a.config) == _without_eval(b.config)
    )


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
    """ "lm-eval==0.4.13": the managed environment's pin, or what a site's environment has installed ("" when it
    cannot be read here)."""
    package = HARNESS_PACKAGES[suite.harness]
    venv, own = harness_venv(cell, suite)
    if not own:
        return _managed(suite.harness)[1]
    dist = package.replace("-", "_")
    # every cell's every suite asks it (three times: its rules, scores and eval.json): the environment is listed
    # once per state of its site-packages (an install or a removal changes their modification time)
    key = (str(venv), dist, _site_packages_state(venv))
    if key not in _VERSIONS:
        found = sorted(venv.glob(f"lib/python3*/site-packages/{dist}-*.dist-info"))
        _VERSIONS[key] = f"{package}=={found[-1].name[len(dist) + 1 : -len('.dist-info')]}" if found else ""
    return _VERSIONS[key]


_VERSIONS: dict[tuple[Any, ...], str] = {}


def _site_packages_state(venv: Path) -> tuple[tuple[str, int], ...]:
    try:
        libs = sorted(name for name in os.listdir(venv / "lib") if name.startswith("python3"))
    except OSError:
        return ()
    state = []
    for name in libs:
        try:
            state.append((name, os.stat(venv / "lib" / name / "site-packages").st_mtime_ns))
        except OSError:
            continue
    return tuple(state)


# -- scores -------------------------------------------------------------------------------------------------------


def task_settings(suite: EvalConf, label: str, task: EvalTaskConf, chat_template: bool = True) -> dict[str, Any]:
    """A task's part of its scores' identity (written back verbatim as a score file's `settings`)."""
    name = task.task or label
    limit = task.limit
    if limit is not None and float(limit).is_integer():
        limit = int(limit)
    chat = bool(task.apply_chat_template and chat_template)
    return {
        "task": name,
        "num_fewshot": task.num_fewshot,
        "limit": limit,
        "gen_kwargs": dict(task.gen_kwargs),
        "apply_chat_template": chat,
        "fewshot_as_multiturn": bool(task.fewshot_as_multiturn and chat),
        "dtype": suite.dtype,
        "seed": suite.seed,
        "version": content_digest(name) if name in TINY_TASKS else None,
    }


def device_of(suite: EvalConf) -> str:
    return "cuda" if suite.resources.gpus else "cpu"


def scores_for(
    key: str, cell: Cell, suites: Sequence[Any], chat_template: bool = True, along: bool = False
) -> tuple[ScoreSpec, ...]:
    """The scores of a target (identity `key`) for these suites, once each; `along`: with each suite's rule for the
    checkpoints it also scores (a cell's; a base model has no checkpoints)."""
    out: dict[str, ScoreSpec] = {}
    for suite in suites:
        harness = harness_version(cell, suite)
        for label, task in suite.tasks.items():
            settings = task_settings(suite, label, task, chat_template)
            sid = score_id(key, settings, harness)
            rule = suite.along if along else None
            spec = ScoreSpec(
                score_id=sid,
                suite=suite.name,
                task=settings["task"],
                settings=settings,
                engine=suite.engine,
                batch_size=suite.batch_size,
                device=device_of(suite),
                along=rule,
            )
            # one task in two suites, one of them along training: the score scores the checkpoints too
            if sid not in out or (rule is not None and out[sid].along is None):
                out[sid] = spec
    return tuple(out.values())


def cell_scores(cell: Cell) -> tuple[ScoreSpec, ...]:
    """The final model's scores (each with its suite's `along` rule)."""
    return scores_for(cell.key, cell, suites_of(cell), along=True)


def along_of(cell: Cell) -> bool:
    """Whether a suite of the cell scores its checkpoints too."""
    return any(s.along is not None for s in suites_of(cell))


def along_scores(cell: Cell, steps: Sequence[int]) -> tuple[ScoreSpec, ...]:
    """The scores of the cell's checkpoints at these steps (those saved so far) that its suites' `along` asks for."""
    if not along_of(cell):
        return ()
    return tuple(along(cell_scores(cell), steps))


# -- base models ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
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
    templates: dict[Path, bool] = {}  # each base's tokenizer read once, not once per cell that trains from it
    for cell in cells:
        suites = tuple(s for s in suites_of(cell) if s.base_models)
        if not suites or not base_source(cell):
            continue
        key = base_key(cell)
        where = cell.sweep_dir / BASE_DIR / f"{slugify(cell.spec.model.name)}-{key}"
        known = found.get(where)
        merged = known.suites + tuple(s for s in suites if s not in known.suites) if known else suites
        first = known.cell if known else cell
        if where not in templates:
            templates[where] = base_has_template(first)
        scores = scores_for(key, first, merged, templates[where])
        found[where] = BaseTarget(
            name=cell.spec.model.name,
            source=base_source(first),
            key=key,
            dir=where,
            cell=first,
            suites=merged,
            scores=scores,
        )
    return list(found.values())


# -- eval.json ------------------------------------------------------------------------------------------------------


def _eval_file(
    cell: Cell, target: str, base: bool, model_path: str, suites: Sequence[Any], scores: Sequence[ScoreSpec]
) -> EvalFile:
    first = suites[0]
    includes = tuple(dict.fromkeys(str(Path(s.include_path).expanduser()) for s in suites if s.include_path))
    return EvalFile(
        target=target,
        base=base,
        model_path=model_path,
        harness=harness_version(cell, first),
        python=str(harness_venv(cell, first)[0] / "bin" / "python"),
        include_paths=includes,
        variables=dict(cell.spec.cluster.env),
        in_train_job=cell.spec.cluster.executor == "local",
        scores=tuple(scores),
        datasets=dataset_snapshots(cell, suites),
    )


def dataset_snapshots(cell: Cell, suites: Sequence[Any]) -> dict[str, str]:
    """{hub dataset id: its staged snapshot folder} for each task dataset of these suites that staging pinned for the
    cell (`<cache>/datasets--org--name/snapshots/<sha>`): the evaluation job loads it there, offline, since offline
    `datasets` finds no Hub repository by its id. A dataset not pinned (the compute nodes fetch it) is left out."""
    wanted = {d for s in suites for t in s.tasks.values() for d in t.datasets}
    return {p.repo_id: str(p.path) for p in cell.pins if p.kind == "dataset" and p.repo_id in wanted}


def eval_complete(cell: Cell, cell_dir: Path) -> bool:
    """Whether every score the cell's suites ask of it now is there (its final model's, and those of the checkpoints
    saved so far that a suite's `along` scores): until then its evaluation still reads its tasks' datasets."""
    steps = checkpoint_steps(cell_dir / OUTPUT_DIR) if along_of(cell) else ()
    wanted = [*cell_scores(cell), *along_scores(cell, steps)]
    return all(has_score(cell_dir, s.score_id) for s in wanted)


def base_complete(target: BaseTarget) -> bool:
    """Whether a base model's evaluation has every score its cells' suites ask of it."""
    return all(has_score(target.dir, s.score_id) for s in target.scores)


def cell_eval_file(cell: Cell, cell_dir: Path) -> EvalFile | None:
    """A cell's eval.json (None when it evaluates nothing): its trained output, scored on its suites' tasks."""
    suites = suites_of(cell)
    if not suites:
        return None
    return _eval_file(cell, cell.name, False, str(cell_dir / OUTPUT_DIR), suites, cell_scores(cell))


def base_eval_file(target: BaseTarget) -> EvalFile:
    return _eval_file(target.cell, target.name, True, target.source, target.suites, target.scores)


def _problem(cell: Cell, key: str, value: object, rule: str, message: str, fix: str) -> Problem:
    return Problem(
        cell=cell.name,
        key=f"eval.{key}",
        value=value,
        rule=rule,
        message=f"(suite {cell.spec.eval.name}) {message}",
        fix=fix,
    )


def _batch_size(cell: Cell, value: Any) -> Iterator[Problem]:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return
    yield _problem(
        cell,
        "batch_size",
        value,
        "eval-batch-size",
        'must be a count >= 1 or "auto"',
        "set eval.batch_size=8 (say), or eval.batch_size=auto",
    )


def _tasks(cell: Cell, suite: Any) -> Iterator[Problem]:
    for label, task in suite.tasks.items():
        name = task.task or label
        if task.limit is not None and task.limit >= 1 and not float(task.limit).is_integer():
            yield _problem(
                cell,
                f"tasks.{label}.limit",
                task.limit,
                "eval-limit",
                "a limit is a count of documents (a whole number >= 1) or a fraction of them (< 1)",
                f"set eval.tasks.{label}.limit={int(task.limit)}, or a fraction such as 0.5",
            )
        if task.fewshot_as_multiturn and not task.apply_chat_template:
            yield _problem(
                cell,
                f"tasks.{label}.fewshot_as_multiturn",
                True,
                "eval-multiturn",
                "few-shot examples as chat turns need the chat template",
                f"set eval.tasks.{label}.apply_chat_template=true, or fewshot_as_multiturn=false",
            )
        if name.startswith("tiny_") and name not in TINY_TASKS:
            yield _problem(
                cell,
                f"tasks.{label}.task" if task.task else "tasks",
                name,
                "eval-task",
                "not one of the project's tiny tasks",
                f"use one of {', '.join(TINY_TASKS)}",
            )


# lm-eval's own generation settings (lm_eval/models/utils.py normalize_gen_kwargs) and what each must be: a key, its
# test, the words for it, and a value that works
_WHOLE = "a whole number >= 1"
GEN_KINDS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "max_gen_toks": (lambda v: _is_int(v) and v >= 1, _WHOLE, "16"),
    "max_new_tokens": (lambda v: _is_int(v) and v >= 1, _WHOLE, "16"),
    "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0 (0: greedy)", "0"),
    "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]", "0.9"),
    "top_k": (lambda v: _is_int(v) and v >= 0, "a whole number >= 0", "50"),
    "do_sample": (lambda v: isinstance(v, bool), "true or false", "false"),
    "until": (
        lambda v: isinstance(v, str) or (isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)),
        "a string or a list of strings (where generation stops)",
        "[END]",
    ),
}
# the other keys lm-eval reads itself (its aliases of max_gen_toks), and the attributes of transformers'
# GenerationConfig (transformers 5.6.0: sorted(vars(GenerationConfig())), listed here so that planning imports no
# transformers): with the hf engine lm-eval passes every other key to model.generate, which raises "The following
# `model_kwargs` are not used by the model" for one that is neither, after training
LM_EVAL_GEN_KEYS = ("max_tokens", "max_completion_tokens")
GENERATION_CONFIG_KEYS = (
    "assistant_confidence_threshold", "assistant_early_exit", "assistant_lookbehind", "bad_words_ids",
    "begin_suppress_tokens", "bos_token_id", "cache_config", "cache_implementation", "compile_config", "constraints",
    "continuous_batching_config", "decoder_start_token_id", "disable_compile", "diversity_penalty", "do_sample",
    "dola_layers", "early_stopping", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "eos_token_id",
    "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty", "force_words_ids", "forced_bos_token_id",
    "forced_eos_token_id", "guidance_scale", "is_assistant", "length_penalty", "low_memory", "max_length",
    "max_matching_ngram_size", "max_new_tokens", "max_time", "min_length", "min_new_tokens", "min_p",
    "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_logits", "output_scores",
    "pad_token_id", "penalty_alpha", "prefill_chunk_size", "prompt_lookup_num_tokens", "remove_invalid_values",
    "renormalize_logits", "repetition_penalty", "return_dict_in_generate", "sequence_bias", "stop_strings",
    "suppress_tokens", "target_lookbehind", "temperature", "token_healing", "top_h", "top_k", "top_p",
    "typical_p", "use_cache", "watermarking_config",
)  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _gen_kwargs(cell: Cell, suite: Any) -> Iterator[Problem]:
    """Each task's generation settings, which lm-eval reads only when the evaluation runs, after training: the keys it
    knows hold values of their kind, and (with the hf engine) every other key is one transformers' generate takes.
    With vllm the other keys go to vLLM's SamplingParams, whose names are not known here: only the kinds are checked."""
    for label, task in suite.tasks.items():
        gen = task.gen_kwargs
        if not isinstance(gen, Mapping):
            continue  # composition refuses a gen_kwargs that is no mapping
        for key, value in gen.items():
            where = f"tasks.{label}.gen_kwargs.{key}"
            if key in GEN_KINDS:
                test, words, example = GEN_KINDS[key]
                if not test(value):
                    yield _problem(
                        cell,
                        where,
                        value,
                        "eval-gen-kwargs",
                        f"must be {words}: lm-eval reads it only when it evaluates, after training",
                        f"eval.{where}={example} (in the suite file: {key}: {example})",
                    )
                continue
            known = (*GEN_KINDS, *LM_EVAL_GEN_KEYS, *GENERATION_CONFIG_KEYS)
            if suite.engine == "hf" and key not in known:
                hint = did_you_mean(key, known)
                close = hint.split("'")[1] if hint else None
                yield _problem(
                    cell,
                    where,
                    value,
                    "eval-gen-kwargs",
                    f"is not a generation setting lm-eval or transformers' generate knows{hint}: generate would"
                    ' refuse it after training ("model_kwargs are not used by the model")',
                    (
                        f"write {close}: instead of {key}: in the suite's tasks.{label}.gen_kwargs, or on the command"
                        f" line '+eval.tasks.{label}.gen_kwargs.{close}={value}'"
                        if close
                        else f"drop it from the suite's tasks.{label}.gen_kwargs"
                    )
                    + " (lm-eval's keys: max_gen_toks, temperature, top_p, top_k, do_sample, until; any other is"
                    " an attribute of transformers' GenerationConfig)",
                )


def _harness(cell: Cell, suite: Any) -> Iterator[Problem]:
    if suite.harness not in HARNESS_PACKAGES:
        return  # no such harness: the schema's values rule names it, with the harnesses there are (eval.harness)
    venv, own = harness_venv(cell, suite)
    cluster = cell.spec.cluster.name
    if suite.engine == "vllm" and not own:
        yield _problem(
            cell,
            "engine",
            "vllm",
            "eval-engine",
            f"the managed {suite.harness} environment has no vllm, and cluster {cluster!r} names no"
            f" {suite.harness} environment of its own",
            f"name the site's environment with vllm: cluster.backend_venvs.{suite.harness}=<venv dir>"
            f" (in conf/cluster/{cluster}.yaml), or eval.engine=hf",
        )
    if own and not harness_version(cell, suite):
        yield _problem(
            cell,
            "harness",
            suite.harness,
            "eval-harness-version",
            f"cannot read which version of the harness {venv} has (no dist-info of it there); the version"
            " is part of every score's identity",
            f"install the harness in {venv}, or drop cluster.backend_venvs.{suite.harness}",
        )
    if not own and not cell.spec.dry_run and not is_ready(venv):
        yield _problem(
            cell,
            "harness",
            suite.harness,
            "eval-venv",
            f"the {suite.harness} environment is not built ({venv})",
            f"build it once: sft-grid venv build {suite.harness}",
        )
    include = suite.include_path
    if include and cell.spec.cluster.executor == "local" and not Path(include).expanduser().is_dir():
        yield _problem(
            cell,
            "include_path",
            include,
            "eval-include-path",
            "is not a directory here",
            "point eval.include_path at a directory of lm-eval task YAMLs, or set it to null",
        )


def _resources(cell: Cell, suite: Any) -> Iterator[Problem]:
    res, cluster = suite.resources, cell.spec.cluster
    try:
        too_long = parse_minutes(res.time) > parse_minutes(cluster.max_time)
    except ValueError as exc:
        yield _problem(
            cell,
            "resources.time",
            res.time,
            "time-format",
            str(exc),
            "write it as HH:MM:SS, e.g. eval.resources.time=01:00:00",
        )
        return
    if too_long:
        yield _problem(
            cell,
            "resources.time",
            res.time,
            "time-max",
            f"over cluster {cluster.name!r}'s maximum wall time {cluster.max_time}",
            f"ask for at most eval.resources.time={cluster.max_time}",
        )
    if res.gpus > cluster.gpus_per_node:
        yield _problem(
            cell,
            "resources.gpus",
            res.gpus,
            "eval-gpus",
            f"cluster {cluster.name!r} has {cluster.gpus_per_node} GPU(s) per node",
            f"eval.resources.gpus={cluster.gpus_per_node} (0: the CPU), or a suite for this cluster"
            " (eval=tiny runs on the CPU)",
        )


def _along(cell: Cell, value: Any) -> Iterator[Problem]:
    """`along`: null, "checkpoint", or every N steps, N a multiple of the cell's save_steps (else no checkpoint is
    ever at a step it scores)."""
    if value is None or value == ALONG_EVERY:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        yield _problem(
            cell,
            "along",
            value,
            "eval-along",
            f'scores along training: null (the final model only), "{ALONG_EVERY}" (every saved checkpoint) or a'
            " count of steps N >= 1 (the checkpoints at multiples of N)",
            f"set eval.along={ALONG_EVERY}, or eval.along=<N steps> (a multiple of save_steps={cell.spec.save_steps})",
        )
        return
    save = cell.spec.save_steps
    if value % save:
        yield _problem(
            cell,
            "along",
            value,
            "eval-along-steps",
            f"the cell saves a checkpoint every save_steps={save} steps, so every {value} steps would score only"
            f" those at multiples of {value * save // math.gcd(value, save)}",
            f"set eval.along to a multiple of {save} (eval.along={save * max(1, round(value / save))}), or"
            f" eval.along={ALONG_EVERY}",
        )


def _checkpoints_along(cell: Cell, value: Any) -> Iterator[Problem]:
    """Scores along training need checkpoints: none is saved before the end when saving is off or save_steps is
    not below the cell's last step."""
    if value is None:
        return
    s = cell.spec
    strategy = s.extra.get("save_strategy") if isinstance(s.extra, Mapping) else None
    if strategy == "no" or (s.max_steps > 0 and s.save_steps >= s.max_steps):
        why = "extra.save_strategy=no" if strategy == "no" else f"save_steps={s.save_steps} >= max_steps={s.max_steps}"
        yield _problem(
            cell,
            "along",
            value,
            "eval-along-checkpoints",
            f"no checkpoint is saved before the end ({why}), so nothing would be scored along training",
            f"save_steps below max_steps (e.g. save_steps={max(1, s.max_steps // 4)}), or drop eval.along",
        )


def eval_suite(cell: Cell) -> Iterator[Problem]:
    """The cell's own suite (validation runs before a grid's `eval` axis is merged: each suite is checked)."""
    suite = cell.spec.eval
    if not suite.tasks:
        if suite.along is not None:
            yield _problem(
                cell,
                "along",
                suite.along,
                "eval-along",
                "scores along training of a suite with no task: eval names no suite, so nothing would be scored",
                "name a suite (eval=tiny, or one of conf/eval/), or drop eval.along",
            )
        return
    yield from _along(cell, suite.along)
    yield from _checkpoints_along(cell, suite.along)
    yield from _batch_size(cell, suite.batch_size)
    yield from _tasks(cell, suite)
    yield from _gen_kwargs(cell, suite)
    yield from _harness(cell, suite)
    yield from _resources(cell, suite)


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
        return {
            **common,
            "output_type": "multiple_choice",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "label",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        }
    number = r"(-?[0-9]+)"
    return {
        **common,
        "output_type": "generate_until",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": GEN_MAX_TOKENS, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "filter_list": [
            {
                "name": "strict-match",
                "filter": [
                    {"function": "regex", "regex_pattern": r"The answer is " + number + r"\."},
                    {"function": "take_first"},
                ],
            },
            {
                "name": "flexible-extract",
                "filter": [
                    {"function": "regex", "regex_pattern": number, "group_select": 0},
                    {"function": "take_first"},
                ],
            },
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
    # every score of every cell asks it, and making the rows is ~0.4 ms: once per what decides them
    return _content_digest(name, _SEEDS[name], TEST_ROWS, TRAIN_ROWS, GEN_MAX_TOKENS)


@functools.cache
def _content_digest(name: str, *decides: int) -> str:
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
