"""The ``huggingface_hub`` client as staging uses it: its setup, its requests retried, its errors as ours.

Everything that depends on the client's exception types lives here, imported lazily (the orchestrator's other
commands do not pay for the import). Nothing here depends on the client's version: what a client and a server do
with a partial file is observed (``memory``), and errors are read from their types and HTTP statuses.

Errors: each client error becomes a ``HubError`` whose one line names the repository, the revision and the fix.
- A server error (5xx, 429) or a connection cut mid-request is transient: the request is tried again after
  ``RETRY_WAITS_S`` (with a new connection: a server that closes the connection after an error without saying so,
  as olah does after a 500, would otherwise fail the next request on it with a reset). A refused connection is not
  retried: it is a Hub out of reach, and each try would cost the grid a timeout per repository.
- Which thing is missing: a server may answer a revision it does not have as if the repository were missing
  (olah: 401 RepoNotFound for an unknown branch), or with a server error (olah: 500 for an unknown commit). Before
  saying so, the repository is asked for at its default revision: if it answers, the revision is what is missing;
  if not, the repository is missing or cannot be read with this token (the Hub answers those two alike).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sft_grid.core.hubcache import MAIN, SHA_RE, Kind
from sft_grid.stages.staging.values import (
    Budget,
    GatedRepo,
    HubError,
    HubServerError,
    HubUnreachable,
    RepoNotFound,
    RevisionNotFound,
    TokenRequired,
    TransferFailed,
)

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
# between the tries of a request that met a transient error: a server restarting or a proxy's hiccup is over within
# seconds, and a grid with many repositories on a failing server should hear so soon
RETRY_WAITS_S: tuple[float, ...] = (0.5, 1.0, 2.0)


def server_error(status: int | None) -> bool:
    """A status worth another try: any 5xx (a server or a proxy in front of it failing now), and 429 (too many)."""
    return status is not None and (status == 429 or 500 <= status < 600)


T = TypeVar("T")


def hf_client() -> Any:
    """huggingface_hub, set up for staging.

    Xet is off unless the user chose otherwise: its transfers restart from zero after a kill. The client writes
    a file, and calls our progress hook, once per read chunk (10 MiB by default): on a slow link that makes a
    killed run lose up to 10 MiB and lets the budget check run late, so the chunk is 1 MiB (a module setting
    the client reads at each download; it only makes other downloads in this process write in smaller pieces).
    """
    os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
    for name in ("httpx", "httpx2"):  # a line per request otherwise, under the progress line
        logging.getLogger(name).setLevel(logging.WARNING)
    import huggingface_hub
    import huggingface_hub.constants  # a submodule: the package exposes it as an attribute only once imported

    # the module reads the variable once, at its import: when something imported it before this, the variable set
    # above would not count, and this process would use Xet (which never continues a cut file) after all
    huggingface_hub.constants.HF_HUB_DISABLE_XET = os.environ["HF_HUB_DISABLE_XET"].upper() in {
        "1",
        "ON",
        "YES",
        "TRUE",
    }
    huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE = min(huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE, CHUNK_BYTES)
    return huggingface_hub


def client_version() -> str:
    return str(hf_client().__version__)


def endpoint_of(endpoint: str | None) -> str:
    """The endpoint requests go to: the one given, else the client's (``HF_ENDPOINT`` as it was at its import)."""
    return (endpoint or hf_client().constants.ENDPOINT).rstrip("/")


def fresh_connections() -> None:
    """Drop the client's pooled connections (see the module's docstring: servers that close after an error)."""
    close = getattr(hf_client(), "close_session", None)
    if close is not None:
        close()


def http_errors(*names: str) -> tuple[type[BaseException], ...]:
    """The error classes ``names`` of each HTTP library a client may raise them from: httpx, and httpx2 (what
    huggingface_hub 2.x uses instead)."""
    out: list[type[BaseException]] = []
    for module in ("httpx", "httpx2"):
        try:
            lib = importlib.import_module(module)
        except ImportError:
            continue
        out += [cls for name in names if isinstance(cls := getattr(lib, name, None), type)]
    return tuple(out)


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    node: BaseException | None = e
    while node is not None and node not in out:
        out.append(node)
        node = node.__cause__ or node.__context__
    return out


