"""How sft_grid reaches a site: a process here, or OpenSSH to a remote site's login node.

One small interface, `Transport.run(argv, stdin=...)`, used for everything site-side: the argv runs on the site
(for ssh: quoted with shlex, so what runs there is exactly that argv), with stdin streamed to it and its output
returned. The ssh transport is the user's own OpenSSH with the user's own ~/.ssh/config (keys, agents, jump hosts,
the `Host` aliases `cluster.remote.host` names), plus one control connection (ControlMaster) that every command of
an invocation reuses: one authentication, then a round trip per command; `close()` ends it, and it ends by itself
when idle (ControlPersist), so nothing is left running on the site. No library: OpenSSH is what users already
configure and trust, and it is what their jump hosts and key agents work with (paramiko reads neither fully).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

TIMEOUT_S = 300


class SiteUnreachable(OSError):
    """ssh could not reach the site (exit status 255: the connection, not the command, failed)."""


class Transport(Protocol):
    name: str

    def run(
        self, argv: Sequence[str], stdin: bytes | None = None, check: bool = True, timeout: float = TIMEOUT_S
    ) -> subprocess.CompletedProcess[bytes]: ...

    def stream(self, argv: Sequence[str]) -> int: ...

    def close(self) -> None: ...


@dataclass
class Local:
    """This machine: the argv runs as a local process."""

    name: str = "here"

    def run(
        self, argv: Sequence[str], stdin: bytes | None = None, check: bool = True, timeout: float = TIMEOUT_S
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(list(argv), input=stdin, capture_output=True, check=check, timeout=timeout)

    def stream(self, argv: Sequence[str]) -> int:
        return subprocess.run(list(argv), check=False).returncode

    def close(self) -> None:
        pass


LOCAL = Local()


@dataclass
class Ssh:
    """A remote site over OpenSSH: `host` is a Host of the ssh config (`config`: another file than ~/.ssh/config,
    `ssh -F`, as the tests use). The first command opens the control connection; the others reuse it."""

    host: str
    config: Path | None = None
    persist_s: int = 60
    name: str = ""
    _socket: Path = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.host
        # short: a unix socket path has ~100 bytes; private to this user (the directory is 0700)
        digest = hashlib.sha256(f"{self.host}\0{self.config}\0{os.getpid()}".encode()).hexdigest()[:12]
        self._socket = Path(tempfile.gettempdir()) / f"sft_grid-ssh-{os.getuid()}" / digest

    def base(self) -> list[str]:
        argv = ["ssh"]
        if self.config is not None:
            argv += ["-F", str(self.config)]
        return [
            *argv,
            "-o",
            "BatchMode=yes",  # never a password prompt in the middle of a grid: keys or agents only
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self._socket}",
            "-o",
            f"ControlPersist={self.persist_s}",
        ]

    def run(
        self, argv: Sequence[str], stdin: bytes | None = None, check: bool = True, timeout: float = TIMEOUT_S
    ) -> subprocess.CompletedProcess[bytes]:
        self._socket.parent.mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run(
            [*self.base(), self.host, "--", shlex.join(argv)],
            input=stdin,
            capture_output=True,
            check=False,
            timeout=timeout,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
        if done.returncode == 255:
            raise SiteUnreachable(f"ssh {self.host}: {done.stderr.decode(errors='replace').strip()[-300:]}")
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, list(argv), done.stdout, done.stderr)
        return done

    def stream(self, argv: Sequence[str]) -> int:
        """Run argv on the site, its output and errors streaming to this process's; its exit status."""
        self._socket.parent.mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run([*self.base(), self.host, "--", shlex.join(argv)], stdin=subprocess.DEVNULL, check=False)
        if done.returncode == 255:
            raise SiteUnreachable(f"ssh {self.host}: the connection failed (exit status 255)")
        return done.returncode

    def connected(self) -> bool:
        """Whether the control connection is up (`ssh -O check`)."""
        check = [*self.base(), "-O", "check", self.host]
        return subprocess.run(check, capture_output=True, check=False, timeout=30).returncode == 0

    def close(self) -> None:
        """End the control connection (and with it the session on the site)."""
        if self._socket.exists():
            subprocess.run([*self.base(), "-O", "exit", self.host], capture_output=True, check=False, timeout=30)
