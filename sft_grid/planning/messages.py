"""Messages for input Hydra could not compose: the valid keys or options, and the closest one."""

from __future__ import annotations

import difflib
import re
from dataclasses import fields, is_dataclass
from typing import Iterable, Sequence

from sft_grid.core import schema
from sft_grid.core.paths import CONF_DIR
from sft_grid.core.problems import Problem

_NOT_IN = re.compile(r"Key '(?P<key>[^']+)' not in '(?P<type>\w+)'")
_ENV_UNSET = re.compile(r"environment variable (?P<var>\w+) is not set")
_NOT_FOUND = re.compile(r"Could not find '(?P<group>[^'/]+)/(?P<option>[^']+)'")


def did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _schema_keys(type_name: str) -> list[str] | None:
    cls = getattr(schema, type_name, None)
    if cls is None or not is_dataclass(cls):
        return None
    return [f.name for f in fields(cls)]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def key_hint(message: str) -> str | None:
    """The valid keys (and the closest one) for an unknown-key error, or the options for an unknown option."""
    match = _NOT_IN.search(message)
    if match:
        valid = _schema_keys(match.group("type"))
        if valid:
            return f"valid keys of {match.group('type')}: {', '.join(valid)}{did_you_mean(match.group('key'), valid)}"
    match = _NOT_FOUND.search(message)
    if match:
        found = options(match.group("group"))
        if found:
            return f"{match.group('group')} is one of {', '.join(found)}{did_you_mean(match.group('option'), found)}"
    return None


def malformed_override(argv: Sequence[str]) -> str | None:
    """Which command-line override Hydra's grammar refuses, and how to write it (None: they all parse)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue  # a flag (-m, --cfg) or its value
        try:
            parser.parse_override(arg)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:200]
            return (f"the override {arg!r} is malformed ({detail}): write key=value, a sweep as key=a,b, a list as"
                    f" key=[a,b] (quoted in the shell: 'key=[a,b]'), a new key as +key=value")
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
