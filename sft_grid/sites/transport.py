"""How sft_grid reaches a site: a process here, or OpenSSH to a remote site's login node.

One small interface, `Transport.run(argv, stdin=...)`, used for everything site-side: the argv runs on the site
(for ssh: quoted with shlex, so what runs there is exactly that argv), with stdin streamed to it and its output
returned. The ssh transport is the user's own OpenSSH with the user's own ~/.ssh/config (keys, agents, jump hosts,
the `Host` aliases `cluster.remote.host` names), plus one control connection (ControlMaster) that every command of
an invocation reuses: one authentication, then a round trip per command; `close()` ends it, and it ends by itself
when idle (ControlPersist), so nothing is left running on the site. No library: OpenSSH is what users already
configure and trust, and it is what their jump hosts and key agents work with (paramiko reads neither fully).

Nothing waits on a site without limit. A connection that cannot be made ends after ssh's ConnectTimeout (the TCP
connect and the server's banner); one that goes silent once made (a laptop asleep, a VPN dropped, a site that drops
packets: a half-open connection) ends after ServerAliveInterval x ServerAliveCountMax, ssh's own keepalive (during
the key exchange too); each values the cluster profile's `remote:` section gives, else the user's ssh config's,
else this module's defaults. And every call has a bound of its own (`timeout`): a command still running then is
stopped. A site that does not answer in any of these ways is `SiteUnreachable` (`SiteTimeout`: the call's bound),
its message one line that names the host and how long was waited.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

TIMEOUT_S = 300  # one command that answers (a snapshot sent, a status, a pull), unless the caller bounds it
# the keepalive and connect limits where neither the profile nor the user's ssh config sets them: a connection is
# given up after 30 s unmade, or 60 s silent
CONNECT_TIMEOUT_S = 30
ALIVE_INTERVAL_S = 15
ALIVE_COUNT_MAX = 4


# words of ssh's messages for a connection not made or lost (not refused: a key, a host key, a name)
LOST = ("timed out", "not responding", "closed", "reset", "broken pipe", "read header failed", "exit status 255")


class SiteUnreachable(OSError):
    """ssh could not reach the site (exit status 255: the connection, not the command, failed), or the site did not
    answer within the call's bound (`SiteTimeout`)."""


class SiteTimeout(SiteUnreachable):
    """A call to the site outlived its bound: the command was stopped (the connection may be half-open, or the
    site's command stuck)."""


def one_line(text: str, limit: int = 300) -> str:
    """ssh's or a command's message as one line: its lines joined, the end kept."""
    joined = "; ".join(line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip())
    return joined if len(joined) <= limit else "..." + joined[-limit:]


def _what(argv: Sequence[str]) -> str:
    """A command, short, for a message."""
    text = shlex.join(argv).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


