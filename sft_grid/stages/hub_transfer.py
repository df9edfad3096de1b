"""The file-by-file transfer behind ``hub.download``: the real client, retries, checksums, the time budget.

Design: ``huggingface_hub.hf_hub_download`` moves the bytes (cache layout, ``.incomplete`` handling and its
per-blob lock stay the client's), one file at a time at the pinned sha, smallest first so that a short run
completes as many files as it can and big files come last. Progress comes from the ``tqdm_class`` hook the
client calls once per received chunk; the same hook enforces the time budget by raising ``_Stop`` (or
``BudgetExceeded``) inside the client's read loop, which leaves huggingface_hub <= 1.17's partial file in
place for the next run. The client is imported lazily: the orchestrator's other commands do not pay for it.

Retries: a transient failure (connection cut or refused, timeout, 429/5xx, short body) is retried with
backoff; the count resets whenever bytes arrived, so a flaky link that still moves data is not given up on.
A file whose checksum (LFS sha256, or git blob oid) does not match is deleted and fetched once more.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from sft_grid.stages.hub_client import _client, _transient, _translate
from sft_grid.core.hubcache import (RemoteFile, blob_path, checksum_ok, file_ok, partial_bytes, repo_folder,
                                       snapshot_path)
from sft_grid.stages.hub_lock import RepoLock
from sft_grid.stages.hub_types import (Budget, BudgetExceeded, HubError, NotEnoughSpace, Plan, Progress, Staged,
                                       TransferFailed, human)

log = logging.getLogger(__name__)

TRUST_BYTES, TRUST_S = 1 << 20, 0.25  # below this a measured rate is mostly noise
EMIT_EVERY_S = 0.1  # progress callbacks at most this often within a file (the CLI redraws a line each time)
ORPHAN_RE = re.compile(r"\.[0-9a-f]{8}\.incomplete$")  # huggingface_hub >= 1.18's per-attempt temporary files
ORPHAN_AGE_S = 300.0


class _Stop(Exception):
    """Raised from the progress hook to end this run cleanly; the message says what is left and what to do."""


class Transfer:
    """One run over a plan's files; ``run()`` returns ``Staged`` or raises a ``HubError``."""

    def __init__(self, plan: Plan, *, token: str | None, endpoint: str | None, budget: Budget | None,
                 on_progress: Callable[[Progress], None] | None, verify: bool, retries: int, resumable: bool,
                 rate_hint: float | None, lock: RepoLock | None) -> None:
        self.plan, self.r = plan, plan.resolved
        self.token, self.budget, self.on_progress = token, budget, on_progress
        self.verify, self.retries, self.resumable = verify, retries, resumable
        self.rate_hint, self.lock = rate_hint, lock
        self.hf = _client()
        self.endpoint = endpoint or self.hf.constants.ENDPOINT
        self.base = sum(f.size for f in plan.cached + plan.to_link)  # bytes of complete files
        self.file_done = 0
        self.moved = 0  # bytes received in this run
        self.active_s = 0.0  # time spent receiving file bodies: requests and small-file overheads are not rate
        self.tick: float | None = None
        self.fetched: list[RemoteFile] = []
        self.files_done = len(plan.cached) + len(plan.to_link)
        self.current: RemoteFile | None = None
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
        self.on_progress(Progress(self.r.repo_id, f.path if f else "", self.file_done, f.size if f else 0, done,
                                  self.plan.bytes_needed, rate, eta, self.files_done, len(self.plan.selection.keep)))

    def _bar(self, f: RemoteFile) -> type:
        """A stand-in for tqdm that the client drives: it reports progress and enforces the budget."""
        transfer = self

        class _Hook:
            def __init__(self, *args: Any, initial: int = 0, **kwargs: Any) -> None:
                transfer.file_done = initial  # resumed bytes count as done, not as moved
                transfer.tick = time.monotonic()  # the body starts now (the client made us after the headers)
                transfer._emit()

            def update(self, n: int = 1) -> None:
                transfer._advance(f, n)

            def __enter__(self) -> _Hook:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def close(self) -> None:
                return None

        return _Hook

    def _advance(self, f: RemoteFile, n: int) -> None:
        """Called by the client with each chunk before it writes it: raising here keeps the chunk out."""
        now = time.monotonic()
        if self.tick is not None:
            self.active_s += now - self.tick
        self.tick = now
        self.moved += max(n, 0)
        if self.budget is not None:
            left, rate = self.budget.left(), self.rate()
            if left <= 0:
                raise _Stop(self._stop_message("the time budget is spent"))
            if rate and not self.resumable:
                if f.size / rate > self.budget.usable_s:
                    raise BudgetExceeded(self._too_big(f, rate))
                if (f.size - self.file_done) / rate > left:
                    raise _Stop(self._stop_message(f"{f.path} cannot finish in the {left:.0f}s left"))
        self.file_done += n
        self._emit(force=False)

    # -- messages -----------------------------------------------------------------------------------------------
    def _remaining(self) -> int:
        """Bytes still to transfer, read from the cache: what the next run will really fetch."""
        c, r = self.plan.cache, self.r
        return sum(f.size - (partial_bytes(c, r.repo_id, r.kind, f) if self.resumable else 0)
                   for f in self.plan.selection.keep if not file_ok(c, r.repo_id, r.kind, r.sha, f))

    def _stop_message(self, why: str) -> str:
        left, rate = self._remaining(), self.rate()
        resume = "partial files resume where they stopped" if self.resumable else "a cut file restarts from zero"
        runs = f"; about {self.budget.runs_for(left / rate)} more run(s) at {human(rate)}/s" if (
            rate and self.budget) else ""
        return (f"stopped before this process's time limit ({why}): {human(left)} of {self.r.kind} "
                f"'{self.r.repo_id}' left. Rerun to continue ({resume}{runs}), or stage where processes may run "
                "longer to finish in one go (a staging job on the transfer partition: cluster.staging.where=job).")

    def _too_big(self, f: RemoteFile, rate: float) -> str:
        assert self.budget is not None
        return (f"{f.path} of {self.r.kind} '{self.r.repo_id}' is {human(f.size)}: at {human(rate)}/s it needs "
                f"~{f.size / rate:.0f}s, more than the {self.budget.usable_s:.0f}s a process may run here, and this "
                f"client (huggingface_hub {self.hf.__version__}) restarts a cut file from zero, so reruns would "
                "never finish it. Fix: stage where processes may run longer: a staging job on the cluster's transfer "
                "partition (cluster.staging.where=job, cluster.staging.partition=<it>), or a job on a node that "
                "reaches the Hub; or use huggingface_hub<=1.17 (sft_grid's pin), which resumes a cut file.")

    # -- the run ------------------------------------------------------------------------------------------------
    def run(self) -> Staged:
        t0 = time.monotonic()
        for f in self.plan.to_link:
            self._link(f)
        self._drop_orphans()
        order = sorted(self.plan.to_fetch, key=lambda f: (f.size, f.path))
        rate = self.rate()
        if order and rate and self.budget and not self.resumable and order[-1].size / rate > self.budget.usable_s:
            raise BudgetExceeded(self._too_big(order[-1], rate))  # known before spending the run on it
        stopped = None
        for f in order:
            if self.lock is not None and self.lock.lost:
                raise TransferFailed(f"another process took the staging lock of '{self.r.repo_id}' (this one "
                                     "looked dead: paused, or clocks apart). Fix: rerun once it has finished.")
            stopped = self._before(f)
            if stopped is None:
                try:
                    self._fetch(f)
                except _Stop as s:
                    stopped = str(s)
            if stopped is not None:
                log.warning("%s", stopped)
                break
        return Staged(self.r.repo_id, self.r.kind, self.r.revision, self.r.sha,
                      snapshot_path(self.plan.cache, self.r.repo_id, self.r.kind, self.r.sha),
                      stopped is None, tuple(f.path for f in self.fetched), sum(f.size for f in self.fetched),
                      self._remaining(), time.monotonic() - t0, self.measured_rate(), stopped)

    def _before(self, f: RemoteFile) -> str | None:
        """Why this run should not start ``f`` (a message), or None."""
        if self.budget is None:
            return None
        left, rate = self.budget.left(), self.rate()
        if left <= 0:
            return self._stop_message("the time budget is spent")
        if rate and not self.resumable:
            if f.size / rate > self.budget.usable_s:
                raise BudgetExceeded(self._too_big(f, rate))
            if f.size / rate > left:
                return self._stop_message(f"{f.path} needs ~{f.size / rate:.0f}s, {left:.0f}s are left")
        return None

    def _fetch(self, f: RemoteFile) -> None:
        attempts, bad_sums = 0, 0
        while True:
            self.current, self.file_done, self.tick = f, 0, None
            before = self.moved
            try:
                path = Path(self.hf.hf_hub_download(
                    self.r.repo_id, f.path, repo_type=self.r.kind, revision=self.r.sha,
                    cache_dir=str(self.plan.cache), token=self.token, endpoint=self.endpoint, tqdm_class=self._bar(f)))
            except (_Stop, HubError):
                raise
            except Exception as e:
                if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                    raise NotEnoughSpace(f"the filesystem of {self.plan.cache} filled up while staging {f.path} "
                                         f"of '{self.r.repo_id}'. Fix: free space there and rerun.") from e
                err = _translate(e, self.r.repo_id, self.r.kind, self.r.sha, self.token, self.endpoint,
                                 self.plan.cache)
                if not _transient(e):
                    raise (err or e) from e
                attempts = 0 if self.moved > before else attempts + 1
                if attempts > self.retries:
                    raise (err or TransferFailed(
                        f"{f.path} of '{self.r.repo_id}' failed {attempts} times in a row with no progress ({e}). "
                        "Fix: check this node's route to the Hub (proxy, firewall) and rerun; finished files are "
                        "kept.")) from e
                delay = 0.0 if attempts == 0 else min(30.0, 0.5 * 2 ** (attempts - 1))  # progress: go again now
                log.warning("retrying %s of %s in %.1fs after: %s", f.path, self.r.repo_id, delay, e)
                if self.budget is not None and delay >= self.budget.left():
                    raise _Stop(self._stop_message(f"a transfer failed ({e})")) from e
                time.sleep(delay)
                continue
            if self.verify and not checksum_ok(path, f):
                bad_sums += 1
                blob_path(self.plan.cache, self.r.repo_id, self.r.kind, f).unlink(missing_ok=True)
                path.unlink(missing_ok=True)
                if bad_sums >= 2:
                    raise TransferFailed(f"{f.path} of '{self.r.repo_id}' arrived corrupted twice (checksum "
                                         "mismatch). Fix: rerun later; if it persists, report it to the repo owner.")
                log.warning("checksum mismatch on %s of %s: fetching it again", f.path, self.r.repo_id)
                continue
            self.base += f.size
            self.fetched.append(f)
            self.files_done += 1
            self.current, self.file_done = None, 0
            self._emit()
            return

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
        """Remove old per-attempt temporary files of huggingface_hub >= 1.18 that a killed run left behind:
        no client can resume them, and they hold disk. Only under our lock, and only if untouched for a while
        (a process outside sft_grid might be writing one)."""
        blobs = self.plan.cache / repo_folder(self.r.repo_id, self.r.kind) / "blobs"
        if not blobs.is_dir():
            return
        now = time.time()
        for p in blobs.iterdir():
            try:
                if ORPHAN_RE.search(p.name) and now - p.stat().st_mtime > ORPHAN_AGE_S:
                    size = p.stat().st_size
                    p.unlink()
                    log.info("removed %s left by a killed download (%s)", p.name, human(size))
            except FileNotFoundError:
                continue

