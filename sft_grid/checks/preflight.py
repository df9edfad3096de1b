"""Checks that need a tokenizer or data: run once per unique input, before anything is queued.

A check runs where its input can be read. On the submitting machine that is a local path or a copy in
the Hugging Face cache; a hub id that is not cached cannot be read here (no hub from this machine, and
login nodes may differ from compute nodes). Such a check is not skipped: it is *deferred*, written into
the cell's preflight.json, reported by name in the dry run and the launch summary, and run by the job
as its first step, before training (sft_grid/job/runner.py), where it fails the job with the same message.

The verdict of each kind of check on its input, where the input can be read (pure reads, no hub), is below the
grid's preflight: a path's existence and kind, the template's special tokens, assistant turns in a sample, a
prepared model or a tokenized dataset built by a job before the cell, the staging's outcome.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sft_grid.checks import mask, own_envs, venv_facts
from sft_grid.checks.tokenizers import check_tokenizer
from sft_grid.checks.venv_facts import INTEGRATIONS
from sft_grid.core import events
from sft_grid.core.cellfiles import Check, Verdict
from sft_grid.core.events import Kind
from sft_grid.core.hubcache import is_complete, parse_snapshot, staging_failure
from sft_grid.core.problems import Problem
from sft_grid.core.schema import CellConf, fingerprint
from sft_grid.core.secrets import shown_source
from sft_grid.core.templates import DELPHI_TOKENS, TEMPLATES
from sft_grid.core.tokenized import tokenized_complete
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.environments import bin_dir
from sft_grid.planning.evaluation import HARNESS_PACKAGES, harness_venv, suites_of
from sft_grid.planning.inputs import (
    PREP_NEED,
    dataset_source,
    hub_repos,
    pin_of,
    prep_complete,
    prep_for,
    tokenizer_source,
)
from sft_grid.planning.readable import SAMPLE_ROWS, NoSplit, NotData, hub_cache, locate, scan_rows


def checks_for(cell: Cell, memo: dict[tuple[Any, ...], list[Check]] | None = None) -> list[Check]:
    """The cell's checks. `memo`: one grid's, over one preflight (its environment and files as they are then):
    cells that share their model, data, backend and cluster sections (by value) have the same checks, listed once."""
    if memo is None:
        return _checks_for(cell)
    s = cell.spec
    sections = (s.model, s.backend, s.cluster, s.extra, *s.dataset.values(), *suites_of(cell))
    model_prep = prep_for(cell)
    key = (
        tuple(map(fingerprint, sections)),
        tuple(s.dataset),
        s.model.template,
        str(cell.runs_root),
        model_prep is not None and model_prep.complete,
        cell.pins,
    )
    found = memo.get(key)
    if found is None:
        found = memo[key] = _checks_for(cell)
    return found


def _checks_for(cell: Cell) -> list[Check]:
    s = cell.spec
    checks: list[Check] = []
    for key, repo in hub_repos(cell):
        pin = pin_of(cell, repo.kind, repo.repo_id)
        if pin is not None:  # first: while it is not staged, the checks that read it wait (see preflight)
            checks.append(Check("staged", key, str(pin.path)))
    tokenizer = tokenizer_source(cell)
    python = str(bin_dir(s) / "python")
    if s.model.path:
        checks.append(Check("path", "model.path", s.model.path))
    if tokenizer and is_local(tokenizer):
        # a local directory or a pinned snapshot (a hub id nobody staged is the backend's own download)
        checks.append(Check("model", "model.path" if s.model.path else "model.hub_id", tokenizer, python=python))
    if s.report_to in INTEGRATIONS:
        checks.append(Check("integration", "report_to", s.report_to, python=python))
    # the fast kernels the cell's layout trains with (the cluster says its environment has them): asked of it
    lay = cell.layout
    if lay.attention in ("fa2", "fa3"):
        checks.append(Check("kernel", "layout.attention", "flash_attn", python=python))
    if lay.liger:
        checks.append(Check("kernel", "layout.liger", "liger_kernel", python=python))
    # each `extra` key is one the backend's own parser takes (axolotl's plugins named in extra bring keys of their
    # own, which only importing them would tell: such a cell's keys are left to axolotl)
    if s.backend.name in CONFIG_PARSERS and not (s.backend.name == "axolotl" and "plugins" in s.extra):
        checks += [
            Check(
                "backend_key", f"extra.{k}", k, backend=s.backend.name, python=python, spec=json.dumps(v, default=str)
            )
            for k, v in s.extra.items()
        ]
    checks += _eval_checks(cell)
    template = TEMPLATES.get(s.model.template)
    model_prep = prep_for(cell)
    # a Delphi checkpoint before its prep: its tokenizer as the prep makes it (prepared here, tokenizer files only)
    prepared = check_tokenizer(cell)
    if template is not None and tokenizer:
        tokens = template.special_tokens
        if model_prep is not None and model_prep.complete:
            tokenizer = str(model_prep.model_dir)  # what the cell trains: every token must be single there
        elif prepared is not None:
            tokenizer = str(prepared)
        elif model_prep is not None:
            # not prepared yet: the source has the rest; the prep itself asserts its tokens before any cell runs
            tokens = tuple(t for t in tokens if t not in DELPHI_TOKENS)
        checks.append(Check("template_tokens", "model.template", tokenizer, tokens=tokens))
    if model_prep is not None and not model_prep.complete:
        # the prep runs before the cell (locally first, on Slurm as a job the cell's job waits to end): the job
        # finds out first whether its own model's prep succeeded
        checks.append(Check("prepared", "model", str(model_prep.dir)))
    for name, ds in s.dataset.items():
        if is_local(ds.source):
            checks.append(Check("path", f"dataset.{name}.source", ds.source))
        tags = (
            ("role_tag", ds.tags.role_tag),
            ("assistant_tag", ds.tags.assistant_tag),
            ("content_tag", ds.tags.content_tag),
        )
        checks.append(
            Check(
                "assistant_turns",
                f"dataset.{name}",
                dataset_source(cell, name),
                column=ds.messages,
                tags=tags,
                split=ds.split,
                python=python,
            )
        )
    masks = mask.checks_for(cell)
    if prepared is not None and model_prep is not None:
        masks = [replace(c, model=str(prepared)) if c.model == str(model_prep.model_dir) else c for c in masks]
    return checks + masks


def _eval_checks(cell: Cell) -> list[Check]:
    """Each lm-eval task a suite of the cell asks for is a name the harness's own task index knows (its YAMLs and
    the suite's include_path), asked of the environment the evaluation runs in: a name it does not know would
    fail the evaluation only after the training it scores. Each reads only Hub datasets its `datasets` list
    stages (the job runs offline), and the include_path's YAMLs are all read by lm-eval's index, none taking a
    name lm-eval ships. The project's tiny_* tasks are written by the job (planning/evaluation.py checks their
    names)."""
    checks = []
    for suite in suites_of(cell):
        if suite.harness not in HARNESS_PACKAGES:
            continue
        python = str(harness_venv(cell, suite)[0] / "bin" / "python")
        include = [str(Path(suite.include_path).expanduser())] if suite.include_path else []
        listed = json.dumps(include) if include else ""
        if include:
            checks.append(Check("eval_include", "eval.include_path", include[0], python=python, spec=listed))
        for label, task in suite.tasks.items():
            name = task.task or label
            if not name.startswith("tiny_"):
                key = f"eval.tasks.{label}.task" if task.task else f"eval.tasks.{label}"
                checks.append(Check("eval_task", key, name, python=python, spec=listed))
                spec = json.dumps({"include": include, "datasets": list(task.datasets), "label": label})
                checks.append(Check("eval_datasets", f"eval.tasks.{label}.datasets", name, python=python, spec=spec))
    return checks


@dataclass(frozen=True)
class Preflight:
    problems: list[Problem]
    # cell name -> checks that could not run here and run as the job's first step
    deferred: dict[str, list[Check]]
    unique_checks: int
    # cell name -> dataset name -> the token counts of the loss-mask probe's sample rows (where it ran here)
    lengths: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    # kind of check -> how many distinct inputs passed it here, before queueing
    passed: dict[str, int] = field(default_factory=dict)


def preflight(
    cells: Iterable[Cell],
    on_phase: mask.Phase | None = None,
    environments: tuple[list[Problem], set[str]] | None = None,
) -> Preflight:
    """Every check of every cell, each distinct input checked once: checks that differ only in the key they are
    reported under (a dataset's name) share their verdict. `on_phase` hears the loss-mask probe's progress.

    First the environments the cells name themselves (own_envs: there, a python that runs, the backend importable;
    `environments`: what own_envs.check already found of these cells): a cell's loss-mask check in an environment
    refused there is not run (its cause is reported once, with its fix)."""
    cells = list(cells)
    verdicts: dict[Check, Verdict] = {}
    found = own_envs.check(cells) if environments is None else environments
    problems, unusable = list(found[0]), found[1]
    deferred: dict[str, list[Check]] = {}
    memo: dict[tuple[Any, ...], list[Check]] = {}
    per_cell = [(cell, checks_for(cell, memo)) for cell in cells]
    for _, checks in per_cell:
        for check in checks:
            if check.kind == mask.KIND and check.python in unusable:
                verdicts[_input(check)] = Verdict(True)  # not run: the environment's own problem stops the grid
    waits = _not_staged(per_cell, verdicts)
    # loss-mask checks run as one batch: one backend process per virtual environment for the whole grid
    masks = list(
        dict.fromkeys(
            _input(c)
            for _, checks in per_cell
            for c in checks
            if c.kind == mask.KIND and not waits(c) and _input(c) not in verdicts
        )
    )
    sampled: dict[Check, tuple[int, ...]] = {}
    verdicts.update(mask.run_checks(masks, lengths=sampled, on_phase=on_phase) if masks else {})
    lengths: dict[str, dict[str, tuple[int, ...]]] = {}
    for cell, checks in per_cell:
        for check in checks:
            content = _input(check)
            if check.kind == mask.KIND and content in sampled:
                lengths.setdefault(cell.name, {})[check.key.split(".", 1)[1]] = sampled[content]
            verdict = verdicts.get(content)
            if verdict is None and check.kind != "staged" and waits(check):
                deferred.setdefault(cell.name, []).append(check)
                continue
            if verdict is None:
                verdict = verdicts[content] = run(content)
            if verdict.unreachable:
                deferred.setdefault(cell.name, []).append(check)
            elif not verdict.ok:
                problems.append(
                    Problem(
                        cell=cell.name,
                        key=check.key,
                        value=_given(check),
                        rule=f"preflight-{check.kind}",
                        message=verdict.message,
                        fix=verdict.fix,
                    )
                )
    passed = Counter(c.kind for c, v in verdicts.items() if v.ok and not v.unreachable)
    return Preflight(mask.root_causes(problems), deferred, len(verdicts), lengths=lengths, passed=dict(passed))


def _given(check: Check) -> object:
    """The value a problem of a check shows beside its key: an `extra` key's own value (its check's target is the
    key's name), else the input checked (a path, a hub id, a task's name)."""
    if check.kind == "backend_key" and check.spec:
        return json.loads(check.spec)
    if check.kind == "eval_datasets":
        return json.loads(check.spec)["datasets"]  # a task's `datasets`, short of what lm-eval reads
    return check.target


def _not_staged(
    per_cell: Sequence[tuple[Cell, list[Check]]],
    verdicts: dict[Check, Verdict],
) -> Callable[[Check], bool]:
    """Whether a check reads a Hub input that cannot be read here: not staged yet (its staging job runs first),
    or the cluster says this machine does not mount the cache (`cluster.staging.readable_here: false`). Such a
    check waits for the job's first step, like the input's own `staged` check."""
    pending: set[str] = set()
    for cell, checks in per_cell:
        for check in checks:
            if check.kind != "staged":
                continue
            if not cell.spec.cluster.staging.readable_here:
                verdicts[_input(check)] = Verdict(
                    False,
                    f"{check.target} is not readable from this machine (cluster.staging.readable_here is false)",
                    unreachable=True,
                )
            verdict = verdicts.get(_input(check)) or verdicts.setdefault(_input(check), run(_input(check)))
            if verdict.unreachable:
                pending.add(check.target)

    def waits(check: Check) -> bool:
        return any(t == p or t.startswith(p + "/") for t in (check.target, check.model) if t for p in pending)

    return waits


@functools.lru_cache(maxsize=4096)
def _input(check: Check) -> Check:
    """The check without the key it is reported under: what decides its verdict. (Cached: a grid's cells share
    their checks, and dataclasses.replace costs more than a lookup; a pure function of a frozen value.)"""
    return replace(check, key="")


# -- the job side -----------------------------------------------------------------------------------------


def fetch_and_run(check: Check, python: str, workdir: Path, variables: Mapping[str, str] | None = None) -> Verdict:
    """For an input not on this node's disk: fetch a sample with the backend's own loaders (its hub access or
    cache) under the cluster's variables, then run the same check on it."""
    workdir.mkdir(parents=True, exist_ok=True)
    if check.kind == "template_tokens":
        dest = workdir / "tokenizer"
        argv = [python, str(mask.FETCHER), "tokenizer", check.target, str(dest)]
    elif check.kind == mask.KIND:
        return mask.fetch_and_probe(check, python, workdir, variables)
    elif check.kind == "assistant_turns":
        dest = workdir / f"{check.key.replace('.', '_')}.jsonl"
        argv = [python, str(mask.FETCHER), "rows", check.target, check.split, str(SAMPLE_ROWS), str(dest)]
    else:
        return run(check)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(variables or {})})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(
            False,
            f"could not read {check.target!r} from this node either: {last[:300]}",
            "make the input reachable from compute nodes (hub access, or a local copy in the HF cache)",
        )
    return run(replace(check, target=str(dest)))


