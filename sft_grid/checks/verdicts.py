"""The verdict of each kind of preflight check on its input, where the input can be read (pure reads, no hub).

`run(check)` answers passed, failed (why, and the fix), or `unreachable`: the input cannot be read here, and the
check waits for the job's first step (checks/preflight.py decides which checks a cell has and runs them once per
unique input).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from sft_grid.checks import mask
from sft_grid.checks.inputs import NotData, hub_cache, locate, read_sample
from sft_grid.core import events
from sft_grid.core.cellfiles import Check, Verdict
from sft_grid.core.events import Kind
from sft_grid.core.hubcache import is_complete, parse_snapshot, staging_failure
from sft_grid.core.templates import DELPHI_TOKENS
from sft_grid.core.tokenized import tokenized_complete
from sft_grid.planning.cells import is_local
from sft_grid.planning.inputs import PREP_NEED, prep_complete


def _unreachable(target: str, what: str) -> Verdict:
    return Verdict(
        False,
        f"{what} {target!r} is not readable from this machine (a hub id with no copy in the Hugging Face cache"
        f" {hub_cache()}); the check runs as the first step of the job, before training",
        unreachable=True,
    )


def check_path(check: Check) -> Verdict:
    if Path(os.path.expanduser(check.target)).exists():
        return Verdict(True)
    return Verdict(False, "no such file or directory",
                   "fix the path; tiny local assets are built by `python -m sft_grid.assets build`")


def _find(check: Check, kind: str, what: str) -> Path | Verdict:
    """The readable copy of the check's input, or the verdict when there is none here."""
    where = locate(check.target, kind)
    if where is not None:
        return where
    # a missing local path is reported by its own path check, once
    return Verdict(True) if is_local(check.target) else _unreachable(check.target, what)


def check_template_tokens(check: Check) -> Verdict:
    where = _find(check, "models", "tokenizer")
    return where if isinstance(where, Verdict) else template_tokens_at(where, check.tokens)


def template_tokens_at(model_dir: Path, tokens: Iterable[str]) -> Verdict:
    from tokenizers import Tokenizer  # light (a Rust extension), but only needed here

    file = model_dir / "tokenizer.json"
    if not file.is_file():
        return Verdict(False, f"no tokenizer.json in {model_dir}", "point model.path at a Hugging Face model directory")
    tok = Tokenizer.from_file(str(file))
    broken = {t: len(tok.encode(t, add_special_tokens=False).ids) for t in tokens}
    broken = {t: n for t, n in broken.items() if n != 1}
    if not broken:
        return Verdict(True)
    detail = ", ".join(f"{t} -> {n} tokens" for t, n in broken.items())
    if set(broken) <= set(DELPHI_TOKENS):
        return Verdict(False, f"the Delphi think/tool tokens are not single tokens of this tokenizer ({detail}):"
                       " it is not prepared, and the model has no prep stage",
                       f"add `needs: [{PREP_NEED}]` to the model's conf/model/<name>.yaml (the grid then prepares"
                       " it once, before its cells), or point model.path at a prepared checkpoint")
    return Verdict(False, f"the template's special tokens are not single tokens of this tokenizer: {detail}",
                   "use the template of the model's family (llama3 for Llama-3/Delphi tokenizers, qwen3 for ChatML)")


def assistant_turns(rows: list[dict[str, Any]], column: str, tags: Mapping[str, str]) -> Verdict:
    role_tag, assistant_tag = tags["role_tag"], tags["assistant_tag"]
    if rows and all(column not in r for r in rows):
        return Verdict(False, f"no column {column!r} in the data (columns: {', '.join(sorted(rows[0]))})",
                       f"set `messages:` of this dataset to the conversation column, e.g. {sorted(rows[0])[0]}")
    turns: Counter[Any] = Counter()
    keys: Counter[str] = Counter()
    for row in rows:
        for msg in row.get(column) or []:
            if isinstance(msg, dict):
                keys.update(msg.keys())
                turns[msg.get(role_tag)] += 1
    if turns.get(assistant_tag, 0) > 0:
        return Verdict(True)
    seen = ", ".join(f"{k!r}" for k, _ in turns.most_common(5) if k is not None)
    fix = "set this dataset's tags to the roles its rows use"
    if {"from", "value"} <= set(keys):
        fix = "ShareGPT rows: tags role_tag=from content_tag=value user_tag=human assistant_tag=gpt"
    elif {"role", "content"} <= set(keys):
        fix = "role/content rows: tags role_tag=role content_tag=content user_tag=user assistant_tag=assistant"
    return Verdict(
        False,
        f"0 assistant turns in {len(rows)} sampled rows with role_tag={role_tag!r} assistant_tag={assistant_tag!r}"
        f" (message keys seen: {', '.join(sorted(keys)) or 'none'}; {role_tag!r} values seen: {seen or 'none'})",
        fix,
    )


