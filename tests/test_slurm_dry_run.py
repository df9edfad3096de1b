"""A dry run is the submission, on the real local Slurm cluster (scripts/slurm_up.sh): the sbatch scripts a real
run sends equal the dry run's preview byte for byte apart from job ids (a grid with a model prep, training arrays
and post-training arrays); and a dry run of a grid whose jobs are queued, one of its orchestrators killed in the
middle of submitting, changes nothing: squeue, every ledger and every submitit folder stay byte-identical.

A `sbatch` first on PATH copies each script it is given, then runs the real one (or kills the orchestrator right
after it, as a crash would). Every job a test queues is cancelled at the end.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sft_grid.cli.present import normalise_ids
from sft_grid.core.layout import LEDGER_FILE, SUBMITIT_DIR

from .conftest import run_sft
from .helpers import ledger

pytestmark = [pytest.mark.slurm, pytest.mark.backend]

REAL_SBATCH = shutil.which("sbatch") or "/usr/bin/sbatch"
CAPTURE = 'mkdir -p "$CAPTURE"; cp "${@: -1}" "$CAPTURE/$(date +%s%N).sh"\n'


def fake_sbatch(tmp_path: Path, tail: str) -> dict[str, str]:
    """The environment for a run whose sbatch captures every script into tmp_path/captured, then `tail`."""
    bin_dir = tmp_path / "capturebin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sbatch"
    script.write_text(f"#!/usr/bin/env bash\nREAL={REAL_SBATCH}\nCAPTURE={tmp_path / 'captured'}\n{CAPTURE}{tail}")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def run_with(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = env["PATH"]
    try:
        return run_sft(*args, timeout=timeout)
    finally:
        os.environ["PATH"] = saved


def test_the_real_run_sends_the_dry_runs_sbatch_scripts(runs_root, tmp_path):
    grid = [
        "-m",
        "model=tiny_delphi,tiny_llama",
        "seed=1,2",
        "max_steps=2",
        "global_batch_size=2",
        "cutoff_len=256",
        "cluster=slurm_local",
        "+cluster.sbatch_extra.hold=true",
        f"runs_root={runs_root}",
    ]
    dry = run_sft(*grid, "dry_run=true", check=True)
    previews = {p.stem: p.read_text() for p in (runs_root / "default" / ".dry_run").glob("*.sbatch")}
    roles = re.findall(r"sft_grid-[0-9a-f]+: (model prep|tokenize once|training|post-training stages)", dry.stdout)
    assert sorted(roles) == ["model prep", "post-training stages", "tokenize once", "training"]
    run_with(fake_sbatch(tmp_path, 'exec "$REAL" "$@"\n'), *grid)
    sent = [p.read_text() for p in sorted((tmp_path / "captured").glob("*.sh"))]
    assert len(sent) == len(previews) == 4
    for script in sent:
        name = re.search(r"^#SBATCH --job-name=(\S+)", script, re.M).group(1)
        assert normalise_ids(script) == normalise_ids(previews[name]), name
    # the dependencies name the jobs the dry run named: the tokenize array waits for the prep, the training array
    # for the tokenize array, the post array for the training array task by task
    assert sum("--dependency=afterany:" in s for s in sent) == 2 and sum("aftercorr:" in s for s in sent) == 1


def snapshot(runs_root: Path) -> dict[str, str]:
    """squeue's view of every job, and every ledger and every file of every submitit folder, by content."""
    files = [
        *runs_root.rglob(LEDGER_FILE),
        *[p for p in runs_root.rglob("*") if p.is_file() and (SUBMITIT_DIR in p.parts or "submitit" in p.parts)],
    ]
    out = {str(p.relative_to(runs_root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}
    # the queue's view of this grid's jobs only (other tests share the cluster): every job its ledgers name
    names = {e["name"] for p in runs_root.rglob(LEDGER_FILE) for e in ledger(p.parent) if e.get("name")}
    queue = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i|%j|%T|%r"], capture_output=True, text=True, timeout=30
    ).stdout
    out["squeue"] = "".join(  # sorted: squeue's own order among equals is not stable
        sorted(line + "\n" for line in queue.splitlines() if line.split("|")[1:2] and line.split("|")[1] in names)
    )
    return out


def test_a_dry_run_of_a_grid_in_flight_after_a_crash_changes_nothing(runs_root, tmp_path):
    # (the training array is the first sbatch: no tokenize-once job before it)
    base = [
        "-m",
        "model=tiny_llama",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "tokenize_once=false",
        "cluster=slurm_local",
        "+cluster.sbatch_extra.hold=true",
        f"runs_root={runs_root}",
    ]
    run_sft(*base, "seed=1,2", check=True)  # queued (held), ids recorded
    # a second invocation dies right after sbatch: its jobs are queued, their ids and pickles not in place
    killed = run_with(
        fake_sbatch(tmp_path, 'out=$("$REAL" "$@"); rc=$?; echo "$out"; kill -9 $PPID; exit $rc\n'), *base, "seed=3,4"
    )
    assert killed.returncode != 0
    before = snapshot(runs_root)
    assert before["squeue"].count("sft_grid-") == 4 + 2  # four training tasks, the first grid's two post tasks
    dry = run_sft(*base, "seed=1,2,3,4,5", "dry_run=true", check=True)
    assert "recover job" in dry.stdout and "would skip" in dry.stdout
    assert snapshot(runs_root) == before
