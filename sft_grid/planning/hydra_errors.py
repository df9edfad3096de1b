"""What Hydra and OmegaConf refuse while composing a cell, said for a user: the key, the value, what the key takes
and the fix. Their messages are read here once (a key not in the schema: the valid keys and the closest; an option
not found: the group's options, or the file Hydra does not read; a value of the wrong type or shape: what the key
takes, written as it would be; an unset environment variable: the key that reads it), for a single run's hint
(`key_hint`) and for a grid's problem (`composition_problem`) alike."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

from sft_grid.core import project, schema
from sft_grid.core.problems import Problem

_NOT_IN = re.compile(r"Key '(?P<key>[^']+)' not in '(?P<type>\w+)'")
_ENV_UNSET = re.compile(r"environment variable (?P<var>\w+) is (?:not set|empty)")
_NOT_FOUND = re.compile(r"Could not find '(?P<group>[^'/]+)/(?P<option>[^']+)'")
# OmegaConf's words for a value of the wrong type, and the key it names on a line of its own
_NOT_TYPED = re.compile(
    r"Value '(?P<value>.*?)'(?: of type '\w+')? (?:could not be converted to|is not a valid) (?P<type>[A-Za-z]+)"
)
_FULL_KEY = re.compile(r"full_key: (?P<key>\S+)")
_TYPE_WORDS = {"float": "a number (2e-05, 0.1, 3)", "integer": "a whole number (4)", "bool": "true or false"}


def type_words(message: str) -> str | None:
    """What a value must be, in words ("a number (2e-05, 0.1, 3)"), from OmegaConf's refusal of a value of the wrong
    type ("Value 'abc' of type 'str' could not be converted to Float"); None for another error."""
    typed = _NOT_TYPED.search(message)
    if typed is None:
        return None
    word = typed.group("type").lower()
    return _TYPE_WORDS.get(word, f"a {word}")


def did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _schema_keys(type_name: str) -> list[str] | None:
    cls = getattr(schema, type_name, None)
    if cls is None or not is_dataclass(cls):
        return None
    return [f.name for f in fields(cls)]


def options(group: str) -> list[str]:
    return project.options(group)


# OmegaConf's refusals of a value of the wrong shape (a string for a list, a list for a mapping, a list for the whole
# option), read here once: Hydra's "In 'group/option'" names the file, OmegaConf's full_key the key (or nothing)
_IN_CONFIG = re.compile(r"In '(?P<group>[^'/]+)/(?P<option>[^']+)'")
_SHAPE = re.compile(
    r"is not a ListConfig|Cannot merge \w+Config with \w+Config|Cannot assign \w+ to (?:Dict|List)"
    r"|is not a subclass of \w+Conf|Invalid type assigned: \w+ is not a subclass"
)
_ENV_MISSING = re.compile(r"Environment variable '(?P<var>[^']+)' not found")


def _takes(hint: Any) -> str | None:
    """'list' or 'mapping' for a schema type that holds one (list[str], a section, dict[str, Any]), else None."""
    import typing

    origin = typing.get_origin(hint)
    if origin is list or hint is list:
        return "list"
    if origin is dict or hint is dict or (isinstance(hint, type) and is_dataclass(hint)):
        return "mapping"
    return None


def _yaml_value(value: Any) -> str:
    """A value as YAML's flow style writes it on one line (`[module load cuda]`, `{A: 1}`)."""
    import yaml

    return str(yaml.safe_dump(value, default_flow_style=True, width=10_000)).strip().removesuffix("...").strip()


def _example(key: str, value: Any, hint: Any, takes: str) -> str:
    """The key written with the shape it takes, from what it holds where that can be kept."""
    if takes == "list":
        return f"{key}: {_yaml_value([value] if value is not None and not isinstance(value, dict) else ['<item>'])}"
    if isinstance(value, list) and value and all(isinstance(v, str) and "=" in v for v in value):
        return f"{key}: {_yaml_value(dict(v.split('=', 1) for v in value))}"  # env: [A=1] -> env: {A: '1'}
    if isinstance(hint, type) and is_dataclass(hint):
        return f"{key}: {{{', '.join(f'{f.name}: <value>' for f in fields(hint)[:2])}, ...}}"
    return f"{key}: {{<key>: <value>, ...}}"


def _option_file(message: str) -> tuple[str, str, Any] | None:
    """(the file as shown, its group, its YAML data) of the option Hydra's error names (`In 'model/x'`)."""
    from sft_grid.planning.conf_files import _shown, option_data

    where = _IN_CONFIG.search(message)
    path = project.find_option(where.group("group"), where.group("option")) if where else None
    if where is None or path is None:
        return None
    return _shown(str(path)), where.group("group"), option_data(path)


