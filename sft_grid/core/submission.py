"""The submission plan: everything a grid invocation will do, decided before anything runs, as one object.

`submit = schedule(plan)`: the grid builds a `SubmissionPlan` from the cells, their states and the scheduler's
view, without side effects. A dry run prints it; a real run executes it and nothing else (sft_grid/grid/execute.py).
So every array, its name, size and throttle, every model prep job, every post-training array and every dependency
between them is in the plan, and what a dry run shows is what a real run sends, byte for byte apart from the job
ids that Slurm hands out.

A Slurm job of the plan is named `sft_grid-<hash>` from what it runs and how often its cells were submitted
before, so a dry run and the real run that follows it name it alike, and a later submission of the same cells
gets a new name. Names are recorded in the cells' ledgers before sbatch runs: an orchestrator killed between
sbatch and recording the job ids finds its jobs again by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

JOB_PREFIX = "sft_grid-"


class Role(str, Enum):
    STAGE = "stage"  # the grid's Hub inputs fetched into the site's cache, on a transfer partition
    PREP = "prep"  # a model's tokenizer prep, shared by its cells
    TOKENIZE = "tokenize"  # a tokenized dataset, shared by the cells whose data tokenizes the same
    TRAIN = "train"  # a cell's training (then, locally, its post-training stages)
    POST = "post"  # a cell's post-training stages, after its training
    EVAL = "eval"  # a cell's evaluation after its post-training stages, or a base model's


# what a job of each role runs on its node: "module:function", called with the target directory
ENTRIES = {
    Role.STAGE: "sft_grid.job.entries:stage",
    Role.PREP: "sft_grid.job.entries:prep",
    Role.TOKENIZE: "sft_grid.job.entries:tokenize",
    Role.TRAIN: "sft_grid.job.entries:train",
    Role.POST: "sft_grid.job.entries:post",
    Role.EVAL: "sft_grid.job.entries:evaluate",
}

# what a training job's batch script runs once its training step ended (its EXIT trap): the requeue its failure's
# policy asks for, submitted from outside the step, which srun may be killing (job/after.py); the runner reads
# AFTER_STEP_ENV to leave the submission to it
AFTER_STEP = "sft_grid.job.after"
AFTER_STEP_ENV = "SFT_GRID_AFTER_STEP"


@dataclass(frozen=True)
class SlurmRequest:
    """sbatch parameters, in submitit's SlurmExecutor vocabulary; equal requests can share an array."""

    params: tuple[tuple[str, Any], ...]
    max_requeues: int
    # the site's Slurm client environment (cluster.client_env): where sbatch sends it; left out of the
    # repr when empty, so a one-site grid's job names stay what they were
    client_env: tuple[tuple[str, str], ...] = ()
    # the site (cluster profile) a grid across sites placed the job on; "" in a one-site grid
    site: str = ""

    def __repr__(self) -> str:
        env = f", client_env={self.client_env!r}, site={self.site!r}" if self.client_env or self.site else ""
        return f"SlurmRequest(params={self.params!r}, max_requeues={self.max_requeues!r}{env})"

    def as_dict(self) -> dict[str, Any]:
        return {
            k: dict(v) if k == "additional_parameters" else list(v) if isinstance(v, tuple) else v
            for k, v in self.params
        }

    def replace(self, drop: tuple[str, ...] = (), **changes: Any) -> SlurmRequest:
        params = {k: v for k, v in self.params if k not in drop}
        params.update(changes)
        return SlurmRequest(tuple(sorted(params.items())), self.max_requeues, self.client_env, self.site)


@dataclass(frozen=True)
class Dependency:
    """Start only after another job: `afterok` (it succeeded) or `aftercorr` (each array task after the same
    task of that array); cancelled when it fails. `job` is the name of a job of this plan, or (`planned`
    False) the id of a job already queued by an earlier invocation."""

    kind: str
    job: str
    planned: bool = True

    def text(self, ids: Mapping[str, str] | None = None) -> str:
        """`kind:<id>`; a planned job's id, when not known yet, stands as the job's name (what a dry run shows)."""
        if not self.planned:
            return f"{self.kind}:{self.job}"
        return f"{self.kind}:{(ids or {}).get(self.job) or self.job}"


@dataclass(frozen=True)
class SlurmJob:
    """One sbatch: an array with a task per target directory, or a single job for one target."""

    name: str
    role: Role
    targets: tuple[Path, ...]
    request: SlurmRequest
    folder: Path  # submitit's folder: the pickles and logs of the job's tasks
    throttle: int | None = None  # at most this many tasks at once (%N)
    dependency: Dependency | None = None
    # the job requeues itself on USR2 (time limit near, preemption) and resumes from its last checkpoint
    checkpointable: bool = False
    label: str = ""  # what a person calls it (a prep's model)

    @property
    def entry(self) -> str:
        return ENTRIES[self.role]


