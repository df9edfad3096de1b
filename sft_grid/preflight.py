"""Checks that need a tokenizer or data: run once per unique input, before anything is queued.

A check runs where its input can be read. On the submitting machine that is a local path or a copy in
the Hugging Face cache; a hub id that is not cached cannot be read here (no hub from this machine, and
login nodes may differ from compute nodes). Such a check is not skipped: it is *deferred*, written into
the cell's preflight.json, reported by name in the dry run and the launch summary, and run by the job
as its first step, before training (sft_grid/runner.py), where it fails the job with the same message.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from sft_grid import mask, prep
from sft_grid.plan import Cell, is_local
from sft_grid.templates import DELPHI_TOKENS, TEMPLATES
from sft_grid.validate import Problem

log = logging.getLogger(__name__)

SAMPLE_ROWS = 200
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Check:
    """One read-only check; equal checks (same input) run once for the whole grid."""

    kind: str  # "path" | "template_tokens" | "assistant_turns" | "loss_mask"
    key: str  # the dotted key of the cell it is about
    target: str  # a local path or a hub id
    tokens: tuple[str, ...] = ()
    column: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    split: str = "train"
    # loss_mask (sft_grid/mask.py): the backend, its env's python, the tokenizer, the backend's settings (JSON)
    backend: str = ""
    python: str = ""
    model: str = ""
    spec: str = ""

    def describe(self) -> str:
        what = {
            "path": "the local path exists",
            "template_tokens": "the template's special tokens are single tokens of the tokenizer",
            "assistant_turns": "the schema tags find assistant turns in a sample of the data",
            "loss_mask": f"the {self.backend} loss mask trains the assistant turns and nothing else",
        }[self.kind]
        return f"{what} ({self.key}={self.target})"

    def to_json(self) -> dict[str, Any]:
        # the loss_mask fields only where set: other checks read as before
        return {k: v for k, v in asdict(self).items() if v or k not in ("backend", "python", "model", "spec")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Check":
        return cls(**{**data, "tokens": tuple(data["tokens"]), "tags": tuple(tuple(t) for t in data["tags"])})


@dataclass(frozen=True)
class Outcome:
    ok: bool
    # why the check failed, or why it could not run here
    message: str = ""
    fix: str = ""
    unreachable: bool = False


def checks_for(cell: Cell) -> list[Check]:
    s = cell.spec
    checks: list[Check] = []
    tokenizer = s.model.path or s.model.hub_id or ""
    if s.model.path:
        checks.append(Check("path", "model.path", s.model.path))
    template = TEMPLATES.get(s.model.template)
    if template is not None and tokenizer:
        tokens = template.special_tokens
        model_prep = prep.prep_for(cell)
        if model_prep is not None and model_prep.complete:
            tokenizer = str(model_prep.model_dir)  # what the cell trains: every token must be single there
        elif model_prep is not None:
            # not prepared yet: the source has the rest; the prep itself asserts its tokens before any cell runs
            tokens = tuple(t for t in tokens if t not in DELPHI_TOKENS)
        checks.append(Check("template_tokens", "model.template", tokenizer, tokens=tokens))
    for name, ds in s.dataset.items():
        if is_local(ds.source):
            checks.append(Check("path", f"dataset.{name}.source", ds.source))
        tags = (("role_tag", ds.tags.role_tag), ("assistant_tag", ds.tags.assistant_tag), ("content_tag", ds.tags.content_tag))
        checks.append(Check("assistant_turns", f"dataset.{name}", ds.source, column=ds.messages, tags=tags, split=ds.split))
    return checks + mask.checks_for(cell)


# -- locating inputs ------------------------------------------------------------------------------------


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def _cached_snapshot(repo_id: str, kind: str) -> Path | None:
    snapshots = _hub_cache() / f"{kind}--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def locate(target: str, kind: str) -> Path | None:
    """A readable local copy of a path or hub id (kind: 'models' or 'datasets'), or None."""
    if is_local(target):
        path = Path(os.path.expanduser(target))
        return path if path.exists() else None
    return _cached_snapshot(target, kind)


# -- the checks -----------------------------------------------------------------------------------------


def _unreachable(target: str, what: str) -> Outcome:
    return Outcome(
        False,
        f"{what} {target!r} is not readable from this machine (a hub id with no copy in the Hugging Face cache"
        f" {_hub_cache()}); the check runs as the first step of the job, before training",
        unreachable=True,
    )


def check_path(check: Check) -> Outcome:
    if Path(os.path.expanduser(check.target)).exists():
        return Outcome(True)
    return Outcome(False, "no such file or directory",
                   "fix the path; tiny local assets are built by `python -m sft_grid.assets build`")


def _find(check: Check, kind: str, what: str) -> Path | Outcome:
    """The readable copy of the check's input, or the outcome when there is none here."""
    where = locate(check.target, kind)
    if where is not None:
        return where
    # a missing local path is reported by its own path check, once
    return Outcome(True) if is_local(check.target) else _unreachable(check.target, what)


