"""The options an import reuses or writes, as text: an existing model or dataset option that says the same as the
original is reused (named in the report, no file written); else a new option, named so that it shadows no shipped
one, its size and tokenizer read from the model's name where the caller gives none; and the sweep file selecting
them, every value commented with the key it came from."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.importing.terms import TITLE, Option, Result

# a dataset option's tags where it names none (schema.py DatasetTags): what an option to reuse must say alike
TAG_DEFAULTS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "system_tag": "system",
}
# a model option's keys that say which checkpoint it is and how it is chatted with, not what the model is
_MODEL_SOURCE = ("name", "template", "hub_id", "path", "revision")


def where(option: Option) -> str:
    """How the report names an option it reuses: a shipped one, or the team's with its file."""
    return "the shipped option" if option.shipped else f"your option ({option.path})"


# -- the model option ---------------------------------------------------------------------------------------------


def same_model(
    models: Mapping[str, Option], model: str, path: str | None, template: str, revision: Any
) -> Option | None:
    """The option that trains the same checkpoint the same way: its hub id (or, for a local model, its `path`), its
    template and its revision."""
    for option in models.values():
        data = option.data
        same_source = (data.get("path") == path) if path is not None else (data.get("hub_id") == model)
        if same_source and data.get("template") == template and data.get("revision") == revision:
            return option
    return None


def similar_model(models: Mapping[str, Option], model: str) -> Option | None:
    """An option of the same hub id under another template or revision: its facts (size, tokenizer, shape) are the
    model's too."""
    return next((o for o in models.values() if o.data.get("hub_id") == model), None)


def model_name(model: str, template: str, like: Option | None, models: Mapping[str, Option], sweep: str) -> str:
    """A new model option's name: the model's (its hub id's last part), the similar option's with the template, or
    with the sweep's name where a shipped option has the model's name already."""
    name = snake(Path(model).name)
    if like is not None:
        return f"{like.name}_{snake(template)}"
    if name in models and models[name].shipped:
        return f"{name}_{sweep}"
    return name


def model_facts(like: Option) -> dict[str, Any]:
    """What an option says about the model itself (size, tokenizer, shape, needs), without which checkpoint."""
    return {k: v for k, v in like.data.items() if k not in _MODEL_SOURCE}


def model_text(name: str, model: str, data: Mapping[str, Any], notes: list[str], what: str) -> str:
    head = comment(f"{name}: {model}, imported by `sft-grid import` from {what}.")
    for note in notes:
        head += comment(note)
    head.append(f"# Use: sft-grid run model={name}")
    return "\n".join([*head, *block(data, {})]) + "\n"


