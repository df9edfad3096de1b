"""What the backends render the same way: the keys both trainers spell alike, and the multi-rank launchers.

Each node of a multi-rank cell starts one launcher, and launch.sh sets the variables they read (NNODES,
NODE_RANK, NPROC_PER_NODE, WORLD_SIZE, MASTER_ADDR/PORT) from the Slurm allocation
(backends/launch.py). `${VAR}` arguments are expanded by launch.sh, nothing else is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sft_grid.backends import zero
from sft_grid.planning.cells import Cell


def optional_keys(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Trainer keys written only when the cell sets them: a step limit, a checkpoint limit, DeepSpeed ZeRO."""
    s = cell.spec
    out: dict[str, Any] = {}
    if s.max_steps > 0:
        out["max_steps"] = s.max_steps
    if s.save_total_limit is not None:
        out["save_total_limit"] = s.save_total_limit
    if zero.needed(cell):
        out["deepspeed"] = zero.path(cell, cell_dir)
    return out


def accelerate(env_bin: Path) -> list[str]:
    """`accelerate launch` on each node, before the module or script it starts."""
    return [
        str(env_bin / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_machines=${NNODES}",
        "--machine_rank=${NODE_RANK}",
        "--main_process_ip=${MASTER_ADDR}",
        "--main_process_port=${MASTER_PORT}",
        "--num_processes=${WORLD_SIZE}",
    ]


def torchrun(env_bin: Path) -> list[str]:
    """torchrun on each node, rendezvous at the first node of the allocation."""
    return [
        str(env_bin / "torchrun"),
        "--nnodes=${NNODES}",
        "--nproc_per_node=${NPROC_PER_NODE}",
        "--node_rank=${NODE_RANK}",
        "--master_addr=${MASTER_ADDR}",
        "--master_port=${MASTER_PORT}",
    ]
