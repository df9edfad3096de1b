"""Write an interleaved mix of a cell's datasets as one file (standalone: runs in the backend env).

    python mix_data.py <cell_dir>/mix.json

axolotl cannot interleave datasets, so a cell with `mix.strategy=interleave_under|over` trains on the file
this step writes. Each source is read with its own message column and role/content fields and normalised to
`{"messages": [{"role", "content"}]}` with its own role mapping (ShareGPT human/gpt -> user/assistant); then
the datasets library's interleave_datasets mixes them with the cell's probabilities, seed and stopping
strategy: the very call LLaMA-Factory makes for the same cell, so both backends see the same rows in the same
order. Idempotent: the output carries a stamp of its spec, and a file with the same stamp is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def stamp(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def load(source: dict[str, Any]) -> Any:
    from datasets import load_dataset

    path = Path(source["source"])
    if source["local"] and path.suffix in _BUILDERS:
        return load_dataset(_BUILDERS[path.suffix], data_files=str(path), split="train")
    return load_dataset(source["source"], split=source["split"])


def normalise(ds: Any, source: dict[str, Any]) -> Any:
    """Only role/content messages, roles mapped to the template's names; every other column is dropped."""
    column, role, content, roles = source["messages"], source["role_tag"], source["content_tag"], source["roles"]

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [{"role": roles.get(m[role], m[role]), "content": m[content]} for m in row[column]]}

    return ds.map(convert, remove_columns=ds.column_names, desc=f"normalise {source['name']}")


def mix(spec: dict[str, Any]) -> Any:
    from datasets import interleave_datasets

    parts = [normalise(load(s), s) for s in spec["sources"]]
    return interleave_datasets(
        parts, probabilities=spec["probs"], seed=spec["seed"], stopping_strategy=spec["stopping_strategy"]
    )


def main(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text())
    out = Path(spec["output"])
    marker = out.with_name(out.name + ".stamp")
    key = stamp(spec)
    if out.is_file() and marker.is_file() and marker.read_text().strip() == key:
        print(f"mix_data: {out} is up to date")
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    mixed = mix(spec)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with tmp.open("w") as fh:
        for row in mixed:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(out)
    marker.write_text(key + "\n")
    print(
        f"mix_data: wrote {len(mixed)} rows to {out} ({spec['stopping_strategy']}, probs {spec['probs']},"
        f" seed {spec['seed']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
