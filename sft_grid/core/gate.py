"""The gate of a cell's queued job (a grid across sites): whoever takes it first decides, once.

A queued job of a cell that may move to another site is raced by two parties: the job, which starts, and a move
(sft_grid/sites/moves.py), which sends the cell elsewhere. Each claims `<cell>/gate.<site>.<job id>` (`key`: two
clusters sharing a file system may give one cell's jobs the same id) by an atomic
exclusive link of a file holding its word ("started" or "moved"); the first link wins and the loser reads the
winner's word. A job that finds "moved" trains nothing and ends; a move that finds "started" is dropped (a started
cell never moves). Crash-safe: the link is whole or absent, never half written, and claiming again returns the word
that won. Written by hand: a lock library would hold a lock for a process's life; this is a decision for good.
"""

from __future__ import annotations

import os
from pathlib import Path

STARTED, MOVED = "started", "moved"
# set in the environment of a job of a grid across sites (its sbatch's, schedulers/slurm.py): the site it was queued on
SITE_ENV = "SFT_GRID_SITE"


def key(site: str, job_id: str) -> str:
    """The gate's name for a job of a site (the site's name as the grid's `sites` list names it)."""
    return f"{site}.{job_id}" if site else job_id


def gate_path(cell_dir: Path, name: str) -> Path:
    return Path(cell_dir) / f"gate.{name}"


def claim(cell_dir: Path, name: str, word: str) -> str:
    """Claim the gate `name` (`key`: a site's job) for `word`; the word that holds it afterwards (this one, or the
    one that came first)."""
    path = gate_path(cell_dir, name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{word}")
    tmp.write_text(word)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return read(cell_dir, name) or word


def read(cell_dir: Path, name: str) -> str | None:
    path = gate_path(cell_dir, name)
    return path.read_text().strip() if path.is_file() else None
