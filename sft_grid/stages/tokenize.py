"""Tokenize once per grid: cells whose training data is identical after tokenization share one tokenized dataset,
built once as a stage, with each backend's own preprocessing.

Why: each cell used to tokenize its data in its own job, on a GPU node, and every rank of a multi-node job did it
again (the users hit the HF datasets cache race, and a tokenization hang that looked like a 24 h timeout). Now the
grid plans one tokenization per distinct key, builds it before the cells (a CPU job on Slurm that the cells'
arrays wait for, or here, for local cells), and each cell's job loads it (core/tokenized.py); its first step
checks that it is there, or fails with why it is not.

The key is a hash of what decides the tokens (`identity`): the backend and its environment; the tokenizer's
content (checks/tokenizers.py: a digest of its files, for a Delphi checkpoint the prepared tokenizer's, so
checkpoints that carry the same tokenizer share); the template and its jinja; the backend's data settings and
each source as rendered, with its pinned commit or, for a local file, its size and modification time; the mix and
its seed where the backend's data preparation uses it; the cutoff. A change of any of them gives a new key, and
so a new tokenized dataset. A tokenizer that cannot be read where the grid runs (not staged yet) is keyed by its
name and commit instead, and read by the job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sft_grid.backends import get as backend_of
from sft_grid.backends.launch import command_line, data_step_line, script_head
from sft_grid.checks.tokenizers import TOKENIZER_FILES, check_tokenizer, tokenizer_digest
from sft_grid.core import events
from sft_grid.core.cellfiles import dump_json
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import tail_lines
from sft_grid.core.templates import TEMPLATES
from sft_grid.core.tokenized import MARKER, TOKENIZED, TOKENIZER_DIR, TokenizedData, tokenized_complete
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.environments import bin_dir
from sft_grid.planning.inputs import (
    PREP_VERSION,
    hub_variables,
    model_source,
    pin_of,
    prep_for,
    source_of,
    tokenizer_source,
)
from sft_grid.planning.readable import locate
from sft_grid.stages import once

SCRIPT = "tokenize.sh"
LOG = "tokenize.log"
LOCK = ".tokenize.lock"
IDENTITY = "tokenize.json"
TIME_MIN = 120  # the longest a tokenize job may run on Slurm (minutes)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class Tokenization:
    data: TokenizedData
    backend: str
    identity: Mapping[str, Any]  # what decides its tokens (written beside it, shown by a dry run)
    tokenizer_from: Path | None  # the tokenizer files copied into it (None: the job reads the cell's own)

    @property
    def dir(self) -> Path:
        return self.data.dir


def _tokenizer(cell: Cell) -> tuple[dict[str, Any], Path | None]:
    """The tokenizer a cell trains with, by content when it can be read here, else by name and commit."""
    prep = prep_for(cell)
    where = prep.model_dir if prep is not None and prep.complete else check_tokenizer(cell)
    if where is None and prep is None:
        where = locate(model_source(cell), "models")
    if where is not None and (where / "tokenizer.json").is_file():
        return {"digest": tokenizer_digest(where)}, where
    return {"name": source_of(cell), "prep": PREP_VERSION if prep is not None else None}, None


def _local_revision(source: str) -> tuple[int, int] | None:
    try:
        st = Path(source).expanduser().stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class _Reads:
    """What `identity` reads from the file system, once per distinct input of a grid (its cells share a few
    models, sources and templates; a digest is ~0.5 ms, a stat or a jinja read per cell adds up over 1000 cells).
    One per `plan` call: a later call sees files as they are then."""

    def __init__(self) -> None:
        self._tokenizers: dict[tuple[Any, ...], tuple[dict[str, Any], Path | None]] = {}
        self._locals: dict[str, tuple[int, int] | None] = {}
        self._jinja: dict[str, str | None] = {}

    def tokenizer(self, cell: Cell) -> tuple[dict[str, Any], Path | None]:
        m = cell.spec.model
        # what _tokenizer reads of the cell: its model, that model's pin, and the runs root its prep lives under
        key = (m.name, m.path, m.hub_id, tuple(m.needs), pin_of(cell, "model", m.hub_id or ""), cell.runs_root)
        if key not in self._tokenizers:
            self._tokenizers[key] = _tokenizer(cell)
        return self._tokenizers[key]

    def sources(self, cell: Cell) -> list[Any]:
        """Each source's revision: its pinned commit, or a local file's size and modification time."""
        out: list[Any] = []
        for name, ds in cell.spec.dataset.items():
            if is_local(ds.source):
                if ds.source not in self._locals:
                    self._locals[ds.source] = _local_revision(ds.source)
                revision = self._locals[ds.source]
                out.append([name, "local", *revision] if revision else [name, "local", None])
            else:
                out.append([name, "hub", next((p.sha for p in cell.pins if p.repo_id == ds.source), "unpinned")])
        return out

    def jinja(self, name: str) -> str | None:
        """The digest of a template's jinja text (None: a template the backends ship, or an unknown one)."""
        if name not in self._jinja:
            template = TEMPLATES.get(name)
            self._jinja[name] = (
                hashlib.sha256((template.jinja_text() or "").encode()).hexdigest()[:16] if template else None
            )
        return self._jinja[name]


