"""Put the chat template in effect into a saved tokenizer's tokenizer_config.json (standalone, stdlib only).

transformers 5 saves a tokenizer's chat template to a separate chat_template.jinja by default, and serving
stacks that read only tokenizer_config.json then render without it (tool calls are dropped). The repair
writes the template into tokenizer_config.json (keys sorted) and makes any .jinja file beside it say the
same. It is idempotent: a directory that already carries the template is left byte for byte as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Template = str | dict[str, Any]
CONFIG = "tokenizer_config.json"
DEFAULT_JINJA = "chat_template.jinja"
MORE_JINJA = "additional_chat_templates"


def config_value(template: Template) -> str | list[dict[str, str]]:
    """How tokenizer_config.json holds a template: a string, or named templates as a list."""
    if isinstance(template, dict):
        return [{"name": name, "template": text} for name, text in sorted(template.items())]
    return template


def _write(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True


def expected_jinja(directory: Path, template: Template) -> dict[Path, str]:
    """The .jinja files present in `directory` and what each must say."""
    named = template if isinstance(template, dict) else {"default": template}
    out: dict[Path, str] = {}
    default = directory / DEFAULT_JINJA
    if default.is_file() and "default" in named:
        out[default] = named["default"]
    for path in sorted((directory / MORE_JINJA).glob("*.jinja")):
        if path.stem in named:
            out[path] = named[path.stem]
    return out


def repair(directory: str | Path, template: Template) -> list[str]:
    """Make `directory`'s tokenizer files carry `template`; returns the files it changed (none the 2nd time)."""
    directory = Path(directory)
    changed = []
    config_file = directory / CONFIG
    if config_file.is_file():
        data = json.loads(config_file.read_text(encoding="utf-8"))
        data["chat_template"] = config_value(template)
        if _write(config_file, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"):
            changed.append(CONFIG)
    for path, text in expected_jinja(directory, template).items():
        if _write(path, text):
            changed.append(str(path.relative_to(directory)))
    return changed


def check(directory: str | Path, template: Template) -> list[str]:
    """What is wrong with `directory`'s tokenizer files (empty when they carry `template`)."""
    directory = Path(directory)
    config_file = directory / CONFIG
    if not config_file.is_file():
        return [f"{config_file} is missing"]
    problems = []
    if json.loads(config_file.read_text(encoding="utf-8")).get("chat_template") != config_value(template):
        problems.append(f"{config_file} does not carry the chat template in effect")
    for path, text in expected_jinja(directory, template).items():
        if path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} differs from the chat template in effect")
    return problems
