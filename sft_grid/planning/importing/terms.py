"""What an import is asked (`Request`, with the options there are), what it reads (`Original`), what it answers
(`Result`: the files and where each key went), and how it refuses (`Refused`); the two backends it reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LF = "llamafactory"
AX = "axolotl"
TITLE = {LF: "LLaMA-Factory", AX: "axolotl"}
# "a LLaMA-Factory config", "an axolotl config"
ARTICLE = {LF: "a", AX: "an"}


class Refused(ValueError):
    """Input the import cannot take: what, where, and the fix (a line, or a line for each of several problems)."""


@dataclass(frozen=True)
class Option:
    """A config group option as the caller found it (the project's or a shipped one): reused when it says the same."""

    name: str
    path: Path
    data: Mapping[str, Any]  # a model's keys; a dataset's entry (the mapping under its name)
    shipped: bool


@dataclass(frozen=True)
class Request:
    """What to import and what the caller knows besides: the options there are, and the world size's parts."""

    source: Path | None  # the file (a YAML, or a script with the launcher's command line)
    argv: tuple[str, ...] = ()  # ... or the launcher's command line itself
    name: str | None = None  # the sweep's name (default: from the file or the launcher's --job_name)
    cluster: str | None = None  # the cluster option the sweep selects
    cluster_gpus: int | None = None  # that cluster's gpus_per_node
    nodes: int | None = None
    gpus_per_node: int | None = None
    params_b: float | None = None
    tokenizer_family: str | None = None
    models: Mapping[str, Option] = field(default_factory=dict)
    datasets: Mapping[str, Option] = field(default_factory=dict)
    cwd: Path = Path(".")


@dataclass
class Result:
    """The options the original amounts to (`files`: path under the config folder -> text) and where each key
    went."""

    kind: str
    what: str  # "a LLaMA-Factory training config", "the old launcher's command line over ..."
    name: str
    files: dict[str, str] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)
    mapped: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    decided: list[tuple[str, str]] = field(default_factory=list)
    not_carried: list[tuple[str, str]] = field(default_factory=list)
    model: str = ""
    datasets: list[str] = field(default_factory=list)


@dataclass
class Original:
    """The original as one backend config (the launcher's flags merged over its base YAML, as the launcher did)."""

    kind: str
    config: dict[str, Any]
    base: Path  # the folder its relative paths are read from first (the YAML's)
    what: str
    # from the launcher's flags: the world size's parts, the wall time, what it said that is not a trainer key
    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    job_name: str | None = None
    launcher: dict[str, Any] = field(default_factory=dict)
    file_stem: str = "imported"
    launched: bool = False  # the old launcher's command line (its rules apply: FSDP without deepspeed, ...)
    script: Path | None = None  # the launcher's script, whose folder relative paths are read from too
    flags: frozenset[str] = frozenset()  # the trainer flags the command line gave