def identity(cell: Cell, reads: _Reads | None = None) -> tuple[dict[str, Any], Path | None]:
    s = cell.spec
    reads = reads or _Reads()
    tokenizer, where = reads.tokenizer(cell)
    ident = {
        "backend": s.backend.name,
        "env": bin_dir(s).parent.name,
        "tokenizer": tokenizer,
        "template": s.model.template,
        "jinja": reads.jinja(s.model.template),
        # the seed counts where the backend's data preparation uses it (its data_spec keeps it then: axolotl
        # shuffles the prepared dataset with it; LLaMA-Factory only interleaves or splits with it)
        "sources": reads.sources(cell),
        "mix": [s.mix.strategy, s.mix.probs],
        "cutoff_len": s.cutoff_len,
        "data": backend_of(s.backend.name).data_spec(cell),
    }
    return ident, where


def plan(cells: Sequence[Cell]) -> dict[str, Tokenization]:
    """cell name -> the tokenization it shares (cells of backends without a tokenize job tokenize themselves)."""
    out: dict[str, Tokenization] = {}
    by_key: dict[Path, Tokenization] = {}
    reads = _Reads()
    for cell in cells:
        if not cell.spec.tokenize_once or backend_of(cell.spec.backend.name).tokenize_job is None:
            continue
        ident, where = identity(cell, reads)
        key = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:12]
        directory = cell.runs_root / TOKENIZED / f"{cell.spec.backend.name}-{key}"
        if directory not in by_key:
            by_key[directory] = Tokenization(
                TokenizedData(directory, key, where is not None), cell.spec.backend.name, ident, where
            )
        out[cell.name] = by_key[directory]
    return out


def worth_a_job(tok: Tokenization, users: Sequence[Cell]) -> bool:
    """Whether the cells that run and need `tok` load it from a job of its own, built before them. Yes when several
    load it, and where a job before the cells keeps the tokenizing off their nodes (on Slurm: a CPU job, not GPU
    time; a multi-process cell, whose every rank would tokenize). No for one cell that runs here in one process:
    nothing would be shared, and the job would only add a backend process's start-up (its imports: seconds) before
    the cell's first step; that cell tokenizes in its own job. Built already: loaded, whoever needs it."""
    return (
        tok.data.complete
        or len(users) > 1
        or any(c.spec.cluster.executor != "local" or c.world_size > 1 for c in users)
    )


def job_cell(cell: Cell, tok: Tokenization) -> Cell:
    """The cell as its tokenize job renders it: one process on a CPU node, sharing `tok`."""
    s = cell.spec
    spec = dataclasses.replace(s, nodes=1, cluster=dataclasses.replace(s.cluster, gpus_per_node=0, precision="fp32"))
    return dataclasses.replace(cell, spec=spec, tokenized=tok.data)


def files(tok: Tokenization, cell: Cell, sites: Mapping[str, Cell]) -> dict[str, str | bytes]:
    """The tokenize job's directory: the backend's own files, its script, its identity and the tokenizer copy; and,
    in a grid across sites, a script for each site (`sites`: the site's first cell) from that site's cell, which its
    job there runs (stages/once.py)."""
    structured, script = _rendered(tok, cell)
    out: dict[str, str | bytes] = {
        rel: data
        if isinstance(data, str)
        else dump_json(data)
        if rel.endswith(".json")
        else yaml.dump(data, Dumper=_DUMPER, sort_keys=False, width=120)
        for rel, data in structured.items()
    }
    out[SCRIPT] = script
    out.update({once.site_script(SCRIPT, s): _rendered(tok, c)[1] for s, c in sites.items()})
    out[IDENTITY] = json.dumps({"key": tok.data.key, **tok.identity}, indent=2, default=str) + "\n"
    if tok.tokenizer_from is not None:
        source = tok.tokenizer_from
        # config.json too (axolotl reads the model's type from it): from the prepared copy when it is made, else
        # from the checkpoint it is made from (the prep changes no architecture and no vocabulary)
        for name in (*TOKENIZER_FILES, "config.json"):
            for where in (source, Path(model_source(cell)), Path(tokenizer_source(cell))):
                if (where / name).is_file():
                    out[f"{TOKENIZER_DIR}/{name}"] = _content(where / name)
                    break
    return out


