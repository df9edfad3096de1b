"""What a backend's environment can load (standalone: runs with the environment's python, never imports sft_grid).

    <backend env>/bin/python env_facts.py OUT.json [--transformers] MODULE...
    <backend env>/bin/python env_facts.py OUT.json --config-keys llamafactory|axolotl
    <harness env>/bin/python env_facts.py OUT.json --lm-eval-tasks [DIR...]

OUT.json: {"modules": {MODULE: importable}} (found, not imported: milliseconds), and with --transformers also
{"transformers": version, "model_types": [...], "architectures": [...]}: the model types transformers' AutoConfig
knows and the architecture classes its Auto model mappings name, so a model directory's config.json can be checked
against what this environment's transformers would load (without importing the model classes: seconds).

With --config-keys, OUT.json is {"config_keys": [...], "config_kinds": {key: kind}}: the keys the backend's own
config parser takes, and what each takes where that is one plain kind (an int, a float, a bool, one of a Literal's or
an Enum's values), read from
its classes (seconds: they import transformers). LLaMA-Factory's training parser is an HfArgumentParser over its
argument dataclasses, which refuses any other key; axolotl's is its pydantic config model, which ignores any other
key, with each of its bundled plugins' arguments added (a plugin's keys count where the config lists it).

With --lm-eval-tasks, OUT.json is {"tasks": [...]}: the names lm-eval's own task index (TaskManager.all_tasks: its
tasks, groups and tags) knows, the harness's own YAMLs without a DIR (~13 s: it reads ~15k of them), else the
YAMLs under the DIRs alone (lm-eval's --include_path; milliseconds).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any


def transformers_facts() -> dict[str, Any]:
    try:
        import transformers
        from transformers.models.auto import modeling_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except Exception as exc:  # an environment without transformers: the modules are still answered
        return {"error": f"{type(exc).__name__}: {exc}"}
    archs: set[str] = set()
    for name in dir(modeling_auto):
        mapping = getattr(modeling_auto, name)
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            for value in mapping.values():
                archs.update(value if isinstance(value, (list, tuple)) else [value])
    return {
        "transformers": transformers.__version__,
        "model_types": sorted(CONFIG_MAPPING_NAMES),
        "architectures": sorted(archs),
    }


def kind_of(hint: Any) -> dict[str, Any] | None:
    """What a config field takes, where it is one plain kind: {"kind": "int" | "float" | "bool"}, or {"kind":
    "choice", "choices": [...]} (a Literal, an Enum); None for anything else (a str, a union of kinds, a mapping)."""
    import enum
    import types
    import typing

    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            return None
        hint = args[0]
    if hint in (bool, int, float):
        return {"kind": hint.__name__}
    if typing.get_origin(hint) is typing.Literal:
        values = list(typing.get_args(hint))
        return {"kind": "choice", "choices": values} if all(isinstance(v, str | int) for v in values) else None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        return {"kind": "choice", "choices": values} if all(isinstance(v, str | int) for v in values) else None
    return None


def config_keys(backend: str) -> dict[str, dict[str, Any] | None]:
    """Each key the backend's config parser takes, and what it takes where that is one plain kind (kind_of)."""
    import dataclasses
    import typing

    if backend == "llamafactory":
        from llamafactory.hparams import parser  # the classes get_train_args parses a training config with

        found: dict[str, dict[str, Any] | None] = {}
        for cls in parser._TRAIN_ARGS:
            try:
                hints = typing.get_type_hints(cls)
            except Exception:  # a hint that does not resolve here: the keys still count, their kinds are not said
                hints = {}
            for f in dataclasses.fields(cls):
                found.setdefault(f.name, kind_of(hints.get(f.name)))
        return found
    if backend == "axolotl":
        import importlib
        import pkgutil

        import axolotl.integrations
        from axolotl.utils.schemas.config import AxolotlInputConfig
        from pydantic import BaseModel

        models: list[type[BaseModel]] = [AxolotlInputConfig]
        for info in pkgutil.iter_modules(axolotl.integrations.__path__):
            try:
                args = importlib.import_module(f"axolotl.integrations.{info.name}.args")
            except Exception:  # a plugin whose own dependency is not installed: its keys are not asked for
                continue
            models += [v for v in vars(args).values() if isinstance(v, type) and issubclass(v, BaseModel)]
        keys: dict[str, dict[str, Any] | None] = {}
        for model in models:
            for name, field in model.model_fields.items():
                for key in (name, *(a for a in (field.alias, field.validation_alias) if isinstance(a, str))):
                    keys.setdefault(key, kind_of(field.annotation))
        return keys
    raise SystemExit(f"no config parser known for {backend!r}")


def lm_eval_tasks(include: list[str]) -> list[str]:
    from lm_eval.tasks import TaskManager

    if include:
        return sorted(TaskManager(include_path=include, include_defaults=False).all_tasks)
    return sorted(TaskManager().all_tasks)


def main(argv: list[str]) -> int:
    if "--lm-eval-tasks" in argv:
        with open(argv[0], "w") as fh:
            json.dump({"tasks": lm_eval_tasks(argv[argv.index("--lm-eval-tasks") + 1 :])}, fh)
        return 0
    if "--config-keys" in argv:
        backend = argv[argv.index("--config-keys") + 1]
        with open(argv[0], "w") as fh:
            found = config_keys(backend)
            json.dump({"config_keys": sorted(found), "config_kinds": {k: v for k, v in found.items() if v}}, fh)
        return 0
    modules = [m for m in argv[1:] if m != "--transformers"]
    out: dict[str, Any] = {"modules": {m: importlib.util.find_spec(m) is not None for m in modules}}
    if "--transformers" in argv[1:]:
        out.update(transformers_facts())
    with open(argv[0], "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