def run_deferred(
    checks: Iterable[Check],
    python: str | None = None,
    workdir: Path | None = None,
    variables: Mapping[str, str] | None = None,
) -> Iterator[tuple[Check, Verdict]]:
    """Every deferred check must now pass. An input still not on disk is fetched with the backend's loaders
    when a backend python is given; otherwise it fails the job."""
    for check in checks:
        verdict = run(check)
        if verdict.unreachable and python and workdir is not None:
            verdict = fetch_and_run(check, python, workdir, variables)
        yield check, verdict


def _unreachable(target: str, what: str) -> Verdict:
    return Verdict(
        False,
        f"{what} {shown_source(target)!r} is not readable from this machine (a hub id with no copy in the Hugging Face"
        f" cache {hub_cache()}); the check runs as the first step of the job, before training",
        unreachable=True,
    )


def check_path(check: Check) -> Verdict:
    if Path(os.path.expanduser(check.target)).exists():
        return Verdict(True)
    return Verdict(
        False,
        "no such file or directory",
        "fix the path; tiny local assets are built by `sft-grid assets build`",
    )


def _find(check: Check, kind: str, what: str) -> Path | Verdict:
    """The readable copy of the check's input, or the verdict when there is none here."""
    where = locate(check.target, kind)
    if where is not None:
        return where
    # a missing local path is reported by its own path check, once
    return Verdict(True) if is_local(check.target) else _unreachable(check.target, what)


