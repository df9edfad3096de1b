"""The ``huggingface_hub`` client as staging uses it: import and setup, resume capability, error mapping.

Everything that depends on the client's version or its exception types lives here, imported lazily, so a
change of the pinned version touches one module. The pin is ``huggingface_hub==1.17.0`` (see ``hub``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from sft_grid.core.hubcache import SHA_RE, Kind
from sft_grid.stages.hub_types import (GatedRepo, HubError, HubUnreachable, RepoNotFound, RevisionNotFound,
                                       TokenRequired)

CHUNK_BYTES = 1 << 20


def _client() -> Any:
    """huggingface_hub, set up for staging.

    Xet is off unless the user chose otherwise: its transfers restart from zero after a kill. The client writes
    a file, and calls our progress hook, once per read chunk (10 MiB by default): on a slow link that makes a
    killed run lose up to 10 MiB and lets the budget check run late, so the chunk is 1 MiB (a module setting
    the client reads at each download; it only makes other downloads in this process write in smaller pieces).
    """
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise, under the progress line
    import huggingface_hub
    import huggingface_hub.constants  # a submodule: the package exposes it as an attribute only once imported

    # the module reads the variable once, at its import: when something imported it before this, the variable set
    # above would not count, and this process would use Xet while client_resumes_across_processes said it does not
    huggingface_hub.constants.HF_HUB_DISABLE_XET = os.environ["HF_HUB_DISABLE_XET"].upper() in {"1", "ON", "YES", "TRUE"}
    if huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE > CHUNK_BYTES:
        huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES
    return huggingface_hub


def client_resumes_across_processes() -> bool:
    """True when a partial file left by a killed process is resumed by the next one (<= 1.17, no Xet)."""
    hf = _client()
    major, minor = (int(x) for x in hf.__version__.split(".")[:2])
    return (major, minor) <= (1, 17) and bool(hf.constants.HF_HUB_DISABLE_XET)


def _translate(e: BaseException, repo_id: str, kind: Kind, revision: str, token: str | None, endpoint: str,
               cache: Path | None = None) -> HubError | None:
    """The client's exception as ours, with the fix; None for errors that are not about access."""
    import httpx
    from huggingface_hub import errors as hfe

    what = f"{kind} repo '{repo_id}'"
    page = f"{endpoint}/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hfe.GatedRepoError):
        who = "no token was given" if not token else "the token's account has not been granted access"
        return GatedRepo(f"{what} is gated and {who}. Fix: request access at {page} with your account, then "
                         "set HF_TOKEN to a token of that account (or run `hf auth login`).")
    if isinstance(e, hfe.RevisionNotFoundError):
        where = f" and is not staged in {cache}" if cache and SHA_RE.match(revision) else ""
        return RevisionNotFound(f"revision '{revision}' of {what} does not exist on {endpoint}{where}. Fix: use "
                                "an existing branch, tag or commit sha; a pinned sha disappears when the repo's "
                                "history is rewritten, so pin its current commit instead.")
    if isinstance(e, hfe.RepositoryNotFoundError) or status == 401:
        if status == 401 and not token:  # the Hub answers 401 to anonymous requests for private repos
            return TokenRequired(f"{endpoint} refused {what} without a token: it is private or gated, or does "
                                 "not exist. Fix: check the id, and set HF_TOKEN (or run `hf auth login`) with "
                                 "an account that can read it.")
        return RepoNotFound(f"{what} was not found on {endpoint}, or the token cannot read it. Fix: check the "
                            f"id (org/name) and that it is a {kind}; for a private repo use a token with access.")
    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, hfe.OfflineModeIsEnabled)):
        return HubUnreachable(f"cannot reach {endpoint} to stage {what} ({e}). Fix: stage where the Hub is "
                              "reachable (a login node, or the cluster profile's transfer partition), not on a "
                              "compute node, and unset HF_HUB_OFFLINE for the staging.")
    return None


def _transient(e: BaseException) -> bool:
    import httpx
    from huggingface_hub import errors as hfe

    chain: BaseException | None = e
    while chain is not None:  # the client wraps a failed HEAD in LocalEntryNotFoundError
        if isinstance(chain, httpx.TransportError):
            return True
        if isinstance(chain, hfe.HfHubHTTPError) and getattr(chain.response, "status_code", 0) in (
                429, 500, 502, 503, 504):
            return True
        if isinstance(chain, OSError) and "Consistency check failed" in str(chain):
            return True  # the body ended short of its announced size
        chain = chain.__cause__
    return False
