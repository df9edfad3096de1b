"""A cell as the exact files of its directory and the exact request that submit consumes (pure).

A dry run writes these files and prints a summary; a real run writes the same files and submits the
same request, so the two cannot drift. Files a person reads are built as data and dumped once, and the
launch script is built from argv lists with shell quoting.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from sft_grid import backends
from sft_grid import env, post, zero
from sft_grid.plan import Cell
from sft_grid.preflight import Check
from sft_grid.slurm import SlurmRequest, request_for
from sft_grid.timefmt import parse_minutes

CELL_FILE = "cell.yaml"
LAUNCH_FILE = "launch.sh"
PREFLIGHT_FILE = "preflight.json"
OUTPUT_DIR = "output"
LOGS_DIR = "logs"

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class SubmitRequest:
    """What the executor needs for one cell; cells with equal `slurm` requests can share a job array."""

    cell_name: str
    cell_dir: Path
    executor: str
    timeout_min: int
    # the sbatch request (nodes, CPUs, GPUs, ...), on Slurm clusters
    slurm: SlurmRequest | None = None


@dataclass(frozen=True)
class RenderedCell:
    cell: Cell
    dir: Path
    # path relative to the cell directory -> file content; cell.yaml is written last
    files: Mapping[str, str]
    request: SubmitRequest


def env_bin(cell: Cell) -> Path:
    """The bin/ of the backend's environment: the cluster's own, the one for the model's needs (Qwen3.5:
    transformers >= 5.3), or the managed one for these pins (sft_grid/env.py select; validate reports a need
    no environment meets)."""
    return env.select(cell.spec)[0] / "bin"


def dump_yaml(data: Any, header: str = "") -> str:
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


# A grid's cells share their group sections (the composer hands out one object per group option), so
# each section is dumped once; an entry keeps its object alive, so its id cannot be reused meanwhile.
_SECTIONS: dict[tuple[str, int], tuple[Any, str]] = {}


def _section(key: str, value: Any) -> str:
    cached = _SECTIONS.get((key, id(value)))
    if cached is not None and cached[0] is value:
        return cached[1]
    text = dump_yaml({key: value})
    if len(_SECTIONS) > 4096:
        _SECTIONS.clear()
    _SECTIONS[(key, id(value))] = (value, text)
    return text


def cell_yaml(cell: Cell) -> str:
    """cell.yaml: the resolved config, its shared group sections dumped once per grid."""
    parts = [cell_header(cell)]
    scalars: dict[str, Any] = {}
    for key, value in cell.config.items():
        if isinstance(value, dict) and value:
            if scalars:
                parts.append(dump_yaml(scalars))
                scalars = {}
            parts.append(_section(key, value))
        else:
            scalars[key] = value
    if scalars:
        parts.append(dump_yaml(scalars))
    return "".join(parts)


def launch_script(cell: Cell, cell_dir: Path, bin_dir: Path) -> str:
    s = cell.spec
    backend = backends.get(s.backend.name)
    argv = backend.command(cell, cell_dir, bin_dir)
    lines = [
        "#!/usr/bin/env bash",
        f"# sft_grid cell {cell.name} of grid {s.sweep_name!r}: {s.model.name} on {'+'.join(s.dataset)} with {s.backend.name}.",
        "# Run by hand: bash launch.sh [key=value ...]  (extra arguments go to the backend;",
        "# training resumes from the last checkpoint in output/). Secrets come from your environment only.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(cell_dir))}",
    ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(s.cluster.env.items())]
    # one W&B run per cell: a requeued or rerun job continues it instead of starting another
    lines.append(f"export WANDB_RUN_ID={shlex.quote(f'{s.sweep_name}-{cell.key}')} WANDB_RESUME=allow")
    lines += list(s.cluster.setup)
    if cell.world_size > 1:
        lines += distributed_lines(cell)
    lines.append(f"export PATH={shlex.quote(str(bin_dir))}:\"$PATH\"")
    # the backend's own variables (the cluster's env wins) and its steps before training
    own_env = backend.env(cell)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(own_env.items()) if k not in s.cluster.env]
    for step in backend.pre_commands(cell, cell_dir, bin_dir):
        lines.append(" ".join(_quote(a) for a in step))
    lines.append("exec " + " ".join(_quote(a) for a in argv) + ' "$@"')
    return "\n".join(lines) + "\n"


RUN_SWITCHES = ("dry_run", "force", "rerun_failed")


def rerun_overrides(overrides: tuple[str, ...]) -> list[str]:
    """The overrides that name this cell, without this invocation's run switches."""
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in RUN_SWITCHES]


# `--flag=${VAR}`: a launcher flag whose value is one of the variables launch.sh itself sets above
_OWN_VARIABLE = re.compile(r"^--[a-z_]+=\$\{[A-Z_]+\}$")


