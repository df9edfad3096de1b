"""The HTTP side of the loopback hub (stdlib only): routing, Hub-shaped answers, faults, the request log.

Answers as the Hub does (see ``hubserver`` for the endpoint list): errors carry ``X-Error-Code``; files are
served directly with ``X-Repo-Commit``, a quoted ``ETag`` that is stable per content (the sha256 for LFS files,
the git blob oid otherwise; clients name the cache blob after it), ``Accept-Ranges``, ``X-Linked-Etag`` and
``X-Linked-Size`` for LFS files, and Range answers (206, 416). Faults are applied per response: a throttle
paces the whole body to a rate, a drop cuts the connection after N body bytes (once or every time), a failure
answers matching requests with a server error (5xx, no ``X-Error-Code``) and may close the connection after it
without saying so. Modes make the server answer as mirrors and proxies do where they differ from the Hub:
``ignore_range`` (every GET is 200 with the whole file, chunked, without Content-Length), ``unquoted_etags``, and
``unknown_revision`` (a revision it does not have answered as a missing repository: 401 or 404 RepoNotFound).
Each request gets a record that is updated while its body streams; ``bytes_sent`` counts what was written.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

try:
    from tests.hubstore import HubStore, HubStoreError, StoredFile
except ImportError:  # run as a script: tests/ itself is on sys.path
    from hubstore import HubStore, HubStoreError, StoredFile  # type: ignore[no-redef, import-not-found]

log = logging.getLogger("hubserver")

_REPO = r"(?P<repo>[^/]+(?:/[^/]+)?)"
_OPS = r"(?:/(?P<op>revision|tree|preupload|commit)/(?P<rest>.*))?"
API_RE = re.compile(rf"^/api/(?P<kind>model|dataset)s/{_REPO}{_OPS}$")
RESOLVE_RE = re.compile(rf"^/(?:(?P<ds>datasets)/)?{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
CHUNK = 64 * 1024


@dataclass
class Fault:
    kind: str  # "throttle" | "drop" | "fail"
    repo: str | None = None  # None: every repo
    path: str | None = None  # None: every file
    rate: int = 0  # throttle: bytes per second
    after: int = 0  # drop: body bytes sent in one response before the connection is cut
    times: int | None = 1  # drop, fail: how many responses are cut or failed (None: every one)
    status: int = 500  # fail: the status answered
    contains: str = ""  # fail: requests whose path (URL-decoded) contains this
    method: str | None = None  # fail: only this method (None: any)
    close: bool = True  # fail: close the connection after the answer, without "Connection: close" (as olah does)

    def matches(self, repo: str, path: str) -> bool:
        return self.repo in (None, repo) and self.path in (None, path)


MODES = {"ignore_range": False, "unquoted_etags": False, "unknown_revision": None}  # None: as the Hub


@dataclass
class RequestRecord:
    id: int
    method: str
    path: str
    query: str
    range: str | None
    status: int = 0
    bytes_sent: int = 0
    aborted: bool = False
    done: bool = False
    rate: int = 0  # bytes/s the response was paced at (a throttle fault); 0: as fast as the connection goes
    started: float = field(default_factory=time.time)


class _Dropped(Exception):
    """The server cut a connection on purpose (fault injection)."""


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, store: HubStore, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.store = store
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.faults: list[Fault] = []
        self.modes: dict[str, Any] = dict(MODES)
        self.log: list[RequestRecord] = []
        self.mutex = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return  # a client that went away between requests (killed, or done with a kept-alive connection)
        super().handle_error(request, client_address)

    def record(self, rec: RequestRecord) -> None:
        with self.mutex:
            rec.id = len(self.log)
            self.log.append(rec)

    def faults_for(self, repo: str, path: str) -> tuple[int, int | None]:
        """(throttle rate or 0, drop-after bytes or None) for one response; consumes a one-shot drop."""
        with self.mutex:
            rates = [f.rate for f in self.faults if f.kind == "throttle" and f.matches(repo, path)]
            drop = next((f for f in self.faults if f.kind == "drop" and f.matches(repo, path)), None)
            if drop is not None and drop.times is not None:
                drop.times -= 1
                if drop.times <= 0:
                    self.faults.remove(drop)
            return (min(rates) if rates else 0), (drop.after if drop else None)

    def failure_for(self, method: str, path: str) -> Fault | None:
        """The failure to answer this request with, if any; consumes one of a counted failure."""
        with self.mutex:
            fail = next(
                (f for f in self.faults if f.kind == "fail" and f.contains in path and f.method in (None, method)), None
            )
            if fail is not None and fail.times is not None:
                fail.times -= 1
                if fail.times <= 0:
                    self.faults.remove(fail)
            return fail

    def mode(self, name: str) -> Any:
        with self.mutex:
            return self.modes[name]

    def control(self, body: dict[str, Any]) -> None:
        with self.mutex:
            if body["op"] == "clear":
                self.faults.clear()
                self.modes = dict(MODES)
            elif body["op"] == "clear_log":
                self.log.clear()
            elif body["op"] == "mode":
                if body["name"] not in MODES:
                    raise ValueError(f"no mode {body['name']!r}: one of {sorted(MODES)}")
                self.modes[body["name"]] = body["value"]
            else:
                self.faults.append(Fault(**{k: v for k, v in body.items() if k != "op"}, kind=body["op"]))

    def requests(self) -> list[dict[str, Any]]:
        with self.mutex:
            return [asdict(r) for r in self.log]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub: clients reuse connections
    server: HubHTTPServer

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    # -- plumbing -----------------------------------------------------------------------------------------------
    def _start(self) -> tuple[str, dict[str, list[str]], RequestRecord]:
        url = urlsplit(self.path)
        rec = RequestRecord(-1, self.command, url.path, url.query, self.headers.get("Range"))
        self.server.record(rec)
        return url.path, parse_qs(url.query), rec

    def _reply(self, rec: RequestRecord, status: int, body: Any = b"", headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        hdrs = {
            "Content-Type": "application/json" if not isinstance(body, bytes) else "text/plain",
            "Content-Length": str(len(data)),
            **(headers or {}),
        }
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
            rec.bytes_sent = len(data)
        rec.status, rec.done = status, True

    def _error(self, rec: RequestRecord, status: int, code: str | None, message: str, **extra: str) -> None:
        headers = {"X-Error-Message": message, **extra}
        if code:
            headers["X-Error-Code"] = code
        self._reply(rec, status, {"error": message}, headers)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _check_repo(self, rec: RequestRecord, repo: str, kind: str, *, file: bool) -> bool:
        """Answer as the Hub does for a missing, private or gated repo; True when the request may go on."""
        store = self.server.store
        if not store.exists(repo, kind):
            self._error(rec, 404, "RepoNotFound", "Repository not found")
            return False
        access, token = store.access(repo, kind), self._token()
        if access.token is not None and token != access.token:
            # The Hub hides private repos: unauthenticated gets 401, a token without access 404.
            self._error(rec, 401 if token is None else 404, "RepoNotFound", "Repository not found")
            return False
        if file and access.gated and token not in access.granted:
            msg = f"Access to {kind} {repo} is restricted. You must have access to it and be authenticated."
            self._error(rec, 401 if token is None else 403, "GatedRepo", msg)
            return False
        return True

    # -- dispatch -----------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path, query, rec = self._start()
        body = self._read_body() if self.command == "POST" else b""
        try:
            if path == "/_test/requests":
                return self._reply(rec, 200, self.server.requests())
            if path == "/_test/faults":
                self.server.control(json.loads(body))
                return self._reply(rec, 200, {"ok": True})
            fail = self.server.failure_for(self.command, unquote(path))
            if fail is not None:
                self._reply(rec, fail.status, b"Internal Server Error" if fail.status == 500 else b"Server Error")
                self.close_connection = fail.close  # and no "Connection: close" said: a client learns it by a reset
                return
            if m := RESOLVE_RE.match(path):
                kind = "dataset" if m["ds"] else "model"
                return self._resolve(rec, m["repo"], kind, unquote(m["rev"]), unquote(m["path"]))
            if path == "/api/repos/create" and self.command == "POST":
                return self._create(rec, json.loads(body or b"{}"))
            if path == "/api/validate-yaml":
                return self._reply(rec, 200, {"errors": [], "warnings": []})
            if m := API_RE.match(path):
                return self._api(rec, m["repo"], m["kind"], m["op"], unquote(m["rest"] or ""), query, body)
            self._error(rec, 404, None, f"no route for {self.command} {path}")
        except HubStoreError as e:
            as_repo = self.server.mode("unknown_revision")
            if e.code == "RevisionNotFound" and as_repo:  # as olah: a revision it lacks looks like a missing repo
                return self._error(rec, int(as_repo), "RepoNotFound", "Repository not found")
            headers = {"X-Repo-Commit": e.sha} if e.sha else {}
            self._error(rec, 404, e.code, str(e), **headers)
        except _Dropped:
            rec.aborted, rec.done = True, True
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):  # the client went away (killed, timed out)
            rec.aborted, rec.done = True, True
            self.close_connection = True

    # -- API ----------------------------------------------------------------------------------------------------
    def _api(
        self,
        rec: RequestRecord,
        repo: str,
        kind: str,
        op: str | None,
        rest: str,
        query: dict[str, list[str]],
        body: bytes,
    ) -> None:
        if not self._check_repo(rec, repo, kind, file=False):
            return
        store = self.server.store
        if op in (None, "revision"):
            rev = store.revision(repo, rest or "main", kind)
            return self._reply(rec, 200, self._info(rev, blobs=query.get("blobs") == ["true"]))
        if op == "tree":
            rev_name, _, sub = rest.partition("/")
            rev = store.revision(repo, rev_name, kind)
            recursive = query.get("recursive") == ["true"]
            return self._reply(rec, 200, _tree(rev.files, sub.strip("/"), recursive))
        if op == "preupload":
            files = json.loads(body).get("files", [])
            out = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
            return self._reply(rec, 200, {"files": out})
        if op == "commit":
            return self._commit(rec, repo, kind, rest, body)
        self._error(rec, 404, None, f"unknown operation {op}")

    def _info(self, rev: Any, blobs: bool) -> dict[str, Any]:
        access = self.server.store.access(rev.repo_id, rev.kind)
        siblings = []
        for f in sorted(rev.files.values(), key=lambda f: f.path):
            s: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                s |= {"size": f.size, "blobId": f.oid}
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.lfs_pointer())}
            siblings.append(s)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(rev.created))
        return {
            "_id": rev.sha[:24],
            "id": rev.repo_id,
            "modelId": rev.repo_id,
            "sha": rev.sha,
            "siblings": siblings,
            "lastModified": stamp,
            "createdAt": stamp,
            "private": access.token is not None,
            "gated": "manual" if access.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "author": rev.repo_id.split("/")[0],
        }

    def _create(self, rec: RequestRecord, body: dict[str, Any]) -> None:
        kind = body.get("type") or "model"
        repo = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        prefix = "datasets/" if kind == "dataset" else ""
        url = f"{self.server.url}/{prefix}{repo}"
        if not self.server.store.create_repo(repo, kind, exist_ok=True):
            return self._reply(rec, 409, {"error": "You already created this repo", "url": url})
        self._reply(rec, 200, {"url": url, "name": repo, "id": repo})

    def _commit(self, rec: RequestRecord, repo: str, kind: str, branch: str, body: bytes) -> None:
        files: dict[str, bytes] = {}
        gone: list[str] = []
        summary = "commit"
        store = self.server.store
        for line in body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary") or summary
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":  # only valid for bytes this repo already holds (a copy)
                obj = store.object_path(repo, kind, value["oid"])
                if not obj.is_file():
                    return self._error(rec, 422, None, f"LFS object {value['oid']} was never uploaded")
                files[value["path"]] = obj.read_bytes()
            elif key == "deletedFile":
                gone.append(value["path"])
            elif key == "deletedFolder":
                gone.append(value["path"].rstrip("/") + "/")
        sha = store.commit(repo, files, kind, branch=branch, replace=False, delete=tuple(gone), message=summary)
        prefix = "datasets/" if kind == "dataset" else ""
        self._reply(
            rec,
            200,
            {
                "commitOid": sha,
                "commitUrl": f"{self.server.url}/{prefix}{repo}/commit/{sha}",
                "success": True,
                "hookOutput": "",
            },
        )

    # -- files --------------------------------------------------------------------------------------------------
    def _resolve(self, rec: RequestRecord, repo: str, kind: str, rev_name: str, path: str) -> None:
        if not self._check_repo(rec, repo, kind, file=True):
            return
        store = self.server.store
        rev = store.revision(repo, rev_name, kind)
        f = rev.files.get(path)
        if f is None:
            raise HubStoreError("EntryNotFound", f"{path} does not exist at {rev_name}", sha=rev.sha)
        q = "" if self.server.mode("unquoted_etags") else '"'
        headers = {
            "X-Repo-Commit": rev.sha,
            "ETag": f"{q}{f.etag}{q}",
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if f.lfs:
            headers |= {"X-Linked-Etag": f"{q}{f.sha256}{q}", "X-Linked-Size": str(f.size)}
        whole = self.server.mode("ignore_range")  # as a mirror or proxy that ignores Range: 200, the whole file
        span = None if whole else _parse_range(rec.range, f.size)
        if isinstance(span, str):  # "unsatisfiable"
            return self._reply(rec, 416, b"", {**headers, "Content-Range": f"bytes */{f.size}"})
        start, end = span or (0, f.size - 1)
        status = 206 if span else 200
        if span:
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        chunked = whole and self.command == "GET"  # such servers stream it chunked; HEAD keeps Content-Length
        if whole:
            headers.pop("Accept-Ranges")
        self.send_response(status)
        for k, v in {
            **headers,
            **({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(end - start + 1)}),
        }.items():
            self.send_header(k, v)
        self.end_headers()
        rec.status = status
        if self.command == "GET":
            self._stream(rec, repo, f, start, end - start + 1, chunked)
        rec.done = True

    def _stream(
        self, rec: RequestRecord, repo: str, f: StoredFile, start: int, length: int, chunked: bool = False
    ) -> None:
        rate, drop_at = self.server.faults_for(repo, f.path)
        rec.rate = rate
        t0 = time.monotonic()
        with open(self.server.store.object_path(repo, _rec_kind(rec), f.sha256), "rb") as fh:
            fh.seek(start)
            while rec.bytes_sent < length:
                n = min(CHUNK, length - rec.bytes_sent, max(1, rate // 20) if rate else CHUNK)
                if drop_at is not None:
                    n = min(n, drop_at - rec.bytes_sent)
                if n > 0:
                    data = fh.read(n)
                    self.wfile.write(b"%x\r\n%s\r\n" % (n, data) if chunked else data)
                    rec.bytes_sent += n
                if drop_at is not None and rec.bytes_sent >= drop_at:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    raise _Dropped()
                if rate:  # pace to the rate over the whole response, not per chunk
                    time.sleep(max(0.0, t0 + rec.bytes_sent / rate - time.monotonic()))
            if chunked:
                self.wfile.write(b"0\r\n\r\n")


def _rec_kind(rec: RequestRecord) -> str:
    return "dataset" if rec.path.startswith("/datasets/") else "model"


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``bytes=N-``, ``bytes=N-M`` or ``bytes=-K``; None means "whole file" (absent or not understood)."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or (not m[1] and not m[2]):
        return None
    if not m[1]:  # suffix: the last K bytes
        k = int(m[2])
        return (max(0, size - k), size - 1) if k else "unsatisfiable"
    start = int(m[1])
    if start >= size:
        return "unsatisfiable"
    end = min(int(m[2]), size - 1) if m[2] else size - 1
    return (start, end) if end >= start else None


def _tree(files: dict[str, StoredFile], sub: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{sub}/" if sub else ""
    out: dict[str, dict[str, Any]] = {}
    for f in files.values():
        if not f.path.startswith(prefix):
            continue
        rel = f.path[len(prefix) :].split("/")
        for depth in range(1, len(rel)):  # the folders on the way to the file
            d = prefix + "/".join(rel[:depth])
            if recursive or depth == 1:
                out.setdefault(d, {"type": "directory", "oid": "0" * 40, "size": 0, "path": d})
        if recursive or len(rel) == 1:
            entry: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.size, "path": f.path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.lfs_pointer())}
            out[f.path] = entry
    return [out[k] for k in sorted(out)]
