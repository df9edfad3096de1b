"""A Hugging Face Hub look-alike on 127.0.0.1 for tests (stdlib only).

Why: compute nodes and CI have no route to the Hub, and the staging code must be tested against the *real*
``huggingface_hub`` client (pointed here with ``HF_ENDPOINT``), not against mocks of it. The server speaks the
subset of the Hub's HTTP API that clients use to resolve, list, download and upload:

    GET  /api/{models|datasets}/{repo}[/revision/{rev}]   repo info (sha, siblings; sizes with ?blobs=true)
    GET  /api/{type}s/{repo}/tree/{rev}[/{path}]          listing (?recursive=true), LFS info on large files
    HEAD|GET /{repo}/resolve/{rev}/{path}                 (datasets under /datasets/...) file bytes, Range
    POST /api/repos/create, /api/validate-yaml, /api/{type}s/{repo}/preupload/{rev}, .../commit/{rev}

Errors carry the Hub's ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) so the
client raises its own typed errors. Files are always served directly (200/206): the client follows only
relative redirects for metadata. Xet is never advertised, so clients use plain HTTP (uploads need
``HF_HUB_DISABLE_XET=1``, and the server answers "regular" to preupload, so file bytes come base64 in the
commit).

Test hooks: faults (throttle bytes/s globally or per file; drop the connection after N body bytes of a file,
once or every time; answer a path with a server error), modes that answer as a mirror or proxy does (ignore
Range; unquoted ETags; an unknown revision answered as a missing repository) and a request log (method, path,
status, Range, bytes sent, aborted) that is updated while a body streams, so a test can act "when the big file is
partly sent". Repos and access rules live on disk
(see ``hubstore``), so a standalone server process and the test process share them; faults and the log live
in the server process and are reached over ``/_test/*`` when the server runs apart (``spawn``/``RemoteHub``).

Standalone: ``python tests/hubserver.py --root DIR --port 0 --ready-file F`` writes its URL to F once it
listens, and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

try:
    from tests.hubhttp import HubHTTPServer
    from tests.hubstore import HubStore
except ImportError:  # run as a script: tests/ itself is on sys.path
    from hubhttp import HubHTTPServer  # type: ignore[no-redef, import-not-found]
    from hubstore import HubStore  # type: ignore[no-redef, import-not-found]

log = logging.getLogger("hubserver")


class _Control:
    """Faults and the request log; the same calls whether the server runs in this process or apart."""

    def _control(self, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def throttle(self, rate: int, repo: str | None = None, path: str | None = None) -> None:
        """Send at most ``rate`` bytes/s per response, for one file, one repo, or everything."""
        self._control({"op": "throttle", "rate": rate, "repo": repo, "path": path})

    def drop_after(self, nbytes: int, repo: str | None = None, path: str | None = None, times: int | None = 1) -> None:
        """Cut the connection after ``nbytes`` body bytes of a response (``times=None``: every response)."""
        self._control({"op": "drop", "after": nbytes, "repo": repo, "path": path, "times": times})

    def fail(
        self,
        status: int = 500,
        contains: str = "",
        method: str | None = None,
        times: int | None = None,
        close: bool = True,
    ) -> None:
        """Answer requests whose path contains ``contains`` with ``status`` and no ``X-Error-Code`` (``times``: that
        many, None: every one); ``close``: then close the connection without saying so, as olah does after a 500."""
        self._control(
            {"op": "fail", "status": status, "contains": contains, "method": method, "times": times, "close": close}
        )

    def ignore_range(self, on: bool = True) -> None:
        """Answer every GET of a file with 200 and the whole file, chunked without Content-Length (a mirror or a
        caching proxy); HEAD still gives Content-Length."""
        self._control({"op": "mode", "name": "ignore_range", "value": on})

    def unquoted_etags(self, on: bool = True) -> None:
        self._control({"op": "mode", "name": "unquoted_etags", "value": on})

    def unknown_revision(self, status: int | None = 401) -> None:
        """Answer a revision the repository lacks as a missing repository (``status`` RepoNotFound: olah gives 401);
        None: as the Hub (404 RevisionNotFound)."""
        self._control({"op": "mode", "name": "unknown_revision", "value": status})

    def clear_faults(self) -> None:
        """Every fault gone and every mode back to the Hub's."""
        self._control({"op": "clear"})

    def clear_log(self) -> None:
        self._control({"op": "clear_log"})

    def requests(self, contains: str = "", method: str | None = None, live: bool = False) -> list[dict[str, Any]]:
        """Logged requests whose path contains ``contains`` (and of ``method``), oldest first.

        The server counts bytes after they left, so a client can hold a whole body before its record says so:
        unless ``live`` (watching a transfer in flight), wait until the matching requests are finished.
        """
        deadline = time.monotonic() + 30
        while True:
            found = [r for r in self._requests() if contains in r["path"] and method in (None, r["method"])]
            if live or all(r["done"] for r in found) or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    def downloads(self, repo: str, path: str, live: bool = False) -> list[dict[str, Any]]:
        """GETs of one file's bytes (not HEADs), whatever revision they named."""
        return [r for r in self.requests(f"/{repo}/resolve/", "GET", live) if r["path"].endswith(f"/{path}")]

    def _requests(self) -> list[dict[str, Any]]:
        raise NotImplementedError


