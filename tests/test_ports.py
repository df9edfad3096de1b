"""The loopback ports the test servers are started on (tests/ports.py): distinct within one call and across calls.

A CI run failed when two of nginx's ten setups were given the same port, picked one at a time: nginx answered the
``strip`` setup from the ``no_query`` block, and staging through it succeeded where it must refuse.
"""

from __future__ import annotations

import socket

from tests.ports import free_port, free_ports


def test_ports_are_never_handed_out_twice_and_are_free():
    many = free_ports(64) + [free_port() for _ in range(64)] + free_ports(64)
    assert len(set(many)) == len(many)
    for port in many[:8]:  # free when returned: a server can listen there
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
