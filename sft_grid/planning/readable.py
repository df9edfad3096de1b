"""Where an input can be read here: a local path, or a hub id's copy in the Hugging Face cache; a sample of rows.

No hub access from here: a hub id with no copy in the cache cannot be read, and its checks wait for the job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sft_grid.core.hubcache import default_cache
from sft_grid.planning.cells import is_local

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


class NotData(ValueError):
    """A local dataset source that holds no data file sft_grid or the backends read."""


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
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise NotData(
                        f"line {n} of {file} is not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1});"
                        " the backends read JSON lines as UTF-8"
                    ) from None
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
