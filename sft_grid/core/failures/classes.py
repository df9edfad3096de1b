"""What a failure is: its classes, what each means in a sentence, and the record triage returns (`Failure`).

A class says whose fault a failure is and so what helps: the scheduler's end of a job (time limit, preemption,
cancel), the machine (a node, a GPU, the network between ranks, a full disk, a node without the Hub, a rank that
hangs), the run itself (its loss), the backend refusing its config or data (or the user's code or config failing
before the first step), the grid itself (a cell started before the job that builds its input: `missing_input`), or
nothing the log can tell (`unknown`). Only `backend_error` blames the user, and only on
positive evidence (see classify.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FailureClass(StrEnum):
    # a StrEnum: the ledger writes its value, and formatting it in a message gives the value too
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node_failure"
    HOST_OOM = "host_oom"
    GPU_OOM = "gpu_oom"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    RENDEZVOUS = "rendezvous"
    GPU_HARDWARE = "gpu_hardware"
    DISK_FULL = "disk_full"
    # no training progress (a step, a checkpoint file, the data step, a progress bar's move) for longer than the
    # site's bound: the job's runner ended it (job/hang.py); the evidence is each node's last line and the last step
    HANG = "hang"
    OFFLINE_HUB = "offline_hub"
    # an input the grid builds before the cell (its model's prepared copy, its shared tokenized dataset, a staged Hub
    # repository) not there when its job started: the grid's order of jobs failed it, not the config or the data
    MISSING_INPUT = "missing_input"
    NAN_LOSS = "nan_loss"
    DIVERGED = "diverged"
    BACKEND_ERROR = "backend_error"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    # the data loader's workers out of shared memory (/dev/shm): torch's own words for a worker's bus error, or for a
    # tensor's /torch_ file it could not write; a resource of the node or container, apart from host memory
    SHM_FULL = "shm_full"

    @classmethod
    def parse(cls, value: object) -> FailureClass | None:
        """The class a ledger names, or None (no class, or one this version does not know)."""
        try:
            return cls(str(value)) if value not in (None, "") else None
        except ValueError:
            return None


DESCRIPTION = {
    FailureClass.TIME_LIMIT: "time limit reached",
    FailureClass.PREEMPTED: "preempted by the scheduler",
    FailureClass.NODE_FAILURE: "node failure",
    FailureClass.HOST_OOM: "host memory exhausted (OOM killer)",
    FailureClass.GPU_OOM: "GPU out of memory",
    FailureClass.COLLECTIVE_TIMEOUT: "a collective operation failed or timed out",
    FailureClass.RENDEZVOUS: "distributed rendezvous failed",
    FailureClass.GPU_HARDWARE: "GPU hardware error",
    FailureClass.DISK_FULL: "disk full or quota exceeded",
    FailureClass.HANG: "hung: no training progress for longer than the site's bound",
    FailureClass.OFFLINE_HUB: "Hugging Face Hub not reachable (offline node or files not cached)",
    FailureClass.MISSING_INPUT: "an input the grid builds before the cell was missing when it started",
    FailureClass.NAN_LOSS: "loss became NaN or infinite",
    FailureClass.DIVERGED: "loss diverged",
    FailureClass.BACKEND_ERROR: "the backend refused its config or data, or the run's code failed before training",
    FailureClass.CANCELLED: "cancelled by the user",
    FailureClass.UNKNOWN: "failed for a reason sft_grid does not recognise",
    FailureClass.SHM_FULL: "shared memory (/dev/shm) exhausted by the data loader's workers",
}
# classes whose evidence may name a node worth excluding from the next attempt: only a node's own fault (the
# scheduler's NODE_FAIL, a GPU's Xid, ECC or a device that fails at start-up) excludes it
NODE_CLASSES = frozenset({FailureClass.NODE_FAILURE, FailureClass.GPU_HARDWARE})


@dataclass(frozen=True, kw_only=True)
class Failure:
    klass: FailureClass
    evidence: str  # the log line or sacct record that decided it, one line
    nodes: tuple[str, ...]  # nodes to avoid next time (--exclude): named only for NODE_CLASSES
    summary: str  # one line for the user
    step: int | None = None
    total: int | None = None
    requeues: int = 0
    requeue_budget: int = 0
