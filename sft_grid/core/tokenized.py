"""A tokenized dataset shared by the cells of a grid whose training data is identical after tokenization.

The grid's tokenize-once stage (sft_grid/stages/tokenize.py) builds it once, with the backend's own preprocessing,
in `<runs_root>/_tokenized/<backend>-<key>/`, where key is a hash of what decides the tokens (the tokenizer's
content, the template, the sources and their revisions, the mix and its seed, the cutoff, the backend's data
settings and its environment). Each cell that shares it loads it and never tokenizes: LLaMA-Factory through its
`tokenized_path`, axolotl through its `dataset_prepared_path`, with the tokenizer copied into the directory as
`tokenizer_config` (axolotl names its prepared dataset after the tokenizer's path, so every cell must name the
same one; the copy has the same content as each cell's own tokenizer, that is what the key says).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TOKENIZED = "_tokenized"
MARKER = "tokenized.json"
DATA_DIR = "data"  # LLaMA-Factory's tokenized_path; axolotl's interleaved mix file
PREPARED_DIR = "prepared"  # axolotl's dataset_prepared_path
TOKENIZER_DIR = "tokenizer"


@dataclass(frozen=True)
class TokenizedData:
    """Where a cell's tokenized dataset is; `tokenizer`: whether the directory holds the tokenizer copy (made when
    the tokenizer could be read where the grid ran)."""

    dir: Path
    key: str
    tokenizer: bool = True

    @property
    def data_dir(self) -> Path:
        return self.dir / DATA_DIR

    @property
    def prepared_dir(self) -> Path:
        return self.dir / PREPARED_DIR

    @property
    def tokenizer_dir(self) -> Path | None:
        return self.dir / TOKENIZER_DIR if self.tokenizer else None

    @property
    def complete(self) -> bool:
        return tokenized_complete(self.dir)


def tokenized_complete(directory: Path) -> bool:
    """The marker is written last, by the stage, once the backend's own output is checked."""
    try:
        return bool(json.loads((directory / MARKER).read_text()).get("key"))
    except (OSError, ValueError):
        return False
