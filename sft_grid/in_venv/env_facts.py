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

With --lm-eval-tasks, OUT.json is {"tasks": [...], ...}: the names lm-eval's own task index (TaskManager.all_tasks:
its tasks, groups and tags) knows, the harness's own YAMLs without a DIR (~10 s: it reads ~15k of them), else the
YAMLs under the DIRs alone (lm-eval's --include_path; milliseconds, ~10 s more where a group of them names lm-eval's
own tasks), with the Hub datasets each name reads and the YAMLs lm-eval's index would skip (lm_eval_tasks).
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


# datasets' own loaders of local files (dataset_path: json with dataset_kwargs.data_files): not Hub repositories
LOCAL_LOADERS = {"json", "csv", "parquet", "arrow", "text", "pandas", "xml", "sql", "webdataset", "generator"}
LOCAL_LOADERS |= {"imagefolder", "audiofolder", "videofolder"}


def lm_eval_tasks(include: list[str]) -> dict[str, Any]:
    """lm-eval's task index (its own YAMLs, or those under the include directories alone), read as its TaskIndex
    reads it (tasks/_index.py: each *.yaml with its includes resolved, `!function` left unresolved, no task built):
    {"tasks": every name, "files": name -> its YAML (a tag: its first task's; relative to lm-eval's tasks folder
    for its own), "datasets": name -> the Hub datasets it reads, "unknown": names whose datasets cannot be read
    without running code (a Python task class, a custom_dataset function)}; with include directories also
    {"broken": [[file, why]]: YAMLs its index skips without a word (a YAML error, a missing include), "duplicates":
    [[name, kept, skipped]]: a name two of them define, the second skipped with a warning}."""
    from pathlib import Path

    from lm_eval.tasks import _index

    shipped = Path(_index.__file__).parent
    roots = [Path(d).expanduser() for d in include] or [shipped]
    index: dict[str, Any] = {}
    broken: list[list[str]] = []
    duplicates: list[list[str]] = []
    for root in roots:  # TaskIndex.build, with what it skips written down
        own: dict[str, Any] = {}
        broken += [[str(p), "lm-eval reads *.yaml files only"] for p in sorted(root.rglob("*.yml"))]
        for path in _index.TaskIndex._iter_yaml_files(root):
            try:
                cfg = _index.load_yaml(path, resolve_func=False, recursive=True)
                name = cfg.get("group") or cfg.get("task")
                if isinstance(name, str) and name in own:  # process_cfg skips it (a warning, or not a word)
                    kept = own[name].yaml_path
                    duplicates.append(
                        [name, str(kept) if kept else f"the tag of {sorted(own[name].tags)[0]}", str(path)]
                    )
                _index.TaskIndex.process_cfg(cfg, path, own)
            except Exception as exc:
                why = _load_error(exc)
                if why:
                    broken.append([str(path), why])
        index.update(own)  # later paths override earlier ones (TaskManager: lm-eval's own first)
    registry = index
    if include and any(r not in index for e in index.values() for r in _references(e)):
        registry = {**_index.TaskIndex.build([shipped]), **index}  # a team group of lm-eval's tasks: as the job
    datasets: dict[str, list[str]] = {}
    unknown: list[str] = []
    for name in index:
        found: set[str] = set()
        datasets[name] = sorted(i for i in _datasets_of(registry[name], None, registry, found, 0) if i not in ("", "?"))
        if "?" in found:
            unknown.append(name)

    def where(entry: Any) -> str | None:
        path = entry.yaml_path
        if path is None and entry.tags:  # a tag: its first task's YAML
            first = index.get(sorted(entry.tags)[0])
            path = first.yaml_path if first is not None else None
        if path is None:
            return None
        return str(path.relative_to(shipped)) if not include and path.is_relative_to(shipped) else str(path)

    out = {
        "tasks": sorted(index),
        "files": {n: where(e) for n, e in index.items()},
        "datasets": datasets,
        "unknown": sorted(unknown),
    }
    return {**out, "broken": broken, "duplicates": duplicates} if include else {**out, "root": str(shipped)}


def _load_error(exc: Exception) -> str:
    """Why lm-eval's index skips a YAML, where that is a mistake (a YAML error, with its line; an include that is
    missing or a cycle); "" for a YAML that is no task config (a template other YAMLs include, a data file)."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark, context = exc.problem_mark, exc.context_mark
        where = f" ({exc.context} at line {context.line + 1})" if exc.context and context is not None else ""
        return f"YAML error at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}{where}"
    if isinstance(exc, yaml.YAMLError | OSError) or "Include cycle" in str(exc):
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return ""


def _references(entry: Any) -> list[str]:
    """The names a group's `task:` list or a tag names (what its index must hold to build it)."""
    if entry.kind.name == "TAG":
        return sorted(entry.tags)
    members = (entry.cfg or {}).get("task") if entry.kind.name == "GROUP" else None
    if not isinstance(members, list):
        return []
    names = [m if isinstance(m, str) else m.get("task") or m.get("group") for m in members if isinstance(m, str | dict)]
    return [n for n in names if isinstance(n, str)]  # an inline one counts as one: the index is built whole for it