def check_assistant_turns(check: Check) -> Verdict:
    where = _find(check, "datasets", "dataset")
    if isinstance(where, Verdict):
        return where
    try:
        rows = read_sample(where, check.column, split=check.split)
    except ImportError:
        return Verdict(False, f"reading parquet needs pyarrow, which this environment lacks ({where})",
                       "the job runs it", unreachable=True)
    except NotData as exc:
        return Verdict(False, str(exc), "point the dataset's source at a .jsonl, .json or .parquet file (or a"
                       " directory of them) with one conversation a row")
    except (OSError, ValueError) as exc:
        return Verdict(False, f"cannot read a sample of {where}: {exc}", "point the dataset's source at a data file")
    if not rows:
        return Verdict(False, f"{where} has no rows", "point the dataset's source at a file with conversations")
    return assistant_turns(rows, check.column, dict(check.tags))


def _built_before(directory: Path, complete: bool, failed_as: str, fix: str, not_yet: str) -> Verdict:
    """A grid-level job's output the cell needs (its model prep, its tokenization): there; or its job failed,
    and why (the ledger in its directory); or not built yet, and the check waits for the cell's job."""
    if complete:
        return Verdict(True)
    failed = events.last(events.read(directory), Kind.FAILED)
    if failed is not None:
        return Verdict(False, f"{failed_as}: {failed.reason}", f"{fix} and run the grid again with rerun_failed=true")
    return Verdict(False, not_yet, "", unreachable=True)


def check_prepared(check: Check) -> Verdict:
    """The model's prepared copy is there; if its prep failed, why."""
    prep_dir = Path(check.target)
    return _built_before(prep_dir, prep_complete(prep_dir), "its model prep failed",
                         f"fix the prep (its log: {prep_dir}/prep.log)",
                         f"the model's prepared copy {prep_dir / 'model'} is not there yet; the prep runs before the cell")


def check_staged(check: Check) -> Verdict:
    """Every file training needs of a pinned Hub repository is in the cache (target: its snapshot directory);
    else, if its staging job failed, why; else it is not staged yet and whatever reads it waits."""
    parsed = parse_snapshot(check.target)
    if parsed is None:
        return Verdict(False, f"{check.target} is not a snapshot of a Hugging Face cache", "")
    cache, repo_id, kind, sha = parsed
    if is_complete(cache, repo_id, kind, sha):
        return Verdict(True)
    failed = staging_failure(cache, repo_id, kind, sha)
    if failed:
        return Verdict(False, f"staging {kind} {repo_id}@{sha[:12]} failed: {failed}",
                       "fix the cause, stage it again (python -m sft_grid.stage, or the grid command) and run the"
                       " grid again with rerun_failed=true")
    return Verdict(False, f"{kind} {repo_id}@{sha[:12]} is not staged in {cache} yet; staging runs before the cell",
                   "", unreachable=True)


def check_tokenized(check: Check) -> Verdict:
    """The grid's shared tokenized dataset of the cell is built; if its tokenize job failed, why."""
    tok_dir = Path(check.target)
    return _built_before(tok_dir, tokenized_complete(tok_dir), "its tokenized dataset was not built",
                         f"fix the cause (its log: {tok_dir}/tokenize.log)",
                         f"the tokenized dataset {tok_dir} is not built yet; it is built before the cell")


RUNNERS: dict[str, Callable[[Check], Verdict]] = {
    "staged": check_staged,
    "tokenized": check_tokenized,
    "prepared": check_prepared,
    "path": check_path,
    "template_tokens": check_template_tokens,
    "assistant_turns": check_assistant_turns,
    "loss_mask": lambda check: mask.run_checks([check])[check],
}


def run(check: Check) -> Verdict:
    return RUNNERS[check.kind](check)
