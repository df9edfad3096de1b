"""Fetch what a deferred preflight check needs, where the job runs (standalone: runs in the backend env).

    python fetch_sample.py tokenizer <hub id or path> <out_dir>
    python fetch_sample.py rows <hub id or path> <split> <n> <out.jsonl>
    python fetch_sample.py parquet <file> <column> <n> <out.jsonl>

It uses the backend's own loaders (transformers, datasets), so it reaches the hub or the node's cache
exactly as training will; it reads a few rows (streaming), never the whole dataset. `parquet` reads the first rows
of one column of a local parquet file with pyarrow (the backends' datasets needs it), for a submitting process that
has none: the preflight reads the same rows the job would.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable


def tokenizer(target: str, out_dir: str) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(target).save_pretrained(out_dir)


def rows(target: str, split: str, n: str, out_file: str) -> None:
    from datasets import load_dataset

    stream = load_dataset(target, split=split, streaming=True)
    with open(out_file, "w") as fh:
        for row in itertools.islice(stream, int(n)):
            fh.write(json.dumps(row, default=str) + "\n")


def parquet(file: str, column: str, n: str, out_file: str) -> None:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(file).read_row_group(0, columns=[column])
    with open(out_file, "w") as fh:
        for row in table.slice(0, int(n)).to_pylist():
            fh.write(json.dumps(row, default=str) + "\n")


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    commands: dict[str, Callable[..., None]] = {"tokenizer": tokenizer, "rows": rows, "parquet": parquet}
    commands[kind](*args)
