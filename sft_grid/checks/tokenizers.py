"""Tokenizers as content: a digest of what decides the tokens, and a Delphi checkpoint's prepared tokenizer made
before its model prep runs.

Why: the checks before queueing (template tokens, the loss mask, the first example of each source) and the
grid's tokenize-once stage must read the tokenizer each cell really trains with. For a Delphi checkpoint that is
the prepared one, whose model prep (weights included) runs as a job after queueing. The tokenizer half of the
prep is a pure rewrite of the tokenizer files (in_venv/delphi_tokens.py, the same code the prep runs), so it is
done here, on the tokenizer files alone, into the preflight cache: `<cache root>/preflight/tokenizers/<digest of
the source tokenizer>-prep<version>/`, checked to encode each think/tool token as its one reserved id.

The digest hashes the tokenizer files' content (JSON parsed and written canonically, without the keys that name
where a file came from), so two checkpoints with the same tokenizer (every Delphi checkpoint carries Llama-3's)
have the same digest wherever they are staged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sft_grid.checks.cache import cache_dir
from sft_grid.core.hubcache import is_complete
from sft_grid.core.templates import DELPHI_TOKENS
from sft_grid.in_venv.delphi_tokens import PrepError, prepare_files
from sft_grid.planning.cells import Cell
from sft_grid.planning.inputs import PREP_VERSION, pin_of, prep_for
from sft_grid.planning.readable import locate

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "tokenizer.model",
)
# where a file came from, not what it tokenizes
_PROVENANCE_KEYS = ("name_or_path", "tokenizer_file", "_commit_hash")


def _canonical(name: str, raw: bytes) -> bytes:
    if not name.endswith(".json"):
        return raw
    data: Any = json.loads(raw)
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _PROVENANCE_KEYS}
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# (directory, each tokenizer file's (name, inode, size, mtime)) -> its digest: the cells of a grid share a few
# tokenizers, and parsing and re-serialising tokenizer.json costs ~0.5 ms a file, so each content is hashed once a
# process; a file rewritten since (a test's second grid) has another signature and is hashed again
_DIGESTS: dict[tuple[Any, ...], str] = {}


def _signature(model_dir: Path) -> tuple[Any, ...]:
    files = []
    for name in TOKENIZER_FILES:
        try:
            st = os.stat(model_dir / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
    return (str(model_dir), tuple(files))


def tokenizer_digest(model_dir: Path) -> str:
    """A hash of the tokenizer files' content (see the module docstring)."""
    key = _signature(model_dir)
    digest = _DIGESTS.get(key)
    if digest is None:
        h = hashlib.sha256()
        for name, *_ in key[1]:
            h.update(name.encode() + b"\0" + _canonical(name, (model_dir / name).read_bytes()) + b"\0")
        digest = _DIGESTS[key] = h.hexdigest()[:16]
    return digest


def prepared_tokenizer(
    source_dir: Path, tokens: Mapping[str, int] = DELPHI_TOKENS, version: str = PREP_VERSION
) -> Path:
    """The source's tokenizer with the Delphi tokens in their reserved slots (made once, in the preflight cache).
    Raises PrepError when the source is not a Llama-3 tokenizer or a token does not encode as its one id."""
    dest = cache_dir() / "tokenizers" / f"{tokenizer_digest(source_dir)}-prep{version}"
    if (dest / "tokenizer.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name in TOKENIZER_FILES:
            if (source_dir / name).is_file():
                shutil.copyfile(source_dir / name, tmp / name)
        if not (tmp / "tokenizer.json").is_file():
            raise PrepError(f"no tokenizer.json in {source_dir}")
        prepare_files(tmp, tokens)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
        for token, token_id in tokens.items():
            ids = tok.encode(token, add_special_tokens=False).ids
            if ids != [token_id]:
                raise PrepError(f"{token} encodes to {ids} after the rename; expected the single id {token_id}")
        try:
            os.rename(tmp, dest)
        except OSError:  # another grid made it meanwhile: the same content
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def check_tokenizer(cell: Cell) -> Path | None:
    """The tokenizer the cell's checks read while its model prep has not run: the prepared tokenizer of its source
    (a local checkpoint, or its staged snapshot); None when the prep is done, or its source cannot be read here."""
    prep = prep_for(cell)
    if prep is None or prep.complete:
        return None
    pin = pin_of(cell, "model", cell.spec.model.hub_id or "")
    if pin is not None and not is_complete(pin.cache, pin.repo_id, "model", pin.sha):
        return None  # not staged yet: the checks that read it wait for the job
    source = locate(prep.source, "models")
    if source is None or not (source / "tokenizer.json").is_file():
        return None
    try:
        return prepared_tokenizer(source)
    except (PrepError, ValueError, KeyError, OSError):
        return None  # not a Llama-3 tokenizer: the model prep itself fails, naming why