def check_template_tokens(check: Check) -> Outcome:
    where = _find(check, "models", "tokenizer")
    return where if isinstance(where, Outcome) else template_tokens_at(where, check.tokens)


def template_tokens_at(model_dir: Path, tokens: Iterable[str]) -> Outcome:
    from tokenizers import Tokenizer  # light (a Rust extension), but only needed here

    file = model_dir / "tokenizer.json"
    if not file.is_file():
        return Outcome(False, f"no tokenizer.json in {model_dir}", "point model.path at a Hugging Face model directory")
    tok = Tokenizer.from_file(str(file))
    broken = {t: len(tok.encode(t, add_special_tokens=False).ids) for t in tokens}
    broken = {t: n for t, n in broken.items() if n != 1}
    if not broken:
        return Outcome(True)
    detail = ", ".join(f"{t} -> {n} tokens" for t, n in broken.items())
    if set(broken) <= set(DELPHI_TOKENS):
        return Outcome(False, f"the Delphi think/tool tokens are not single tokens of this tokenizer ({detail}):"
                       " it is not prepared, and the model has no prep stage",
                       f"add `needs: [{prep.NEED}]` to the model's conf/model/<name>.yaml (the grid then prepares"
                       " it once, before its cells), or point model.path at a prepared checkpoint")
    return Outcome(False, f"the template's special tokens are not single tokens of this tokenizer: {detail}",
                   "use the template of the model's family (llama3 for Llama-3/Delphi tokenizers, qwen3 for ChatML)")


