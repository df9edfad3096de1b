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
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sft_grid.core.hubcache import MAIN, SHA_RE, Kind
from sft_grid.stages.staging import watch
from sft_grid.stages.staging.values import (
    Budget,
    FileHostUnreachable,
    GatedRepo,
    HubError,
    HubServerError,
    HubUnreachable,
    RepoNotFound,
    RevisionNotFound,
    TokenRequired,
    TransferFailed,
    UnexpectedAnswer,
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
    watch.install(huggingface_hub)
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
    url = failed_url(e)
    refused = http_errors("ConnectError", "ConnectTimeout", "UnsupportedProtocol")
    if any(isinstance(n, (*refused, hfe.OfflineModeIsEnabled)) for n in chain):
        reason = first_line(e).rstrip(".")
        if url and watch.host_of(url) != watch.host_of(endpoint):
            return file_host_unreachable(e, url, endpoint, f"{file} of {at}" if file else at)
        return HubUnreachable(
            f"cannot reach {endpoint} to stage {what} ({f'{url}: ' if url else ''}{reason}). Fix: stage where the"
            " Hub is reachable (a login node, or the cluster profile's transfer partition), not on a compute node,"
            " and unset HF_HUB_OFFLINE for the staging."
        )
    if any(isinstance(n, hfe.FileMetadataError) for n in chain):
        return missing_headers(e, endpoint, f"{file} of {at}" if file else at)
    if status is None and any(isinstance(n, (ValueError, KeyError, TypeError)) for n in chain):
        not_api = unexpected_answer(e, endpoint, at)
        if not_api is not None:
            return not_api
    answered = f"answered {status}{_reason(status)}" + (
        f" to each of {tries} tries" if tries > 1 else " to each of the client's own tries" if tries == 0 else ""
    )
    if server_error(status):
        if file is not None:
            return HubServerError(
                f"{_host_url(url, endpoint)} {answered} for {file} of {at}. Fix: the server is failing: run the"
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
            f"{_host_url(url, endpoint)} answered {status}{_reason(status)} for {subject} ({first_line(e)}). Fix: check"
            " the repository id, revision and token; if they are right, the server refuses them: ask its"
            " operator, or stage from another endpoint (HF_ENDPOINT)."
        )
    if any(isinstance(n, http_errors("TransportError")) for n in chain):
        subject = f"{file} of {at}" if file else at
        return TransferFailed(
            f"the connection to {_host_url(url, endpoint)} kept failing for {subject} ({tries} tries, the last:"
            f" {first_line(e)}). Fix: check this node's route to the server (proxy, firewall) and"
            " run the same command again; finished files are kept."
        )
    return None


def failed_url(e: BaseException) -> str | None:
    """The URL whose request failed (a redirect target, not the endpoint, when the redirect failed), or None."""
    for node in _chain(e):
        url = getattr(getattr(node, "response", None), "url", None)
        if url is not None:
            return str(url)
        try:
            request = getattr(node, "request", None)  # httpx raises when an error carries none
        except RuntimeError:
            request = None
        url = getattr(request, "url", None)
        if url is not None:
            return str(url)
    return None


def _host_url(url: str | None, endpoint: str) -> str:
    """Who answered: the endpoint, or the other host a request went to (with the URL)."""
    if url is None or watch.host_of(url) == watch.host_of(endpoint):
        return endpoint + (f" ({url})" if url else "")
    return f"{watch.host_of(url)} ({url}, where {endpoint} sent the request)"


def file_host_unreachable(e: BaseException, url: str, endpoint: str, subject: str) -> FileHostUnreachable:
    """The endpoint answered and sent the download elsewhere (the Hub: its CDN), and that host cannot be reached."""
    host = watch.host_of(url)
    did = (
        "did not answer in time"
        if any(isinstance(n, http_errors("ConnectTimeout")) for n in _chain(e))
        else ("refused the connection")
    )
    return FileHostUnreachable(
        f"{endpoint} answers, but the file host it sends downloads to, {host}, {did} ({url}, for {subject}):"
        f" at a site this usually means a firewall or proxy that lets this node reach the Hub's API"
        f" ({watch.host_of(endpoint)}) but not its file host (the Hub sends files to its CDN, e.g. cdn-lfs.hf.co,"
        f" cas-bridge.xethub.hf.co). Fix: ask the site to allow {host} as well (or set HTTPS_PROXY to a proxy that"
        " reaches it), then run the same command again (finished files are kept)."
    )


def missing_headers(e: BaseException, endpoint: str, subject: str) -> HubError:
    """A HEAD of a file answered without the headers the Hub sends (a proxy stripping them)."""
    head = watch.last("HEAD", "/resolve/")
    needed = {
        "X-Repo-Commit": ("x-repo-commit",),
        "ETag or X-Linked-Etag": ("etag", "x-linked-etag"),
        "Content-Length or X-Linked-Size": ("content-length", "x-linked-size"),
    }
    lacking = [name for name, keys in needed.items() if head and not any(k in head.headers for k in keys)]
    where = f"{head.url} answered HEAD {head.status}" if head else f"a HEAD request to {endpoint} was answered"
    return UnexpectedAnswer(
        f"{where} for {subject} without {', '.join(lacking) or 'the headers the Hub sends'} (the client"
        f" said: {first_line(e)}): something between this node and the Hub strips them (a proxy or a portal"
        " answering in its place). Fix: ask the proxy's operator to pass the Hub's X-* headers, ETag and"
        " Content-Length through for /resolve/ requests, or stage from another endpoint (HF_ENDPOINT)."
    )


def unexpected_answer(e: BaseException, endpoint: str, subject: str) -> HubError | None:
    """An answer that is not the Hub API's JSON (an HTML page, a body cut short or rewritten), or None when no
    recorded answer explains the error."""
    import json

    doc = next((n.doc for n in _chain(e) if isinstance(n, json.JSONDecodeError)), None)
    answer = watch.last("GET")
    if answer is None:
        return None
    ctype = answer.content_type or "no Content-Type"
    head = (doc or "").lstrip()[:512].lower()
    if "html" in ctype or head.startswith(("<!doctype html", "<html")):
        title = re.search(r"<title[^>]*>([^<]{1,80})", doc or "", re.IGNORECASE)
        page = f"an HTML page{f' titled {title.group(1).strip()!r}' if title else ''} ({ctype})"
        return UnexpectedAnswer(
            f"{answer.url} answered {answer.status} with {page} instead of the Hub API's JSON, for {subject}: at a"
            f" site this usually means {endpoint} is not the root of the Hub API but a web page of the proxy or"
            " portal in front of it (a path prefix missing or cut short). Fix: set HF_ENDPOINT to the full URL"
            f" under which <endpoint>/api/models/<org>/<name> answers JSON (the prefix the site gives, e.g."
            f" {endpoint}/<prefix>)."
        )
    if doc is not None:
        what = f"a body that is not JSON ({ctype}, {len(doc)} characters" + (
            ", cut short)" if doc.lstrip().startswith(("{", "[")) else ")"
        )
    else:
        what = f"JSON that is not what the Hub API answers ({first_line(e)})"
    return UnexpectedAnswer(
        f"{answer.url} answered {answer.status} with {what}, for {subject}: something between this node and the"
        " Hub cut or rewrote the answer (a proxy, a portal, a mirror that is not Hub-compatible). Fix: run the same"
        " command again; if it persists, ask the proxy's operator, or stage from another endpoint (HF_ENDPOINT)."
    )


def _reason(status: int | None) -> str:
    from http import HTTPStatus

    try:
        return f" {HTTPStatus(status).phrase}" if status else ""
    except ValueError:
        return ""