WEIGHTS = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _json_file(file: Path) -> Any:
    """A JSON file's content; raises ValueError naming the file, the line and the column."""
    try:
        return json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None


def _weights_problem(model_dir: Path) -> str | None:
    """Why the directory's weights cannot load (none, or shards its index names that are not there), or None."""
    for index in WEIGHT_INDEXES:
        if (model_dir / index).is_file():
            weight_map = _json_file(model_dir / index).get("weight_map") or {}
            shards = sorted(set(weight_map.values()))
            missing = [f for f in shards if not (model_dir / f).is_file()]
            if not shards:
                return f"{index} names no shard (no weight_map)"
            if missing:
                return f"{index} names {len(shards)} shard(s) and {len(missing)} are missing: {', '.join(missing[:3])}"
            return None
    if any((model_dir / w).is_file() for w in WEIGHTS):
        return None
    return f"no weights ({', '.join(WEIGHTS)}, or shards with their {' or '.join(WEIGHT_INDEXES)})"


def model_dir_at(model_dir: Path, python: str = "") -> Verdict:
    """A model directory as the backend loads it: its config.json (JSON, with the model's vocabulary size), its
    weights (one file, or every shard its index names), a vocabulary that covers every id of its tokenizer (added
    tokens included: a larger id indexes past the embedding, an IndexError in the first forward pass), and a model
    type and architecture that the transformers of the backend's environment knows (`python`: that environment)."""
    if not model_dir.is_dir():
        return Verdict(
            False,
            f"{model_dir} is a file; a model is a directory (config.json, weights, tokenizer)",
            "point model.path at the model's directory",
        )
    hf = "point model.path at a Hugging Face model directory (save_pretrained writes config.json and the weights)"
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        return Verdict(False, f"no config.json in {model_dir}: the backend cannot tell which model to build", hf)
    try:
        config = _json_file(config_file)
        weights = _weights_problem(model_dir)
    except (OSError, ValueError, AttributeError) as exc:
        return Verdict(False, f"the model's config cannot be read: {exc}", f"fix or replace the file; {hf}")
    if not isinstance(config, dict):
        return Verdict(False, f"{config_file} is not a JSON object (a model config)", hf)
    if weights:
        return Verdict(False, f"{model_dir}: {weights}", f"copy the model's weights there too; {hf}")
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        return no_tokenizer(model_dir)
    if isinstance(vocab, int):
        from tokenizers import Tokenizer  # light (a Rust extension), but only needed here

        ids = Tokenizer.from_file(str(tokenizer_file)).get_vocab(with_added_tokens=True)
        top = max(ids.values(), default=-1)
        if top >= vocab:
            return Verdict(
                False,
                f"config.json's vocab_size is {vocab}, and the tokenizer has ids up to {top} ({len(ids)} tokens with"
                f" the added ones): every id from {vocab} on indexes past the embedding (an IndexError in the"
                " forward pass)",
                "resize the model's embeddings to the tokenizer (model.resize_token_embeddings(len(tokenizer)),"
                " then save_pretrained), or use the tokenizer the model was trained with",
            )
    known = venv_facts.facts(python, transformers=True) if python else None
    if known and known.get("model_types"):
        kind, archs = config.get("model_type"), list(config.get("architectures") or [])
        version = f"transformers {known.get('transformers')} of the backend's environment {Path(python).parent.parent}"
        fix = (
            "a model this transformers supports, or an environment whose transformers does (a site environment:"
            " cluster.backend_venvs.<backend>=<venv dir>)"
        )
        if kind not in known["model_types"]:
            return Verdict(False, f"config.json's model_type {kind!r} is not one {version} knows", fix)
        if archs and not set(archs) & set(known["architectures"]):
            return Verdict(False, f"config.json's architectures {archs} are not classes {version} has", fix)
    return Verdict(True)


