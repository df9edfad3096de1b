"""sacct's records of a job, as the classifier reads them (pure: the caller runs sacct_argv): the scheduler's
own record, which decides a job's end over any tool's label in the log.

Every leg matters: `--duplicates` keeps one record per run of a requeued job (the last alone often shows
only the pending reason of the last requeue, such as BeginTime), and without -X the step records
(<id>.batch, <id>.0) come too, where an OUT_OF_MEMORY state is often the only trace of the OOM killer.
Parsing keeps sacct's order: each allocation record is followed by its steps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# `sacct -P` columns, in this order. --duplicates (-D) lists every leg of a requeued job, not only the last;
# no -X, so step records (<id>.batch, <id>.0) come too: the OOM state is often on a step only.
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Reason", "NodeList", "Elapsed", "Start", "End")
SACCT_FORMAT = ",".join(SACCT_FIELDS)


def sacct_argv(job_ids: Iterable[str]) -> list[str]:
    """The sacct call whose output parse_sacct reads (one call for any number of jobs)."""
    return [
        "sacct",
        "--duplicates",
        "--parsable2",
        "--noheader",
        f"--format={SACCT_FORMAT}",
        "--jobs=" + ",".join(job_ids),
    ]


@dataclass(frozen=True)
class SacctLeg:
    """One record of a job as sacct reports it (an allocation leg or one of its steps)."""

    job_id: str  # 55, 55_3 (array task), 55_3.batch / 55_3.0 (steps)
    state: str  # TIMEOUT, "CANCELLED by 0", OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, FAILED, REQUEUED, ...
    exit_code: str = "0:0"  # rc:signal
    reason: str = ""
    nodes: str = ""  # a Slurm hostlist: n[1-2],gpu07
    elapsed: str = ""
    start: str = ""
    end: str = ""

    @property
    def allocation(self) -> str:
        return self.job_id.split(".", 1)[0]

    @property
    def is_step(self) -> bool:
        return "." in self.job_id

    @property
    def base_state(self) -> str:
        return self.state.split()[0].rstrip("+") if self.state.strip() else ""

    @property
    def cancelled_by(self) -> str | None:
        m = re.match(r"CANCELLED by (\S+)", self.state.strip())
        return m.group(1) if m else None

    def node_names(self) -> list[str]:
        return [] if self.nodes in ("", "None assigned", "(null)") else expand_hostlist(self.nodes)

    def describe(self) -> str:
        return f"{self.job_id} State={self.state} ExitCode={self.exit_code} NodeList={self.nodes}"


def parse_sacct(text: str) -> list[SacctLeg]:
    """Records from `sacct_argv(...)` output, in sacct's order (a header line, if any, is skipped)."""
    legs = []
    for line in text.splitlines():
        parts = line.rstrip("\n").split("|")
        if len(parts) < len(SACCT_FIELDS) or parts[0] in ("", "JobID"):
            continue
        legs.append(SacctLeg(*(p.strip() for p in parts[: len(SACCT_FIELDS)])))
    return legs


def group_legs(legs: Iterable[SacctLeg]) -> dict[str, list[SacctLeg]]:
    """Records by allocation id (55_3 and its steps), each list in sacct's order: one cell's legs."""
    out: dict[str, list[SacctLeg]] = {}
    for leg in legs:
        out.setdefault(leg.allocation, []).append(leg)
    return out


def expand_hostlist(expr: str) -> list[str]:
    """n[01-03,7],gpu1 -> [n01, n02, n03, n7, gpu1] (zero padding kept, as Slurm writes it)."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", expr):
        prefix, ranges, suffix = m.groups()
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            names.extend(f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi or lo) + 1))
    return names
