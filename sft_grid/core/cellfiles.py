"""The typed files a job reads from its cell directory, and the preflight `Check` they carry.

The grid renders them; the job (and `sft-grid post` on a login node) reads them back into these
types, so the job never re-composes from conf/ and never guesses at keys.

- cell.yaml: the cell's resolved config (`CellYaml`: the only reader of it; as data, and as the schema's
  `CellConf`);
- post.json: the post-training stages of the cell and what they need (the backend's python, the cluster's
  variables, the base model, the hub repository, the register command);
- preflight.json (only when something is deferred): the checks that could not run where the grid ran, which
  the job runs as its first step, before training.

A file that cannot be read as what it should be (cut short, bytes that are not UTF-8, not JSON or YAML, a directory
where a file should be) is a `Damage`: the file and what is wrong with it and where, in one line a person reads
("cell.yaml: not YAML at line 12 (cut short?)"), never a parser's internals. The readers here raise it as
`DamagedFile` (a ValueError, as the parsers' own errors were); `damage_of` names the damaged file of a cell when some
reader failed on it, so that the commands that read a grid show that cell as damaged and go on with the others.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from sft_grid.core.layout import (
    CELL_FILE,
    DATA_STEP_FILE,
    ESTIMATE_FILE,
    LEDGER_FILE,
    OUTPUT_DIR,
    POST_FILE,
    PREFLIGHT_FILE,
    TRAIN_RESULTS,
    TRAINER_LOG,
    TRAINER_STATE,
)
from sft_grid.core.schema import CellConf, typed

# the C loader where PyYAML was built with libyaml: a cell.yaml with a sweep's own tables is several kB
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# -- damaged files ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    """A damaged file: which (relative to the directory read: the cell's or the grid's; "" where no file could be
    named), and what is wrong with it and where. `whole`: the cell cannot be read as what it is (its config, its
    ledger, its trainer's state), so its state is shown as `damaged`; else a part of it is (a log, a score, an
    estimate) and its state stands, with `flag` beside it where the damage changes what a column says ("log ends at
    step 10 of 100")."""

    file: str
    what: str
    whole: bool = True
    flag: str = ""

    def text(self) -> str:
        return f"{self.file}: {self.what}" if self.file else self.what


class DamagedFile(ValueError):
    """A file a reader parses is damaged: `damage` says which and where; `path`: the file, where the reader knows it
    (a file outside the directory read, a model prep's ledger, is named by it); `message`: the error's own words,
    where callers match an earlier wording."""

    def __init__(self, damage: Damage, path: Path | None = None, message: str = "") -> None:
        super().__init__(message or damage.text())
        self.damage = damage
        self.path = path


def _line_of(data: bytes, index: int) -> int:
    return data.count(b"\n", 0, index) + 1


def not_utf8(data: bytes, exc: UnicodeDecodeError, line: int = 0, offset: int = 0) -> str:
    """Where a file stops being UTF-8, in words: `data` is the file, or its line `line` from byte `offset` on."""
    line = line or _line_of(data, exc.start)
    return f"line {line} is not UTF-8 (byte 0x{data[exc.start]:02x} at byte {offset + exc.start})"


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", bool: "true or false", type(None): "null", dict: "an object"}.get(
        type(value), "a number"
    )


def read_text(path: Path, name: str = "", whole: bool = True) -> str:
    """A file's text. FileNotFoundError where there is none; DamagedFile where it is a directory, cannot be read or
    is not UTF-8 (`name`: how the damage names it, by default the file's name)."""
    name = name or path.name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise DamagedFile(Damage(name, "a directory, not a file", whole), path) from None
    except OSError as exc:
        raise DamagedFile(Damage(name, f"cannot be read ({exc.strerror or exc})", whole), path) from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise DamagedFile(Damage(name, not_utf8(data, exc), whole), path) from None


def not_json(text: str, exc: json.JSONDecodeError) -> str:
    """Where a JSON text stops being JSON, in words: at its end, it was cut short."""
    if not text.strip():
        return "empty (cut short?)"
    # at its end, or in a string that never ends (json names where such a string starts)
    unended = exc.msg.startswith("Unterminated string") and '"' not in text[exc.pos + 1 :]
    if exc.pos >= len(text.rstrip()) or unended:
        return f"not JSON at line {text.count(chr(10), 0, len(text.rstrip())) + 1} (cut short?)"
    return f"not JSON at line {exc.lineno}, column {exc.colno}"