def check_model(check: Check) -> Verdict:
    where = _find(check, "models", "model")
    return where if isinstance(where, Verdict) else model_dir_at(where, check.python)


def _modules(check: Check) -> tuple[Path, dict[str, bool] | Verdict]:
    """The backend's environment, and which of venv_facts.MODULES it can import; a Verdict where it is not on this
    machine (the job's first step asks it there)."""
    known = venv_facts.facts(check.python)
    venv = Path(check.python).parent.parent
    if known is None:
        return venv, Verdict(
            False,
            f"the backend's virtual environment {venv} is not on this machine; the job checks it first",
            unreachable=True,
        )
    return venv, dict(known["modules"])


def check_integration(check: Check) -> Verdict:
    """The `report_to` integration is importable in the backend's environment (the trainer imports it at start)."""
    venv, modules = _modules(check)
    if isinstance(modules, Verdict):
        return modules
    module = venv_facts.INTEGRATIONS[check.target]
    if modules.get(module):
        return Verdict(True)
    return Verdict(
        False,
        f"report_to={check.target} needs the {module} package, and the backend's environment {venv} does not have"
        " it: the trainer would fail as it starts",
        f"install it there ({venv}/bin/pip install {module}), or report_to=none",
    )


def check_kernel(check: Check) -> Verdict:
    """A fast kernel the cell's layout uses (FlashAttention, Liger) is importable in the backend's environment: the
    cluster's `kernels` says so, and the environment, where it is on this machine, is asked (else the job's first
    step asks it)."""
    venv, modules = _modules(check)
    if isinstance(modules, Verdict):
        return modules
    if modules.get(venv_facts.KERNELS[check.target]):
        return Verdict(True)
    switch = "layout.attention=sdpa" if check.target == "flash_attn" else "layout.liger=false"
    return Verdict(
        False,
        f"the cell's layout trains with {check.target}, which its cluster's `kernels` lists, and the backend's"
        f" environment {venv} does not have it: the trainer would fail to import it as it starts",
        f"install it there ({venv}/bin/pip install {check.target.replace('_', '-')}), or {switch}, or drop"
        f" {check.target} from the cluster's kernels",
    )


