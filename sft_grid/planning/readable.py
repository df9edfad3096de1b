"""Where an input can be read here: a local path, or a hub id's copy in the Hugging Face cache; a sample of rows.

No hub access from here: a hub id with no copy in the cache cannot be read, and its checks wait for the job.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sft_grid.core.hubcache import (
    MAIN,
    SHA_RE,
    default_cache,
    read_ref,
    repo_id_problem,
    revision_problem,
    snapshot_path,
)
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.inputs import hf_cache, pin_of

SAMPLE_ROWS = 200
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


def hub_cache() -> Path:
    return default_cache()


def _cached_snapshot(repo_id: str, kind: str) -> Path | None:
    snapshots = hub_cache() / f"{kind}--{repo_id.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def locate(target: str, kind: str) -> Path | None:
    """A readable local copy of a path or hub id (kind: 'models' or 'datasets'), or None."""
    if is_local(target):
        path = Path(os.path.expanduser(target))
        return path if path.exists() else None
    return _cached_snapshot(target, kind)


def real_source(source: str) -> str:
    """A dataset source as what it reads: a local path with `~` and its symbolic links resolved (two names of one
    file are one source), a hub id as it is."""
    return os.path.realpath(os.path.expanduser(source)) if is_local(source) else source


def model_dir(cell: Cell) -> Path | None:
    """The model's directory readable here, as its job loads it: its local path; a Hub model's pinned snapshot; else
    the snapshot its revision names in the cluster's or this environment's Hugging Face cache (a sha, or the commit
    a branch's `refs/` file points at), and for a model that names no revision the cache's newest copy. None where
    there is none (a revision with no copy here: the cache's newest copy may be another commit)."""
    m = cell.spec.model
    if m.path:
        return locate(m.path, "models")
    if not m.hub_id or "://" in m.hub_id or repo_id_problem(m.hub_id):
        return None
    pin = pin_of(cell, "model", m.hub_id)
    if pin is not None:
        return pin.path
    revision = str(m.revision or MAIN)
    if revision_problem(revision):
        return None
    for cache in dict.fromkeys((hf_cache(cell.spec), hub_cache())):
        sha = revision if SHA_RE.match(revision) else read_ref(cache, m.hub_id, "model", revision)
        snapshot = snapshot_path(cache, m.hub_id, "model", sha) if sha else None
        if snapshot is not None and snapshot.is_dir():
            return snapshot
    return locate(m.hub_id, "models") if m.revision is None else None


_CONFIGS: dict[tuple[str, int], dict[str, Any] | None] = {}


def model_config(cell: Cell) -> tuple[Path, dict[str, Any]] | None:
    """The model's config.json readable here (`model_dir`) and where it is: its text model's part where it has one
    (a multimodal checkpoint's `text_config`). Read once per file content (its path and mtime); None where there is
    none, or it is not a JSON object (the preflight's model check says why). The one reader of a model's
    config.json in planning: the shape rule (hub_rules) and the estimate (costs) read the same file the same way."""
    where = model_dir(cell)
    file = where / "config.json" if where is not None else None
    try:
        key = (str(file), file.stat().st_mtime_ns) if file is not None and file.is_file() else None
    except OSError:
        key = None
    if file is None or key is None:
        return None
    if key not in _CONFIGS:
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        text = config.get("text_config") if isinstance(config, dict) else None
        _CONFIGS[key] = text if isinstance(text, dict) else config if isinstance(config, dict) else None
    config = _CONFIGS[key]
    return (file, config) if config is not None else None


class NotData(ValueError):
    """A local dataset source that holds no data file sft_grid or the backends read; `fix`, where known, how to
    make it one."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


class NoSplit(NotData):
    """A dataset `split` its source does not have: the backend would train on another one instead."""


def data_files(where: Path, split: str = "train") -> list[Path]:
    """The data file, or the data files of a directory (a staged snapshot: those of the split first) in name order.
    A split other than train must be there: one file is the split `train` to both backends (the split would be
    dropped and the whole file trained), and a directory names its splits in its files' paths."""
    if where.is_file():
        if where.suffix not in DATA_SUFFIXES:
            raise NotData(f"{where} is not a data file (expected {', '.join(DATA_SUFFIXES)})")
        if split != "train":
            raise NoSplit(
                f"split {split!r} asked of one file, which the backends read whole as the split 'train' (the cell"
                " would train on all of it)"
            )
        return [where]
    files = sorted(
        (p for p in where.rglob("*") if p.suffix in DATA_SUFFIXES),
        key=lambda p: (split not in p.relative_to(where).as_posix(), p),
    )
    if not files:
        raise NotData(f"no {', '.join(DATA_SUFFIXES)} file in {where}")
    if split != "train" and split not in files[0].relative_to(where).as_posix():
        named = sorted({s for s in SPLIT_NAMES for p in files if s in p.relative_to(where).as_posix()})
        raise NoSplit(
            f"no file of split {split!r} in {where} (splits its files name: {', '.join(named) or 'none'}): the"
            " backend would train on another split"
        )
    return files


# the split names the datasets library recognises in file names
SPLIT_NAMES = ("train", "validation", "valid", "dev", "test", "eval")


def _columns(file: Path) -> tuple[str, ...] | None:
    """The columns of a data file, from its first row (JSON) or its schema (parquet); None when that cannot be read
    here (the file's own reading says why)."""
    try:
        if file.suffix == ".jsonl":
            with file.open("rb") as fh:
                for raw in fh:
                    if raw.strip():
                        row = json.loads(raw)
                        return tuple(sorted(row)) if isinstance(row, dict) else None
            return None
        if file.suffix == ".json":
            data = json.loads(file.read_bytes())
            first = data[0] if isinstance(data, list) and data else data
            return tuple(sorted(first)) if isinstance(first, dict) else None
        import pyarrow.parquet as pq

        return tuple(sorted(pq.read_schema(file).names))
    except (OSError, ValueError, ImportError):
        return None


def same_columns(where: Path, files: list[Path], split: str) -> None:
    """The files of one split must share their columns: the datasets library reads them as one table and fails on
    the first that differs (a cast error, in the job, after queueing), and a check that samples the first file
    alone would pass. Raises NotData naming two files and the columns they differ in."""
    if where.is_file() or len(files) < 2:
        return
    named = [f for f in files if split in f.relative_to(where).as_posix()]
    unnamed = [f for f in files if not any(s in f.relative_to(where).as_posix() for s in SPLIT_NAMES)]
    group = named or (unnamed if split == "train" else [])
    seen: dict[tuple[str, ...], Path] = {}
    for f in group:
        cols = _columns(f)
        if cols is None:
            continue
        if seen and cols not in seen:
            other_cols, other = next(iter(seen.items()))
            only_a = sorted(set(other_cols) - set(cols))
            only_b = sorted(set(cols) - set(other_cols))
            raise NotData(
                f"the files of split {split!r} do not share one schema: {other.relative_to(where)} has"
                f" {', '.join(only_a) or 'no other column'} that {f.relative_to(where)} lacks"
                + (f", and {f.relative_to(where)} has {', '.join(only_b)}" if only_b else "")
                + "; the backend reads them as one table and would fail in the job"
            )
        seen.setdefault(cols, f)


# the first bytes of a file that is not UTF-8 text at all, and what it is (UTF-32's before UTF-16's: they share FF FE)
_NOT_TEXT = (
    (b"\x1f\x8b", "gzip-compressed"),
    (b"\xff\xfe\x00\x00", "UTF-32 text"),
    (b"\x00\x00\xfe\xff", "UTF-32 text"),
    (b"\xff\xfe", "UTF-16 text"),
    (b"\xfe\xff", "UTF-16 text"),
)
_BOM = b"\xef\xbb\xbf"


def _sniff(head: bytes, file: Path) -> None:
    """Raises NotData, with its fix, for a file whose first bytes show it is no UTF-8 text: gzip's magic bytes, or
    UTF-16/UTF-32's byte-order mark (a latin1 conversion of such a file would only convert garbage)."""
    for magic, what in _NOT_TEXT:
        if head.startswith(magic):
            marks = " ".join(f"{b:02x}" for b in magic)
            if what == "gzip-compressed":
                raise NotData(
                    f"{file} is gzip-compressed (it starts with bytes {marks}), not JSON text; the backends take a"
                    " data file by its extension (.jsonl, .json, .parquet), and LLaMA-Factory reads no .jsonl.gz",
                    f"decompress it and point the source at the result: gunzip -c {file} > {file.with_suffix('')}"
                    f"-plain{file.suffix}",
                )
            encoding = what.split()[0].lower()
            raise NotData(
                f"{file} is {what} (it starts with the byte-order mark {marks}); the backends read JSON as UTF-8",
                f"re-save it as UTF-8: iconv -f {encoding} -t utf-8 {file} > {file.with_suffix('')}-utf8{file.suffix}",
            )


def _text_of(raw: bytes, n: int, file: Path) -> str:
    """Line n (1-based) of a JSON-lines file as text: the first line's UTF-8 byte-order mark dropped (the backends'
    datasets reads such a file), a file that is no UTF-8 text at all (gzip, UTF-16/32) named as what it is."""
    if n == 1:
        _sniff(raw, file)
        raw = raw.removeprefix(_BOM)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotData(
            f"line {n} of {file} is not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); the"
            " backends read JSON lines as UTF-8",
            f"convert the file to UTF-8 (from Latin-1: iconv -f latin1 -t utf-8 {file} >"
            f" {file.with_suffix('')}-utf8{file.suffix}; check the result, the source encoding may be another)",
        ) from None


def _row_problem(row: Any, column: str, role_tag: str, content_tag: str, seen: set[str]) -> str | None:
    """What is wrong with one row as the sharegpt formatting reads it (the conversation column a list of messages,
    each an object whose role is a string and whose content a string), or None. A key no row has is not the row's
    fault but the dataset's settings (the sample check says which to set): `seen` collects the keys seen so far,
    and the caller reports a missing one only once another row has it."""
    if not isinstance(row, dict):
        return f"is not a JSON object (a row) but a JSON {_json_kind(row)}"
    if column not in row:
        return None
    seen.add(column)
    messages = row[column]
    if not isinstance(messages, list):
        return f"has {column!r} as a JSON {_json_kind(messages)}, not a list of messages"
    for i, msg in enumerate(messages, 1):
        if not isinstance(msg, dict):
            return f"has message {i} of {column!r} as a JSON {_json_kind(msg)}, not an object (a message)"
        for key in (role_tag, content_tag):
            if key in msg:
                seen.add(key)
                if not isinstance(msg[key], str):
                    kind = _json_kind(msg[key])
                    shown = "" if msg[key] is None else f" ({_shown(msg[key])})"
                    return f"has {key!r} of message {i} as a JSON {kind}{shown}, not a string (text)"
    return None


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing(row: Any, column: str, role_tag: str, content_tag: str, seen: set[str]) -> str | None:
    """A key another row has and this row lacks: the column itself, or a message's role or content."""
    if not isinstance(row, dict):
        return None
    if column not in row:
        return f"has no column {column!r} (its columns: {', '.join(sorted(row)) or 'none'})" if column in seen else None
    for i, msg in enumerate(row[column], 1):
        for key in (role_tag, content_tag):
            if key not in msg and key in seen:
                return f"has no {key!r} in message {i} (its keys: {', '.join(sorted(msg)) or 'none'})"
    return None


_SCANNED: dict[tuple[str, int, int, str, str, str], tuple[str, str] | None] = {}


def scan_rows(where: Path, column: str, tags: Mapping[str, str], split: str = "train") -> None:
    """Every line of every JSON-lines file of a local source (each file of a directory), and every row of a .json
    list: valid UTF-8, a JSON object a line, the conversation column and each message's role and content keys
    present in every row that the others have, content and role strings. A sample passes where line 11001 does not
    parse, or a write was cut off in the last line, and the backend then fails in the job, after its queue wait.
    One pass a file, streamed; its verdict cached per file (path, size, mtime) and dataset fields, so a grid of
    many cells reads each file once. Raises NotData naming the file, the line (1-based) and what is wrong, with
    its fix. Parquet is read in the backend's environment, not here."""
    role_tag, content_tag = tags.get("role_tag", "role"), tags.get("content_tag", "content")
    for file in data_files(where, split):
        if file.suffix not in (".jsonl", ".json"):
            continue
        st = file.stat()
        key = (str(file), st.st_size, st.st_mtime_ns, column, role_tag, content_tag)
        if key not in _SCANNED:
            _SCANNED[key] = (_scan_lines if file.suffix == ".jsonl" else _scan_list)(
                file, column, role_tag, content_tag
            )
        found = _SCANNED[key]
        if found is not None:
            raise NotData(*found)


def _scan_lines(file: Path, column: str, role_tag: str, content_tag: str) -> tuple[str, str] | None:
    seen: set[str] = set()
    lacking: tuple[int, Any] | None = None  # the first row lacking a key, while no row had it yet
    fix_row = f"fix that line or remove it (see it: sed -n {{n}}p {file})"
    try:
        with file.open("rb") as fh:
            n = 0
            for n, raw in enumerate(fh, 1):
                line = _text_of(raw, n, file)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    # the text ends inside a string or before the object closes, and nothing follows
                    ends = exc.msg.startswith("Unterminated") or exc.pos >= len(line.rstrip())
                    if ends and all(not rest.strip() for rest in fh):
                        return (
                            f"the last line ({n}) of {file} is cut off, an interrupted write? ({exc.msg} column"
                            f" {exc.colno}, and the line ends there)",
                            f"write the file again, or drop that line: sed -i '{n}d' {file}",
                        )
                    return (
                        f"line {n} of {file} is not JSON: {exc.msg} (column {exc.colno})",
                        fix_row.format(n=n) + "; one JSON object a line",
                    )
                wrong = _row_problem(row, column, role_tag, content_tag, seen)
                if wrong is not None:
                    return f"line {n} of {file} {wrong}", fix_row.format(n=n)
                at, missing = n, _missing(row, column, role_tag, content_tag, seen)
                if missing is None and lacking is not None:
                    at, missing = lacking[0], _missing(lacking[1], column, role_tag, content_tag, seen)
                if missing is not None:
                    return (
                        f"line {at} of {file} {missing}, which the other rows have; the backend reads null there"
                        " and fails in the job",
                        fix_row.format(n=at),
                    )
                if lacking is None and not _complete(row, column, role_tag, content_tag):
                    lacking = (n, row)
    except NotData as exc:
        return str(exc), exc.fix
    return None


def _complete(row: dict[str, Any], column: str, role_tag: str, content_tag: str) -> bool:
    return column in row and all(role_tag in m and content_tag in m for m in row[column])


def _scan_list(file: Path, column: str, role_tag: str, content_tag: str) -> tuple[str, str] | None:
    try:
        with file.open("rb") as fh:
            _sniff(fh.read(4), file)
        data = json.loads(file.read_bytes().decode("utf-8"))
    except NotData as exc:
        return str(exc), exc.fix
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # read_sample says what (the whole file's reading)
    if not isinstance(data, list):
        return None
    seen: set[str] = set()
    wrong = next(
        ((i, w) for i, r in enumerate(data, 1) if (w := _row_problem(r, column, role_tag, content_tag, seen))), None
    )
    # then the keys some row has and another lacks, now that every key seen is known
    wrong = wrong or next(
        ((i, w) for i, r in enumerate(data, 1) if (w := _missing(r, column, role_tag, content_tag, seen))), None
    )
    if wrong is None:
        return None
    return f"row {wrong[0]} of {file} (a JSON list) {wrong[1]}", f"fix or remove that row of {file}"


def row_lines(file: Path, limit: int) -> list[int]:
    """The file lines (1-based) of the first `limit` rows of a JSON-lines file, as read_sample reads them (blank
    lines skipped): where a row of a sample is in its file. Empty for other files, or one that cannot be read."""
    if file.suffix != ".jsonl":
        return []
    lines: list[int] = []
    try:
        with file.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                if len(lines) >= limit:
                    break
                if raw.strip():
                    lines.append(n)
    except OSError:
        return []
    return lines


def read_sample(where: Path, column: str, limit: int = SAMPLE_ROWS, split: str = "train") -> list[dict[str, Any]]:
    """The first rows of a local data file (or of the first data file in a directory), once the files of the split
    are known to share one schema. Raises NotData, ValueError for a file that does not parse, and ImportError for
    parquet where pyarrow is missing."""
    files = data_files(where, split)
    same_columns(where, files, split)
    file = files[0]
    if file.suffix == ".jsonl":
        rows = []
        with file.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                line = _text_of(raw, n, file)
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"line {n} of {file} is not JSON: {exc}") from None
                    if not isinstance(row, dict):
                        raise NotData(f"line {n} of {file} is not a JSON object (a row)")
                    rows.append(row)
                if len(rows) >= limit:
                    break
        return rows
    if file.suffix == ".json":
        with file.open("rb") as fh:
            _sniff(fh.read(4), file)
        try:
            data = json.loads(file.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise NotData(f"{file} is not UTF-8 text (byte {exc.start}); the backends read JSON as UTF-8") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        rows = list(data[:limit]) if isinstance(data, list) else [data]
        if not all(isinstance(r, dict) for r in rows):
            raise NotData(f"{file} holds no list of JSON objects (rows)")
        return rows
    import pyarrow.parquet as pq  # only for parquet data; raises ImportError where absent

    table = pq.ParquetFile(file).read_row_group(0, columns=[column])
    out: list[dict[str, Any]] = table.slice(0, limit).to_pylist()
    return out
