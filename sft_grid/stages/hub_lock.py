"""One stager per repo: a lock file in the HF cache that works on cluster filesystems (stdlib only).

Why not ``flock``: on Lustre, GPFS and some NFS mounts ``flock(2)`` can silently succeed for every caller
(huggingface_hub gave up relying on it for that reason), and huggingface_hub <= 1.17, which we use for its
byte-level resume, appends to one shared ``<blob>.incomplete`` per file: two unserialised stagers would
interleave their bytes. So the lock is a file created with ``O_CREAT | O_EXCL``, which is atomic on all of them.

Invariants:
- The holder writes ``{host, pid, token, since}`` into the file and touches its mtime every ``heartbeat_s``.
- A lock is stale when its holder is a dead process on this host (checked at once: a login node that kills a
  stager with SIGKILL must not block the rerun), or, from another host, when its mtime is older than
  ``stale_s`` (the holder's heartbeat stopped). A stale lock is moved aside with ``rename`` (atomic); if what
  was moved turns out to be a fresh lock taken in between, it is linked back.
- A holder whose file was taken from it (it looked stale: a paused process, a clock skew beyond ``stale_s``)
  sees that at its next heartbeat and sets ``lost``; the stager checks it between files and stops.
- Waiting has a deadline: ``LockTimeout`` names the holder, so the user knows which process to wait for.
- Files under ``<cache>/.locks`` are skipped by huggingface_hub's cache scanner, so ours go there too.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


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
    try:
        raw = json.loads(path.read_text())
        return Holder(raw["host"], int(raw["pid"]), raw["token"], float(raw["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # gone, or created and not yet written


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RepoLock:
    """``with RepoLock(path, timeout_s=600): ...``; ``on_wait(holder, waited_s)`` is called about every 10 s."""

    def __init__(self, path: Path, *, timeout_s: float, stale_s: float = 60.0, heartbeat_s: float = 5.0,
                 poll_s: float = 0.1, on_wait: Callable[[Holder | None, float], None] | None = None) -> None:
        self.path = Path(path)
        self.timeout_s, self.stale_s, self.heartbeat_s, self.poll_s = timeout_s, stale_s, heartbeat_s, poll_s
        self.on_wait = on_wait
        self.me = Holder(socket.gethostname(), os.getpid(), uuid.uuid4().hex, 0.0)
        self.lost = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> RepoLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        told = -1.0
        while True:
            if self._try_create():
                self._beat = threading.Thread(target=self._heartbeat, name="hub-lock-heartbeat", daemon=True)
                self._beat.start()
                return
            holder = _read(self.path)
            if self._stale(holder):
                log.warning("breaking a stale staging lock %s (%s)", self.path,
                            holder.describe() if holder else "unreadable")
                self._break(holder)
                continue
            waited = time.monotonic() - start
            if waited >= self.timeout_s:
                raise LockTimeout(self.path, holder, waited)
            if self.on_wait is not None and (told < 0 or waited - told >= 10.0):
                told = waited
                self.on_wait(holder, waited)
            time.sleep(min(self.poll_s, max(0.0, self.timeout_s - waited)))

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        self.me = Holder(self.me.host, self.me.pid, self.me.token, time.time())
        with os.fdopen(fd, "w") as fh:
            json.dump({"host": self.me.host, "pid": self.me.pid, "token": self.me.token, "since": self.me.since}, fh)
        return True

    def _stale(self, holder: Holder | None) -> bool:
        if holder is not None and holder.host == self.me.host:
            return not _pid_alive(holder.pid)
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return False  # released meanwhile: the next create attempt will tell
        return age > self.stale_s

    def _break(self, judged: Holder | None) -> None:
        aside = self.path.with_name(f"{self.path.name}.stale-{self.me.token}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = _read(aside)
        if judged is not None and (moved is None or moved.token != judged.token):
            try:  # a live lock was taken between our look and the rename: give it back
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            current = _read(self.path)
            if current is None or current.token != self.me.token:
                log.error("staging lock %s was taken over (%s)", self.path, current.describe() if current else "gone")
                self.lost = True
                return
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=self.heartbeat_s + 5)
            self._beat = None
        current = _read(self.path)
        if current is not None and current.token == self.me.token:
            self.path.unlink(missing_ok=True)
