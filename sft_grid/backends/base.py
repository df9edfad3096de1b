"""The one interface every training backend implements, and what a backend's loss-mask probe needs.

A backend turns a cell into its own files and command line (pure), names the variables and steps launch.sh
needs, says how to resume, how its own preprocessing is asked what it trains (the loss-mask probe), and what it
cannot train (its own validation rules). Nothing outside sft_grid/backends branches on a backend's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sft_grid.core.problems import Problem
from sft_grid.planning.cells import Cell


@dataclass(frozen=True)
class MaskSpec:
    """How the loss-mask probe (sft_grid/in_venv/mask_probe.py) reproduces this backend's preprocessing: the
    tokenizer it loads, the probe's reader for this backend, and per data source the backend's own settings
    that decide that source's mask."""

    tokenizer: str
    reader: str
    sources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """A backend is these functions of a cell (each backend module builds its BACKEND from its own)."""

    name: str
    # the backend's main config file in the cell directory
    config_file: str
    # the cell's files for this backend, as data (dicts are dumped as YAML or JSON by suffix, text as is)
    files: Callable[[Cell, Path], dict[str, Any]]
    # the training argv launch.sh executes (its arguments reach the backend): (cell, cell_dir, bin_dir)
    command: Callable[[Cell, Path, Path], list[str]]
    # what it cannot train as the cell says: an error before queueing, never a different run
    problems: Callable[[Cell], Iterator[Problem]]
    # how the loss-mask probe reproduces its preprocessing
    mask_spec: Callable[[Cell], MaskSpec]
    # launch.sh arguments that resume training from a checkpoint
    resume_args: Callable[[Path], list[str]]
    # environment variables launch.sh exports for this backend (the cluster's own win)
    variables: Callable[[Cell], dict[str, str]] = lambda cell: {}
    # steps launch.sh runs before training (argv lists): (cell, cell_dir, bin_dir)
    pre_commands: Callable[[Cell, Path, Path], list[list[str]]] = lambda cell, cell_dir, bin_dir: []
    # what decides its tokens, besides the tokenizer (data settings, sources as rendered): the identity of a
    # tokenized dataset that cells can share (stages/tokenize.py)
    data_spec: Callable[[Cell], dict[str, Any]] = lambda cell: {}
    # the tokenize-once job of a cell (one that will load the result, run as one process): its files in the
    # job's directory and its steps, the last being the backend's own preprocessing; (cell, tok_dir, bin_dir)
    tokenize_job: Callable[[Cell, Path, Path], tuple[dict[str, Any], list[list[str]]]] | None = None
    # launch.sh arguments that end this leg of training at a step, its checkpoint saved, after a
    # cooldown probe of that many steps from it (0: none), (stop_at_step, probe_steps); None: the backend cannot
    # end a leg at a rung (a `prune:` block is refused for it). The job runner also exports LEG_ENV=<step> to the
    # leg's launch.sh: the real backends' trainers end the leg from it (in_venv/leg_stop.py) and take no arguments
    legs: Callable[[int, int], list[str]] | None = None
    # whether a leg can end with a cooldown probe from its rung's checkpoint (`guard: cooldown`); a backend
    # without one compares its cells at the same schedule position (`guard: position`) only
    cooldown_probe: bool = False
    # the model a cell's result stands for, (its name, its parameter count), where that is not the cell's own model
    # (replay: the model whose measured curve the cell replays, on the config's stand-in); None: the cell's model.
    # An adaptive grid reads it (adaptive/steer.py) for a cell's cost where the planner has no estimate, its size
    # on a parameter axis, and the model name a holdout names
    stands_for: Callable[[Cell], tuple[str, int] | None] = lambda cell: None


# the leg a cell's next job trains (sft_grid/adaptive/prune.py writes it, job/runner.py reads it):
# {"stop_at_step": int, "probe_steps": int}; absent: train to the end
LEG_FILE = "leg.json"
# the variable the job runner sets for a leg that ends at a rung (read by in_venv/leg_stop.py, which repeats the name)
LEG_ENV = "SFT_GRID_LEG_STOP"