def load_json(path: Path, name: str = "", whole: bool = True) -> dict[str, Any]:
    """A JSON file that holds one object, as data. FileNotFoundError where there is none; DamagedFile where it is not
    such a file (see read_text), not JSON, or JSON of another kind."""
    name = name or path.name
    text = read_text(path, name, whole)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DamagedFile(Damage(name, not_json(text, exc), whole), path) from None
    except RecursionError:
        raise DamagedFile(Damage(name, "not JSON (nested too deep)", whole), path) from None
    if not isinstance(data, dict):
        raise DamagedFile(Damage(name, f"not a JSON object (it holds {_kind(data)})", whole), path)
    return data


def json_damage(path: Path, name: str = "", whole: bool = True) -> Damage | None:
    """What is wrong with a JSON file that should hold one object; None where it is whole, or there is none."""
    try:
        load_json(path, name, whole)
    except DamagedFile as exc:
        return exc.damage
    except FileNotFoundError:
        pass
    return None


def jsonl_damage(
    path: Path,
    name: str = "",
    whole: bool = True,
    torn_last: bool = True,
    check: Callable[[Mapping[str, Any]], str] | None = None,
) -> Damage | None:
    """The first damaged line of a JSON-lines file (one object a line): not UTF-8, not JSON, not an object, or (`check`,
    a record -> what is wrong with it, or "") not what the file's records are. A last line without its newline that is
    not JSON is a write a kill cut short (`torn_last`: no damage; the file's writers append whole lines). None where
    it is whole, or there is none."""
    name = name or path.name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return Damage(name, "a directory, not a file", whole)
    except OSError as exc:
        return Damage(name, f"cannot be read ({exc.strerror or exc})", whole)
    lines = data.split(b"\n")
    offset = 0
    for i, raw in enumerate(lines, 1):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        last = i == len(lines)  # no newline after it
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            return Damage(name, not_utf8(raw, exc, i, start), whole)
        try:
            record = json.loads(text)
        except ValueError:
            if last and torn_last:
                continue
            return Damage(name, f"line {i} is not JSON" + (" (cut short?)" if last else ""), whole)
        if not isinstance(record, dict):
            return Damage(name, f"line {i} is not a JSON object (it holds {_kind(record)})", whole)
        wrong = check(record) if check is not None else ""
        if wrong:
            return Damage(name, f"line {i}: {wrong}", whole)
    return None