# the backends whose config keys are asked of their environment (in_venv/env_facts.py --config-keys), and what
# each does with a key it does not know
CONFIG_PARSERS = {
    "llamafactory": "LLaMA-Factory's argument parser refuses a config with a key it does not know (\"Some keys are"
    ' not used by the HfArgumentParser"): the job would fail as it starts',
    "axolotl": "axolotl's config model drops a key it does not know: the cell would train as if it were not set",
}


def _known_name(check: Check, known: frozenset[str] | str | None, env: str) -> Verdict | list[str]:
    """A name asked of an environment (`known`: its answer, venv_facts): the verdict where the environment is not on
    this machine (the job asks it) or knows the name (or cannot say: its own parser decides); else the names it
    knows that are closest, for the fix."""
    if known is None:
        return _not_here(check, env)
    if isinstance(known, str) or check.target in known:
        return Verdict(True)
    return difflib.get_close_matches(check.target, sorted(known), n=3, cutoff=0.75)


def _not_here(check: Check, env: str) -> Verdict:
    """The verdict of a check asked of an environment that is not on this machine: deferred, the job asks it."""
    venv = Path(check.python).parent.parent
    return Verdict(False, f"the {env} {venv} is not on this machine; the job checks it first", unreachable=True)


# pydantic's words for true and false (axolotl's config model reads a string as one of them, lax)
_PYDANTIC_BOOLS = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _takes(value: Any, kind: Mapping[str, Any], lax: bool) -> bool:
    """Whether a value is of the kind a config field takes: as given (LLaMA-Factory's parser builds its dataclasses
    from the values as they are), or as pydantic's lax mode converts it (`lax`: axolotl's config model)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    text = str(value).strip().lower() if lax and isinstance(value, str) else None
    if kind["kind"] == "bool":
        return isinstance(value, bool) or (text is not None and text in _PYDANTIC_BOOLS)
    if kind["kind"] in ("int", "float"):
        if text is not None:
            try:
                value, number = float(text), True
            except ValueError:
                return False
        return number and (kind["kind"] == "float" or float(value).is_integer())
    return value in kind.get("choices", ())


def check_backend_key(check: Check) -> Verdict:
    """An `extra` key is one the backend's config parser takes in the cell's environment (see CONFIG_PARSERS), and
    its value (`spec`, JSON) of the kind the parser's field takes, where that is one plain kind."""
    close = _known_name(check, venv_facts.config_keys(check.python, check.backend), "backend's virtual environment")
    if isinstance(close, Verdict):
        if not close.ok or not check.spec:
            return close
        kind = venv_facts.config_kinds(check.python, check.backend).get(check.target)
        value = json.loads(check.spec)
        if kind is None or _takes(value, kind, lax=check.backend == "axolotl"):
            return close
        words = {"bool": "true or false", "int": "a whole number", "float": "a number"}.get(
            kind["kind"], f"one of {', '.join(map(str, kind.get('choices', ())))}"
        )
        return Verdict(
            False,
            f"{check.backend}'s config takes {words} for {check.target}, not {value!r}"
            + (
                ": its parser builds the config from the value as given, so the job would fail or train otherwise"
                if check.backend == "llamafactory"
                else ": its config model would refuse it as the job starts"
            ),
            f"+extra.{check.target}=<{words}>, or drop extra.{check.target}",
        )
    venv = Path(check.python).parent.parent
    own = check.target in {f.name for f in dataclasses.fields(CellConf)}
    return Verdict(
        False,
        f"not a key of {check.backend}'s config in {venv}: {CONFIG_PARSERS[check.backend]}",
        (f"{check.target} is sft_grid's own key: set it without extra. ({check.target}=...); " if own else "")
        + (f"did you mean {' or '.join(close)}? " if close else "")
        + f"set a key {check.backend} knows (its config reference), or drop extra.{check.target}",
    )