def _wrong_shapes(data: Any, prefix: str) -> list[tuple[str, str, Any, Any, str]]:
    """(key in the file, the cell's key, the value, its schema type, what it takes) of each value of an option file
    that is not the shape its key takes (a string where a list goes, a list where a mapping goes)."""
    found = []
    for key, value in data.items() if isinstance(data, dict) else ():
        full = f"{prefix}.{key}" if prefix else str(key)
        hint = schema_type(full)
        takes = _takes(hint)
        if value is None or takes is None or (isinstance(value, str) and value.startswith("${")):
            continue
        if (takes == "list") != isinstance(value, list) or (takes == "mapping") != isinstance(value, dict):
            found.append((str(key), full, value, hint, takes))
        elif takes == "mapping" and isinstance(hint, type) and is_dataclass(hint):
            found += [(f"{key}.{k}", f, v, h, t) for k, f, v, h, t in _wrong_shapes(value, full)]
    return found


def shape_problem(message: str) -> tuple[str, str] | None:
    """(the cell's key, what to write) for OmegaConf's refusal of a value of the wrong shape in an option file, with
    the file, the key, what it holds and what it takes; None for another error."""
    if not _SHAPE.search(message):
        return None
    where, named = _option_file(message), _FULL_KEY.search(message)
    if where is None:
        return None
    shown, group, data = where
    prefix = "" if group == "sweep" else group
    package = schema_type(prefix) if prefix else schema.CellConf
    if prefix and _takes(package) == "mapping" and not isinstance(data, dict):
        what = "a YAML list ('- ' items)" if isinstance(data, list) else f"the value {data!r}"
        merged = {k: v for d in data if isinstance(d, dict) for k, v in d.items()} if isinstance(data, list) else {}
        return prefix, (
            f"{shown} is {what}: an option's file is a mapping of its keys, one a line with no '- ' before it"
            + (f" ({', '.join(f'{k}: {_yaml_value(v)}' for k, v in merged.items())})" if merged else "")
        )
    if group == "dataset" and isinstance(data, dict) and _takes(package) == "mapping" and not is_dataclass(package):
        import typing

        inner = typing.get_args(package)[-1]  # a dataset option is keyed by its name: {name: {source: ...}}
        name = where[0].rsplit("/", 1)[-1].rsplit(".", 1)[0]
        keys = {f.name for f in fields(inner)} if isinstance(inner, type) and is_dataclass(inner) else set()
        if set(map(str, data)) & keys:
            return "dataset", (
                f"{shown} holds a dataset's keys ({', '.join(map(str, data))}) at its top: a dataset option is keyed"
                f" by its name, its keys indented under it ({name}: then source: ... on the next line, indented)"
            )
    wrong = _wrong_shapes(data, prefix)
    if named:
        wrong = sorted(wrong, key=lambda w: w[1] != named.group("key"))
    if not wrong:
        return None
    key, full, value, hint, takes = wrong[0]
    kind = "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else "one value"
    if full in project.GROUPS and isinstance(value, str):  # `model: tiny_llama` meant as the group's option
        return full, (
            f"{shown}: {key} holds {value!r}, and {full} is a config group: its option is chosen in the defaults"
            f" list (defaults: [override /{full}: {value}], with `# @package _global_`), or swept as an axis"
            f" (hydra.sweeper.params.{full}: {value}), not set as a key"
        )
    return full, (
        f"{shown}: {key} holds {kind}, {_yaml_value(value)}; {full} takes a {takes}:"
        f" {_example(key.rsplit('.', 1)[-1], value, hint, takes)}"
    )


def env_problem(message: str) -> tuple[str, str] | None:
    """(the key, the fix) for an `${oc.env:VAR}` whose variable is not set; None for another error."""
    env = _ENV_MISSING.search(message)
    if env is None:
        return None
    named = _FULL_KEY.search(message)
    var = env.group("var")
    key = named.group("key") if named else ""
    fix = f"{var} is not set: export {var}=<value>, or give it a default: ${{oc.env:{var},/fallback}}"
    return key, (f"{key} reads ${{oc.env:{var}}}, and " if key else "") + fix


