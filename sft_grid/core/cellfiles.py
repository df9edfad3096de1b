"""The typed files a job reads from its cell directory, and the preflight `Check` they carry.

The grid renders them; the job (and `sft-grid post` on a login node) reads them back into these
types, so the job never re-composes from conf/ and never guesses at keys.

- cell.yaml: the cell's resolved config (`CellYaml`: the only reader of it; as data, and as the schema's
  `CellConf`);
- post.json: the post-training stages of the cell and what they need (the backend's python, the cluster's
  variables, the base model, the hub repository, the register command);
- preflight.json (only when something is deferred): the checks that could not run where the grid ran, which
  the job runs as its first step, before training.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sft_grid.core.layout import CELL_FILE, POST_FILE, PREFLIGHT_FILE
from sft_grid.core.schema import CellConf, typed

# the C loader where PyYAML was built with libyaml: a cell.yaml with a sweep's own tables is several kB
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Check:
    """One read-only check of a cell's input; equal checks (same input) run once for the whole grid."""

    # "path" | "model" | "integration" | "kernel" | "template_tokens" | "assistant_turns" | "loss_mask" | "prepared"
    # | "staged" | "tokenized"
    kind: str
    key: str  # the dotted key of the cell it is about
    target: str  # a local path or a hub id
    tokens: tuple[str, ...] = ()
    column: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    split: str = "train"
    # loss_mask: the backend, its venv's python, the tokenizer, the backend's settings (JSON)
    backend: str = ""
    python: str = ""
    model: str = ""
    spec: str = ""

    def describe(self) -> str:
        what = {
            "path": "the local path exists",
            "model": "the model directory has a config, weights, a vocabulary that covers its tokenizer and an"
            " architecture the backend's transformers knows",
            "integration": "the report_to integration is installed in the backend's environment",
            "kernel": "the layout's fast kernel is installed in the backend's environment",
            "template_tokens": "the template's special tokens are single tokens of the tokenizer",
            "assistant_turns": "the schema tags find assistant turns in a sample of the data",
            "loss_mask": f"the {self.backend} loss mask trains the assistant turns and nothing else",
            "prepared": "the model's prep succeeded",
            "staged": "the Hub input is staged in the cluster's cache",
            "tokenized": "the grid's shared tokenized dataset is built",
        }[self.kind]
        return f"{what} ({self.key}={self.target})"

    def to_json(self) -> dict[str, Any]:
        # the loss_mask fields only where set: other checks read as before
        return {k: v for k, v in asdict(self).items() if v or k not in ("backend", "python", "model", "spec")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        return cls(
            **{**data, "tokens": tuple(data.get("tokens", ())), "tags": tuple(tuple(t) for t in data.get("tags", ()))}
        )


@dataclass(frozen=True)
class Verdict:
    """A check's result: passed, failed (why, and the fix), or could not run here (`unreachable`)."""

    ok: bool
    message: str = ""
    fix: str = ""
    unreachable: bool = False


# Indented JSON is written by the pure-Python encoder; a grid's cells write the same small files again and again,
# so each distinct content (keyed by its compact JSON, from the C encoder) is indented once.
_DUMPED: dict[str, str] = {}


def dump_json(data: Any) -> str:
    key = json.dumps(data, default=str)
    text = _DUMPED.get(key)
    if text is None:
        if len(_DUMPED) > 16384:
            _DUMPED.clear()
        text = _DUMPED[key] = json.dumps(data, indent=2, default=str) + "\n"
    return text


_dump = dump_json


def read_json(directory: Path, name: str) -> Any:
    """A rendered JSON file of a directory, as data; None when there is none."""
    path = directory / name
    return json.loads(path.read_text()) if path.is_file() else None


# (deferred checks, python, variables) -> preflight.json's text
_PREFLIGHT_TEXTS: dict[tuple[Any, ...], str] = {}


@dataclass(frozen=True)
class PreflightFile:
    """preflight.json: the checks deferred to the job's first step, and how to run them there."""

    deferred: tuple[Check, ...]
    python: str  # the backend venv's python, whose loaders fetch what is not on the node's disk
    variables: Mapping[str, str] = field(default_factory=dict)  # the cluster's environment variables

    def dumps(self) -> str:
        # the cells of a grid defer the same checks (a grid's models and sources): each content is made once
        key = (self.deferred, self.python, tuple(self.variables.items()))
        text = _PREFLIGHT_TEXTS.get(key)
        if text is None:
            if len(_PREFLIGHT_TEXTS) > 4096:
                _PREFLIGHT_TEXTS.clear()
            text = _PREFLIGHT_TEXTS[key] = _dump(
                {
                    "deferred": [c.to_json() for c in self.deferred],
                    "python": self.python,
                    "variables": dict(self.variables),
                }
            )
        return text

    @classmethod
    def load(cls, cell_dir: Path) -> PreflightFile | None:
        data = read_json(cell_dir, PREFLIGHT_FILE)
        if data is None:
            return None
        return cls(
            tuple(Check.from_json(c) for c in data.get("deferred", ())),
            str(data.get("python") or ""),
            dict(data.get("variables", data.get("env")) or {}),
        )


@dataclass(frozen=True, kw_only=True)
class PostFile:
    """post.json: what the post-training chain of a cell needs, without conf/. The cell is the directory's
    name (a cell's name is its directory's), so cells of one configuration write the same file."""

    cell: str
    stages: tuple[str, ...]
    python: str
    variables: Mapping[str, str] = field(default_factory=dict)
    base_model: str = ""
    hub_model_id: str = ""
    # whether a job may upload (its nodes reach the Hub); else the upload waits for the login node
    upload_in_job: bool = False
    # local cells run the chain in their training job; Slurm cells in a dependent post job
    in_train_job: bool = False
    datasets: tuple[str, ...] = ()
    register_command: tuple[str, ...] = ()

    def dumps(self) -> str:
        data = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "cell"}
        return _dump(
            {k: list(v) if isinstance(v, tuple) else dict(v) if k == "variables" else v for k, v in data.items()}
        )

    @classmethod
    def load(cls, cell_dir: Path) -> PostFile | None:
        data = read_json(cell_dir, POST_FILE)
        if data is None:
            return None
        return cls(
            cell=str(data.get("cell") or cell_dir.name),
            stages=tuple(data.get("stages") or ()),
            python=str(data.get("python") or ""),
            variables=dict(data.get("variables", data.get("env")) or {}),
            base_model=str(data.get("base_model") or ""),
            hub_model_id=str(data.get("hub_model_id") or ""),
            upload_in_job=bool(data.get("upload_in_job")),
            in_train_job=bool(data.get("in_train_job")),
            datasets=tuple(data.get("datasets") or ()),
            register_command=tuple(data.get("register_command") or ()),
        )


