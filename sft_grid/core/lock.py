"""The one file lock of sft_grid: one holder at a time per path, across processes and hosts (stdlib only).

Who uses it: the grid's sweep directories (one invocation decides and submits at a time), the run-once jobs of a
grid (model preps, tokenizations), the managed virtual environments and tiny assets (one builder), and Hub staging
(one stager per repository, in the Hugging Face cache).

Why our own, and not ``flock`` nor the ``filelock`` library: the runs root and the Hub cache live on cluster
filesystems (Lustre, GPFS, NFS mounts) where ``flock(2)`` can silently succeed for every caller (huggingface_hub gave
up relying on it for that reason), and ``filelock.FileLock`` is built on it. filelock's soft locks (4.3.1, the
version requirements.lock pins: ``SoftFileLock``, and ``SoftFileLease`` with its heartbeat and ``lease_duration``)
do notice a dead holder, but they break its lock only by swapping the marker with ``renameat2(RENAME_EXCHANGE)``,
and where the filesystem refuses that flag (the Linux NFS client refuses every rename flag with EINVAL) they give
up and wait on: a dead holder's lock is never broken there. Measured on 2026-12-02 (a FUSE passthrough mount, whose
kernel path refuses RENAME_EXCHANGE with EINVAL as NFS's does, and local ext4; a holder killed with SIGKILL, and a
marker of a holder on another host whose heartbeat stopped):

    holder ...                               filelock 4.3.1 SoftFileLease     this lock
    killed, same host, ext4                  taken after 0.02 s               taken after 0.01 s
    another host, no heartbeat, ext4         taken after the lease (2 s)      taken at once (mtime 120 s old)
    killed, same host, rename without flags  not taken in 15 s (never)        taken after 0.01 s
    another host, no heartbeat, same         not taken in 15 s (never)        taken at once

filelock also waits forever on an empty lock file (flock's leftovers, or a taker killed between creating its file
and writing it), which it takes for an old filelock's live holder. So the lock is a file created with
``O_CREAT | O_EXCL`` (atomic on all of these filesystems) that names its holder and is kept fresh by a heartbeat,
so that a dead holder's lock can be told apart from a live one and broken with a plain ``rename``.

Invariants:
- The holder writes ``{host, pid, token, since}`` into the file and touches its mtime every ``heartbeat_s``.
- A lock is stale when its holder is a dead process on this host (checked at once: a login node that kills a
  process with SIGKILL must not block the rerun), or, from another host (or with no readable holder), when its
  mtime is older than ``stale_s`` (the heartbeat stopped). A stale lock is moved aside with ``rename`` (atomic);
  if what was moved is another file than the one judged (its inode and mtime: a fresh lock taken in between by
  another breaker), it is linked back.
- A holder whose file was taken from it (it looked stale: a paused process, clocks apart beyond ``stale_s``) sees
  that at its next heartbeat and sets ``lost``; long holders check it between steps and stop.
- Waiting may have a deadline (``timeout_s``); ``LockTimeout`` names the holder, so the user knows whom to wait for.
  Without one, a waiter waits as long as the holder lives (what ``flock`` did).
- The file is removed on release: a path without a file is a free lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

log = logging.getLogger(__name__)

MAX_POLL_S = 1.0  # a long wait polls the file at most this often (each look is a metadata call on a shared filesystem)
TELL_EVERY_S = 10.0  # on_wait is called about this often while waiting


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    token: str
    since: float  # wall-clock time the lock was taken

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, since {time.strftime('%H:%M:%S', time.localtime(self.since))}"


class LockTimeout(TimeoutError):
    def __init__(self, path: Path, holder: Holder | None, waited_s: float) -> None:
        who = holder.describe() if holder else "an unknown process"
        super().__init__(f"{path} is held by {who}; waited {waited_s:.0f}s")
        self.path, self.holder, self.waited_s = path, holder, waited_s


def _read(path: Path) -> Holder | None:
    """The holder a lock file names; None when it is gone, not yet written, or not one of ours (an old flock file)."""
    try:
        raw = json.loads(path.read_text())
        return Holder(raw["host"], int(raw["pid"]), raw["token"], float(raw["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file is at ``path``: its inode alone could be a freed one reused at once, its mtime tells them apart."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


class Lock:
    """``with Lock(path): ...``, or ``acquire()``/``release()``.

    ``timeout_s``: how long to wait for another holder (None: as long as it lives). ``on_wait(holder, waited_s)`` is
    called when waiting starts and about every 10 s after. ``lost`` turns true if another process broke this lock.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        timeout_s: float | None = None,
        stale_s: float = 60.0,
        heartbeat_s: float = 5.0,
        poll_s: float = 0.05,
        on_wait: Callable[[Holder | None, float], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.timeout_s, self.stale_s, self.heartbeat_s, self.poll_s = timeout_s, stale_s, heartbeat_s, poll_s
        self.on_wait = on_wait
        self.me = Holder(socket.gethostname(), os.getpid(), uuid.uuid4().hex, 0.0)
        self.lost = False
        self.waited_s = 0.0  # how long the last acquire waited for another holder
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        told, poll = -1.0, self.poll_s
        while True:
            if self._try_create():
                self.waited_s = time.monotonic() - start
                self._stop.clear()
                self._beat = threading.Thread(
                    target=self._heartbeat, name=f"lock-heartbeat {self.path.name}", daemon=True
                )
                self._beat.start()
                return
            judged, holder = _identity(self.path), _read(self.path)
            if self._stale(holder):
                log.warning(
                    "breaking a stale lock %s (%s)", self.path, holder.describe() if holder else "no holder named"
                )
                self._break(judged)
                continue
            waited = time.monotonic() - start
            if self.timeout_s is not None and waited >= self.timeout_s:
                raise LockTimeout(self.path, holder, waited)
            if self.on_wait is not None and (told < 0 or waited - told >= TELL_EVERY_S):
                told = waited
                self.on_wait(holder, waited)
            left = float("inf") if self.timeout_s is None else max(0.0, self.timeout_s - waited)
            time.sleep(min(poll, left))
            poll = min(MAX_POLL_S, poll * 1.5)

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self.me = Holder(self.me.host, self.me.pid, self.me.token, time.time())
        with os.fdopen(fd, "w") as fh:
            json.dump({"host": self.me.host, "pid": self.me.pid, "token": self.me.token, "since": self.me.since}, fh)
        self.lost = False
        return True

    def _stale(self, holder: Holder | None) -> bool:
        if holder is not None and holder.host == self.me.host:
            return not _pid_alive(holder.pid)
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return False  # released meanwhile: the next create attempt will tell
        return age > self.stale_s

    def _break(self, judged: tuple[int, int, int] | None) -> None:
        """Move the stale file aside; if the file moved is not the one judged stale, put it back."""
        aside = self.path.with_name(f"{self.path.name}.stale-{self.me.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if _identity(aside) != judged:
            # a live lock was taken between our look and the rename: give it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            current = _read(self.path)
            if current is None or current.token != self.me.token:
                log.error("lock %s was taken over (%s)", self.path, current.describe() if current else "gone")
                self.lost = True
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=self.heartbeat_s + 5)
            self._beat = None
        current = _read(self.path)
        if current is not None and current.token == self.me.token:
            self.path.unlink(missing_ok=True)


@contextmanager
def hold_all(paths: Iterable[Path | str], **options: Any) -> Iterator[list[Lock]]:
    """Several locks at once, taken in sorted order (two takers of overlapping sets cannot deadlock), released in
    reverse; ``options`` are ``Lock``'s."""
    with ExitStack() as stack:
        yield [stack.enter_context(Lock(p, **options)) for p in sorted({Path(p) for p in paths})]
