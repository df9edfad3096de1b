"""launch.sh: the one script that trains a cell, runnable by hand, built from argv lists with shell quoting.

It sets the cluster's variables and setup lines, the distributed launcher's variables from the Slurm
allocation (several ranks), the virtual environment's bin/ first on PATH, the backend's own variables and
steps, then execs the backend's command; its arguments (`bash launch.sh key=value`) reach the backend.
`script_head` is the part every sft_grid script shares (the model prep's prep.sh too).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from sft_grid.backends import get, wandb
from sft_grid.core.layout import DATA_STEP_FILE
from sft_grid.core.schema import ClusterConf
from sft_grid.planning.cells import Cell
from sft_grid.planning.inputs import hub_variables

# `--flag=${VAR}`: a launcher flag whose value is one of the variables launch.sh itself sets
_OWN_VARIABLE = re.compile(r"^--[a-z_]+=\$\{[A-Z_]+\}$")


def quote(arg: str) -> str:
    """Shell quoting for argv; the launch script's own variables are expanded, nothing else ever is."""
    return f'"{arg}"' if _OWN_VARIABLE.match(arg) else shlex.quote(arg)


def command_line(argv: Sequence[str]) -> str:
    return " ".join(quote(a) for a in argv)


def script_head(comment: Sequence[str], cwd: Path, cluster: ClusterConf) -> list[str]:
    """Shebang, what the script is, strict mode, its directory, the cluster's variables and setup lines."""
    lines = ["#!/usr/bin/env bash", *(f"# {c}" for c in comment), "set -euo pipefail", f"cd {shlex.quote(str(cwd))}"]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(cluster.env.items())]
    return lines


def distributed_lines(cell: Cell) -> list[str]:
    """torchrun on every node, from the Slurm allocation: c10d rendezvous at the first node's address.

    LLaMA-Factory's CLI starts torchrun itself from these variables (FORCE_TORCHRUN, NNODES, NODE_RANK,
    NPROC_PER_NODE, MASTER_ADDR/PORT, RDZV_ID). Outside Slurm it is one node on this machine.
    """
    return [
        "# several ranks: torchrun on each node, c10d rendezvous at the first node of the allocation",
        f"export FORCE_TORCHRUN=1 NNODES={cell.nodes} NPROC_PER_NODE={cell.ranks_per_node}"
        f" WORLD_SIZE={cell.world_size}",
        'export NODE_RANK="${SLURM_NODEID:-0}" RDZV_ID="${SLURM_JOB_ID:-local}"',
        'if [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
        '  first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        '  MASTER_ADDR=$(scontrol show node "$first_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        "fi",
        # every node of a Slurm job derives the same port from its id; one machine outside Slurm takes a free one,
        # so that two grids (or a grid and a launch.sh run by hand) training several ranks there never collide
        'if [ -z "${MASTER_PORT:-}" ] && [ -n "${SLURM_JOB_ID:-}" ];'
        " then MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)); fi",
        'if [ -z "${MASTER_PORT:-}" ]; then',
        """  MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0));"""
        " print(s.getsockname()[1])')",
        "fi",
        'export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}" MASTER_PORT',
    ]


def data_step_line(directory: Path) -> str:
    return f"export SFT_GRID_DATA_STEP={shlex.quote(str(directory / DATA_STEP_FILE))}"


def watchdog_line(cell: Cell) -> str:
    """The loss watchdog's settings, which both backends' hooks read (in_venv/loss_watchdog.py)."""
    w = cell.spec.watchdog
    if not w.enabled:
        return "export SFT_GRID_WATCHDOG=off"
    return (
        f"export SFT_GRID_WATCHDOG=on SFT_GRID_WATCHDOG_K={w.k:g} SFT_GRID_WATCHDOG_P={w.p}"
        f" SFT_GRID_WATCHDOG_TOL={w.tol:g}"
    )


def launch_script(cell: Cell, cell_dir: Path, bin_dir: Path) -> str:
    s = cell.spec
    backend = get(s.backend.name)
    lines = script_head(
        [
            f"sft_grid cell {cell.name} of grid {s.sweep_name!r}: {s.model.name} on {'+'.join(s.dataset)}"
            f" with {s.backend.name}.",
            "Run by hand: bash launch.sh [key=value ...]  (extra arguments go to the backend;",
            "training resumes from the last checkpoint in output/). Secrets come from your environment only.",
        ],
        cell_dir,
        s.cluster,
    )
    # one W&B run per cell: a requeued or rerun job continues it instead of starting another
    lines.append(f"export WANDB_RUN_ID={shlex.quote(f'{s.sweep_name}-{cell.key}')} WANDB_RESUME=allow")
    lines += [watchdog_line(cell), data_step_line(cell_dir)]
    lines += wandb.lines(cell, cell_dir)
    lines += list(s.cluster.setup)
    if cell.world_size > 1:
        lines += distributed_lines(cell)
    lines.append(f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"')
    # the Hub's variables (the staged cache, offline mode) and the backend's own (the cluster's env wins), then
    # the backend's steps before training
    own = {**hub_variables(cell), **backend.variables(cell)}
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(own.items()) if k not in s.cluster.env]
    lines += [command_line(step) for step in backend.pre_commands(cell, cell_dir, bin_dir)]
    lines.append("exec " + command_line(backend.command(cell, cell_dir, bin_dir)) + ' "$@"')
    return "\n".join(lines) + "\n"