def params_from_name(name: str) -> float | None:
    """A model's size in billions as its name says it (Qwen3-8B: 8.0; Qwen3-0.6B: 0.6; delphi-...-447Mparams:
    0.447), or None."""
    match = re.search(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([BbMm])(?=$|[-_./ ]|params)", name)
    if not match:
        return None
    number = float(match.group(1))
    return number if match.group(2) in "Bb" else round(number / 1000, 4)


def tokenizer_family(model: str, template: str) -> str | None:
    """The tokenizer a checkpoint carries, as its name and template tell: Qwen3.5's, Qwen3's, Delphi's, Llama 3's."""
    low = model.lower()
    if "delphi" in low or template == "delphi":
        return "delphi"
    if re.search(r"qwen3[._]5", low):
        return "qwen3_5"
    if "qwen" in low and TEMPLATES[template].family == "chatml":
        return "qwen3"
    if TEMPLATES[template].family == "llama3" and "llama" in low:
        return "llama3"
    return None


# -- the dataset options -------------------------------------------------------------------------------------------


def same_dataset(datasets: Mapping[str, Option], entry: Mapping[str, Any]) -> Option | None:
    """The option that names the same source, conversation column and tags (a tag it leaves out is the default)."""
    tags = entry.get("tags", {})
    for option in datasets.values():
        data = option.data
        if data.get("source") != entry["source"] or data.get("messages", "messages") != entry["messages"]:
            continue
        theirs = {**TAG_DEFAULTS, **(data.get("tags") or {})}
        if all(theirs[k] == tags.get(k, default) for k, default in TAG_DEFAULTS.items()):
            return option
    return None


def dataset_name(stem: str, datasets: Mapping[str, Option], files: Mapping[str, str], sweep: str) -> str:
    """A new dataset option's name: the source's, with the sweep's name where a shipped option has it, and a suffix
    where the original names two sources alike."""
    name = snake(stem)
    if name in datasets and datasets[name].shipped:
        name = f"{sweep}_{name}"
    while f"dataset/{name}.yaml" in files:
        name += "_2"
    return name


def dataset_text(name: str, entry: Mapping[str, Any], what: str) -> str:
    head = comment(f"{name}: {entry['source']}, imported by `sft-grid import` from {what}.")
    head.append(f"# Use: sft-grid run dataset={name}")
    return "\n".join([*head, *block({name: entry}, {})]) + "\n"


# -- the sweep file ---------------------------------------------------------------------------------------------


def sweep_text(result: Result, sweep: Mapping[str, Any], comments: Mapping[str, str], cluster: str | None) -> str:
    """The sweep: the options it selects, its values commented with where each came from, what was assumed in its
    head, and `extra` (the backend keys sft_grid does not model) last."""
    name = result.name
    defaults = []
    if cluster:
        defaults.append(f"  - override /cluster: {cluster}")
    defaults.append(f"  - override /backend: {result.kind}")
    defaults.append(f"  - override /model: {result.model}")
    datasets = result.datasets
    shown = datasets[0] if len(datasets) == 1 else "[" + ", ".join(datasets) + "]"
    defaults.append(f"  - override /dataset: {shown}")
    head = [
        "# @package _global_",
        *comment(f"{name}: imported by `sft-grid import` from {result.what}."),
        f"#   sft-grid run -m +sweep={name} dry_run=true     # render it and check it",
        f"#   sft-grid run -m +sweep={name}                  # train it",
    ]
    for assumed in result.assumed:
        head += comment(f"Assumed: {assumed}")
    body = {"sweep_name": name, **sweep}
    extra = body.pop("extra", None)
    lines = [*head, "defaults:", *defaults, *block(body, comments)]
    if extra:
        lines.append(f"# {TITLE[result.kind]} keys sft_grid does not model, passed to the backend as they are")
        lines += yaml.safe_dump({"extra": escape(extra)}, sort_keys=False, width=118).splitlines()
    return "\n".join(lines) + "\n"


# -- YAML text ------------------------------------------------------------------------------------------------------


def snake(text: str) -> str:
    """An option name from a hub id's last part or a file's stem: lower case, words joined by _."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "imported"


def escape(value: Any) -> Any:
    """Text for OmegaConf: a `${` that is the original's own text, not an interpolation of Hydra's."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape(v) for v in value]
    return value


def flow(value: Any) -> str:
    """One value as YAML on one line."""
    text = yaml.safe_dump(escape(value), default_flow_style=True, width=10**6, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def comment(text: str) -> list[str]:
    """A comment of the generated files, wrapped within the line length."""
    return textwrap.wrap(text, width=118, initial_indent="# ", subsequent_indent="#   ", break_on_hyphens=False)


def block(mapping: Mapping[str, Any], comments: Mapping[str, str], indent: int = 0) -> list[str]:
    """A mapping as YAML lines, each scalar with its comment (keyed by the dotted path from this mapping)."""
    out: list[str] = []
    pad = " " * indent
    for key, value in mapping.items():
        note = comments.get(key)
        if isinstance(value, dict) and value:
            out.append(f"{pad}{flow(key)}:" + (f"  # {note}" if note else ""))
            inner = {k.removeprefix(f"{key}."): v for k, v in comments.items() if k.startswith(f"{key}.")}
            out += block(value, inner, indent + 2)
        else:
            line = f"{pad}{flow(key)}: {flow(value)}"
            if note and len(line) + len(note) + 4 > 120:
                out += [f"{pad}{c}" for c in comment(note)]
                note = ""
            out.append(line + (f"  # {note}" if note else ""))
    return out
