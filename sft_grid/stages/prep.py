"""Model prep as a stage of the grid: the Delphi tokenizer prep, once per model, shared by all its cells.

Where the prepared copy lives and whether it is done is planning's (sft_grid/planning/inputs.py); this module
writes the prep's script and runs it. The prep directory keeps its own ledger (events.jsonl), its script
(prep.sh, runnable by hand: the think/tool tokens renamed into Llama-3's reserved slots by
in_venv/prep_delphi.py, in the backend's virtual environment) and its log (prep.log). Locally the grid runs the
prep before the cells, under a lock (other grids may share the prepared copy: one prepares it, the others find
it done); on Slurm it is one array of the models' preps and the cells' arrays depend on it (see grid/jobs.py), one
on each site of a grid across sites that has a cell of the model.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from sft_grid.backends.launch import command_line, script_head
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import tail_lines
from sft_grid.core.paths import IN_VENV_DIR
from sft_grid.core.templates import DELPHI_TOKENS
from sft_grid.planning.cells import Cell
from sft_grid.planning.environments import bin_dir
from sft_grid.planning.inputs import MARKER, MODEL_DIR, PREP_VERSION, Prep, hub_revision, prep_complete
from sft_grid.stages import once

SCRIPT = "prep.sh"
LOG = "prep.log"
LOCK = ".prep.lock"
PROBE = IN_VENV_DIR / "prep_delphi.py"
# the longest a prep job may run on Slurm (minutes): load, rewrite and save one checkpoint
TIME_MIN = 60


class PrepFailed(RuntimeError):
    """The prep did not complete; the message is its reason."""


def script(prep: Prep, cell: Cell) -> str:
    """prep.sh: the cluster's variables and setup, then the prep in the backend's virtual environment."""
    c = cell.spec.cluster
    lines = script_head(
        [
            f"sft_grid: Delphi tokenizer prep of model {prep.model} ({prep.source}),"
            " shared by every cell that trains it.",
            f"Writes {MODEL_DIR}/ with {MODEL_DIR}/{MARKER} last. Run by hand: bash {SCRIPT}",
        ],
        prep.dir,
        c,
    )
    lines += list(c.setup)
    argv = [
        str(bin_dir(cell.spec) / "python"),
        str(PROBE),
        "--model",
        prep.source,
        "--output",
        str(prep.model_dir),
        "--tokens",
        json.dumps(DELPHI_TOKENS),
        "--version",
        PREP_VERSION,
    ]
    revision = hub_revision(cell)
    if revision and prep.source == cell.spec.model.hub_id:
        argv += ["--revision", revision]
    lines.append("exec " + command_line(argv))
    return "\n".join(lines) + "\n"


def files(prep: Prep, cell: Cell, sites: Mapping[str, Cell]) -> dict[str, str | bytes]:
    """The prep's directory: its script from `cell`, and one for each site of a grid across sites (`sites`: the
    site's first cell) from that site's cell, which its job there runs (stages/once.py)."""
    return {SCRIPT: script(prep, cell), **{once.site_script(SCRIPT, s): script(prep, c) for s, c in sites.items()}}


def prepare(prep: Prep, cell: Cell) -> str | None:
    """Write the prep's script and run it here (unless done); None, or why it failed."""
    prep.dir.mkdir(parents=True, exist_ok=True)
    (prep.dir / SCRIPT).write_text(script(prep, cell))
    return run_here(prep.dir)


def run(prep_dir: Path) -> str:
    """The prep job's entry on Slurm: prepare the model unless it is prepared. A prep that cells of two sites of one
    file system share is queued on each site (grid/jobs.py); their jobs take turns through the lock, and whoever
    comes second finds it done."""
    return once.run_in_job(prep_dir, LOCK, prep_complete, build)


def build(prep_dir: Path) -> str:
    """Run a model's prep.sh here (locally, or in its Slurm job) and record it in the prep's ledger."""
    events.append(prep_dir, Event.here(Kind.RUNNING, details=once.site()))
    script = once.script_for(prep_dir, SCRIPT)
    with (prep_dir / LOG).open("ab") as fh:
        fh.write(f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} bash {script.name}\n".encode())
        fh.flush()
        rc = subprocess.run(["bash", str(script)], stdout=fh, stderr=subprocess.STDOUT, cwd=prep_dir).returncode
    if rc == 0 and (prep_dir / MODEL_DIR / MARKER).is_file():
        events.append(prep_dir, Event(Kind.COMPLETED))
        return "completed"
    lines = tail_lines(prep_dir / LOG, 16384)
    errors = [line.strip() for line in lines if "Error" in line or "failed" in line]
    reason = f"tokenizer prep exited with {rc}: {(errors or lines or ['no output'])[-1][:300]} (log: {prep_dir / LOG})"
    events.append(prep_dir, Event(Kind.FAILED, reason=reason))
    raise PrepFailed(reason)


def run_here(prep_dir: Path) -> str | None:
    """Run a prep (its prep.sh written) on this machine unless it is done, also by another grid meanwhile (they
    take turns through a lock); None, or why it failed."""
    return once.run_here(prep_dir, LOCK, prep_complete, build, PrepFailed)