def not_yaml(text: str, exc: yaml.YAMLError) -> str:
    """Where a YAML text stops being YAML, in words (the line, never the parser's own message): at its end, it was
    cut short."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return "not YAML"
    lines = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    if mark.index >= len(text.rstrip()):
        return f"not YAML at line {min(mark.line + 1, lines)} (cut short?)"
    return f"not YAML at line {min(mark.line + 1, lines)}, column {mark.column + 1}"


def _data_step_record(record: Mapping[str, Any]) -> str:
    """What is wrong with a data step record (in_venv/data_step.py's), or ""."""
    t = record.get("time")
    return "its time is not a number" if t is not None and not isinstance(t, (int, float)) else ""


def _text_damage(path: Path, name: str) -> Damage | None:
    try:
        read_text(path, name)
    except DamagedFile as exc:
        return exc.damage
    except FileNotFoundError:
        pass
    return None


def _trainer_state_damage(path: Path, name: str) -> Damage | None:
    try:
        data = load_json(path, name)
    except DamagedFile as exc:
        return exc.damage
    except FileNotFoundError:
        return None
    history = data.get("log_history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        return Damage(name, "its log_history is not a list of objects")
    return None


# what a reader raises on a damaged file (a parser's error, or a value of another kind than the file's own), as
# the commands that read a grid catch it per cell: that cell is shown as damaged, the others are read
READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    LookupError,
    TypeError,
    AttributeError,
    RecursionError,
    yaml.YAMLError,
)


def trainer_log_damage(output_dir: Path) -> Damage | None:
    """What is wrong with the per-step log (output/trainer_log.jsonl) of a training that completed, or None: it is a
    directory or empty; its last line is cut short, not UTF-8 or not JSON (the trainer is done: it wrote whole lines);
    or it ends before the run's last step (trainer_state.json's global_step, else the total the log names). Only its
    tail is read (status reads it for every completed cell). No log at all is no damage: trainer_state.json stands
    for it."""
    name = f"{OUTPUT_DIR}/{TRAINER_LOG}"
    log = output_dir / TRAINER_LOG
    try:
        st = log.stat()
        if stat.S_ISDIR(st.st_mode):
            return Damage(name, "a directory, not a file", False, "no log")
        size = st.st_size
        with log.open("rb") as fh:
            fh.seek(max(0, size - 8192))
            tail = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Damage(name, f"cannot be read ({exc.strerror or exc})", False, "log unreadable")
    if not tail.strip():
        return Damage(name, "empty (cut short?)", False, "log empty")
    if not tail.endswith(b"\n"):
        return Damage(name, f"its last line is cut short (the file ends at byte {size})", False, "log cut short")
    start = size - len(tail)
    if start > 0:  # the first line of the tail may be cut where the tail begins
        cut = tail.find(b"\n") + 1
        tail, start = tail[cut:], start + cut
    try:
        text = tail.decode()
    except UnicodeDecodeError as exc:
        return Damage(
            name, f"not UTF-8 at byte {start + exc.start} (byte 0x{tail[exc.start]:02x})", False, "log damaged"
        )
    end: int | None = None
    total: int | None = None
    stop = len(text) - 1  # the last line's newline
    while stop > 0 and end is None:  # from the last line back to the last that names its step
        begin = text.rfind("\n", 0, stop) + 1
        line = text[begin:stop]
        stop = begin - 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            at = start + len(text[:begin].encode())
            return Damage(name, f"the line at byte {at} is not JSON", False, "log damaged")
        if isinstance(record, dict) and isinstance(record.get("current_steps"), int):
            end = record["current_steps"]
            total = record["total_steps"] if isinstance(record.get("total_steps"), int) else None
    if end is None or (total is not None and end >= total):
        return None
    try:
        run_end = load_json(output_dir / TRAINER_STATE).get("global_step")
    except (FileNotFoundError, DamagedFile):
        run_end = None
    run_end = run_end if isinstance(run_end, int) and not isinstance(run_end, bool) else total
    if run_end is None or end >= run_end:
        return None
    return Damage(name, f"ends at step {end} of {run_end} (cut short?)", False, f"log ends at step {end} of {run_end}")


def damage_of(cell_dir: Path, exc: BaseException, whole: bool = True) -> Damage:
    """The damaged file of a cell whose reading failed with `exc`: the one it names (DamagedFile), else the first of
    the files the commands parse that is damaged, else the error, in one line. `whole`: as Damage's."""
    if isinstance(exc, DamagedFile):
        elsewhere = exc.path is not None and not exc.path.is_relative_to(cell_dir)
        return replace(exc.damage, whole=whole, file=str(exc.path) if elsewhere else exc.damage.file)
    out = f"{OUTPUT_DIR}/"
    checks: list[Callable[[], Damage | None]] = [
        lambda: CellYaml.damage(cell_dir),
        lambda: jsonl_damage(cell_dir / LEDGER_FILE),
        lambda: _trainer_state_damage(cell_dir / OUTPUT_DIR / TRAINER_STATE, out + TRAINER_STATE),
        lambda: _text_damage(cell_dir / OUTPUT_DIR / "latest", out + "latest"),
        lambda: json_damage(cell_dir / POST_FILE),
        lambda: json_damage(cell_dir / "eval.json"),
        lambda: json_damage(cell_dir / PREFLIGHT_FILE),
        lambda: json_damage(cell_dir / ESTIMATE_FILE),
        lambda: next(filter(None, (json_damage(cell_dir / OUTPUT_DIR / n, out + n) for n in TRAIN_RESULTS)), None),
        lambda: jsonl_damage(cell_dir / OUTPUT_DIR / TRAINER_LOG, out + TRAINER_LOG),
        lambda: jsonl_damage(cell_dir / DATA_STEP_FILE, check=_data_step_record),
    ]
    for check in checks:
        found = check()
        if found is not None:
            return replace(found, whole=whole)
    return Damage("", f"a file of the cell could not be read ({type(exc).__name__}: {str(exc)[:160]})", whole)


@dataclass(frozen=True)
class Check:
    """One read-only check of a cell's input; equal checks (same input) run once for the whole grid."""

    # "path" | "model" | "integration" | "kernel" | "template_tokens" | "assistant_turns" | "loss_mask" | "prepared"
    # | "staged" | "tokenized" | "backend_key" | "eval_task" | "eval_datasets" | "eval_include"
    kind: str
    key: str  # the dotted key of the cell it is about
    target: str  # a local path or a hub id
    tokens: tuple[str, ...] = ()
    column: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    split: str = "train"
    # loss_mask: the backend, its venv's python, the tokenizer, the backend's settings (JSON); eval_task and
    # eval_include: the harness's python and the suite's include_path (a JSON list); eval_datasets: its python and
    # {"include": [...], "datasets": the task's, "label": its label} (JSON)
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
            "backend_key": f"the {self.backend} config parser of the backend's environment takes the key",
            "eval_task": "the evaluation harness's task index knows the task",
            "eval_datasets": "the task's datasets list every Hub dataset the harness reads for it",
            "eval_include": "the harness's task index reads every YAML of the include_path, none under a shipped name",
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


def read_json(directory: Path, name: str) -> dict[str, Any] | None:
    """A rendered JSON file of a directory (one object), as data; None when there is none. DamagedFile where it
    cannot be read as one (cut short, not UTF-8, a directory...)."""
    try:
        return load_json(directory / name, name)
    except FileNotFoundError:
        return None


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


# The first line of every cell.yaml sft_grid renders (grid/render.py cell_header), and the top-level keys every
# version of it has written, in the order it writes them (the schema's CellConf fields of its first version, all
# still there): a rendered file that lacks one of them, or ends without its last newline, was cut short.
RENDERED = "# sft_grid cell "
ALWAYS_KEYS = (
    "cluster",
    "backend",
    "model",
    "dataset",
    "mix",
    "sweep_name",
    "runs_root",
    "lr",
    "epochs",
    "max_steps",
    "global_batch_size",
    "micro_batch_size",
    "cutoff_len",
    "seed",
    "scheduler",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "finetuning_type",
    "extra",
    "save_steps",
    "save_total_limit",
    "logging_steps",
    "report_to",
    "push_to_hub",
    "hub_model_id",
    "nodes",
    "time",
    "dry_run",
    "force",
    "rerun_failed",
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
        """Raises OSError where the file cannot be read (FileNotFoundError: there is none) and ValueError
        (DamagedFile) where it is no YAML mapping. `keys`: build only these top-level keys' values (the loader still
        parses the whole document, in C; a sweep's own tables, `vars`, can be most of the file: 72 Delphi cells'
        table rows read 0.11 s loaded whole, 0.06 s so)."""
        path = cell_dir / CELL_FILE
        text = read_text(path, CELL_FILE)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if not isinstance(node, yaml.MappingNode):
                what = "empty" if node is None else "not a mapping of keys (a cell's resolved config)"
                if node is None and text.startswith(RENDERED):
                    what += " but for its header (cut short?)"
                raise DamagedFile(Damage(CELL_FILE, what), path, f"{path} holds no mapping (a cell's resolved config)")
            config = {
                k.value: loader.construct_object(v, deep=True)
                for k, v in node.value
                if isinstance(k, yaml.ScalarNode) and (keys is None or k.value in keys)
            }
        except yaml.YAMLError as exc:
            what = not_yaml(text, exc)
            raise DamagedFile(
                Damage(CELL_FILE, what), path, f"{path} is not YAML: {what[9:] or 'unreadable'}"
            ) from None
        finally:
            loader.dispose()
        return cls(text, config)

    @classmethod
    def read(cls, cell_dir: Path, keys: Sequence[str] | None = None) -> CellYaml:
        """`load`, and a rendered file cut short where it still reads as YAML (cut at the end of a line, or within a
        value) raises DamagedFile too: what the commands that read a grid use."""
        found = cls.load(cell_dir, keys)
        loaded = found.config if keys is None else None
        cut = cut_short(found.text, loaded.keys() if loaded is not None else None)
        if cut:
            raise DamagedFile(Damage(CELL_FILE, cut), cell_dir / CELL_FILE)
        return found

    @classmethod
    def damage(cls, cell_dir: Path) -> Damage | None:
        """What is wrong with a cell's cell.yaml, or None: missing, a directory, not UTF-8, empty, cut short, not
        YAML. A rendered file whose every key is there and whose last line is whole is taken as read without being
        parsed (what `status` checks of every cell, in microseconds); one written by hand is parsed."""
        path = cell_dir / CELL_FILE
        try:
            text = read_text(path, CELL_FILE)
        except FileNotFoundError:
            return Damage(CELL_FILE, "missing")
        except DamagedFile as exc:
            return exc.damage
        if text.startswith(RENDERED) and not cut_short(text, None):
            return None
        try:
            cls.read(cell_dir)
        except DamagedFile as exc:
            return exc.damage
        except OSError as exc:
            return Damage(CELL_FILE, f"cannot be read ({exc.strerror or exc})")
        return None

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


def cut_short(text: str, keys: Iterable[str] | None) -> str:
    """Why a cell.yaml sft_grid rendered (its first line says so) reads as cut short, or "": its last line has no
    newline, or a key every version writes is not there. `keys`: its top-level keys, where parsed (None: looked for
    at the start of its lines, where the renderer writes them; a file in flow style is then parsed)."""
    if not text.startswith(RENDERED):
        return ""
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if not text.endswith("\n"):
        return f"ends within line {lines} (cut short?)"
    if keys is None:
        # a cut takes the end of the file: the last of the keys there, at a line's start, says the others are
        if f"\n{ALWAYS_KEYS[-1]}:" in text:
            return ""
        try:
            keys = yaml.load(text, Loader=_Loader).keys()
        except (yaml.YAMLError, AttributeError):
            return ""  # not YAML, or no mapping: `load` says so
    have = set(keys)
    missing = [k for k in ALWAYS_KEYS if k not in have]
    if not missing:
        return ""
    return f"ends at line {lines}, before `{missing[0]}` (cut short?)"