def data_files(where: Path) -> list[Path]:
    """The data file, or the data files of a directory in name order."""
    files = [where] if where.is_file() else sorted(p for p in where.rglob("*") if p.suffix in _DATA_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no {', '.join(_DATA_SUFFIXES)} file in {where}")
    return files


def read_sample(where: Path, column: str, limit: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    """The first rows of a local data file (or of the first data file in a directory)."""
    file = data_files(where)[0]
    if file.suffix == ".jsonl":
        rows = []
        with file.open() as fh:
            for line in fh:
                if line.strip():
                    rows.append(json.loads(line))
                if len(rows) >= limit:
                    break
        return rows
    if file.suffix == ".json":
        data = json.loads(file.read_text())
        return list(data[:limit]) if isinstance(data, list) else [data]
    import pyarrow.parquet as pq  # only for parquet data; raises ImportError where absent

    table = pq.ParquetFile(file).read_row_group(0, columns=[column])
    return table.slice(0, limit).to_pylist()


def assistant_turns(rows: list[dict[str, Any]], column: str, tags: Mapping[str, str]) -> Outcome:
    role_tag, assistant_tag = tags["role_tag"], tags["assistant_tag"]
    if rows and all(column not in r for r in rows):
        return Outcome(False, f"no column {column!r} in the data (columns: {', '.join(sorted(rows[0]))})",
                       f"set `messages:` of this dataset to the conversation column, e.g. {sorted(rows[0])[0]}")
    turns = Counter()
    keys = Counter()
    for row in rows:
        for msg in row.get(column) or []:
            if isinstance(msg, dict):
                keys.update(msg.keys())
                turns[msg.get(role_tag)] += 1
    if turns.get(assistant_tag, 0) > 0:
        return Outcome(True)
    seen = ", ".join(f"{k!r}" for k, _ in turns.most_common(5) if k is not None)
    fix = "set this dataset's tags to the roles its rows use"
    if {"from", "value"} <= set(keys):
        fix = "ShareGPT rows: tags role_tag=from content_tag=value user_tag=human assistant_tag=gpt"
    elif {"role", "content"} <= set(keys):
        fix = "role/content rows: tags role_tag=role content_tag=content user_tag=user assistant_tag=assistant"
    return Outcome(
        False,
        f"0 assistant turns in {len(rows)} sampled rows with role_tag={role_tag!r} assistant_tag={assistant_tag!r}"
        f" (message keys seen: {', '.join(sorted(keys)) or 'none'}; {role_tag!r} values seen: {seen or 'none'})",
        fix,
    )


def check_assistant_turns(check: Check) -> Outcome:
    where = _find(check, "datasets", "dataset")
    if isinstance(where, Outcome):
        return where
    try:
        rows = read_sample(where, check.column)
    except ImportError:
        return Outcome(False, f"reading parquet needs pyarrow, which this environment lacks ({where})",
                       "the job runs it", unreachable=True)
    except (OSError, ValueError) as exc:
        return Outcome(False, f"cannot read a sample of {where}: {exc}", "point the dataset's source at a data file")
    return assistant_turns(rows, check.column, dict(check.tags))


RUNNERS = {
    "path": check_path,
    "template_tokens": check_template_tokens,
    "assistant_turns": check_assistant_turns,
    "loss_mask": lambda check: mask.run_checks([check])[check],
}


def run(check: Check) -> Outcome:
    return RUNNERS[check.kind](check)


@dataclass(frozen=True)
class Preflight:
    problems: list[Problem]
    # cell name -> checks that could not run here and run as the job's first step
    deferred: dict[str, list[Check]]
    unique_checks: int


def preflight(cells: Iterable[Cell]) -> Preflight:
    outcomes: dict[Check, Outcome] = {}
    problems: list[Problem] = []
    deferred: dict[str, list[Check]] = {}
    per_cell = [(cell, checks_for(cell)) for cell in cells]
    # loss-mask checks run as one batch: one backend process per environment for the whole grid
    masks = list(dict.fromkeys(c for _, checks in per_cell for c in checks if c.kind == mask.KIND))
    outcomes.update(mask.run_checks(masks) if masks else {})
    for cell, checks in per_cell:
        for check in checks:
            outcome = outcomes.get(check)
            if outcome is None:
                outcome = outcomes[check] = run(check)
            if outcome.unreachable:
                deferred.setdefault(cell.name, []).append(check)
            elif not outcome.ok:
                problems.append(Problem(cell.name, check.key, check.target, f"preflight-{check.kind}",
                                        outcome.message, outcome.fix))
    return Preflight(mask.root_causes(problems), deferred, len(outcomes))


FETCHER = Path(__file__).parent / "probes" / "fetch_sample.py"


def fetch_and_run(check: Check, python: str, workdir: Path, env: Mapping[str, str] | None = None) -> Outcome:
    """Job side, for an input not on this node's disk: fetch a sample with the backend's own loaders
    (its hub access or cache) under the cluster's environment, then run the same check on it."""
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    if check.kind == "template_tokens":
        dest = workdir / "tokenizer"
        argv = [python, str(FETCHER), "tokenizer", check.target, str(dest)]
    elif check.kind == mask.KIND:
        return mask.fetch_and_probe(check, python, workdir, env)
    elif check.kind == "assistant_turns":
        dest = workdir / f"{check.key.replace('.', '_')}.jsonl"
        argv = [python, str(FETCHER), "rows", check.target, check.split, str(SAMPLE_ROWS), str(dest)]
    else:
        return run(check)
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome(False, f"could not read {check.target!r} from this node either: {last[:300]}",
                       "make the input reachable from compute nodes (hub access, or a local copy in the HF cache)")
    return run(replace(check, target=str(dest)))


def run_deferred(checks: Iterable[Check], python: str | None = None, workdir: Path | None = None,
                 env: Mapping[str, str] | None = None) -> Iterator[tuple[Check, Outcome]]:
    """Job side: every deferred check must now pass. An input still not on disk is fetched with the
    backend's loaders when a backend python is given; otherwise it fails the job."""
    for check in checks:
        outcome = run(check)
        if outcome.unreachable and python and workdir is not None:
            outcome = fetch_and_run(check, python, workdir, env)
        yield check, outcome
