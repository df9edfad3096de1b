"""Values and errors of Hub staging (stdlib only): what the entry points print and what the planner decides on.

Every error names the repository and says how to fix the situation, in one line, because staging runs unattended
on a login node and the message is all the user gets.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sft_grid.core import human
from sft_grid.core.hubcache import Kind, RemoteFile, Selection
from sft_grid.core.state import started_at

# the time a run is given to transfer something when the smallest limit that works is worked out: a run that has no
# time left at all once its safety margin and what the process spent before its first transfer are taken off, or
# that stops before its first byte, would end every rerun the same way
MIN_TRANSFER_S = 1.0


class HubError(RuntimeError):
    """Base of staging errors; ``str()`` is the whole message, fix included."""


class RepoNotFound(HubError):
    pass


class RevisionNotFound(HubError):
    pass


class GatedRepo(HubError):
    pass


class TokenRequired(HubError):
    """The Hub refused an anonymous request: the repo is private or gated (or missing: it answers the same)."""


class HubUnreachable(HubError):
    pass


class UnconfirmedId(HubError):
    """A hub id the model table marks unconfirmed (`confirmed: false`), which could not be resolved from here."""


class FileHostUnreachable(HubError):
    """The endpoint answered and sent a download to another host (the Hub: its CDN), which cannot be reached."""


class UnexpectedAnswer(HubError):
    """An answer that is not what the Hub API promises (an HTML page, a body cut short, headers missing)."""


class IncompleteListing(HubError):
    """The server's listing shows folders without their files, even when each is listed by its path."""


class HubServerError(HubError):
    """The server kept answering with a server error (5xx) after the retries, and was failing for the repository
    at its default revision too (otherwise the revision is the missing thing: ``RevisionNotFound``)."""


class NotEnoughSpace(HubError):
    pass


class BudgetExceeded(HubError):
    """A file cannot finish within the process time limit, and a cut file restarts from zero here."""


class TimeLimitTooShort(HubError):
    """The process time limit leaves no time to transfer anything once its safety margin and the time this process
    needs before its first transfer are taken off: every run would end having done nothing."""


class StagingLocked(HubError):
    pass


class TransferFailed(HubError):
    pass


@dataclass(frozen=True)
class Resolved:
    """A revision pinned to its commit, with every file of that commit (sizes, hashes)."""

    repo_id: str
    kind: Kind
    revision: str  # as asked: a branch, tag or sha
    sha: str
    files: tuple[RemoteFile, ...]


@dataclass(frozen=True, kw_only=True)
class Plan:
    resolved: Resolved
    cache: Path
    selection: Selection
    cached: tuple[RemoteFile, ...]  # complete in this snapshot already
    to_link: tuple[RemoteFile, ...]  # content already in the cache (another commit): a symlink, no transfer
    to_fetch: tuple[RemoteFile, ...]
    bytes_to_fetch: int  # minus partial downloads only where the server was seen to continue one
    free_bytes: int
    reserve_bytes: int

    @property
    def bytes_needed(self) -> int:
        return self.selection.bytes

    @property
    def fits(self) -> bool:
        return self.bytes_to_fetch + self.reserve_bytes <= self.free_bytes

    def describe(self) -> str:
        r = self.resolved
        return (
            f"{r.kind} {r.repo_id}@{r.sha[:12]}: {len(self.selection.keep)} files, {human.size(self.bytes_needed)}"
            f" needed, {human.size(self.bytes_to_fetch)} to fetch ({len(self.to_fetch)} files),"
            f" {human.size(self.free_bytes)} free in {self.cache}"
        )


@dataclass(frozen=True, kw_only=True)
class Progress:
    """Sent to the progress callback on each received chunk and at each file's start and end."""

    repo_id: str
    file: str
    file_done: int
    file_total: int
    done: int  # bytes of the needed files now in the cache, cached ones included
    total: int
    rate_bps: float | None  # measured in this run; None until enough bytes moved to trust it
    eta_s: float | None
    files_done: int
    files_total: int