def check_eval_task(check: Check) -> Verdict:
    """An evaluation task name is one lm-eval's task index knows in the harness's environment (with the suite's
    include_path): a task, a group or a tag."""
    include = json.loads(check.spec) if check.spec else []
    close = _known_name(check, venv_facts.eval_tasks(check.python, include), "evaluation's environment")
    if isinstance(close, Verdict):
        return close
    venv = Path(check.python).parent.parent
    where = f" nor under include_path {include[0]}" if include else ""
    return Verdict(
        False,
        f"not a task, group or tag of lm-eval in {venv}{where}: the evaluation would fail after the training",
        (f"did you mean {' or '.join(close)}? " if close else "")
        + "name a task lm-eval lists (lm_eval --tasks list), or put its YAML under eval.include_path",
    )


def check_eval_datasets(check: Check) -> Verdict:
    """The Hub datasets lm-eval reads for the task (in_venv/env_facts.py: its config, its group's members, as
    lm-eval resolves them) are all in the task's `datasets`: only those are staged, and the job runs offline."""
    spec = json.loads(check.spec)
    found = venv_facts.eval_datasets(check.python, check.target, spec["include"])
    if found is None and not Path(check.python).is_file():
        return _not_here(check, "evaluation's environment")
    missing = sorted((found[0] if found else frozenset()) - set(spec["datasets"]))
    if not missing:
        return Verdict(True)  # an unknown name: the name's own check says it
    label = spec["label"]
    ids = ", ".join(missing)
    return Verdict(
        False,
        f"lm-eval's {check.target} reads the Hub dataset(s) {ids}, which are not in the task's datasets: only those"
        " are staged, and the evaluation job runs offline, so it would fail after the training",
        f"datasets: [{', '.join([*spec['datasets'], *missing])}] under tasks.{label} in the suite's YAML, or"
        f" '+eval.tasks.{label}.datasets=[{','.join([*spec['datasets'], *missing])}]'",
    )


def check_eval_include(check: Check) -> Verdict:
    """Every YAML under the include_path is read by lm-eval's task index (it skips one that does not load without a
    word: a team task would not exist, or lm-eval's own of that name would be scored), no two define one name, and
    none takes a name lm-eval ships (the include_path's wins in its index: its scores would pass for lm-eval's)."""
    include = json.loads(check.spec)
    found = venv_facts.eval_index(check.python, include)
    if found is None:
        return _not_here(check, "evaluation's environment")
    if isinstance(found, str):
        return Verdict(True)  # it cannot answer: its own check of the environment says why
    shipped, own = found
    said, fixes = [], []
    if own.get("broken"):
        said.append(
            "lm-eval's task index skips, without a word, " + "; ".join(f"{f}: {why}" for f, why in own["broken"])
        )
        fixes.append("fix each such YAML where it says (lm-eval's loader also takes !function tags) or move it out")
    if own.get("duplicates"):
        said.append(
            "two of its YAMLs define one name, and lm-eval keeps the first: "
            + "; ".join(f"{name} in {kept} and {skipped}" for name, kept, skipped in own["duplicates"])
        )
        fixes.append("rename one of each pair")
    taken = sorted(set(own["tasks"]) & set(shipped["tasks"]))
    if taken:
        root = Path(shipped.get("root", ""))
        said.append(
            "lm-eval's index takes its names over lm-eval's own (a warning in the job's log, after the training),"
            " and their scores would pass for lm-eval's: "
            + "; ".join(f"{n} of {own['files'].get(n)} over {root / (shipped['files'].get(n) or n)}" for n in taken)
        )
        fixes.append(
            f"rename each in its YAML (task: team_{taken[0]}) and ask for that name, or drop it to score lm-eval's"
        )
    if not said:
        return Verdict(True)
    return Verdict(False, "; and ".join(said), "; ".join(fixes))


def check_template_tokens(check: Check) -> Verdict:
    where = _find(check, "models", "tokenizer")
    if isinstance(where, Verdict):
        return where
    if is_local(check.target) and (where / "config.json").is_file() and not (where / "tokenizer.json").is_file():
        return Verdict(True)  # a model directory without its tokenizer: the model check says so, under model.path
    return template_tokens_at(where, check.tokens)


def no_tokenizer(model_dir: Path) -> Verdict:
    """A model directory without tokenizer.json (the file the backends and these checks read the tokenizer from)."""
    return Verdict(
        False,
        f"no tokenizer.json in {model_dir}: the backend loads the model's tokenizer from the model's directory",
        'save the tokenizer of the model it was trained from there: python -c "from transformers import'
        f" AutoTokenizer; AutoTokenizer.from_pretrained('<base model>').save_pretrained('{model_dir}')\", or point"
        " model.path at a directory that has it",
    )