def _rendered(tok: Tokenization, cell: Cell) -> tuple[dict[str, Any], str]:
    """The backend's own files of the tokenize job as `cell` renders it (its cluster, its environment), and its
    script."""
    tcell = job_cell(cell, tok)
    env_bin = bin_dir(tcell.spec)
    structured, steps = backend_of(cell.spec.backend.name).tokenize_job(tcell, tok.dir, env_bin)  # type: ignore[misc]
    c = tcell.spec.cluster
    lines = script_head(
        [
            f"sft_grid: the tokenized dataset of {tok.backend} key {tok.data.key}, shared by every cell"
            " whose data tokenizes the same. Run by hand: bash tokenize.sh"
        ],
        tok.dir,
        c,
    )
    lines += [data_step_line(tok.dir), *c.setup, f'export PATH={command_line([str(env_bin)])}:"$PATH"']
    own = {**hub_variables(tcell), **backend_of(cell.spec.backend.name).variables(tcell)}
    lines += [f"export {k}={command_line([v])}" for k, v in sorted(own.items()) if k not in c.env]
    lines += [command_line(step) for step in steps[:-1]] + ["exec " + command_line(steps[-1])]
    return structured, "\n".join(lines) + "\n"


# (path, inode, size, mtime) -> a tokenizer file's bytes: the tokenizations of a grid (one per mix, seed, cutoff)
# copy the same few tokenizers, each file ~10 MB for a real model; read once and shared, not once per tokenization
_CONTENTS: dict[tuple[str, int, int, int], bytes] = {}


def _content(path: Path) -> bytes:
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    data = _CONTENTS.get(key)
    if data is None:
        if len(_CONTENTS) > 64:
            _CONTENTS.clear()
        data = _CONTENTS[key] = path.read_bytes()
    return data


def run(tok_dir: Path) -> str:
    """The tokenize job's entry on Slurm: build it unless it is built. A tokenization that cells of two sites of
    one file system share is queued on each site (grid/jobs.py); their jobs take turns through the lock, and
    whoever comes second finds it built. Raises TokenizeFailed with the reason."""
    return once.run_in_job(tok_dir, LOCK, tokenized_complete, build)


def build(tok_dir: Path) -> str:
    """Run a tokenize job's script here (locally, or in its Slurm job); the marker is written once the backend's
    own output is there. Raises TokenizeFailed with the reason."""
    events.append(tok_dir, Event.here(Kind.RUNNING, details=once.site()))
    clear_partial(tok_dir)  # an earlier attempt's partial output: LLaMA-Factory would load it as if complete
    before = os.times()
    script = once.script_for(tok_dir, SCRIPT)
    with (tok_dir / LOG).open("ab") as fh:
        fh.write(f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} bash {script.name}\n".encode())
        fh.flush()
        proc = subprocess.run(["bash", str(script)], stdout=fh, stderr=subprocess.STDOUT, cwd=tok_dir)
    after = os.times()
    # CPU seconds of the backend's own preprocessing (the script's processes, all of them waited for)
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    made = [p for p in (tok_dir / "data", tok_dir / "prepared") if p.is_dir() and any(p.iterdir())]
    if proc.returncode == 0 and made:
        marker = {"key": json.loads((tok_dir / IDENTITY).read_text())["key"], "cpu_s": round(cpu, 2)}
        tmp = tok_dir / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(marker) + "\n")
        os.replace(tmp, tok_dir / MARKER)
        events.append(tok_dir, Event(Kind.COMPLETED, details={"cpu_s": round(cpu, 2)}))
        return "completed"
    lines = tail_lines(tok_dir / LOG, 16384)
    errors = [line.strip() for line in lines if "Error" in line or "error" in line]
    reason = (
        f"tokenize job exited with {proc.returncode}: {(errors or lines or ['no output'])[-1][:300]}"
        f" (log: {tok_dir / LOG})"
    )
    events.append(tok_dir, Event(Kind.FAILED, reason=reason))
    raise TokenizeFailed(reason)


class TokenizeFailed(RuntimeError):
    """The tokenize job did not complete; the message is its reason."""


def run_here(tok_dir: Path) -> str | None:
    """Run a tokenization on this machine unless it is done, also by another grid meanwhile (they take turns
    through a lock); None, or why it failed."""
    return once.run_here(tok_dir, LOCK, tokenized_complete, build, TokenizeFailed)


def clear_partial(tok_dir: Path) -> None:
    """A tokenization that did not complete leaves nothing a cell could load by mistake."""
    for sub in ("data", "prepared"):
        shutil.rmtree(tok_dir / sub, ignore_errors=True)
