"""Stage Hub models and datasets into the site's HF cache before queueing (orchestrator code).

Why: compute nodes of several clusters have no internet, so every repo a grid needs must be in the cache that
jobs read with ``HF_HUB_OFFLINE=1`` before anything is queued; and login nodes may kill a process after a
minute or two (Leonardo: ~100 s), so a transfer must make progress across repeated short runs.

Design:
- ``resolve`` pins a revision to its commit sha and lists the commit (sizes, LFS sha256). The listing is
  stored in the cache (see ``sft_grid.core.hubcache``): a pinned sha that was staged once is checked and served with no
  network at all, and a sha gone from the Hub but staged here still works.
- ``plan`` selects the files training needs, subtracts what the cache holds (complete snapshot entries,
  blobs shared with another commit, resumable partial files) and compares with the filesystem's free space.
- ``download`` fetches file by file with the real client (``hf_hub_download`` at the pinned sha, small files
  first), under one lock per repo (``hub_lock``), verifies each file's checksum, and writes ``refs/<branch>``
  last. A file in the snapshot is never fetched again.
- Client: ``huggingface_hub==1.17.0`` (``CLIENT_PIN``). Up to 1.17 a partial file survives ``kill -9`` as
  ``blobs/<etag>.incomplete`` and the next run resumes it with a Range request; from 1.18 on each attempt
  writes a fresh temporary file, so a file that cannot finish within one process never finishes on such a
  login node. Resume is granular to the client's write chunk (set to 1 MiB here). Xet transfers do not resume
  either, so ``HF_HUB_DISABLE_XET=1`` is set unless the user set it. Within a run, a dropped connection is retried here
  (1.17 does not retry a connection cut mid-body itself); with 1.17 the retry resumes with Range.
- Time budget (``Budget``): with a known rate (measured in this run once enough bytes moved, else the last
  run's rate kept in the cache), a run stops cleanly ``margin_s`` before the kill and reports what is left and
  how many runs that takes. When the client cannot resume across processes, a file whose transfer alone needs
  more than a whole run raises ``BudgetExceeded`` (instead of restarting it forever), and a file that does not
  fit in what is left of this run is left for the next run, which starts it with the full budget.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from sft_grid.core.pins import repo_id_problem
from sft_grid.stages.hub_client import _client, _translate, client_resumes_across_processes
from sft_grid.core.hubcache import (KINDS, SHA_RE, Kind, RemoteFile, blob_path, cached_elsewhere, file_ok,
                                       is_complete, partial_bytes, read_listing, repo_folder, select_files,
                                       snapshot_path, write_listing, write_ref)
from sft_grid.stages.hub_lock import LockTimeout, RepoLock
from sft_grid.stages.hub_transfer import Transfer
from sft_grid.stages.hub_types import (Budget, BudgetExceeded, GatedRepo, HubError, HubUnreachable,
                                       NotEnoughSpace, Plan, Progress, RepoNotFound, Resolved, RevisionNotFound,
                                       Staged, StagingLocked, TokenRequired, TransferFailed, human)

log = logging.getLogger(__name__)

CLIENT_PIN = "huggingface_hub==1.17.0"
DEFAULT_RESERVE = 256 << 20  # leave the filesystem some room: other users and the training job write there too


def resolve(repo_id: str, kind: Kind = "model", revision: str = "main", token: str | None = None, *,
            endpoint: str | None = None) -> Resolved:
    """The commit ``revision`` names, and every file of it. Raises a ``HubError`` naming the repo and fix."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    hf = _client()
    from huggingface_hub.hf_api import RepoFile

    api = hf.HfApi(endpoint=endpoint)
    token = token or hf.get_token()
    try:
        info = api.repo_info(repo_id, repo_type=kind, revision=revision, token=token)
        entries = api.list_repo_tree(repo_id, repo_type=kind, revision=info.sha, recursive=True, token=token)
        files = tuple(RemoteFile(e.path, e.size, e.blob_id, e.lfs.sha256 if e.lfs else None)
                      for e in entries if isinstance(e, RepoFile))
        if getattr(info, "gated", False) and files:  # listing is public on a gated repo; the files are not
            url = hf.hf_hub_url(repo_id, files[0].path, repo_type=kind, revision=info.sha, endpoint=api.endpoint)
            hf.get_hf_file_metadata(url, token=token)
    except Exception as e:
        err = _translate(e, repo_id, kind, revision, token, api.endpoint)
        if err is None:
            raise
        raise err from e
    return Resolved(repo_id, kind, revision, info.sha, files)