@dataclass(frozen=True)
class LocalJob:
    """A job run on this machine (the local executor), in plan order."""

    role: Role
    target: Path
    label: str  # the cell's (or model's) name, for progress lines
    timeout_min: int
    # a local prep whose failure fails this cell instead of running it
    after: Path | None = None


class Rescue(StrEnum):
    """What to do about a job a killed orchestrator left behind (found by its array's name)."""

    ADOPT = "adopt"  # the job has its submission file: it is the cell's job
    RESTORE = "restore"  # put the submission file left under its temporary name in place, then adopt
    CANCEL = "cancel"  # the job never got its file: cancel it, and plan the cell again
    REPLAN = "replan"  # the job ended without ever running the cell (its pickle never arrived): plan it again


@dataclass(frozen=True)
class Recovery:
    """What to do about a job that sbatch queued for a cell while the orchestrator that ran it died before
    recording its id (found again by its array's name)."""

    cell_dir: Path
    job_id: str
    array: str
    action: Rescue
    orphan: Path | None = None
    target: Path | None = None


@dataclass(frozen=True)
class PrepWait:
    """A Slurm cell whose training waits for its model's prep job (recorded in its ledger when queued, so a
    failed prep reads as the reason its cell was cancelled)."""

    cell_dir: Path
    model: str
    prepared: Path  # the prepared model directory
    job: Dependency  # the prep's job: one of this plan, or one already queued


@dataclass(frozen=True)
class CellFiles:
    """A cell directory's rendered files (relative path -> text, or bytes for a copied binary file); cell.yaml is
    written last."""

    dir: Path
    files: Mapping[str, str | bytes]


@dataclass(frozen=True)
class CodeSnapshot:
    """The code every Slurm job of a plan runs: one commit of the checkout, extracted once into the site's
    store under `dir` (content-addressed: `key` is the commit, with a hash of the shipped changes when a launch
    ships uncommitted ones), never the live checkout. Found and applied by sft_grid/sites/snapshot.py."""

    commit: str
    key: str
    dir: Path  # <store>/<key>: the extracted tree (sft_grid/, conf/, sweeps/, ...), what the jobs import
    checkout: Path  # the git checkout it comes from
    # uncommitted paths shipped with it (ship_dirty=true), relative to the checkout, and a hash of their contents
    shipped: tuple[str, ...] = ()
    shipped_sha: str = ""

    def record(self) -> dict[str, Any]:
        """What a cell's `submitted` event records of it."""
        out: dict[str, Any] = {"commit": self.commit, "snapshot": str(self.dir)}
        if self.shipped:
            out |= {"shipped": list(self.shipped), "shipped_sha": self.shipped_sha}
        return out


@dataclass(frozen=True)
class SubmissionPlan:
    # cell directories to write (a dry run writes these too), and files of model preps to run (a real run only)
    writes: tuple[CellFiles, ...] = ()
    scripts: tuple[CellFiles, ...] = ()
    recoveries: tuple[Recovery, ...] = ()
    # completed cells run again (force=true): their output is moved aside first, never deleted
    archives: tuple[Path, ...] = ()
    # cells this invocation hands to an executor (and so records as submitted first)
    submits: tuple[Path, ...] = ()
    # the note a cell's submission records (a requeue by the failure policy says so)
    notes: Mapping[Path, str] = field(default_factory=dict)
    local: tuple[LocalJob, ...] = ()
    slurm: tuple[SlurmJob, ...] = ()
    waits: tuple[PrepWait, ...] = ()
    # the local executor: cells at once, and whether the command waits for them
    max_parallel: int = 1
    wait: bool = True
    # Slurm's MaxArraySize, as read when planning (arrays are split at it)
    max_array_size: int = 1001
    # cell dir -> what its `submitted` event records beside its state: the commits its Hub inputs were pinned to,
    # the sft_grid version and the git revision of the checkout (core/provenance.py)
    provenance: Mapping[Path, Mapping[str, Any]] = field(default_factory=dict)
    # cell dir -> the tokenized dataset it waits for (one this plan builds)
    tokenized: Mapping[Path, Path] = field(default_factory=dict)
    # the code snapshot the Slurm jobs run (None: no Slurm job, or sft_grid not run from a git checkout)
    code: CodeSnapshot | None = None

    @property
    def empty(self) -> bool:
        return not (self.local or self.slurm or self.recoveries or self.archives)
