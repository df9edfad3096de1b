"""nginx (Debian's package) in front of the loopback hub, as sites put a web server in front of the Hub, for tests.

Why: ``tests/hubserver.py`` answers as the Hub does; what sites run in front of the Hub changes those answers, and
staging must say what failed and where. nginx is real, independently written server software (installed by
``make nginx`` from Debian), started here as a non-daemon process with its own config in a temporary directory,
on free loopback ports, and stopped by the fixture. Two setups, each a ``server`` block of one config:

- ``prefix``: a reverse proxy serving the Hub under a path prefix (``/hf/``), gzip on JSON and file answers (so
  they come chunked, without Content-Length), and every GET of a large file (``*.safetensors``, ``*.bin``,
  ``*.parquet``: what the Hub keeps in LFS) redirected (302, an absolute URL) to a second host on its own port,
  as the Hub does with its CDN. Outside the prefix it answers the site's portal page (HTML, 200): a prefix cut
  short lands there.
- ``cache``: a caching proxy (nginx ``proxy_cache``): answers are kept on disk and served from there, also once
  the hub behind it is gone; a HEAD is fetched from the hub as a GET (nginx's default), and the answer says
  ``X-Cache-Status``.

And, for what staging must survive, variants of these that real proxies produce (each its own ``server`` block):

- ``refused``: ``prefix`` whose file host is a port nothing listens on (a login node's firewall that lets the Hub
  API through but not its file host);
- ``wrong_size``: a HEAD of a file answered with a size header that is not the file's (``X-Linked-Size`` and
  ``Content-Length`` replaced);
- ``no_query``: the query string dropped on the way to the hub (``proxy_pass`` with a variable URI), so
  ``?recursive=true`` never arrives and the tree listing shows folders without their files;
- ``flat``: ``no_query``, and a listing of a folder by its path answered with the top of the tree (a rewrite that
  cuts the path of listings): folders stay without their files whichever way they are asked for;
- ``strip``: the Hub's ``X-Repo-Commit`` header removed from every answer (a proxy that passes no unknown headers);
- ``stall``: after the first 64 KiB of a response, one byte per second (``limit_rate``): the bytes all but stop.

Fixture: ``nginx_front`` (per test) yields an ``NginxFront`` over a running ``HubServer``; the test is skipped,
saying why, only where no nginx binary is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import pytest

from tests.hubserver import HubServer
from tests.ports import free_ports

SETUPS = ("prefix", "cache", "refused", "wrong_size", "no_query", "flat", "strip", "stall", "cdn")
PREFIX = "/hf"
LARGE = r"\.(safetensors|bin|parquet)$"
PORTAL = (
    "<!DOCTYPE html><html><head><title>Research Computing Portal</title></head>"
    "<body><h1>Welcome</h1><p>Sign in to continue.</p></body></html>"
)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


def _config(root: Path, backend: str, ports: dict[str, int], closed: int) -> str:
    up = backend.rstrip("/")
    cdn = f"http://127.0.0.1:{ports['cdn']}"
    temp = "\n".join(
        f"    {name}_temp_path {root / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )

    def prefixed(port: int, file_host: str, extra: str = "") -> str:
        return f"""
    server {{
        listen 127.0.0.1:{port};
        location / {{ default_type text/html; return 200 '{PORTAL}'; }}
        location {PREFIX}/ {{
            {extra}
            location ~ ^{PREFIX}/(?<rest>.+/resolve/.+{LARGE}) {{
                if ($request_method = GET) {{ return 302 {file_host}/$rest$is_args$args; }}
                proxy_pass {up}/$rest$is_args$args;
            }}
            proxy_pass {up}/;
        }}
    }}"""

    # as root, nginx's workers would run as nobody, who cannot write the temporary directories (the cache's)
    user = "user root root;" if os.geteuid() == 0 else ""
    return f"""
{user}
worker_processes 1;
daemon off;
pid {root / "nginx.pid"};
error_log {root / "error.log"} warn;
events {{ worker_connections 256; }}
http {{
{temp}
    access_log {root / "access.log"};
    proxy_http_version 1.1;
    proxy_read_timeout 300s;
    proxy_buffering off;
    gzip on;
    gzip_proxied any;
    gzip_min_length 1;
    gzip_types application/json text/plain application/octet-stream;
    map $request_method $linked_size {{ HEAD 123; default $upstream_http_x_linked_size; }}
    proxy_cache_path {root / "cache"} levels=1:2 keys_zone=hub:4m max_size=256m inactive=1h use_temp_path=off;
{prefixed(ports["prefix"], cdn)}
{prefixed(ports["refused"], f"http://127.0.0.1:{closed}")}
    server {{
        listen 127.0.0.1:{ports["cdn"]};
        gzip off;
        location / {{ proxy_pass {up}; }}
    }}
    server {{
        listen 127.0.0.1:{ports["cache"]};
        gzip off;
        location / {{
            proxy_pass {up};
            proxy_buffering on;
            proxy_cache hub;
            proxy_cache_valid 200 206 1h;
            proxy_cache_use_stale error timeout http_502 http_503 http_504;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
    server {{
        listen 127.0.0.1:{ports["wrong_size"]};
        location / {{
            proxy_pass {up};
            proxy_hide_header X-Linked-Size;
            add_header X-Linked-Size $linked_size always;
        }}
    }}
    server {{
        listen 127.0.0.1:{ports["no_query"]};
        location / {{ proxy_pass {up}$uri; }}
    }}
    server {{
        listen 127.0.0.1:{ports["flat"]};
        location / {{
            rewrite ^(/api/[a-z]+s/[^/]+/[^/]+/tree/[^/]+)/.+$ $1 break;
            proxy_pass {up}$uri;
        }}
    }}
    server {{
        listen 127.0.0.1:{ports["strip"]};
        location / {{ proxy_pass {up}; proxy_hide_header X-Repo-Commit; }}
    }}
    server {{
        listen 127.0.0.1:{ports["stall"]};
        gzip off;
        location / {{ proxy_pass {up}; proxy_buffering on; limit_rate_after 64k; limit_rate 1; }}
    }}
}}
"""


class NginxFront:
    """``with NginxFront(tmp, hub.url) as ng: ng.url("prefix")``: nginx on free loopback ports, stopped on exit."""

    def __init__(self, root: Path, backend: str, binary: str) -> None:
        self.root, self.backend, self.binary = Path(root), backend, binary
        *ports, self.closed = free_ports(len(SETUPS) + 1)  # the last: nothing listens there, the refused file host
        self.ports = dict(zip(SETUPS, ports, strict=True))
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, setup: str) -> str:
        """The endpoint a client is pointed at (``HF_ENDPOINT``) for one setup."""
        base = f"http://127.0.0.1:{self.ports[setup]}"
        return base + PREFIX if setup in ("prefix", "refused") else base

    def portal(self) -> str:
        """The prefix cut short: the front's root, where the portal page answers."""
        return f"http://127.0.0.1:{self.ports['prefix']}"

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / "nginx.conf"
        conf.write_text(_config(self.root, self.backend, self.ports, self.closed))
        self.proc = subprocess.Popen(
            [self.binary, "-p", str(self.root), "-c", str(conf), "-e", str(self.root / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:  # bounded: nginx listens within milliseconds, or has exited saying why
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                log = (self.root / "error.log").read_text() if (self.root / "error.log").exists() else ""
                raise RuntimeError(f"nginx exited {self.proc.returncode}: {err}{log}")
            try:
                with urllib.request.urlopen(self.portal(), timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("nginx did not answer within 30s")
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def log(self) -> str:
        p = self.root / "access.log"
        return p.read_text() if p.exists() else ""


@pytest.fixture
def nginx_front(tmp_path: Path, hf_env: dict[str, str]) -> Iterator[tuple[HubServer, NginxFront]]:
    binary = nginx_binary()
    if binary is None:
        pytest.skip("nginx is not installed (make nginx: apt-get install nginx)")
    with HubServer(tmp_path / "hub") as hub, NginxFront(tmp_path / "nginx", hub.url, binary) as ng:
        yield hub, ng