def status_of(e: BaseException) -> int | None:
    """The HTTP status of the answer behind an error (the client wraps some errors in others), or None."""
    for node in _chain(e):
        status = getattr(getattr(node, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
    return None


def transient(e: BaseException, *, connect: bool = True) -> bool:
    """Worth another try: a server error or rate limit, a connection cut or timed out, a body cut short; a refused
    connection only with ``connect`` (within a transfer: a server restarting)."""
    refused = http_errors("ConnectError", "ConnectTimeout", "UnsupportedProtocol")  # no server there, or no URL
    transport = http_errors("TransportError")
    for node in _chain(e):
        if isinstance(node, refused):
            return connect
        if isinstance(node, transport):
            return True
        if isinstance(node, OSError) and "Consistency check failed" in str(node):
            return True  # the body ended short of its announced size
    return server_error(status_of(e))


class GaveUp(Exception):
    """A request that failed transiently ``tries`` times in a row; ``last`` is its last error."""

    def __init__(self, last: BaseException, tries: int) -> None:
        super().__init__(f"{tries} tries, the last: {first_line(last)}")
        self.last, self.tries = last, tries


def first_line(e: BaseException) -> str:
    text = str(e).strip().split("\n", 1)[0].strip()
    return text or type(e).__name__


def with_retries(call: Callable[[], T], what: str, budget: Budget | None = None) -> T:
    """``call()``, tried again after each wait of ``RETRY_WAITS_S`` while it fails transiently (not past the
    budget); raises ``GaveUp`` after the last try, any other error at once."""
    waits = RETRY_WAITS_S
    for tries in range(1, len(waits) + 2):
        try:
            return call()
        except Exception as e:
            if not transient(e, connect=False):
                raise
            if tries > len(waits) or (budget is not None and waits[tries - 1] >= budget.left()):
                raise GaveUp(e, tries) from e
            wait = waits[tries - 1]
            log.info("%s: %s; trying again in %.1fs", what, first_line(e), wait)
            fresh_connections()
            time.sleep(wait)
    raise AssertionError("unreachable")


def _default_answers(repo_id: str, kind: Kind, token: str | None, endpoint: str) -> str:
    """Ask for the repository at its default revision, once: "ok", "missing" (not found, or not readable with this
    token), "gated" or "error" (anything else: the server itself fails)."""
    from huggingface_hub import errors as hfe

    hf = hf_client()
    fresh_connections()
    try:
        hf.HfApi(endpoint=endpoint).repo_info(repo_id, repo_type=kind, revision=MAIN, token=token)
    except hfe.GatedRepoError:
        return "gated"
    except hfe.RepositoryNotFoundError:
        return "missing"
    except Exception as e:  # a probe: any failure is an answer
        log.debug("probing %s at %s: %s", repo_id, MAIN, e)
        fresh_connections()
        return "error"
    return "ok"


def translate(
    e: BaseException,
    repo_id: str,
    kind: Kind,
    revision: str,
    token: str | None,
    endpoint: str,
    cache: Path | None = None,
    *,
    file: str | None = None,
    probe: bool = True,
) -> HubError | None:
    """The client's exception as ours, with the fix; None for an error that is not about the Hub (a bug).

    ``file``: the error came while fetching that file (a revision already resolved). ``probe``: a revision that
    looks missing may be asked for at the repository's default revision, to say which thing is missing."""
    from huggingface_hub import errors as hfe

    tries = 1
    if isinstance(e, GaveUp):
        tries = e.tries
        e = e.last
    what = f"{kind} repo '{repo_id}'"
    at = f"{what} at revision '{revision}'"
    page = f"{endpoint}/{'datasets/' if kind == 'dataset' else ''}{repo_id}"
    status = status_of(e)
    chain = _chain(e)
    probed = probe and file is None and revision != MAIN

    def revision_missing(seen: str) -> RevisionNotFound:
        where = f" and is not staged in {cache}" if cache and SHA_RE.match(revision) else ""
        return RevisionNotFound(
            f"revision '{revision}' of {what} does not exist on {endpoint}{where}{seen}. Fix: use an existing branch,"
            " tag or commit sha of the repository on that server (a mirror has only the commits it holds); a pinned sha"
            " disappears when the repo's history is rewritten, so pin its current commit instead."
        )

    def gated() -> GatedRepo:
        who = "no token was given" if not token else "the token's account has not been granted access"
        return GatedRepo(
            f"{what} is gated and {who}. Fix: request access at {page} with your account, then "
            "set HF_TOKEN to a token of that account (or run `hf auth login`)."
        )

    if any(isinstance(n, hfe.GatedRepoError) for n in chain):
        return gated()
    if any(isinstance(n, hfe.RevisionNotFoundError) for n in chain):
        return revision_missing("")
    if status == 401 and token and "invalid credentials" in str(e).lower():
        return TokenRequired(
            f"{endpoint} refused the token given for {what} (invalid credentials). Fix: set HF_TOKEN"
            " to a valid token (or run `hf auth login`), or unset it for a public repository."
        )
    if any(isinstance(n, hfe.RepositoryNotFoundError) for n in chain) or (status in (401, 404) and file is None):
        answer = _default_answers(repo_id, kind, token, endpoint) if probed else ""
        if answer == "ok":  # the server answered a missing revision as a missing repository
            return revision_missing(
                f" (it answered {status} as if the repository were missing, but the repository answers at '{MAIN}')"
            )
        if answer == "gated":
            return gated()
        if status == 401 and not token:  # the Hub answers 401 to anonymous requests for private repos
            return TokenRequired(
                f"{endpoint} refused {what} without a token: it is private or gated, or does not"
                " exist. Fix: check the id, and set HF_TOKEN (or run `hf auth login`) with an account"
                " that can read it."
            )
        return RepoNotFound(
            f"{what} was not found on {endpoint}, or the token cannot read it. Fix: check the id"
            f" (org/name) and that it is a {kind}; for a private repo use a token with access."
        )
    refused = http_errors("ConnectError", "ConnectTimeout", "UnsupportedProtocol")
    if any(isinstance(n, (*refused, hfe.OfflineModeIsEnabled)) for n in chain):
        reason = first_line(e).rstrip(".")
        return HubUnreachable(
            f"cannot reach {endpoint} to stage {what} ({reason}). Fix: stage where the Hub is "
            "reachable (a login node, or the cluster profile's transfer partition), not on a "
            "compute node, and unset HF_HUB_OFFLINE for the staging."
        )
    answered = f"answered {status}{_reason(status)}" + (
        f" to each of {tries} tries" if tries > 1 else " to each of the client's own tries" if tries == 0 else ""
    )
    if server_error(status):
        if file is not None:
            return HubServerError(
                f"{endpoint} {answered} for {file} of {at}. Fix: the server is failing: run the"
                " same command again later (finished files are kept), or stage from another"
                " endpoint (HF_ENDPOINT)."
            )
        answer = _default_answers(repo_id, kind, token, endpoint) if probed else ""
        if answer == "ok":
            return revision_missing(f" ({endpoint} {answered} for it, and answers for the repository at '{MAIN}')")
        return HubServerError(
            f"{endpoint} {answered} for {at}"
            + (f", and fails for '{MAIN}' too" if probed else "")
            + ". Fix: the server is failing: run the same command again later, or stage from another"
            " endpoint (HF_ENDPOINT); on a mirror, check that it holds the repository."
        )
    if status is not None:
        subject = f"{file} of {at}" if file else at
        return HubError(
            f"{endpoint} answered {status}{_reason(status)} for {subject} ({first_line(e)}). Fix: check"
            " the repository id, revision and token; if they are right, the server refuses them: ask its"
            " operator, or stage from another endpoint (HF_ENDPOINT)."
        )
    if any(isinstance(n, http_errors("TransportError")) for n in chain):
        subject = f"{file} of {at}" if file else at
        return TransferFailed(
            f"the connection to {endpoint} kept failing for {subject} ({tries} tries, the last:"
            f" {first_line(e)}). Fix: check this node's route to the server (proxy, firewall) and"
            " run the same command again; finished files are kept."
        )
    return None


def _reason(status: int | None) -> str:
    from http import HTTPStatus

    try:
        return f" {HTTPStatus(status).phrase}" if status else ""
    except ValueError:
        return ""
