"""A real OpenSSH server on a loopback port, for the remote-site tests (`make sshd` installs Debian's openssh-server).

Started and stopped by the tests themselves, never the package's service: its own config, host key, user key and
authorized_keys in a temporary directory, key authentication only, and a test-only ssh config (`ssh -F`) whose Host
aliases name it, the way a user's ~/.ssh/config names a cluster's login node. sshd logs each accepted connection to
its stderr (`-e`), which the tests read to count connections.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_ports

SSHD = Path("/usr/sbin/sshd")


@dataclass
class Sshd:
    dir: Path
    port: int
    process: subprocess.Popen[bytes]
    config: Path  # the client's ssh config (ssh -F)
    log: Path

    def add_host(self, host: str, port: int, env: Mapping[str, str] | None = None) -> None:
        """One more Host alias in the client's config: this sshd's key and user, reached at `port` (a forwarder in
        front of it: the tests' half-open connections), its host key known there too; `env` as `start`'s."""
        key = " ".join((self.dir / "host_key.pub").read_text().split()[:2])
        with (self.dir / "known_hosts").open("a") as known:
            known.write(f"[127.0.0.1]:{port} {key}\n")
        with self.config.open("a") as config:
            config.write(_entry(self.dir, host, port, env or {}))

    def accepted(self) -> int:
        """Connections sshd has accepted so far."""
        return self.log.read_text(errors="replace").count("Accepted publickey")

    def sessions(self) -> list[str]:
        """sshd's processes serving a connection now (children of the listener)."""
        out = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False)
        return out.stdout.split()

    def stop(self) -> None:
        """The listener ends on SIGTERM (the connections it served have ended with their commands)."""
        self.process.terminate()
        self.process.wait(timeout=60)


def _entry(where: Path, host: str, port: int, env: Mapping[str, str]) -> str:
    """A Host entry of the client's config: this sshd at `port`, its key, sending `env` (SetEnv)."""
    return (
        f"Host {host}\n  HostName 127.0.0.1\n  Port {port}\n  User {os.environ.get('USER') or 'root'}\n"
        f"  IdentityFile {where / 'user_key'}\n  IdentitiesOnly yes\n  UserKnownHostsFile {where / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n"
        # one SetEnv line: ssh reads the first one only (and refuses one without a variable)
        + ("  SetEnv " + " ".join(f"{k}={v}" for k, v in sorted(env.items())) + "\n" if env else "")
    )


def start(where: Path, hosts: Mapping[str, Mapping[str, str]], env: Mapping[str, str] | None = None) -> Sshd:
    """sshd on a free loopback port; the client config names it by each host of `hosts`, each sending its own
    variables (a site's SLURM_CONF: which cluster its commands reach), and `site_down` names a port nothing listens
    on. `env` is sent by every host: the machine's own cache of environments and tiny assets, which a real site has
    in its home directory. SetEnv, accepted by this sshd alone."""
    if not SSHD.exists():
        raise RuntimeError("no /usr/sbin/sshd: run `make sshd` (Debian's openssh-server)")
    where.mkdir(parents=True, exist_ok=True)
    os.chmod(where, 0o700)
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(where / name)], check=True)
    shutil.copy(where / "user_key.pub", where / "authorized_keys")
    port, down = free_ports(2)  # sshd's, and site_down's (nothing listens there): never the same port
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    server = where / "sshd_config"
    server.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {where / 'host_key'}",
                f"AuthorizedKeysFile {where / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "UsePAM no",
                "StrictModes no",
                f"PidFile {where / 'sshd.pid'}",
                "MaxSessions 50",
                "MaxStartups 50",
                "LogLevel INFO",
                "AcceptEnv " + " ".join(sorted({*(env or {}), *(k for h in hosts.values() for k in h)}) or ["NONE"]),
                "",
            ]
        )
    )
    known = where / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} " + " ".join((where / "host_key.pub").read_text().split()[:2]) + "\n")
    client = where / "ssh_config"
    client.write_text(
        "".join(_entry(where, host, port, {**(env or {}), **extra}) for host, extra in hosts.items())
        + f"Host site_down\n  HostName 127.0.0.1\n  Port {down}\n  IdentityFile {where / 'user_key'}\n"
        "  ConnectTimeout 10\n"
    )
    log = where / "sshd.log"
    process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(server)], stderr=log.open("wb"))
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {log.read_text()}") from None
            time.sleep(0.1)
    return Sshd(where, port, process, client, log)
