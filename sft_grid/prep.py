"""Model prep as a stage of the grid: the Delphi tokenizer prep, once per model, shared by all its cells.

A model whose conf/model/<name>.yaml lists `needs: [delphi_tokenizer_prep]` is trained from a prepared copy:
the think/tool tokens renamed into Llama-3's reserved slots, their rows mean-initialised
(sft_grid/probes/prep_delphi.py, run in the backend's environment). The copy lives in a deterministic
directory, `<runs_root>/_prepared/<model>-<hash of source and prep version>/model`, so every cell of every
grid that trains that model renders the same model path, and a prep that is done (its `prepared.json`
marker is there) is never run again. The prep directory keeps its own ledger (events.jsonl), its script
(prep.sh, runnable by hand) and its log (prep.log).

Locally the prep runs before the cells; on Slurm it is one job per model, and the cells' arrays depend on
it (`--dependency=afterok:<id>`, cancelled if it fails), so the command still returns as soon as all is
queued. Each cell's ledger records the prep it waits for.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shlex
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from sft_grid import ledger
from sft_grid.plan import Cell
from sft_grid.templates import DELPHI_TOKENS


NEED = "delphi_tokenizer_prep"
# Bump when prep_delphi.py changes what it writes: every model is then prepared again, in a new directory
VERSION = "1"
PROBE = Path(__file__).resolve().parent / "probes" / "prep_delphi.py"
PREPARED = "_prepared"
MODEL_DIR = "model"
MARKER = "prepared.json"
SCRIPT = "prep.sh"
LOG = "prep.log"
LOCK = ".prep.lock"
# the longest a prep job may run on Slurm (minutes): load, rewrite and save one checkpoint
TIME_MIN = 60


@dataclass(frozen=True)
class Prep:
    """The prep of one model: where its prepared copy lives and what it is made from."""

    model: str
    source: str
    dir: Path

    @property
    def model_dir(self) -> Path:
        return self.dir / MODEL_DIR

    @property
    def complete(self) -> bool:
        try:
            return json.loads((self.model_dir / MARKER).read_text()).get("version") == VERSION
        except (OSError, ValueError):
            return False


def source_of(cell: Cell) -> str:
    model = cell.spec.model
    return str(Path(model.path).expanduser().resolve()) if model.path else str(model.hub_id or "")


def prep_for(cell: Cell) -> Prep | None:
    """The cell's model prep, or None when its model needs none."""
    if NEED not in cell.spec.model.needs:
        return None
    source = source_of(cell)
    digest = hashlib.sha256(f"{source}\n{VERSION}".encode()).hexdigest()[:8]
    return Prep(cell.spec.model.name, source, cell.runs_root / PREPARED / f"{cell.spec.model.name}-{digest}")


def model_source(cell: Cell) -> str:
    """What a backend loads: the prepared copy for a model that needs prep, else its path or hub id."""
    prep = prep_for(cell)
    if prep is not None:
        return str(prep.model_dir)
    return cell.spec.model.path or cell.spec.model.hub_id or ""


def script(prep: Prep, cell: Cell, python: Path) -> str:
    """prep.sh: the cluster's environment and setup, then the probe in the backend's environment."""
    c = cell.spec.cluster
    lines = [
        "#!/usr/bin/env bash",
        f"# sft_grid: Delphi tokenizer prep of model {prep.model} ({prep.source}), shared by every cell that trains it.",
        f"# Writes {MODEL_DIR}/ with {MODEL_DIR}/{MARKER} last. Run by hand: bash {SCRIPT}",
        "set -euo pipefail",
        f"cd {shlex.quote(str(prep.dir))}",
    ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(c.env.items())]
    lines += list(c.setup)
    argv = [str(python), str(PROBE), "--model", prep.source, "--output", str(prep.model_dir),
            "--tokens", json.dumps(DELPHI_TOKENS), "--version", VERSION]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


class PrepFailed(RuntimeError):
    """The prep did not complete; the message is its reason."""


class PrepJob:
    """Runs a model's prep.sh (in this process locally, or as a Slurm job) and records it in the prep's
    ledger. Picklable for submitit."""

    def __init__(self, prep_dir: str) -> None:
        self.prep_dir = prep_dir

    def __call__(self) -> str:
        where = Path(self.prep_dir)
        ledger.append(where, "running")
        with (where / LOG).open("ab") as fh:
            fh.write(f"\n=== sft_grid: {time.strftime('%Y-%m-%dT%H:%M:%S')} bash {SCRIPT}\n".encode())
            fh.flush()
            rc = subprocess.run(["bash", str(where / SCRIPT)], stdout=fh, stderr=subprocess.STDOUT, cwd=where).returncode
        if rc == 0 and (where / MODEL_DIR / MARKER).is_file():
            ledger.append(where, "completed")
            return "completed"
        lines = ledger._tail_lines(where / LOG, 16384)
        errors = [line.strip() for line in lines if "Error" in line or "failed" in line]
        reason = f"tokenizer prep exited with {rc}: {(errors or lines or ['no output'])[-1][:300]} (log: {where / LOG})"
        ledger.append(where, "failed", reason=reason)
        raise PrepFailed(reason)