def template_tokens_at(model_dir: Path, tokens: Iterable[str]) -> Verdict:
    from tokenizers import Tokenizer  # light (a Rust extension), but only needed here

    file = model_dir / "tokenizer.json"
    if not file.is_file():
        return no_tokenizer(model_dir)
    tok = Tokenizer.from_file(str(file))
    broken = {t: len(tok.encode(t, add_special_tokens=False).ids) for t in tokens}
    broken = {t: n for t, n in broken.items() if n != 1}
    if not broken:
        return Verdict(True)
    detail = ", ".join(f"{t} -> {n} tokens" for t, n in broken.items())
    if set(broken) <= set(DELPHI_TOKENS):
        return Verdict(
            False,
            f"the Delphi think/tool tokens are not single tokens of this tokenizer ({detail}):"
            " it is not prepared, and the model has no prep stage",
            f"add `needs: [{PREP_NEED}]` to the model's conf/model/<name>.yaml (the grid then prepares"
            " it once, before its cells), or point model.path at a prepared checkpoint",
        )
    family = content_family(tok)
    if family is None:
        return Verdict(
            False,
            f"the template's special tokens are not single tokens of this tokenizer: {detail}",
            "use the template of the model's family (llama3 for Llama-3/Delphi tokenizers, qwen3 for ChatML)",
        )
    # the tokenizer's own tokens decide, never the architecture: a Delphi checkpoint is a Qwen3ForCausalLM that
    # carries Llama-3's tokenizer, and a template chosen by model_type (qwen3) would shred every example
    fix = {
        "delphi": "model.template=delphi model.tokenizer_family=delphi",
        "llama3": "model.template=llama3 model.tokenizer_family=llama3 (a Delphi checkpoint, which carries this"
        " tokenizer: model.template=delphi model.tokenizer_family=delphi, with its tokenizer prep)",
        "qwen3": "model.template=qwen3 model.tokenizer_family=qwen3",
    }[family]
    return Verdict(
        False,
        f"the template's special tokens are not single tokens of this tokenizer: {detail}; its own turn tokens"
        f" are {_FAMILY_MARKS[family]}: the template follows the tokenizer, not the model's architecture",
        fix,
    )


# what shows a tokenizer's family in its own vocabulary
_FAMILY_MARKS = {
    "delphi": "Llama-3's, with the Delphi think token <|start_think|> at 128002",
    "llama3": "Llama-3's (<|start_header_id|>, <|eot_id|>)",
    "qwen3": "ChatML's (<|im_start|>, <|im_end|>)",
}


def content_family(tok: Any) -> str | None:
    """The tokenizer family its own vocabulary shows, whatever the model's architecture: delphi (Llama-3's turn
    tokens and the prepared think token), llama3 (Llama-3's turn tokens), qwen3 (ChatML's), or None."""

    def single(token: str) -> bool:
        return len(tok.encode(token, add_special_tokens=False).ids) == 1

    if single("<|start_header_id|>") and single("<|eot_id|>"):
        return "delphi" if tok.id_to_token(128002) == "<|start_think|>" else "llama3"
    if single("<|im_start|>") and single("<|im_end|>"):
        return "qwen3"
    return None


def assistant_turns(rows: list[dict[str, Any]], column: str, tags: Mapping[str, str]) -> Verdict:
    role_tag, assistant_tag = tags["role_tag"], tags["assistant_tag"]
    if rows and all(column not in r for r in rows):
        # a conversation column holds a list of messages (mappings); a column of text is no conversation
        chats = [
            k for k in sorted(rows[0]) if isinstance(rows[0][k], list) and all(isinstance(m, dict) for m in rows[0][k])
        ]
        return Verdict(
            False,
            f"no column {column!r} in the data (columns: {', '.join(sorted(rows[0]))})",
            f"set `messages:` of this dataset to its conversation column: {chats[0]}"
            if chats
            else "no column holds a list of messages (each a mapping such as {role, content}): the rows are not"
            " conversations; convert them to a column of messages first",
        )
    turns: Counter[Any] = Counter()
    keys: Counter[str] = Counter()
    for row in rows:
        for msg in row.get(column) or []:
            if isinstance(msg, dict):
                keys.update(msg.keys())
                turns[msg.get(role_tag)] += 1
    if turns.get(assistant_tag, 0) > 0:
        return Verdict(True)
    seen = ", ".join(f"{k!r}" for k, _ in turns.most_common(5) if k is not None)
    fix = "set this dataset's tags to the roles its rows use"
    shape = (
        ("from", "value", "human", "gpt")
        if {"from", "value"} <= set(keys)
        else ("role", "content", "user", "assistant")
        if {"role", "content"} <= set(keys)
        else None
    )
    if shape is not None:
        role, content, user, assistant = shape
        roles = [r for r, _ in turns.most_common() if isinstance(r, str)]
        if role == role_tag and roles and assistant not in roles:
            # the rows' own roles: the one not the user's or the system's answers (`human`/`bot` rows)
            users = [r for r in roles if r in ("user", "human", tags.get("user_tag"))]
            answers = [r for r in roles if r not in (*users, "system", "tool")]
            user, assistant = (users or [user])[0], (answers or [assistant])[0]
        fix = f"tags role_tag={role} content_tag={content} user_tag={user} assistant_tag={assistant}"
        fix = f"the rows' roles: {fix}" if (role, assistant) != (role_tag, assistant_tag) else fix
    return Verdict(
        False,
        f"0 assistant turns in {len(rows)} sampled rows with role_tag={role_tag!r} assistant_tag={assistant_tag!r}"
        f" (message keys seen: {', '.join(sorted(keys)) or 'none'}; {role_tag!r} values seen: {seen or 'none'})",
        fix,
    )


