"""The transfers: one repository into the cache (``download``), and a grid's pending repositories on this machine
(``stage_here``).

Why: compute nodes of several clusters have no internet, so every repo a grid needs must be in the cache that
jobs read with ``HF_HUB_OFFLINE=1`` before anything is queued; and login nodes may kill a process after a
minute or two (Leonardo: ~100 s), so a transfer must make progress across repeated short runs.

Design:
- A pinned sha that was staged once is checked and served with no network at all (its listing is in the cache,
  see ``sft_grid.core.hubcache``), and a sha gone from the Hub but staged here still works.
- Otherwise, under one lock per repository in the cache (``sft_grid.core.lock``: a second stager waits, then finds
  the files there), the revision is resolved and planned (``plan``), and ``transfer.Transfer`` fetches file by file
  with the real client at the pinned sha, small files first, each checked against its checksum; ``refs/<branch>``
  is written last. A file in the snapshot is never fetched again.
- Time budget (``values.Budget``): with a known rate (measured in this run once enough bytes moved, else the last
  run's rate kept in the cache), a run stops cleanly ``margin_s`` before the kill and reports what is left. Whether
  a file cut by a stop continues in the next run is what the server was seen to do (``memory``), whatever the
  client's version; where it restarts, a file that cannot finish within one run raises ``BudgetExceeded`` (its
  message sends it to a staging job) instead of restarting forever. A limit that leaves no time to transfer at all
  raises ``TimeLimitTooShort``, with the smallest limit that works, instead of stopping every run having done
  nothing.
- Client: ``huggingface_hub`` (tested with 1.17.0, the project's pin), set up by ``client.hf_client``: Xet off
  unless the user set it (its transfers never continue), a 1 MiB write chunk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sft_grid.core import human
from sft_grid.core.hubcache import (
    KINDS,
    SHA_RE,
    Kind,
    is_complete,
    repo_folder,
    repo_id_problem,
    snapshot_path,
    write_listing,
    write_ref,
)
from sft_grid.core.lock import Holder, Lock, LockTimeout
from sft_grid.core.problems import Problem
from sft_grid.stages.staging import memory, watch
from sft_grid.stages.staging.client import endpoint_of, hf_client
from sft_grid.stages.staging.plan import DEFAULT_RESERVE, Item, StagingPlan, check_space, plan, resolve_pinned
from sft_grid.stages.staging.transfer import Transfer
from sft_grid.stages.staging.values import Budget, HubError, Progress, Staged, StagingLocked, TimeLimitTooShort

log = logging.getLogger(__name__)


def download(
    repo_id: str,
    kind: Kind = "model",
    revision: str = "main",
    cache: Path | str | None = None,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    allow: Iterable[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    budget: Budget | None = None,
    lock_timeout_s: float = 3600.0,
    reserve_bytes: int = DEFAULT_RESERVE,
    verify: bool = True,
    retries: int = 5,
    resumable: bool | None = None,
    ref: str | None = None,
) -> Staged:
    """Stage the files training needs from ``repo_id`` at ``revision`` into the HF cache ``cache``.

    Returns ``Staged``; ``complete=False`` with ``stopped`` set when the time budget ended the run (rerun to
    continue). Raises a ``HubError`` subclass for everything the user must fix. ``resumable`` overrides what the
    endpoint was seen to do with a partial file (tests of both behaviours). ``ref``: the branch a sha ``revision``
    was resolved from (``refs/<ref>`` is written once complete, for loads by repo id).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    why = repo_id_problem(repo_id)  # the client's own rule (core/hubcache.py), before any lock, request or file
    if why:
        raise HubError(
            f"{repo_id!r} is not a Hub repository id ({why}). Fix: name the {kind} as org/name, or give a local path"
        )
    t0 = time.monotonic()
    allow = tuple(allow or ())
    cache = Path(cache) if cache is not None else Path(hf_client().constants.HF_HUB_CACHE)

    def staged_offline(sha: str) -> Staged:
        return Staged(
            repo_id=repo_id,
            kind=kind,
            revision=revision,
            sha=sha,
            path=snapshot_path(cache, repo_id, kind, sha),
            complete=True,
            seconds=time.monotonic() - t0,
            offline=True,
        )

    if SHA_RE.match(revision) and is_complete(cache, repo_id, kind, revision, allow=allow):
        return staged_offline(revision)
    wait_s = min(lock_timeout_s, budget.left()) if budget else lock_timeout_s

    def waiting(holder: Holder | None, waited: float) -> None:
        log.info(
            "waiting for another stager of %s (%s), %.0fs so far",
            repo_id,
            holder.describe() if holder else "starting",
            waited,
        )

    lock = Lock(
        cache / ".locks" / "sft_grid" / f"{repo_folder(repo_id, kind)}.lock",
        timeout_s=max(0.0, wait_s),
        on_wait=waiting,
    )
    try:
        lock.acquire()
    except LockTimeout as e:
        raise StagingLocked(
            f"another process is staging {kind} '{repo_id}' ({e}). Fix: let it finish and "
            "rerun (finished files are not fetched again); a holder that died on another node "
            f"loses the lock {lock.stale_s:.0f}s after its last heartbeat."
        ) from e
    except OSError as e:  # the first write into the cache: a path that cannot be one
        raise HubError(
            f"cannot write into the Hugging Face cache {cache} to stage {kind} '{repo_id}'"
            f" ({e.strerror or e}). Fix: point the cache at a directory you can write (cluster.hf_cache,"
            " --cache, or HF_HUB_CACHE)"
        ) from e
    options: dict[str, Any] = {
        "token": token,
        "endpoint": endpoint,
        "allow": allow,
        "on_progress": on_progress,
        "budget": budget,
        "reserve_bytes": reserve_bytes,
        "verify": verify,
        "retries": retries,
        "resumable": resumable,
        "ref": ref,
    }
    try:
        if SHA_RE.match(revision) and is_complete(cache, repo_id, kind, revision, allow=allow):
            return staged_offline(revision)  # the stager we waited for did it
        with watch.watch(budget):
            return _locked(repo_id, kind, revision, cache, lock, **options)
    except watch.TimeUp as e:  # the limit came while resolving: nothing moved yet
        if budget is not None and not watch.stalled() and lock.waited_s < 1.0:  # no server to blame: every rerun
            raise TimeLimitTooShort(budget.refusal()) from e  # would end the same way
        return Staged(
            repo_id=repo_id,
            kind=kind,
            revision=revision,
            sha="",
            path=cache,
            complete=False,
            seconds=time.monotonic() - t0,
            stopped=str(e),
        )
    finally:
        lock.release()