def _write_script(prep: Prep, cell: Cell) -> None:
    from sft_grid.render import env_bin

    prep.dir.mkdir(parents=True, exist_ok=True)
    (prep.dir / SCRIPT).write_text(script(prep, cell, env_bin(cell) / "python"))


def unique(cells: Sequence[Cell]) -> dict[Prep, list[Cell]]:
    """Each model prep the cells need, with the cells that need it."""
    out: dict[Prep, list[Cell]] = {}
    for cell in cells:
        prep = prep_for(cell)
        if prep is not None:
            out.setdefault(prep, []).append(cell)
    return out


def describe(cells: Sequence[Cell]) -> list[str]:
    """One line per model prep: done, or to run before its cells."""
    lines = []
    for prep, users in unique(cells).items():
        if prep.complete:
            state = "done"
        elif users[0].spec.cluster.executor == "slurm":
            state = "a Slurm job its cells depend on"
        else:
            state = "runs before its cells"
        lines.append(_line(prep, users, state))
    return lines


def _line(prep: Prep, users: Sequence[Cell], state: str) -> str:
    return f"  tokenizer prep of {prep.model} for {len(users)} cell(s): {prep.model_dir} ({state})"


def run_local(cells: Sequence[Cell]) -> dict[str, str]:
    """Run every prep these cells need and is not done yet, here; returns cell name -> why it cannot run."""
    failed: dict[str, str] = {}
    for prep, users in unique(cells).items():
        if prep.complete:
            continue
        print(_line(prep, users, "running it now"), flush=True)
        prep.dir.mkdir(parents=True, exist_ok=True)
        # grids of other sweeps may share the prepared copy: one prepares it, the others find it done
        with open(prep.dir / LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if prep.complete:
                continue
            _write_script(prep, users[0])
            ledger.append(prep.dir, "submitted", executor="local")
            try:
                PrepJob(str(prep.dir))()
            except PrepFailed as exc:
                failed.update({c.name: str(exc) for c in users})
    return failed


def _in_flight_job(prep: Prep) -> str | None:
    """The Slurm job of this prep still queued or running (another invocation submitted it), if any."""
    history = ledger.events(prep.dir)
    ids = [str(e["job_id"]) for e in history if e.get("event") == "job" and e.get("job_id")]
    if not ids:
        return None
    from sft_grid import slurm

    try:
        job = slurm.sacct([ids[-1]]).get(ids[-1])
    except (OSError, subprocess.SubprocessError):
        return None
    return ids[-1] if job is not None and job.in_flight else None


def submit_slurm(prep: Prep, cell: Cell, request: Any) -> str:
    """One Slurm job for this prep (or the one already in flight), sbatched like the cells' arrays (retried
    on the controller's transient errors); returns its job id. `request`: a cell's, cut down to the prep."""
    from sft_grid import slurm

    running = _in_flight_job(prep)
    if running:
        return running
    _write_script(prep, cell)
    params = dict(request.params)
    extra = {k: v for k, v in dict(params.get("additional_parameters", ())).items() if k != "requeue"}
    params.update(nodes=1, time=min(TIME_MIN, int(params["time"])), additional_parameters=tuple(sorted(extra.items())))
    params.pop("signal_delay_s", None)
    # the prep loads one checkpoint on one process: one GPU at most (partitions may insist on one)
    if params.get("gpus_per_node"):
        params["gpus_per_node"] = 1
    if params.get("gres"):
        params["gres"] = "gpu:1"
    chunk = slurm.ArrayChunk(slurm.SlurmRequest(tuple(sorted(params.items())), 0), [prep.dir],
                             f"sft_grid-prep-{prep.model}")
    ledger.append(prep.dir, "submitted", executor="slurm")
    (job_id,) = slurm.sbatch(chunk, None, prep.dir / "submitit", PrepJob)
    ledger.append(prep.dir, "job", job_id=job_id)
    return str(job_id)


def slurm_dependencies(rendered: Sequence[Any]) -> list[Any]:
    """Submit the prep job of each model these rendered cells need (unless done), and return the cells with
    their sbatch requests depending on it: cells of different models then go to different arrays."""
    from sft_grid.slurm import with_dependency

    jobs: dict[Prep, str] = {}
    out = []
    for r in rendered:
        prep = prep_for(r.cell)
        if prep is None or prep.complete:
            out.append(r)
            continue
        if prep not in jobs:
            jobs[prep] = submit_slurm(prep, r.cell, r.request.slurm)
            print(f"  tokenizer prep of {prep.model}: job {jobs[prep]} -> {prep.model_dir}", flush=True)
        ledger.append(r.dir, "prep", model=prep.model, dir=str(prep.model_dir), job_id_prep=jobs[prep])
        slurm_request = with_dependency(r.request.slurm, jobs[prep])
        out.append(replace(r, request=replace(r.request, slurm=slurm_request)))
    return out
