"""Free loopback ports for the servers the tests start (nginx, sshd, olah) and for ports nothing listens on.

A port is found by binding port 0 and closing the socket, and a closed port can be handed out again: picked one at
a time, two servers (or a server and a port meant to stay closed) may get the same one. nginx then takes two
``server`` blocks on one port without a word and answers both from the first. So the ports wanted together are all
bound before any is closed, and no port is handed out twice in one test process.
"""

from __future__ import annotations

import socket
from contextlib import ExitStack

_GIVEN: set[int] = set()  # every port this process has handed out


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports, free when returned and never returned before by this process (a server
    started later may still lose one to another process: its start retries or fails saying so)."""
    ports: list[int] = []
    with ExitStack() as stack:
        for _ in range(n + 256):  # bounded: the sockets stay bound, so each bind gets a port not yet seen here
            if len(ports) == n:
                break
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in _GIVEN:
                ports.append(port)
    if len(ports) < n:
        raise RuntimeError(f"found {len(ports)} of {n} free loopback ports")
    _GIVEN.update(ports)
    return ports


def free_port() -> int:
    return free_ports(1)[0]