@dataclass(frozen=True)
class Budget:
    """This process may be killed ``limit_s`` seconds after ``started`` (a ``time.monotonic()`` value).

    Staging stops ``margin_s`` before that on its own, so the run ends with a report instead of a kill. The default
    margin (``auto_margin``) is a tenth of the limit, at least 5 s.
    """

    limit_s: float
    started: float
    margin_s: float = 5.0
    auto_margin: bool = False

    @staticmethod
    def default_margin(limit_s: float) -> float:
        return max(5.0, 0.1 * limit_s)

    @classmethod
    def from_now(cls, limit_s: float, margin_s: float | None = None) -> Budget:
        auto = margin_s is None
        return cls(limit_s, time.monotonic(), cls.default_margin(limit_s) if margin_s is None else margin_s, auto)

    @classmethod
    def since_process_start(cls, limit_s: float, margin_s: float | None = None) -> Budget:
        """Counted from when this process started (what a login node's killer counts), on Linux."""
        b = cls.from_now(limit_s, margin_s)
        started = started_at(os.getpid())
        if started is None:
            return b
        age = max(0.0, time.time() - started)
        return cls(limit_s, b.started - age, b.margin_s, b.auto_margin)

    @property
    def usable_s(self) -> float:
        """Seconds a fresh process can spend transferring."""
        return max(0.0, self.limit_s - self.margin_s)

    def left(self, now: float | None = None) -> float:
        return self.started + self.usable_s - (time.monotonic() if now is None else now)

    def spent(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def runs_for(self, seconds: float, overhead_s: float = 0.0) -> int:
        """Runs of this limit that ``seconds`` of transfer take, each losing ``overhead_s`` before its first byte."""
        per_run = self.usable_s - overhead_s
        return max(1, math.ceil(seconds / per_run)) if per_run > 0 else 0

    def limit_for(self, seconds: float) -> int:
        """The smallest whole limit that leaves ``seconds`` after the margin (the default margin grows with it)."""
        if not self.auto_margin:
            return math.ceil(seconds + self.margin_s)
        return math.ceil(max(seconds + 5.0, seconds / 0.9))

    def too_short(self, now: float | None = None) -> str | None:
        """Why this limit leaves this process no time at all to transfer (``refusal``), or None."""
        return self.refusal(MIN_TRANSFER_S, now) if self.left(now) <= 0 else None

    def refusal(self, needed_s: float = MIN_TRANSFER_S, now: float | None = None) -> str:
        """This limit is too short to transfer anything in a run; the smallest that leaves ``needed_s`` to transfer.

        What this process spent so far (starting up, resolving) is counted: a rerun spends it again."""
        spent = self.spent(now)
        return (
            f"a process time limit of {self.limit_s:g}s leaves no time to transfer here: staging stops"
            f" {self.margin_s:g}s before the limit (its safety margin), and this process needs {spent:.1f}s before"
            " its first transfer, so every run would stop having fetched nothing. Fix: the smallest limit that"
            f" works here is {self.limit_for(spent + needed_s)}s (--time-limit, or cluster.staging.time_limit_s),"
            " or stage in a job (cluster.staging.where=job)."
        )


@dataclass(frozen=True, kw_only=True)
class Staged:
    """The outcome of one ``download`` call."""

    repo_id: str
    kind: Kind
    revision: str
    sha: str  # record it: staging this sha again needs no network
    path: Path  # the snapshot directory to hand to the backend
    complete: bool
    seconds: float
    # what this run transferred (nothing, by default: served from the cache, or stopped before a transfer)
    fetched: tuple[str, ...] = ()
    fetched_bytes: int = 0
    remaining_bytes: int = 0
    rate_bps: float | None = None
    stopped: str | None = None  # why this run ended before completion (time budget), with what to do
    offline: bool = False  # served from the cache without any request