def misplaced_option(group: str, option: str) -> str | None:
    """Where an option Hydra could not find is, when its file is there under a name Hydra does not read: with the
    extension .yml (Hydra reads .yaml only), or in a folder that is no config group (conf/models/ for conf/model/)."""
    from sft_grid.planning.conf_files import _shown

    for conf in project.search_dirs():
        for path in (conf / group / f"{option}.yml", conf / group / f"{option}.YAML"):
            if path.is_file():
                return f"{_shown(str(path))} exists: an option's file must end in .yaml (rename it {option}.yaml)"
        siblings = [d for d in conf.iterdir() if d.is_dir() and d.name != group] if conf.is_dir() else []
        for folder in siblings:
            if folder.name in project.GROUPS or not difflib.get_close_matches(group, [folder.name], n=1, cutoff=0.75):
                continue
            if any((folder / f"{option}{ext}").is_file() for ext in (".yaml", ".yml")):
                return (
                    f"{_shown(str(folder))}/ is not a config group: did you mean {_shown(str(conf / group))}/?"
                    f" (move {option}.yaml into it)"
                )
    return None


_NOT_OPTIONAL = re.compile(r"field '(?P<key>[^']+)' is not Optional")
_NONE_SCALAR = re.compile(r"Incompatible value 'None' for field of type")


def null_problem(message: str) -> tuple[str, str] | None:
    """(the key, what to write) for a key left empty where it takes a value (`adaptive:` with only comments under
    it, `lr:` with nothing after: YAML's null), which OmegaConf refuses as "not Optional"; None for another error."""
    empty, named = _NOT_OPTIONAL.search(message), _FULL_KEY.search(message)
    if empty is None and not (_NONE_SCALAR.search(message) and named):
        return None
    key = empty.group("key") if empty else named.group("key") if named else ""
    where = _option_file(message)
    shown = f"{where[0]}: " if where else ""
    kind = _takes(schema_type(key))
    fill = (
        f"delete the line `{key.rsplit('.', 1)[-1]}:` (the block is optional), or fill it, one key a line indented"
        " under it"
        if kind == "mapping"
        else f"give it its value, or delete the line to keep the default ({key}=<value> on the command line)"
    )
    return key, f"{shown}{key} is empty (YAML's null: nothing after its colon, or only comments under it): {fill}"


def told(message: str) -> tuple[str, str] | None:
    """(the key, what to write) where OmegaConf's refusal is one of those read here: an unset ${oc.env:VAR}, a value
    of the wrong shape, a key left empty."""
    return env_problem(message) or shape_problem(message) or null_problem(message)


def key_hint(message: str) -> str | None:
    """The valid keys (and the closest one) for an unknown-key error, or the options for an unknown option."""
    read = told(message)
    if read:
        return read[1]
    match = _NOT_IN.search(message)
    if match:
        valid = _schema_keys(match.group("type"))
        if valid:
            return f"valid keys of {match.group('type')}: {', '.join(valid)}{did_you_mean(match.group('key'), valid)}"
    typed, where, kind = _NOT_TYPED.search(message), _FULL_KEY.search(message), type_words(message)
    if typed and where and kind:
        return f"{where.group('key')} takes {kind}, not {typed.group('value')!r}: {where.group('key')}=<value>"
    match = _NOT_FOUND.search(message)
    if match and (misplaced := misplaced_option(match.group("group"), match.group("option"))):
        return misplaced
    if match:
        found = options(match.group("group"))
        if found:
            return f"{match.group('group')} is one of {', '.join(found)}{did_you_mean(match.group('option'), found)}"
    return None