def _datasets_of(
    entry: Any, overrides: dict[str, Any] | None, registry: dict[str, Any], found: set[str], depth: int
) -> set[str]:
    """The Hub datasets a task, group or tag reads, as lm-eval's TaskFactory builds it (tasks/_factory.py: a group
    passes its non-group keys down to its members, a member's own keys win; a name not in the index is an inline
    task), without building it (building a task loads its dataset). "?" for one that cannot be read here."""
    if depth > 32:  # a cycle of groups: lm-eval recurses without end, the name check's job
        return found
    kind = entry.kind.name
    if kind == "TAG":
        for name in sorted(entry.tags):
            if name in registry:
                found.add(_hub_id({**(registry[name].cfg or {}), **(overrides or {})}))
        return found
    if kind != "GROUP":
        found.add(_hub_id({**(entry.cfg or {}), **(overrides or {})}))
        return found
    _group(entry.name, entry.cfg or {}, overrides, registry, found, depth)
    return found


def _group(
    name: str, cfg: dict[str, Any], overrides: Any, registry: dict[str, Any], found: set[str], depth: int
) -> None:
    from lm_eval.config.group import GroupConfig  # a dataclass, no task code

    fields = set(GroupConfig.__dataclass_fields__)
    merged = {**{k: v for k, v in cfg.items() if k not in fields}, **(overrides or {})}
    members = cfg.get("task")
    for item in members if isinstance(members, list) else []:
        if isinstance(item, dict) and "group" in item:
            rest = {k: v for k, v in item.items() if k != "group"}
            if item["group"] in registry:
                _datasets_of(registry[item["group"]], {**merged, **rest}, registry, found, depth + 1)
            else:
                _group(f"{name}::{item['group']}", item, merged, registry, found, depth + 1)
            continue
        if isinstance(item, dict) and "task" in item:
            base, mine = item["task"], {**merged, **item}
        elif isinstance(item, str):
            base, mine = item, merged
        else:
            continue
        if base not in registry:  # an inline task: its own keys
            found.add(_hub_id(mine))
            continue
        child = registry[base]
        if child.kind.name == "TAG":
            for task in sorted(child.tags):
                if task in registry:
                    found.add(_hub_id({**(registry[task].cfg or {}), "task": task, **mine}))
        else:
            _datasets_of(child, {"task": base, **mine} if child.kind.name != "GROUP" else mine, registry, found, depth)


def _hub_id(cfg: dict[str, Any]) -> str:
    """The Hub dataset a task's config loads (datasets.load_dataset(dataset_path)): "" for none (a local loader,
    a local path), "?" for one only its code says (a custom_dataset function, a Python class's DATASET_PATH that
    is not a plain string in its module)."""
    if cfg.get("custom_dataset"):
        return "?"
    path = cfg.get("dataset_path")
    if path is None and "class" in cfg:
        path = _class_dataset(str(cfg["class"]))
    if not isinstance(path, str) or not path:
        return "?" if path is None and "class" in cfg else ""
    if path in LOCAL_LOADERS or path.startswith(("/", ".", "~")):
        return ""
    return path


def _class_dataset(ref: str) -> str | None:
    """A Python task class's DATASET_PATH (`class: !function task.SQuAD2`: <dir>/task.SQuAD2), read from its
    module's source (its own or a base class's of the same module), not imported."""
    import ast
    from pathlib import Path

    module, _, name = ref.rpartition(".")
    try:
        tree = ast.parse(Path(module + ".py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
    seen: set[str] = set()
    while name in classes and name not in seen:
        seen.add(name)
        for stmt in classes[name].body:
            if isinstance(stmt, ast.Assign) and any(getattr(t, "id", "") == "DATASET_PATH" for t in stmt.targets):
                value = stmt.value.value if isinstance(stmt.value, ast.Constant) else None
                return value if isinstance(value, str) else None
        bases = [b.id for b in classes[name].bases if isinstance(b, ast.Name)]
        name = bases[0] if bases else ""
    return None


def main(argv: list[str]) -> int:
    if "--lm-eval-tasks" in argv:
        with open(argv[0], "w") as fh:
            json.dump(lm_eval_tasks(argv[argv.index("--lm-eval-tasks") + 1 :]), fh)
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