@dataclass(frozen=True)
class CellYaml:
    """cell.yaml read back: the resolved config the grid rendered (grid/render.py writes it with yaml.dump), as
    plain data (`config`) and as the schema's types (`spec`), and its text (the header carries the overrides and
    the rerun command)."""

    text: str
    config: Mapping[str, Any]

    @classmethod
    def load(cls, cell_dir: Path, keys: Sequence[str] | None = None) -> CellYaml:
        """Raises OSError where the file cannot be read and ValueError where it is no YAML mapping. `keys`: build
        only these top-level keys' values (the loader still parses the whole document, in C; a sweep's own tables,
        `vars`, can be most of the file: 72 Delphi cells' table rows read 0.11 s loaded whole, 0.06 s so)."""
        path = cell_dir / CELL_FILE
        text = path.read_text()
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if not isinstance(node, yaml.MappingNode):
                raise ValueError(f"{path} holds no mapping (a cell's resolved config)")
            config = {
                k.value: loader.construct_object(v, deep=True)
                for k, v in node.value
                if isinstance(k, yaml.ScalarNode) and (keys is None or k.value in keys)
            }
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not YAML: {exc}") from None
        finally:
            loader.dispose()
        return cls(text, config)

    @classmethod
    def config_of(cls, cell_dir: Path) -> dict[str, Any]:
        """The resolved config as data; {} where the file is missing or unreadable (a cell being rendered)."""
        try:
            return dict(cls.load(cell_dir).config)
        except (OSError, ValueError):
            return {}

    @property
    def spec(self) -> CellConf:
        """The config as the schema's dataclasses (built from data OmegaConf validated when the grid composed it)."""
        return typed(CellConf, self.config)
