"""Rules over every cell of a grid. Each rule returns problems; the grid fails once, with all of them.

Every problem names the cell, the dotted key, the value, the rule and how to fix it. Rules here are
pure (they read only the composed cells); checks that need a tokenizer or data are in preflight.py and
report through the same Problem type.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from dataclasses import dataclass, fields, is_dataclass
from typing import Callable, Iterable, Iterator, Sequence

from sft_grid import schema
from sft_grid.plan import Cell
from sft_grid.templates import SUGGESTED, SUGGESTED_FOR_TOKENIZER, TEMPLATES, TOKENIZER_FAMILIES
from sft_grid.timefmt import parse_minutes

MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")
EXECUTORS = ("local", "slurm")
LAUNCHERS = ("torchrun", "accelerate")
FINETUNING = ("full", "lora", "freeze")


@dataclass(frozen=True)
class Problem:
    cell: str  # the cell's name, or its overrides when it could not be composed
    key: str
    value: object
    rule: str
    message: str
    fix: str

    def render(self) -> str:
        head = f"{self.key}={self.value!r}: {self.message} [{self.rule}]" if self.key else f"{self.message} [{self.rule}]"
        return f"{head}\n      fix: {self.fix}"


class GridError(Exception):
    """Raised once with every problem of every cell; nothing has been submitted."""

    def __init__(self, problems: Sequence[Problem], what: str = "validation") -> None:
        self.problems = list(problems)
        by_cell: dict[str, list[Problem]] = defaultdict(list)
        for p in self.problems:
            by_cell[p.cell].append(p)
        lines = [
            f"{len(self.problems)} problem(s) in {len(by_cell)} cell(s) found by {what}; nothing was submitted."
        ]
        for cell, problems in by_cell.items():
            lines.append(f"  cell {cell}")
            lines.extend(f"    {p.render()}" for p in problems)
        super().__init__("\n".join(lines))


Rule = Callable[[Cell], Iterator[Problem]]


def _problem(cell: Cell, key: str, value: object, rule: str, message: str, fix: str) -> Problem:
    return Problem(cell.name, key, value, rule, message, fix)


def batch_divisible(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    per_step = s.micro_batch_size * cell.world_size
    if s.global_batch_size < 1 or s.micro_batch_size < 1 or s.nodes < 1:
        yield _problem(cell, "global_batch_size", s.global_batch_size, "batch-positive",
                       f"global batch, micro batch ({s.micro_batch_size}) and nodes ({s.nodes}) must all be >= 1",
                       "set global_batch_size, micro_batch_size and nodes to positive integers")
    elif s.global_batch_size % per_step:
        yield _problem(
            cell, "global_batch_size", s.global_batch_size, "batch-divisible",
            f"not divisible by nodes x ranks_per_node x micro_batch_size = {s.nodes} x {cell.ranks_per_node}"
            f" x {s.micro_batch_size} = {per_step}; gradient accumulation is derived from it, never set by hand",
            f"use a global_batch_size that is a multiple of {per_step}, or change nodes/micro_batch_size",
        )


def mix_matches(cell: Cell) -> Iterator[Problem]:
    mix, n = cell.spec.mix, len(cell.spec.dataset)
    if n == 0:
        yield _problem(cell, "dataset", [], "dataset-empty", "the cell trains on no dataset",
                       "pick one: dataset=<name>, or a mix: dataset=[a,b]")
        return
    if mix.strategy not in MIX_STRATEGIES:
        yield _problem(cell, "mix.strategy", mix.strategy, "mix-strategy", "unknown mix strategy",
                       f"use one of {', '.join(MIX_STRATEGIES)}")
        return
    if mix.strategy == "concat":
        if mix.probs is not None:
            yield _problem(cell, "mix.probs", mix.probs, "mix-probs", "probabilities are only used by interleave strategies",
                           "drop mix.probs (mix.probs=null) or set mix.strategy=interleave_under")
        return
    if mix.probs is None or len(mix.probs) != n:
        got = "none" if mix.probs is None else str(len(mix.probs))
        yield _problem(
            cell, "mix.probs", mix.probs, "mix-probs",
            f"{mix.strategy} needs one probability per dataset: {n} dataset(s) ({', '.join(cell.spec.dataset)}), {got} given",
            f"give {n} probabilities in dataset order, e.g. mix.probs=[{','.join(['%.2g' % (1 / n)] * n)}]",
        )
    elif any(p <= 0 for p in mix.probs) or abs(sum(mix.probs) - 1.0) > 1e-6:
        yield _problem(cell, "mix.probs", mix.probs, "mix-probs",
                       f"probabilities must be > 0 and sum to 1 (they sum to {sum(mix.probs):.6g})",
                       "rescale them so they sum to 1, e.g. mix.probs=[0.9,0.1]")


def wall_time(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    try:
        limit = parse_minutes(s.cluster.max_time)
    except ValueError as exc:
        yield _problem(cell, "cluster.max_time", s.cluster.max_time, "time-format", str(exc),
                       f"fix max_time in conf/cluster/{s.cluster.name}.yaml")
        return
    try:
        asked = parse_minutes(s.time)
    except ValueError as exc:
        yield _problem(cell, "time", s.time, "time-format", str(exc), "write time as HH:MM:SS, e.g. time=04:00:00")
        return
    if asked > limit:
        yield _problem(cell, "time", s.time, "time-max",
                       f"over cluster {s.cluster.name!r}'s maximum wall time {s.cluster.max_time}",
                       f"ask for at most time={s.cluster.max_time}; a longer run resumes from its checkpoint when rerun")


def template_fits_tokenizer(cell: Cell) -> Iterator[Problem]:
    model = cell.spec.model
    template = TEMPLATES.get(model.template)
    if template is None:
        yield _problem(cell, "model.template", model.template, "template-known", "not a template sft_grid knows",
                       f"use one of {', '.join(sorted(TEMPLATES))}{_did_you_mean(model.template, TEMPLATES)}")
        return
    family = TOKENIZER_FAMILIES.get(model.tokenizer_family)
    if family is None:
        yield _problem(cell, "model.tokenizer_family", model.tokenizer_family, "tokenizer-family", "unknown tokenizer family",
                       f"use one of {', '.join(sorted(TOKENIZER_FAMILIES))} in conf/model/{model.name}.yaml")
    elif family != template.family:
        delphi = (" (Delphi checkpoints carry the Llama-3 tokenizer with think/tool tokens in its reserved slots;"
                  " they train with the delphi template: Llama-3 turns plus those tokens)"
                  if model.tokenizer_family == "delphi" else "")
        yield _problem(
            cell, "model.template", model.template, "template-tokenizer",
            f"writes {template.family} tokens ({', '.join(template.special_tokens[:2])}, ...) but model {model.name!r} has a"
            f" {model.tokenizer_family} tokenizer: every example would be split into pieces of those strings{delphi}",
            f"model.template={SUGGESTED_FOR_TOKENIZER.get(model.tokenizer_family, SUGGESTED[family])}",
        )


def choices(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    for key, value, allowed in (
        ("cluster.executor", s.cluster.executor, EXECUTORS),
        ("cluster.launcher", s.cluster.launcher, LAUNCHERS),
        ("finetuning_type", s.finetuning_type, FINETUNING),
    ):
        if value not in allowed:
            yield _problem(cell, key, value, "choice", "not a supported value",
                           f"use one of {', '.join(allowed)}{_did_you_mean(value, allowed)}")
    if s.cluster.executor == "local" and s.nodes != 1:
        yield _problem(cell, "nodes", s.nodes, "local-one-node", "the local executor runs a cell on this one machine",
                       "nodes=1, or a Slurm cluster (cluster=<site>)")


def training_numbers(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    if s.lr <= 0:
        yield _problem(cell, "lr", s.lr, "positive", "the learning rate must be > 0", "e.g. lr=2e-5")
    if s.max_steps <= 0 and s.epochs <= 0:
        yield _problem(cell, "epochs", s.epochs, "length", "neither epochs nor max_steps is positive",
                       "set epochs (e.g. epochs=1) or max_steps (e.g. max_steps=100)")
    if s.cutoff_len < 1:
        yield _problem(cell, "cutoff_len", s.cutoff_len, "positive", "must be >= 1", "e.g. cutoff_len=4096")
    if s.save_steps < 1:
        yield _problem(cell, "save_steps", s.save_steps, "positive", "must be >= 1", "e.g. save_steps=500")


_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def hub_upload(cell: Cell) -> Iterator[Problem]:
    """The upload is a post-training stage (sft_grid/post.py), so a site without internet on its compute
    nodes is no error: the stage runs on its post_partition, or waits for the login-node command."""
    s = cell.spec
    if s.register_db and not s.push_to_hub:
        yield _problem(cell, "register_db", True, "register-needs-upload",
                       "database registration names the uploaded Hub repository, and this cell uploads nothing",
                       "push_to_hub=true with a hub_model_id, or register_db=false")
    if s.register_db and not s.register_command:
        yield _problem(cell, "register_command", [], "register-command",
                       "register_db=true but no command registers the model (sft_grid ships no database client)",
                       "register_command=[python,manual_db_push.py,--hf-model-id,'{hub_model_id}'], or register_db=false")
    if not s.push_to_hub:
        return
    if not s.hub_model_id:
        yield _problem(cell, "hub_model_id", s.hub_model_id, "hub-id", "push_to_hub=true needs a hub repository id",
                       "set hub_model_id=<org>/<name> (e.g. org/{model}-sft-{key}), or push_to_hub=false")
    elif "{" in s.hub_model_id or not _HUB_REPO.match(s.hub_model_id) or len(s.hub_model_id.split("/")[1]) > 96:
        yield _problem(cell, "hub_model_id", s.hub_model_id, "hub-id",
                       "not a Hub repository id <org>/<name> (letters, digits, - _ . ; name at most 96 characters;"
                       " the placeholders are {key}, {name}, {model} and {data})",
                       "e.g. hub_model_id=laion/{model}-sft-{key}")


def backend_env_meets_needs(cell: Cell) -> Iterator[Problem]:
    from sft_grid import env

    s = cell.spec
    path, unmet = env.select(s)
    if unmet:
        yield _problem(
            cell, f"cluster.need_envs.{unmet}.{s.backend.name}", None, "env-need",
            f"model {s.model.name!r} needs {env.ENV_NEEDS[unmet]}, and cluster {s.cluster.name!r} names no"
            f" {s.backend.name} environment that has it (its environment {path} is not declared to)",
            f"name one in conf/cluster/{s.cluster.name}.yaml: need_envs: {{{unmet}: {{{s.backend.name}: <env dir>}}}}"
            f" (or '+cluster.need_envs.{unmet}={{{s.backend.name}:<env dir>}}' on the command line)")
    from sft_grid import zero

    if zero.needed(cell) and path == env.managed_for(s) and "deepspeed" not in s.backend.provides:
        # a site's own environment is the site's business; the managed one is known not to have DeepSpeed
        yield _problem(
            cell, "backend", s.backend.name, "env-deepspeed",
            f"model {s.model.name!r} trains with DeepSpeed ZeRO-3 (needs: zero3), and the managed {s.backend.name}"
            f" environment {path} has no DeepSpeed",
            "backend=axolotl (its managed environment has DeepSpeed), or name a site environment with DeepSpeed:"
            f" cluster.backend_envs.{s.backend.name}=<env dir>")


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def safe_names(cell: Cell) -> Iterator[Problem]:
    """Names end up in paths, job names, LLaMA-Factory's comma-separated dataset list and script comments:
    they are kept to a safe alphabet rather than quoted in each of those places."""
    s = cell.spec
    named = [("sweep_name", s.sweep_name), ("model.name", s.model.name)]
    named += [(f"dataset.{name}", name) for name in s.dataset]
    for key, name in named:
        if not _SAFE_NAME.match(name):
            yield _problem(cell, key, name, "safe-name",
                           "names may hold only letters, digits and . _ + - (no spaces, quotes, ; or commas)",
                           f"rename it, e.g. {re.sub(r'[^A-Za-z0-9._+-]+', '_', name).strip('_') or 'name'}")


def axolotl_can_train(cell: Cell) -> Iterator[Problem]:
    """What the axolotl backend cannot express is an error here, never a silently different run."""
    s = cell.spec
    if s.backend.name != "axolotl":
        return
    if s.finetuning_type == "freeze":
        yield _problem(cell, "finetuning_type", s.finetuning_type, "axolotl-finetuning",
                       "axolotl has no freeze fine-tuning (LLaMA-Factory's freeze_trainable_layers)",
                       "finetuning_type=full or finetuning_type=lora, or backend=llamafactory")
    template = TEMPLATES.get(s.model.template)
    if template is not None and not (template.axolotl or template.jinja):
        yield _problem(cell, "model.template", s.model.template, "axolotl-template",
                       "axolotl has no template of this name and sft_grid ships no jinja for it",
                       "add its axolotl name (or a jinja file) to sft_grid/templates.py, or backend=llamafactory")


RULES: tuple[Rule, ...] = (
    safe_names,
    batch_divisible, mix_matches, wall_time, template_fits_tokenizer, choices, training_numbers, hub_upload,
    backend_env_meets_needs, axolotl_can_train,
)


def validate(cells: Iterable[Cell]) -> list[Problem]:
    return [p for cell in cells for rule in RULES for p in rule(cell)]


# -- messages for composition errors (typos in keys and options) ----------------------------------------

_NOT_IN = re.compile(r"Key '(?P<key>[^']+)' not in '(?P<type>\w+)'")


def _did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _schema_keys(type_name: str) -> list[str] | None:
    cls = getattr(schema, type_name, None)
    if cls is None or not is_dataclass(cls):
        return None
    return [f.name for f in fields(cls)]


_ENV_UNSET = re.compile(r"environment variable (?P<var>\w+) is not set")
_NOT_FOUND = re.compile(r"Could not find '(?P<group>[^'/]+)/(?P<option>[^']+)'")


def key_hint(message: str) -> str | None:
    """The valid keys (and the closest one) for an unknown-key error, or the options for an unknown option."""
    match = _NOT_IN.search(message)
    if match:
        valid = _schema_keys(match.group("type"))
        if valid:
            return f"valid keys of {match.group('type')}: {', '.join(valid)}{_did_you_mean(match.group('key'), valid)}"
    match = _NOT_FOUND.search(message)
    if match:
        from sft_grid.paths import CONF_DIR

        options = sorted(p.stem for p in (CONF_DIR / match.group("group")).glob("*.yaml"))
        if options:
            return (f"{match.group('group')} is one of {', '.join(options)}"
                    f"{_did_you_mean(match.group('option'), options)}")
    return None


def composition_problem(overrides: Sequence[str], message: str) -> Problem:
    """A Problem for a cell that Hydra could not compose, with the valid keys when a key is unknown."""
    match = _NOT_IN.search(message)
    key = match.group("key") if match else ""
    env = _ENV_UNSET.search(message)
    fix = (key_hint(message) or (f"export {env.group('var')}=<value> (and any other variable named above)" if env else "")
           or "check the override against `python -m sft_grid --cfg job` and the options in conf/")
    first, _, rest = message.partition("\n")
    detail = " ".join(line.strip() for line in rest.splitlines() if line.strip() and "search path" not in line.lower()
                      and not line.strip().startswith("provider="))
    text = first + (f" ({detail})" if detail else "")
    return Problem(" ".join(overrides) or "<defaults>", key, None, "compose", text, fix)