def _free_bytes(path: Path) -> int:
    while not path.exists():  # the cache may not exist yet: ask the filesystem it will be created on
        path = path.parent
    return shutil.disk_usage(path).free


def plan(resolved: Resolved, cache: Path | str, *, allow: Iterable[str] | None = None,
         reserve_bytes: int = DEFAULT_RESERVE, resumable: bool | None = None) -> Plan:
    """What staging ``resolved`` into ``cache`` will transfer, and whether it fits (see ``check_space``)."""
    cache = Path(cache)
    r = resolved
    resumable = client_resumes_across_processes() if resumable is None else resumable
    selection = select_files(r.files, r.kind, allow)
    cached, link, fetch = [], [], []
    for f in selection.keep:
        if file_ok(cache, r.repo_id, r.kind, r.sha, f):
            cached.append(f)
        elif cached_elsewhere(cache, r.repo_id, r.kind, f):
            link.append(f)
        else:
            fetch.append(f)
    partial = sum(partial_bytes(cache, r.repo_id, r.kind, f) for f in fetch) if resumable else 0
    return Plan(r, cache, selection, tuple(cached), tuple(link), tuple(fetch),
                sum(f.size for f in fetch) - partial, _free_bytes(cache), reserve_bytes)


def check_space(p: Plan) -> None:
    if not p.fits:
        r = p.resolved
        raise NotEnoughSpace(
            f"staging {r.kind} '{r.repo_id}'@{r.sha[:12]} needs {human(p.bytes_to_fetch)} more in {p.cache}, but "
            f"its filesystem has {human(p.free_bytes)} free (and {human(p.reserve_bytes)} is kept in reserve). "
            "Fix: free space there, or point the cluster profile's HF cache (HF_HUB_CACHE) at a filesystem with "
            "room (a project or scratch area, not $HOME).")


def _rate_file(cache: Path) -> Path:
    return cache / ".locks" / "sft_grid" / "transfer-rate.json"


def _keep_rate(cache: Path, rate: float | None) -> None:
    """Best effort: a hint for the next run must not hide the error this run may be raising (a full disk)."""
    if not rate:
        return
    path = _rate_file(cache)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # stagers of other repos read it meanwhile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"bytes_per_s": rate, "at": time.time()}))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep the transfer rate in %s: %s", path, e)
        tmp.unlink(missing_ok=True)


def last_rate(cache: Path | str) -> float | None:
    """The rate the last staging into this cache measured (bytes/s), as a first estimate for the next one."""
    try:
        return float(json.loads(_rate_file(Path(cache)).read_text())["bytes_per_s"])
    except (OSError, ValueError, KeyError):
        return None