def check_assistant_turns(check: Check) -> Verdict:
    where = _find(check, "datasets", "dataset")
    if isinstance(where, Verdict):
        return where
    try:
        if is_local(check.target):
            # every line of the local files, not the sample's first rows alone: a broken line 11001 fails the job
            scan_rows(where, check.column, dict(check.tags), check.split)
        rows = mask.sample_rows(where, check.column, SAMPLE_ROWS, check.split, check.python)
    except ImportError:
        return Verdict(
            False,
            f"reading parquet needs pyarrow, which this environment lacks, and the backend's environment is not on"
            f" this machine ({where})",
            "the job runs it",
            unreachable=True,
        )
    except NoSplit as exc:
        return Verdict(
            False,
            str(exc),
            "set the dataset's split to one its files have (dataset.<name>.split=train), or point its source at"
            " the split's own file",
        )
    except NotData as exc:
        return Verdict(
            False,
            str(exc),
            exc.fix
            or "point the dataset's source at a .jsonl, .json or .parquet file (or a"
            " directory of them) with one conversation a row",
        )
    except (OSError, ValueError) as exc:
        return Verdict(
            False,
            f"cannot read a sample of {where}: {exc}",
            "fix that line (one JSON object a line)"
            if "line " in str(exc)
            else "point the dataset's source at a data file",
        )
    if not rows:
        return Verdict(False, f"{where} has no rows", "point the dataset's source at a file with conversations")
    return assistant_turns(rows, check.column, dict(check.tags))


def _built_before(directory: Path, complete: bool, failed_as: str, fix: str, not_yet: str) -> Verdict:
    """A grid-level job's output the cell needs (its model prep, its tokenization): there; or its job failed,
    and why (the ledger in its directory); or not built yet, and the check waits for the cell's job."""
    if complete:
        return Verdict(True)
    failed = events.last(events.read(directory), Kind.FAILED)
    if failed is not None:
        return Verdict(False, f"{failed_as}: {failed.reason}", f"{fix} and run the grid again with rerun_failed=true")
    return Verdict(False, not_yet, "", unreachable=True)


def check_prepared(check: Check) -> Verdict:
    """The model's prepared copy is there; if its prep failed, why."""
    prep_dir = Path(check.target)
    return _built_before(
        prep_dir,
        prep_complete(prep_dir),
        "its model prep failed",
        f"fix the prep (its log: {prep_dir}/prep.log)",
        f"the model's prepared copy {prep_dir / 'model'} is not there yet; the prep runs before the cell",
    )


def check_staged(check: Check) -> Verdict:
    """Every file training needs of a pinned Hub repository is in the cache (target: its snapshot directory);
    else, if its staging job failed, why; else it is not staged yet and whatever reads it waits."""
    parsed = parse_snapshot(check.target)
    if parsed is None:
        return Verdict(False, f"{check.target} is not a snapshot of a Hugging Face cache", "")
    cache, repo_id, kind, sha = parsed
    if is_complete(cache, repo_id, kind, sha):
        return Verdict(True)
    failed = staging_failure(cache, repo_id, kind, sha)
    if failed:
        return Verdict(
            False,
            f"staging {kind} {repo_id}@{sha[:12]} failed: {failed}",
            "fix the cause, stage it again (sft-grid stage, or the grid command) and run the"
            " grid again with rerun_failed=true",
        )
    return Verdict(
        False,
        f"{kind} {repo_id}@{sha[:12]} is not staged in {cache} yet; staging runs before the cell",
        "",
        unreachable=True,
    )


def check_tokenized(check: Check) -> Verdict:
    """The grid's shared tokenized dataset of the cell is built; if its tokenize job failed, why."""
    tok_dir = Path(check.target)
    return _built_before(
        tok_dir,
        tokenized_complete(tok_dir),
        "its tokenized dataset was not built",
        f"fix the cause (its log: {tok_dir}/tokenize.log)",
        f"the tokenized dataset {tok_dir} is not built yet; it is built before the cell",
    )


RUNNERS: dict[str, Callable[[Check], Verdict]] = {
    "staged": check_staged,
    "tokenized": check_tokenized,
    "prepared": check_prepared,
    "path": check_path,
    "model": check_model,
    "integration": check_integration,
    "kernel": check_kernel,
    "backend_key": check_backend_key,
    "eval_task": check_eval_task,
    "eval_datasets": check_eval_datasets,
    "eval_include": check_eval_include,
    "template_tokens": check_template_tokens,
    "assistant_turns": check_assistant_turns,
    "loss_mask": lambda check: mask.run_checks([check])[check],
}


def run(check: Check) -> Verdict:
    return RUNNERS[check.kind](check)