class Transport(Protocol):
    name: str

    def run(
        self,
        argv: Sequence[str],
        stdin: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
        out: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """argv on the site, within `timeout` seconds (None: the transport's own bound), its output returned (or
        written to `out`, a file, when given); raises SiteUnreachable (SiteTimeout past the bound)."""
        ...

    def stream(self, argv: Sequence[str], timeout: float | None = None) -> int:
        """argv on the site, its output and errors streaming to this process's; its exit status. `timeout`: None
        for a command that ends when its user stops it (`status --watch`), the connection's keepalive its only
        limit."""
        ...

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """argv on the site, started and left running: its stdin, stdout and stderr pipes here. It ends when it
        exits, or when its stdin is closed here and it reads the end (the way a held lock is let go)."""
        ...

    def close(self) -> None: ...


@dataclass
class Local:
    """This machine: the argv runs as a local process."""

    name: str = "here"
    timeout_s: float = TIMEOUT_S

    def run(
        self,
        argv: Sequence[str],
        stdin: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
        out: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        bound = self.timeout_s if timeout is None else timeout
        try:
            return subprocess.run(
                list(argv),
                input=stdin,
                stdout=out if out is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=check,
                timeout=bound,
            )
        except subprocess.TimeoutExpired:
            raise SiteTimeout(f"{self.name}: no answer within {bound:g} s ({_what(argv)} stopped)") from None

    def stream(self, argv: Sequence[str], timeout: float | None = None) -> int:
        try:
            return subprocess.run(list(argv), check=False, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise SiteTimeout(f"{self.name}: not done within {timeout:g} s ({_what(argv)} stopped)") from None

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def close(self) -> None:
        pass


LOCAL = Local()


@dataclass
class Ssh:
    """A remote site over OpenSSH: `host` is a Host of the ssh config (`config`: another file than ~/.ssh/config,
    `ssh -F`, as the tests use). The first command opens the control connection; the others reuse it.

    `connect_timeout_s`, `alive_interval_s`, `alive_count_max`: ssh's ConnectTimeout, ServerAliveInterval and
    ServerAliveCountMax (None: the ssh config's for the host, else CONNECT_TIMEOUT_S, ALIVE_INTERVAL_S and
    ALIVE_COUNT_MAX); `timeout_s`: the bound of a call that gives none. `before`: run once, before the first command
    (its own commands go through): a check that must pass before anything is sent there (sites/remote.py: the
    site's python); until it has passed, every command runs it first."""

    host: str
    config: Path | None = None
    persist_s: int = 60
    name: str = ""
    connect_timeout_s: int | None = None
    alive_interval_s: int | None = None
    alive_count_max: int | None = None
    timeout_s: float = TIMEOUT_S
    before: Callable[[Ssh], None] | None = None
    _socket: Path = field(init=False)
    _options: list[str] | None = field(init=False, default=None)
    _limits: tuple[int | None, int | None, int | None] = field(init=False, default=(None, None, None))
    _ready: bool = field(init=False, default=False)
    _checking: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.host
        # short: a unix socket path has ~100 bytes; private to this user (the directory is 0700)
        digest = hashlib.sha256(f"{self.host}\0{self.config}\0{os.getpid()}".encode()).hexdigest()[:12]
        self._socket = Path(tempfile.gettempdir()) / f"sft_grid-ssh-{os.getuid()}" / digest

    def _ssh(self) -> list[str]:
        return ["ssh", *(["-F", str(self.config)] if self.config is not None else [])]

    def resolved(self) -> dict[str, str]:
        """The user's ssh config for the host as ssh resolves it (`ssh -G`: no connection is made), lower-case keys;
        empty when ssh cannot say (an OpenSSH before 6.8)."""
        try:
            done = subprocess.run([*self._ssh(), "-G", self.host], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return {}
        if done.returncode != 0:
            return {}
        return {k.lower(): v.strip() for k, _, v in (ln.partition(" ") for ln in done.stdout.splitlines()) if v}

    def limits(self) -> tuple[int | None, int | None, int | None]:
        """(ConnectTimeout, ServerAliveInterval, ServerAliveCountMax) this transport's connections run with (None:
        unknown, the ssh config's own where this transport sets none)."""
        self.base()
        return self._limits

    def base(self) -> list[str]:
        if self._options is None:
            given = self.resolved()
            theirs_connect = given.get("connecttimeout", "none") not in ("none", "0", "")
            theirs_alive = given.get("serveraliveinterval", "0") not in ("0", "")
            connect = self.connect_timeout_s or (None if theirs_connect else CONNECT_TIMEOUT_S)
            interval = self.alive_interval_s or (None if theirs_alive else ALIVE_INTERVAL_S)
            count = self.alive_count_max or (None if theirs_alive else ALIVE_COUNT_MAX)
            options = [f"ConnectTimeout={connect}"] if connect else []
            options += [f"ServerAliveInterval={interval}"] if interval else []
            options += [f"ServerAliveCountMax={count}"] if count else []

            def known(key: str, mine: int | None) -> int | None:
                value = given.get(key, "")
                return mine if mine else int(value) if value.isdigit() else None

            self._limits = (
                known("connecttimeout", connect),
                known("serveraliveinterval", interval),
                known("serveralivecountmax", count),
            )
            self._options = [opt for o in options for opt in ("-o", o)]
        return [
            *self._ssh(),
            "-o",
            "BatchMode=yes",  # never a password prompt in the middle of a grid: keys or agents only
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self._socket}",
            "-o",
            f"ControlPersist={self.persist_s}",
            *self._options,
        ]

    def _first(self) -> None:
        """The `before` check, once it is due (see the class's docstring)."""
        if self.before is None or self._ready or self._checking:
            return
        self._checking = True
        try:
            self.before(self)
        finally:
            self._checking = False
        self._ready = True

    def _failed(self, stderr: str) -> SiteUnreachable:
        """ssh's exit status 255 as one line: its message, and the limits that end a connection that cannot be made
        or goes silent when it may be one of those (a command run over the control connection learns only that the
        connection ended: the master that saw why runs in the background)."""
        said = one_line(stderr) or "the connection failed (exit status 255)"
        if any(w in said.lower() for w in LOST):
            connect, interval, count = self.limits()
            said += (
                f" (its limits: ConnectTimeout {connect or '-'} s to connect, then silent for at most"
                f" ServerAliveInterval {interval or '-'} s x ServerAliveCountMax {count or '-'})"
            )
        return SiteUnreachable(f"ssh {self.host}: {said}")

    def run(
        self,
        argv: Sequence[str],
        stdin: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
        out: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        self._first()
        self._socket.parent.mkdir(mode=0o700, exist_ok=True)
        bound = self.timeout_s if timeout is None else timeout
        try:
            done = subprocess.run(
                [*self.base(), self.host, "--", shlex.join(argv)],
                input=stdin,
                stdout=out if out is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                check=False,
                timeout=bound,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise SiteTimeout(
                f"ssh {self.host}: no answer within {bound:g} s ({_what(argv)} stopped): the site's command is stuck"
                " or the connection went silent"
            ) from None
        if done.returncode == 255:
            raise self._failed(done.stderr.decode(errors="replace"))
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, list(argv), done.stdout, done.stderr)
        return done

    def stream(self, argv: Sequence[str], timeout: float | None = None) -> int:
        """Run argv on the site, its output and errors streaming to this process's; its exit status. ssh's own
        message, when the connection fails, is among those errors."""
        self._first()
        self._socket.parent.mkdir(mode=0o700, exist_ok=True)
        command = [*self.base(), self.host, "--", shlex.join(argv)]
        try:
            done = subprocess.run(command, stdin=subprocess.DEVNULL, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SiteTimeout(
                f"ssh {self.host}: not done within {timeout:g} s ({_what(argv)} stopped): the site's command is stuck"
                " or the connection went silent"
            ) from None
        if done.returncode == 255:
            raise self._failed("the connection failed (exit status 255)")
        return done.returncode

    def start(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """argv on the site, over the control connection, left running (see Transport.start): when this process
        dies, its session ends with it, and the site's side reads the end of its stdin."""
        self._first()
        self._socket.parent.mkdir(mode=0o700, exist_ok=True)
        command = [*self.base(), self.host, "--", shlex.join(argv)]
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def connected(self) -> bool:
        """Whether the control connection is up (`ssh -O check`)."""
        check = [*self.base(), "-O", "check", self.host]
        try:
            return subprocess.run(check, capture_output=True, check=False, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        """End the control connection (and with it the session on the site): a local request to the master, which
        answers even when the site does not."""
        if self._socket.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([*self.base(), "-O", "exit", self.host], capture_output=True, check=False, timeout=30)