def download(repo_id: str, kind: Kind = "model", revision: str = "main", cache: Path | str | None = None, *,
             token: str | None = None, endpoint: str | None = None, allow: Iterable[str] | None = None,
             on_progress: Callable[[Progress], None] | None = None, budget: Budget | None = None,
             lock_timeout_s: float = 3600.0, reserve_bytes: int = DEFAULT_RESERVE, verify: bool = True,
             retries: int = 5, resumable: bool | None = None, ref: str | None = None) -> Staged:
    """Stage the files training needs from ``repo_id`` at ``revision`` into the HF cache ``cache``.

    Returns ``Staged``; ``complete=False`` with ``stopped`` set when the time budget ended the run (rerun to
    continue). Raises a ``HubError`` subclass for everything the user must fix. ``resumable`` overrides the
    detection of the client's cross-process resume (tests of both behaviours). ``ref``: the branch a sha
    ``revision`` was resolved from (``refs/<ref>`` is written once complete, for loads by repo id).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    why = repo_id_problem(repo_id)  # the client's own rule (core/pins.py), before any lock, request or file
    if why:
        raise HubError(f"{repo_id!r} is not a Hub repository id ({why}). Fix: name the {kind} as org/name, or give"
                       " a local path")
    t0 = time.monotonic()
    allow = tuple(allow or ())
    if cache is None:
        cache = _client().constants.HF_HUB_CACHE
    cache = Path(cache)

    def staged_offline(sha: str) -> Staged:
        return Staged(repo_id, kind, revision, sha, snapshot_path(cache, repo_id, kind, sha), True, (), 0, 0,
                      time.monotonic() - t0, None, offline=True)

    if SHA_RE.match(revision) and is_complete(cache, repo_id, kind, revision, allow=allow):
        return staged_offline(revision)
    lock_path = cache / ".locks" / "sft_grid" / f"{repo_folder(repo_id, kind)}.lock"
    wait_s = min(lock_timeout_s, budget.left()) if budget else lock_timeout_s

    def waiting(holder: Any, waited: float) -> None:
        log.info("waiting for another stager of %s (%s), %.0fs so far", repo_id,
                 holder.describe() if holder else "starting", waited)

    lock = RepoLock(lock_path, timeout_s=max(0.0, wait_s), on_wait=waiting)
    try:
        lock.acquire()
    except LockTimeout as e:
        raise StagingLocked(f"another process is staging {kind} '{repo_id}' ({e}). Fix: let it finish and "
                            "rerun (finished files are not fetched again); a holder that died on another node "
                            f"loses the lock {lock.stale_s:.0f}s after its last heartbeat.") from e
    try:
        if SHA_RE.match(revision) and is_complete(cache, repo_id, kind, revision, allow=allow):
            return staged_offline(revision)  # the stager we waited for did it
        resolved = resolve_pinned(repo_id, kind, revision, token, endpoint, cache)
        resumable = client_resumes_across_processes() if resumable is None else resumable
        p = plan(resolved, cache, allow=allow, reserve_bytes=reserve_bytes, resumable=resumable)
        check_space(p)
        write_listing(cache, repo_id, kind, resolved.sha, resolved.files)
        log.debug("staging %s", p.describe())
        transfer = Transfer(p, token=token or _client().get_token(), endpoint=endpoint, budget=budget,
                            on_progress=on_progress, verify=verify, retries=retries, resumable=resumable,
                            rate_hint=last_rate(cache), lock=lock)
        try:
            result = transfer.run()
        finally:  # a run that ended in BudgetExceeded measured the rate too: the next run decides up front
            _keep_rate(cache, transfer.measured_rate())
        branch = ref or (None if SHA_RE.match(revision) else revision)
        if result.complete and branch:
            write_ref(cache, repo_id, kind, branch, resolved.sha)
        return result
    finally:
        lock.release()


def resolve_pinned(repo_id: str, kind: Kind, revision: str, token: str | None, endpoint: str | None,
                    cache: Path) -> Resolved:
    """``resolve``, except that a sha listed in the cache needs no request (its listing cannot change)."""
    if SHA_RE.match(revision):
        files = read_listing(cache, repo_id, kind, revision)
        if files is not None:
            return Resolved(repo_id, kind, revision, revision, files)
    try:
        return resolve(repo_id, kind, revision, token, endpoint=endpoint)
    except RevisionNotFound as e:
        hf = _client()
        ep = endpoint or hf.constants.ENDPOINT
        err = _translate(e.__cause__ or e, repo_id, kind, revision, token, ep, cache)
        raise (err or e) from e.__cause__


__all__ = ["CLIENT_PIN", "Budget", "BudgetExceeded", "GatedRepo", "HubError", "HubUnreachable", "NotEnoughSpace",
           "Plan", "Progress", "RepoNotFound", "Resolved", "RevisionNotFound", "Staged", "StagingLocked",
           "TokenRequired", "TransferFailed", "check_space", "client_resumes_across_processes", "download",
           "is_complete", "last_rate", "plan", "resolve", "snapshot_path", "blob_path"]
