"""Why a cell failed and what happens next: the failure concept of the core layer, in one place.

- `classes`: the failure classes, what each means, and the `Failure` record triage returns;
- `signs`: the table of each class's wordings in logs (one line per wording family), and the other patterns
  the rules read (exceptions, wrappers, losses, attempt markers, nodes);
- `lines`: a log's attempts, and its lines with launchers' labels, spliced ranks and wrapped lines undone;
- `sacct`: the scheduler's records of a job (every leg of a requeued job, steps included);
- `classify`: the rules: one class, the line of evidence that decided it, the nodes to avoid;
- `policy`: what next per class: a `Remedy` (requeue within a budget, or stop with the fix);
- `cell`: a failed cell's triage from its directory (its logs, ledger, cell.yaml), and the ledger's record of it.

This package exposes the pure API; `cell` reads files and the ledger (import it as
sft_grid.core.failures.cell), so the ledger's own module can import the types here without a cycle.
"""

from sft_grid.core.failures.classes import DESCRIPTION, NODE_CLASSES, Failure, FailureClass
from sft_grid.core.failures.classify import classify, summarize
from sft_grid.core.failures.lines import split_attempts
from sft_grid.core.failures.policy import (
    DEFAULT_RULES,
    CellContext,
    OverrideKeys,
    Policy,
    Remedy,
    RemedyKind,
    Rule,
    parse_time,
    remedy_for,
    with_overrides,
)
from sft_grid.core.failures.sacct import SACCT_FORMAT, SacctLeg, expand_hostlist, group_legs, parse_sacct, sacct_argv

__all__ = [
    "DEFAULT_RULES",
    "DESCRIPTION",
    "NODE_CLASSES",
    "SACCT_FORMAT",
    "CellContext",
    "Failure",
    "FailureClass",
    "OverrideKeys",
    "Policy",
    "Remedy",
    "RemedyKind",
    "Rule",
    "SacctLeg",
    "classify",
    "expand_hostlist",
    "group_legs",
    "parse_sacct",
    "parse_time",
    "remedy_for",
    "sacct_argv",
    "split_attempts",
    "summarize",
    "with_overrides",
]