def malformed_override(argv: Sequence[str]) -> str | None:
    """Which command-line override Hydra's grammar refuses, and how to write it (None: they all parse)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for before, arg in zip(["", *argv], argv, strict=False):
        bare = "=" not in arg and not arg.startswith(("-", "~", "+")) and before not in VALUE_FLAGS
        cell = _a_cell(arg) if bare else None
        if cell:
            return cell
        if bare:
            return _bare_word(arg)
        if arg.startswith("-") or "=" not in arg:
            continue  # a flag (-m, --cfg) or its value
        try:
            parser.parse_override(arg)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:200]
            return (
                f"the override {arg!r} is malformed ({detail}): write key=value, a sweep as key=a,b, a list as"
                f" key=[a,b] (quoted in the shell: 'key=[a,b]'), a new key as +key=value"
            )
    return None


# Hydra's flags that take the next word as their value (--config-name NAME, --cfg job, ...)
VALUE_FLAGS = frozenset(
    [
        *("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"),
        *("--info", "-i", "--experimental-rerun", "--shell-completion", "-sc"),
    ]
)


def _bare_word(arg: str) -> str:
    """The hint for a word without `=` given to `run` (Hydra: "missing EQUAL"): the group whose option it names (or
    nearly names), or how an override is written."""
    said = f"{arg!r} is no override: run takes key=value"
    for group in project.GROUPS:
        close = [arg] if arg in options(group) else difflib.get_close_matches(arg, options(group), n=1)
        if close:
            if close == [arg]:
                return f"{said}, and {arg} is an option of {group}: {group}={arg}"
            return f"{said}; did you mean {group}={close[0]}?"
    return f"{said}: a group's option as model=<option>, a key as lr=2e-5, a sweep file as +sweep=<name>"


# a cell's name: its slug, then its identity's 8 hex digits (planning/cells.py)
_CELL_NAME = re.compile(r".+-[0-9a-f]{8}")


def _a_cell(arg: str) -> str | None:
    """The hint for a cell's directory or name given to `run` as if it were an override: how a cell is rerun."""
    from pathlib import Path

    from sft_grid.core.layout import CELL_FILE

    path = Path(arg).expanduser()
    if (path / CELL_FILE).is_file():
        rerun = next((line for line in _head(path / CELL_FILE) if line.startswith("# Rerun this cell:")), "")
        line = rerun.removeprefix("# Rerun this cell:").strip()
        return (
            f"{arg} is a cell's directory, not an override: run takes key=value overrides; this cell is rerun by"
            f" the line its cell.yaml records: {line or '(see its cell.yaml)'} (add force=true over a finished one)"
        )
    if _CELL_NAME.fullmatch(path.name) and "/" not in arg:
        return (
            f"{arg} looks like a cell's name, not an override: run takes key=value overrides; a cell is rerun by the"
            " line its cell.yaml records (# Rerun this cell: ...), and `sft-grid status GRID` / `logs GRID CELL`"
            " take its name"
        )
    return None


def _head(path: Any) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [next(fh, "").rstrip("\n") for _ in range(5)]
    except OSError:
        return []


_HYDRA_ESCAPE = re.compile(r"\\([\\()\[\]{}:=, \t])")


def composition_problem(overrides: Sequence[str], message: str) -> Problem:
    """A Problem for a cell that Hydra could not compose, with the valid keys when a key is unknown."""
    match = _NOT_IN.search(message)
    key = match.group("key") if match else ""
    read = told(message)
    if read:
        key = read[0]
    elif not key and _NOT_TYPED.search(message) and (where := _FULL_KEY.search(message)):
        key = where.group("key")
    env = _ENV_UNSET.search(message)
    fix = (
        key_hint(message)
        or (f"export {env.group('var')}=<value> (and any other variable named above)" if env else "")
        or "check the override against `sft-grid run --cfg job` and the options in conf/"
    )
    # as the user wrote them: Hydra's sweeper escapes a value's special characters (`$\{oc.env\:X\}`)
    overrides = [_HYDRA_ESCAPE.sub(r"\1", o) for o in overrides]
    # the value the override gave the key it names, so that the problem reads key=value as every other does
    given = [o.split("=", 1) for o in overrides if "=" in o]
    value = next((v for k, v in given if k.lstrip("+~") == key or k.endswith(f".{key}")), None) if key else None
    return Problem(
        cell=" ".join(overrides) or "<defaults>",
        key=key,
        value=value,
        rule="compose",
        message=plain_message(message),
        fix=fix,
    )


# OmegaConf's own framing of an error: the exception it wrapped, and where in its objects it happened
_WRAPPED = re.compile(r"^\w+ raised while resolving interpolation:\s*")
_OMEGA_DETAIL = re.compile(r"^(full_key|reference_type|object_type)\s*[:=]")


def plain_message(message: str) -> str:
    """An error of Hydra or OmegaConf as the user reads it: its first line, without OmegaConf's framing (the
    wrapped exception's name) and internals (full_key, reference_type, object_type: the user's key is named
    already), and the lines after it that say more (not the config search path)."""
    first, _, rest = message.partition("\n")
    first = _WRAPPED.sub("", first.strip())
    detail = " ".join(
        line.strip()
        for line in rest.splitlines()
        if line.strip()
        and "search path" not in line.lower()
        and not line.strip().startswith("provider=")
        and not _OMEGA_DETAIL.match(line.strip())
    )
    return first + (f" ({detail})" if detail else "")


# -- config-group overrides Hydra crashes on or quietly misreads --------------------------------------------------


def schema_type(key: str) -> Any:
    """The schema's type of a dotted key of a cell (`seed`: int, `cluster.nodes`: int), None where it has none."""
    import types
    import typing

    node: Any = schema.CellConf
    for part in key.split("."):
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        hint = typing.get_type_hints(node).get(part)
        if hint is None:
            return None
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
            hint = args[0]  # X | None: the key takes an X
        node = hint
    return node
