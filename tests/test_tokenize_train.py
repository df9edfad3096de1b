"""Tokenize once, really run: a local grid of cells on the same data builds one tokenized dataset with each
backend's own preprocessing (LLaMA-Factory's get_dataset into `tokenized_path`, axolotl's `preprocess` into its
`dataset_prepared_path`, after the seeded mix step of an interleaved mix), and every cell's job loads it and
never tokenizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sft_grid.core.layout import DATA_STEP_FILE, iter_cell_dirs
from sft_grid.core.tokenized import MARKER

from .conftest import run_sft
from .helpers import grid_states

pytestmark = pytest.mark.backend

# what each backend logs when it loads a shared dataset, and when it tokenizes itself
LOADS = {"llamafactory": "Loaded tokenized dataset from", "axolotl": "Loading prepared dataset from disk at"}
TOKENIZES = {"llamafactory": "Running tokenizer on dataset", "axolotl": "Loading raw datasets"}


def assert_one_tokenization_loaded_by_every_cell(root: Path, backend: str, mixed: bool) -> Path:
    assert all(s.state.value == "completed" for s in grid_states(root).values())
    (tok_dir,) = list((root / "_tokenized").iterdir())
    marker = json.loads((tok_dir / MARKER).read_text())
    assert marker["cpu_s"] > 0 and tok_dir.name.endswith(marker["key"])
    if mixed:
        assert (tok_dir / "data" / "mix.jsonl").is_file()  # the mix step ran once, in the tokenize job
    assert len(data_steps(tok_dir)) == 1  # the backend's data step ran once there, and ended
    cells = list(iter_cell_dirs(root / "default"))
    assert len(cells) == 2
    for cell in cells:
        log = (cell / "logs" / "train.log").read_text()
        assert LOADS[backend] in log and str(tok_dir) in log
        assert TOKENIZES[backend] not in log
        assert not (cell / "data").exists()  # no per-cell mix file
        assert len(data_steps(cell)) == 1  # the cell's own data step: the load
    return tok_dir


def test_cells_on_the_same_data_load_one_tokenization_llamafactory(tmp_path, tiny_assets):
    proc = run_sft(
        "-m",
        "model=tiny_llama",
        "lr=1e-5,2e-5",
        "max_steps=2",
        "global_batch_size=2",
        "cutoff_len=256",
        f"runs_root={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_one_tokenization_loaded_by_every_cell(tmp_path, "llamafactory", mixed=False)
    # a change of what decides the tokens builds a new one beside it; the old one is kept for its cells (the key is
    # the same code for both backends: tests/test_tokenize_plan.py)
    # (two new cells: a tokenization only one local cell needs is done in that cell's own job)
    again = run_sft(
        "-m",
        "model=tiny_llama",
        "lr=1e-5,2e-5",
        "max_steps=2",
        "global_batch_size=2",
        "cutoff_len=128",
        f"runs_root={tmp_path}",
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(list((tmp_path / "_tokenized").iterdir())) == 2


def test_cells_on_the_same_data_load_one_tokenization_axolotl_interleaved(axolotl_mix_grid):
    """The shared axolotl grid (tests/conftest.py): two cells on an interleaved mix."""
    assert_one_tokenization_loaded_by_every_cell(axolotl_mix_grid.root, "axolotl", mixed=True)


def data_steps(directory):
    """The ended data steps recorded in a job's directory (in_venv/data_step.py); every one started, ended, ok."""
    records = [json.loads(line) for line in (directory / DATA_STEP_FILE).read_text().splitlines()]
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "end"]
    assert len(starts) == len(ends) and all(r["ok"] and r["cpu_s"] > 0 and r["wall_s"] > 0 for r in ends), records
    return ends