def _locked(
    repo_id: str,
    kind: Kind,
    revision: str,
    cache: Path,
    lock: Lock,
    *,
    token: str | None,
    endpoint: str | None,
    allow: tuple[str, ...],
    on_progress: Callable[[Progress], None] | None,
    budget: Budget | None,
    reserve_bytes: int,
    verify: bool,
    retries: int,
    resumable: bool | None,
    ref: str | None,
) -> Staged:
    """``download`` once its lock is held, under the watch of its time budget."""
    resolved = resolve_pinned(repo_id, kind, revision, token, endpoint, cache, budget)
    p = plan(resolved, cache, allow=allow, reserve_bytes=reserve_bytes, resumable=resumable, endpoint=endpoint)
    check_space(p)
    write_listing(cache, repo_id, kind, resolved.sha, resolved.files)
    if budget is not None and p.to_fetch and lock.waited_s < 1.0:
        too_short = budget.too_short()
        if too_short:
            raise TimeLimitTooShort(too_short)
    log.debug("staging %s", p.describe())
    transfer = Transfer(
        p,
        token=token or hf_client().get_token(),
        endpoint=endpoint_of(endpoint),
        budget=budget,
        on_progress=on_progress,
        verify=verify,
        retries=retries,
        resumable=resumable,
        rate_hint=memory.last_rate(cache),
        lock=lock,
        waited_s=lock.waited_s,
    )
    try:
        result = transfer.run()
    finally:  # a run that ended in BudgetExceeded measured the rate too: the next run decides up front
        memory.keep_rate(cache, transfer.measured_rate())
    branch = ref or (None if SHA_RE.match(revision) else revision)
    if result.complete and branch:
        write_ref(cache, repo_id, kind, branch, resolved.sha)
    return result


class StagingStopped(RuntimeError):
    """This process had to stop before its time limit; the message says what is left and how to continue."""


class StagingFailed(RuntimeError):
    """A transfer failed; `problems` names the cells that need it."""

    def __init__(self, item: Item) -> None:
        super().__init__(str(item.error))
        self.item = item

    def problems(self) -> list[Problem]:
        return StagingPlan([self.item]).problems()


def stage_here(
    staging: StagingPlan, budget: Budget | None = None, on_progress: Callable[[Progress], None] | None = None
) -> list[Staged]:
    """Fetch every pending item here, smallest first (a short run finishes as many as it can). Raises
    ``StagingStopped`` when the time budget ends a run, ``TimeLimitTooShort`` when it leaves no time to stage
    anything at all, ``StagingFailed`` (with the cells that need it) otherwise."""
    done: list[Staged] = []
    for item in sorted((i for i in staging.pending if i.here), key=lambda i: i.bytes_to_fetch):
        assert item.pin is not None
        p = item.pin
        try:
            staged = download(
                p.repo_id,
                p.kind,  # type: ignore[arg-type]
                p.sha,
                p.cache,
                budget=budget,
                on_progress=on_progress,
                ref=None if SHA_RE.match(p.revision) else p.revision,
            )
        except TimeLimitTooShort as e:
            if not done:  # nothing moved in this process: every rerun would end the same way
                raise
            left = sum(i.bytes_to_fetch for i in staging.pending if i.here)
            raise StagingStopped(
                f"stopped before this process's time limit (no time was left for {p.kind}"
                f" '{p.repo_id}'): {human.size(left)} of the grid's inputs are left to stage; nothing was"
                " queued. Run the same command again to continue."
            ) from e
        except HubError as e:
            item.error = e
            raise StagingFailed(item) from e
        done.append(staged)
        if not staged.complete:
            left = sum(i.bytes_to_fetch for i in staging.pending if i.here and i is not item) + staged.remaining_bytes
            raise StagingStopped(
                f"{staged.stopped} In all, {human.size(left)} of the grid's inputs are left to stage;"
                " nothing was queued. Run the same command again to continue."
            )
        item.plan = None
    return done
