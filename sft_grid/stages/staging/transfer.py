"""One run over a plan's files (behind ``download``): the real client, retries, checksums, the time budget, and what
the server does with a partial file.

Design: ``huggingface_hub.hf_hub_download`` moves the bytes (cache layout, ``.incomplete`` handling and its
per-blob lock stay the client's), one file at a time at the pinned sha, smallest first so that a short run
completes as many files as it can and big files come last. Progress comes from the ``tqdm_class`` hook the
client makes once the answer's headers are in and calls once per received chunk; the same hook enforces the time
budget by raising ``_Stop`` (or ``BudgetExceeded``) inside the client's read loop, which leaves the partial file in
place for the next run. The client is imported lazily: the orchestrator's other commands do not pay for it.

Resume, seen (``memory``): a file that was cut before (its partial download on disk, or a stop inside it that this
cache recorded: some clients delete their partial file as they stop) either continues as its transfer starts again
(the client makes the hook with those bytes as done) or restarts from byte 0 (the server answered the request for
the rest with the whole file, or the client starts each attempt anew). Either is remembered for the endpoint.
Until a restart was seen the run counts a partial file as done and promises that it resumes; once one was seen it
counts nothing as done, promises nothing, and a file that cannot finish within one run is not started: it raises
``BudgetExceeded``, whose message sends it to a staging job.

Retries: a transient failure (connection cut or refused, timeout, 429/5xx, short body) is retried with backoff on
a new connection; the count resets whenever bytes arrived, so a flaky link that still moves data is not given up
on. A failure that took the client ``CLIENT_RETRIED_S`` or more without a byte is not retried again: the client
retried it itself (its metadata request, for about 20 s, on the statuses it knows), or it timed out. A file
whose checksum (LFS sha256, or git blob oid) does not match is deleted and fetched once more.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from sft_grid.core import human
from sft_grid.core.hubcache import (
    RemoteFile,
    blob_path,
    checksum_ok,
    file_ok,
    partial_bytes,
    partial_files,
    repo_folder,
    snapshot_path,
)
from sft_grid.core.lock import Lock
from sft_grid.stages.staging import memory, watch
from sft_grid.stages.staging.client import (
    GaveUp,
    client_version,
    failed_url,
    fresh_connections,
    hf_client,
    transient,
    translate,
)
from sft_grid.stages.staging.values import (
    MIN_TRANSFER_S,
    Budget,
    BudgetExceeded,
    HubError,
    NotEnoughSpace,
    Plan,
    Progress,
    Staged,
    TimeLimitTooShort,
    TransferFailed,
)

log = logging.getLogger(__name__)

TRUST_BYTES, TRUST_S = 1 << 20, 0.25  # below this a measured rate is mostly noise
EMIT_EVERY_S = 0.1  # progress callbacks at most this often within a file (the CLI redraws a line each time)
ORPHAN_RE = re.compile(r"\.[0-9a-f]{8}\.incomplete$")  # per-attempt temporary files some clients write
ORPHAN_AGE_S = 300.0
RETRY_BASE_S = 0.5  # the first wait before a file's transfer is tried again; it doubles with each try, up to 30 s
CLIENT_RETRIED_S = 5.0  # a failure without a byte that took the client this long was retried by it (or timed out)


class _Stop(Exception):
    """Raised from the progress hook to end this run cleanly; the message says what is left and what to do."""


class Transfer:
    """One run over a plan's files; ``run()`` returns ``Staged`` or raises a ``HubError``.

    ``resumable``: whether a cut file continues in the next run; None: as last seen for this endpoint (yes until a
    restart was seen). ``waited_s``: how long this run waited for another stager's lock (not this run's overhead).
    """

    def __init__(
        self,
        plan: Plan,
        *,
        token: str | None,
        endpoint: str,
        budget: Budget | None,
        on_progress: Callable[[Progress], None] | None,
        verify: bool,
        retries: int,
        resumable: bool | None,
        rate_hint: float | None,
        lock: Lock | None,
        waited_s: float = 0.0,
    ) -> None:
        self.plan, self.r = plan, plan.resolved
        self.token, self.budget, self.on_progress = token, budget, on_progress
        self.verify, self.retries = verify, retries
        self.rate_hint, self.lock, self.waited_s = rate_hint, lock, waited_s
        self.hf = hf_client()
        self.endpoint = endpoint
        self.client = client_version()
        self.seen = memory.seen(plan.cache, endpoint, self.client)
        self.resumes = resumable if resumable is not None else (self.seen.resumes if self.seen else True)
        self.base = sum(f.size for f in plan.cached + plan.to_link)  # bytes of complete files
        self.file_done = 0
        self.moved = 0  # bytes received in this run
        self.kept = 0  # bytes received and let through to the file (a stop keeps the chunk it was raised on out)
        self.active_s = 0.0  # time spent receiving file bodies: requests and small-file overheads are not rate
        self.tick: float | None = None
        self.fetched: list[RemoteFile] = []
        self.files_done = len(plan.cached) + len(plan.to_link)
        self.current: RemoteFile | None = None
        self.partial: dict[Path, int] = {}  # the current file's partial downloads as its attempt started
        self.cut = 0  # bytes of the current file a stopped run had, as recorded in the cache
        self.emitted = 0.0

    # -- rate and progress --------------------------------------------------------------------------------------
    def measured_rate(self) -> float | None:
        if self.moved >= TRUST_BYTES and self.active_s >= TRUST_S:
            return self.moved / self.active_s
        return None

    def rate(self) -> float | None:
        return self.measured_rate() or self.rate_hint

    def _emit(self, force: bool = True) -> None:
        if self.on_progress is None or (not force and time.monotonic() - self.emitted < EMIT_EVERY_S):
            return
        self.emitted = time.monotonic()
        f, rate = self.current, self.measured_rate()
        done = self.base + self.file_done
        eta = (self.plan.bytes_needed - done) / rate if rate else None
        self.on_progress(
            Progress(
                repo_id=self.r.repo_id,
                file=f.path if f else "",
                file_done=self.file_done,
                file_total=f.size if f else 0,
                done=done,
                total=self.plan.bytes_needed,
                rate_bps=rate,
                eta_s=eta,
                files_done=self.files_done,
                files_total=len(self.plan.selection.keep),
            )
        )

    def _bar(self, f: RemoteFile) -> type:
        """A stand-in for tqdm that the client drives: it reports progress and enforces the budget."""
        transfer = self

        class _Hook:
            def __init__(self, *args: Any, initial: int = 0, **kwargs: Any) -> None:
                transfer.file_done = initial  # continued bytes count as done, not as moved
                transfer.tick = time.monotonic()  # the body starts now (the client made us after the headers)
                transfer._started(f, initial)
                transfer._emit()

            def update(self, n: int = 1) -> None:
                transfer._advance(f, n)

            def __enter__(self) -> Self:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def close(self) -> None:
                return None

        return _Hook

    # -- what the server does with a partial file ---------------------------------------------------------------
    def _blob(self, f: RemoteFile) -> str:
        return f"{repo_folder(self.r.repo_id, self.r.kind)}/{f.etag}"

    def _started(self, f: RemoteFile, initial: int) -> None:
        """The body of ``f`` starts at byte ``initial``: for a file cut before, that tells whether it continued."""
        if not any(self.partial.values()) and not self.cut:
            return
        if self.cut:
            memory.record_cut(self.plan.cache, self._blob(f), None)
        if initial > 0:
            self._observe(True, f"{self.endpoint} continued a partial download with a Range request")
            return
        # who restarted it: a client that continues <etag>.incomplete asked for the rest and, given the whole file,
        # emptied it before this first chunk; a client that left it as it was never asked
        own = blob_path(self.plan.cache, self.r.repo_id, self.r.kind, f).with_name(f"{f.etag}.incomplete")
        try:
            now = own.stat().st_size
        except FileNotFoundError:
            now = 0
        emptied = self.partial.get(own, 0) > 0 and now == 0
        self._observe(
            False,
            f"{self.endpoint} ignores Range requests: it answered one for the rest of a partial file"
            " with the whole file"
            if emptied
            else f"this client, huggingface_hub {self.client}, starts a file cut in an earlier run anew",
        )
        self._check_fits(f)  # known now, before this run spends itself on the file

    def _observe(self, resumes: bool, why: str) -> None:
        self.partial, self.cut = {}, 0  # one observation per attempt
        if self.seen is None or self.seen.resumes != resumes:
            log.info("%s", why)
        memory.remember(self.plan.cache, self.endpoint, self.client, resumes, why)
        self.seen = memory.Seen(resumes, why, time.time())
        self.resumes = resumes

    def _advance(self, f: RemoteFile, n: int) -> None:
        """Called by the client with each chunk before it writes it: raising here keeps the chunk out."""
        if n < 0:  # the client rolls its count back: a retry of its own got the whole file instead of the rest
            self._observe(
                False,
                f"{self.endpoint} ignores Range requests: it answered one for the rest of a cut"
                " file with the whole file",
            )
            self.file_done = max(0, self.file_done + n)
            return
        now = time.monotonic()
        if self.tick is not None:
            self.active_s += now - self.tick
        self.tick = now
        self.moved += n
        if self.budget is not None:
            left, rate = self.budget.left(), self.rate()
            if left <= 0:
                self._stop_or_refuse(MIN_TRANSFER_S, "the time budget is spent")
            if rate and not self.resumes:
                self._check_fits(f)
                if (f.size - self.file_done) / rate > left:
                    self._stop_or_refuse(f.size / rate, f"{f.path} cannot finish in the {left:.0f}s left")
        self.kept += n
        self.file_done += n
        self._emit(force=False)

    def _check_fits(self, f: RemoteFile) -> None:
        rate = self.rate()
        if self.budget is not None and rate and not self.resumes and f.size / rate > self.budget.usable_s:
            raise BudgetExceeded(self._too_big(f, rate))

    def _stop_or_refuse(self, need_s: float, why: str) -> None:
        """Stop this run; but a run that would stop before its first byte, having waited for no other stager, shows
        that the limit is too short: every rerun would stop there too."""
        if self.budget is not None and not (self.kept or self.fetched) and self.waited_s < 1.0:
            raise TimeLimitTooShort(self.budget.refusal(max(need_s, MIN_TRANSFER_S)))
        raise _Stop(self._stop_message(why))

    # -- messages -----------------------------------------------------------------------------------------------
    def _remaining(self) -> int:
        """Bytes still to transfer, read from the cache: what the next run will really fetch."""
        c, r = self.plan.cache, self.r
        return sum(
            f.size - (partial_bytes(c, r.repo_id, r.kind, f) if self.resumes else 0)
            for f in self.plan.selection.keep
            if not file_ok(c, r.repo_id, r.kind, r.sha, f)
        )

    def _resume_note(self) -> str:
        if not self.resumes:
            return f"a cut file restarts from zero here: {self.seen.why if self.seen else 'not resumable'}"
        if self.seen is None:
            return (
                f"partial files resume where they stopped if {self.endpoint} honours Range requests, which the next"
                " run will show"
            )
        return "partial files resume where they stopped"

    def _stop_message(self, why: str) -> str:
        left, rate = self._remaining(), self.rate()
        runs = ""
        if rate and self.budget:
            n = self.budget.runs_for(left / rate)
            runs = f"; about {n} more run(s) at {human.size(rate)}/s" if n else ""
        return (
            f"stopped before this process's time limit ({why}): {human.size(left)} of {self.r.kind} "
            f"'{self.r.repo_id}' left. Rerun to continue ({self._resume_note()}{runs}), or stage where processes"
            " may run longer to finish in one go (a staging job on the transfer partition:"
            " cluster.staging.where=job)."
        )

    def _too_big(self, f: RemoteFile, rate: float) -> str:
        assert self.budget is not None
        why = self.seen.why if self.seen and not self.seen.resumes else "as this run was told"
        command = f"sft-grid stage --repo {self.r.repo_id}" + (" --dataset" if self.r.kind == "dataset" else "")
        return (
            f"{f.path} of {self.r.kind} '{self.r.repo_id}' is {human.size(f.size)}: at {human.size(rate)}/s it needs "
            f"~{f.size / rate:.0f}s, more than the {self.budget.usable_s:.0f}s a process may run here, and a cut"
            f" file restarts from zero here ({why}), so reruns would never finish it. Fix: stage it where processes"
            " may run longer: a staging job on the cluster's transfer partition (cluster.staging.where=job"
            f" cluster.staging.partition=<it>), or `{command}` in a job on a node that reaches the Hub."
        )

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self) -> Staged:
        t0 = time.monotonic()
        for f in self.plan.to_link:
            self._link(f)
        self._drop_orphans()
        order = sorted(self.plan.to_fetch, key=lambda f: (f.size, f.path))
        if order:  # known before spending the run on it
            self._check_fits(order[-1])
        stopped = None
        for f in order:
            if self.lock is not None and self.lock.lost:
                raise TransferFailed(
                    f"another process took the staging lock of '{self.r.repo_id}' (this one "
                    "looked dead: paused, or clocks apart). Fix: rerun once it has finished."
                )
            try:
                self._before(f)
                self._fetch(f)
            except _Stop as s:
                stopped = str(s)
                log.debug("%s", stopped)  # the entry point prints it, once
                if self.current is not None and self.file_done > 0:  # the next run sees whether it continues
                    memory.record_cut(self.plan.cache, self._blob(self.current), self.file_done)
                break
        return Staged(
            repo_id=self.r.repo_id,
            kind=self.r.kind,
            revision=self.r.revision,
            sha=self.r.sha,
            path=snapshot_path(self.plan.cache, self.r.repo_id, self.r.kind, self.r.sha),
            complete=stopped is None,
            fetched=tuple(f.path for f in self.fetched),
            fetched_bytes=sum(f.size for f in self.fetched),
            remaining_bytes=self._remaining(),
            seconds=time.monotonic() - t0,
            rate_bps=self.measured_rate(),
            stopped=stopped,
        )

    def _before(self, f: RemoteFile) -> None:
        """Raise ``_Stop`` when this run should not start ``f``."""
        if self.budget is None:
            return
        left, rate = self.budget.left(), self.rate()
        if left <= 0:
            self._stop_or_refuse(MIN_TRANSFER_S, "the time budget is spent")
        if rate and not self.resumes:
            self._check_fits(f)
            if f.size / rate > left:
                self._stop_or_refuse(f.size / rate, f"{f.path} needs ~{f.size / rate:.0f}s, {left:.0f}s are left")

    def _fetch(self, f: RemoteFile) -> None:
        attempts, bad_sums = 0, 0
        while True:
            self.current, self.file_done, self.tick = f, 0, None
            self.partial = partial_files(self.plan.cache, self.r.repo_id, self.r.kind, f)
            self.cut = memory.cut_at(self.plan.cache, self._blob(f))
            before, t_try = self.moved, time.monotonic()
            try:
                with watch.expecting(f.path, f.size):
                    path = Path(
                        self.hf.hf_hub_download(
                            self.r.repo_id,
                            f.path,
                            repo_type=self.r.kind,
                            revision=self.r.sha,
                            cache_dir=str(self.plan.cache),
                            token=self.token,
                            endpoint=self.endpoint,
                            tqdm_class=self._bar(f),
                        )
                    )
            except (_Stop, HubError):
                raise
            except Exception as e:
                if self.budget is not None and watch.time_up(e):  # the limit came while the client waited
                    if not watch.stalled():
                        self._stop_or_refuse(MIN_TRANSFER_S, "the time budget is spent")
                    raise _Stop(self._stop_message(self._stalled(f, e))) from e  # a server that stalled
                if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                    raise NotEnoughSpace(
                        f"the filesystem of {self.plan.cache} filled up while staging {f.path} "
                        f"of '{self.r.repo_id}'. Fix: free space there and rerun."
                    ) from e
                attempts = 0 if self.moved > before else attempts + 1
                retried = self.moved == before and time.monotonic() - t_try >= CLIENT_RETRIED_S
                elsewhere = (url := failed_url(e)) is not None and watch.host_of(url) != watch.host_of(self.endpoint)
                refused = elsewhere and not transient(e, connect=False)  # another host refused: tries do not help
                if not transient(e) or retried or refused or attempts > self.retries:
                    err = translate(
                        GaveUp(e, attempts + 1 if not retried else 0) if transient(e) else e,
                        self.r.repo_id,
                        self.r.kind,
                        self.r.sha,
                        self.token,
                        self.endpoint,
                        self.plan.cache,
                        file=f.path,
                    )
                    raise (err or e) from e
                # progress: go again now
                delay = 0.0 if attempts == 0 else min(30.0, RETRY_BASE_S * 2 ** (attempts - 1))
                log.info("retrying %s of %s in %.1fs after: %s", f.path, self.r.repo_id, delay, e)
                if self.budget is not None and delay >= self.budget.left():
                    raise _Stop(self._stop_message(f"a transfer failed ({e})")) from e
                fresh_connections()
                time.sleep(delay)
                continue
            if self.verify and not checksum_ok(path, f):
                bad_sums += 1
                got = path.stat().st_size
                blob_path(self.plan.cache, self.r.repo_id, self.r.kind, f).unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                if got != f.size:  # a transfer fault (cut, padded or rewritten on the way), not the repository's
                    raise TransferFailed(
                        f"{f.path} of '{self.r.repo_id}' arrived with {got} bytes from {self._url(f)}, but the"
                        f" listing says {f.size}: it was cut or rewritten on the way (a proxy or cache between),"
                        " and was deleted. Fix: run the same command again; if it persists, ask the proxy's"
                        " operator, or stage from another endpoint (HF_ENDPOINT)."
                    )
                if bad_sums >= 2:  # complete, of the right size, twice: the content itself is wrong
                    raise TransferFailed(
                        f"{f.path} of '{self.r.repo_id}' arrived corrupted twice: complete and of the listed size, but"
                        f" its checksum does not match the listing (from {self._url(f)}). Fix: rerun later; if it"
                        " persists, report it to the repo owner."
                    )
                log.warning("checksum mismatch on %s of %s: fetching it again", f.path, self.r.repo_id)
                continue
            if self.cut:  # finished without a body (already complete on disk): nothing to see
                memory.record_cut(self.plan.cache, self._blob(f), None)
            self.base += f.size
            self.fetched.append(f)
            self.files_done += 1
            self.current, self.file_done = None, 0
            self._emit()
            return

    def _url(self, f: RemoteFile) -> str:
        """Where the bytes of ``f`` came from (the last answer for it: a redirect target, or the endpoint)."""
        a = watch.last("GET", f"/{f.path}")
        return a.url if a else self.endpoint

    def _stalled(self, f: RemoteFile, e: BaseException) -> str:
        url = failed_url(e) or self._url(f)
        since = f" nothing came for the last {time.monotonic() - self.tick:.0f}s," if self.tick else ""
        done = human.size(self.file_done)
        return f"the time limit came while waiting for {url}:{since} {done} of {f.path} had been written"

    def _link(self, f: RemoteFile) -> None:
        """Point this snapshot at a blob another commit brought in (what the client would do after a HEAD)."""
        blob = blob_path(self.plan.cache, self.r.repo_id, self.r.kind, f)
        ptr = snapshot_path(self.plan.cache, self.r.repo_id, self.r.kind, self.r.sha) / f.path
        ptr.parent.mkdir(parents=True, exist_ok=True)
        tmp = ptr.with_name(f".{ptr.name}.{os.getpid()}.link")
        try:
            os.symlink(os.path.relpath(blob, ptr.parent), tmp)
        except OSError:  # a filesystem without symlinks: the client copies too
            shutil.copyfile(blob, tmp)
        os.replace(tmp, ptr)

    def _drop_orphans(self) -> None:
        """Remove old per-attempt temporary files (``<etag>.<8 hex>.incomplete``) that a killed client left behind:
        no client continues them, and they hold disk. Only under our lock, and only if untouched for a while (a
        process outside sft_grid might be writing one)."""
        blobs = self.plan.cache / repo_folder(self.r.repo_id, self.r.kind) / "blobs"
        if not blobs.is_dir():
            return
        now = time.time()
        for p in blobs.iterdir():
            try:
                if ORPHAN_RE.search(p.name) and now - p.stat().st_mtime > ORPHAN_AGE_S:
                    size = p.stat().st_size
                    p.unlink()
                    log.info("removed %s left by a killed download (%s)", p.name, human.size(size))
            except FileNotFoundError:
                continue