class HubServer(_Control):
    """In-process server: ``with HubServer(tmp) as hub: ... hub.url ... hub.store.commit(...)``."""

    def __init__(self, root: Path | str, port: int = 0, lfs_threshold: int = 64 * 1024) -> None:
        self.store = HubStore(root, lfs_threshold)
        self._hub = HubHTTPServer(self.store, port)
        self.url = self._hub.url
        self._thread = threading.Thread(target=self._hub.serve_forever, args=(0.05,), name="hubserver", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._hub.shutdown()
            self._thread.join(timeout=30)
        self._hub.server_close()

    def _control(self, body: dict[str, Any]) -> None:
        self._hub.control(body)

    def _requests(self) -> list[dict[str, Any]]:
        return self._hub.requests()


class RemoteHub(_Control):
    """A server running as its own process (``spawn``); the store is shared through the root directory."""

    def __init__(self, url: str, root: Path, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.url, self.proc, self.store = url, proc, HubStore(root)

    def _call(self, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx  # installed with huggingface_hub

        r = (
            httpx.post(self.url + path, content=json.dumps(body), timeout=30)
            if body is not None
            else httpx.get(self.url + path, timeout=30)
        )
        r.raise_for_status()
        return r.json()

    def _control(self, body: dict[str, Any]) -> None:
        self._call("/_test/faults", body)

    def _requests(self) -> list[dict[str, Any]]:
        return self._call("/_test/requests")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def spawn(root: Path, *, timeout: float = 60.0, python: str = sys.executable, port: int = 0) -> RemoteHub:
    """Start ``python tests/hubserver.py`` on a free port (or ``port``: a restart where clients expect it);
    returns once it listens (or raises)."""
    ready = Path(root) / f".ready-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [python, str(Path(__file__).resolve()), "--root", str(root), "--ready-file", str(ready), "--port", str(port)]
    )
    deadline = time.monotonic() + timeout
    while not ready.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"hub server did not start within {timeout:.0f}s (exit code {proc.poll()})")
        time.sleep(0.02)
    return RemoteHub(ready.read_text().strip(), Path(root), proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--lfs-threshold", type=int, default=64 * 1024)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="hubserver %(levelname)s %(message)s")
    hub = HubHTTPServer(HubStore(args.root, args.lfs_threshold), args.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=hub.shutdown).start())
    if args.ready_file:
        tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
        tmp.write_text(hub.url + "\n")
        os.replace(tmp, args.ready_file)  # readers never see a half-written URL
    log.info("serving %s on %s", args.root, hub.url)
    with contextlib.suppress(KeyboardInterrupt):
        hub.serve_forever()
    hub.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