def _quote(arg: str) -> str:
    """Shell quoting for argv; the launch script's own variables are expanded, nothing else ever is."""
    return f'"{arg}"' if _OWN_VARIABLE.match(arg) else shlex.quote(arg)


def distributed_lines(cell: Cell) -> list[str]:
    """torchrun on every node, from the Slurm allocation: c10d rendezvous at the first node's address.

    LLaMA-Factory's CLI starts torchrun itself from these variables (FORCE_TORCHRUN, NNODES, NODE_RANK,
    NPROC_PER_NODE, MASTER_ADDR/PORT, RDZV_ID). Outside Slurm it is one node on this machine.
    """
    return [
        "# several ranks: torchrun on each node, c10d rendezvous at the first node of the allocation",
        f"export FORCE_TORCHRUN=1 NNODES={cell.spec.nodes} NPROC_PER_NODE={cell.ranks_per_node}"
        f" WORLD_SIZE={cell.world_size}",
        'export NODE_RANK="${SLURM_NODEID:-0}" RDZV_ID="${SLURM_JOB_ID:-local}"',
        'if [ -n "${SLURM_JOB_NODELIST:-}" ]; then',
        '  first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        '  MASTER_ADDR=$(scontrol show node "$first_node" | sed -n "s/.*NodeAddr=\\([^ ]*\\).*/\\1/p")',
        "fi",
        'export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}" MASTER_PORT="${MASTER_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}"',
    ]


def cell_header(cell: Cell) -> str:
    rerun = " ".join(["python -m sft_grid", *(shlex.quote(o) for o in rerun_overrides(cell.overrides))])
    return (
        f"# sft_grid cell {cell.name} (identity {cell.key}) of grid {cell.spec.sweep_name!r}.\n"
        f"# The resolved config this cell was rendered from; jobs never re-read conf/.\n"
        f"# Rerun this cell: {rerun}\n"
    )


def render(cell: Cell, cell_dir: Path, deferred: list[Check]) -> RenderedCell:
    s = cell.spec
    structured = backends.get(s.backend.name).files(cell, cell_dir)
    files: dict[str, str] = {}
    for rel, data in structured.items():
        if isinstance(data, str):  # a text file, as it is (a chat template)
            files[rel] = data
        else:
            files[rel] = json.dumps(data, indent=2) + "\n" if rel.endswith(".json") else dump_yaml(data)
    for rel, data in zero.files(cell).items():  # ZeRO-3 for the models that need it
        files[rel] = json.dumps(data, indent=2) + "\n"
    bin_dir = env_bin(cell)
    files[LAUNCH_FILE] = launch_script(cell, cell_dir, bin_dir)
    files[post.POST_FILE] = json.dumps(post.post_file(cell, bin_dir / "python"), indent=2) + "\n"
    if deferred:  # no file means nothing deferred
        files[PREFLIGHT_FILE] = json.dumps(
            {"deferred": [c.to_json() for c in deferred], "python": str(bin_dir / "python"),
             "env": dict(s.cluster.env)}, indent=2) + "\n"
    files[CELL_FILE] = cell_yaml(cell)
    minutes = int(parse_minutes(s.time))
    request = SubmitRequest(
        cell_name=cell.name,
        cell_dir=cell_dir,
        executor=s.cluster.executor,
        timeout_min=minutes,
        slurm=request_for(s, minutes) if s.cluster.executor == "slurm" else None,
    )
    return RenderedCell(cell, cell_dir, files, request)


def _write_file(path: Path, text: str) -> None:
    mode = 0o755 if path.name == LAUNCH_FILE else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def write(rendered: RenderedCell) -> bool:
    """Write a cell's files so that a cell directory is never half valid; returns whether it is new.

    A new cell is written into a scratch directory beside it and renamed into place whole. An existing
    cell gets each file replaced atomically, cell.yaml last. Its ledger starts when it is submitted.
    """
    final = rendered.dir
    if not final.exists():  # (the grid creates the sweep directory before writing its cells)
        scratch = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        scratch.mkdir()
        for rel, text in rendered.files.items():
            _write_file(scratch / rel, text)
        try:
            scratch.rename(final)
            return True
        except OSError:  # another invocation created it meanwhile: fall through to replacing files
            shutil.rmtree(scratch, ignore_errors=True)
    for rel in sorted(rendered.files, key=lambda r: r == CELL_FILE):
        target = final / rel
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        _write_file(tmp, rendered.files[rel])
        tmp.replace(target)
    if PREFLIGHT_FILE not in rendered.files:
        # checks deferred by an earlier rendering (another cluster, a missing env) must not outlive it
        (final / PREFLIGHT_FILE).unlink(missing_ok=True)
    return False
