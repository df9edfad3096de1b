"""Hub staging: every Hugging Face Hub model and dataset a grid needs, pinned to a commit and in the site's cache
before anything is queued (README: "Offline sites: staging").

The modules, each by what it is about:

- `values`: the value types (`Resolved`, `Plan`, `Progress`, `Budget`, `Staged`) and the errors, each one line with
  its fix (stdlib only);
- `client`: the huggingface_hub client: its setup, its requests retried on server errors, its errors as ours (each
  naming the URL and host that failed), and the probe that says whether the repository, the revision or access is
  missing;
- `watch`: what the server answered, seen on the client's session: requests bounded by the time budget (a stalled
  server ends the run at the limit), the last answers kept for the errors, a file's announced size held against
  the listing;
- `memory`: what the cache remembers between runs: the last transfer rate, and whether each endpoint continues a
  partial file (seen, not assumed from the client's version);
- `plan`: one repository resolved and weighed (`resolve`, `plan`), and a grid's inputs as one plan (`plan_staging`);
- `transfer`: one run over a plan's files: the client's downloads, retries, checksums, the time budget;
- `download`: one repository staged under its lock (`download`), and a grid's pending inputs here (`stage_here`);
- `in_job`: staging as a Slurm job on a transfer partition (`cluster.staging.where: job`).

What a file of the cache is (its layout, the training selection, pins) is the core's: `sft_grid.core.hubcache`.
Importing this package imports the client only when a function needs it.
"""

from sft_grid.core.hubcache import MAIN, blob_path, is_complete, snapshot_path
from sft_grid.stages.staging.download import StagingFailed, StagingStopped, download, stage_here
from sft_grid.stages.staging.memory import last_rate
from sft_grid.stages.staging.plan import (
    DEFAULT_RESERVE,
    Item,
    StagingPlan,
    budget_for,
    check_space,
    plan,
    plan_staging,
    provenance,
    recorded,
    resolve,
    resolve_pinned,
)
from sft_grid.stages.staging.values import (
    Budget,
    BudgetExceeded,
    FileHostUnreachable,
    GatedRepo,
    HubError,
    HubServerError,
    HubUnreachable,
    IncompleteListing,
    NotEnoughSpace,
    Plan,
    Progress,
    RepoNotFound,
    Resolved,
    RevisionNotFound,
    Staged,
    StagingLocked,
    TimeLimitTooShort,
    TokenRequired,
    TransferFailed,
    UnexpectedAnswer,
)

__all__ = [
    "DEFAULT_RESERVE",
    "MAIN",
    "Budget",
    "BudgetExceeded",
    "FileHostUnreachable",
    "GatedRepo",
    "HubError",
    "HubServerError",
    "HubUnreachable",
    "IncompleteListing",
    "Item",
    "NotEnoughSpace",
    "Plan",
    "Progress",
    "RepoNotFound",
    "Resolved",
    "RevisionNotFound",
    "Staged",
    "StagingFailed",
    "StagingLocked",
    "StagingPlan",
    "StagingStopped",
    "TimeLimitTooShort",
    "TokenRequired",
    "TransferFailed",
    "UnexpectedAnswer",
    "blob_path",
    "budget_for",
    "check_space",
    "download",
    "is_complete",
    "last_rate",
    "plan",
    "plan_staging",
    "provenance",
    "recorded",
    "resolve",
    "resolve_pinned",
    "snapshot_path",
    "stage_here",
]
