"""What the server answered, seen on the client's own HTTP session: each request bounded by the time budget, each
answer recorded (the URL, which may be a redirect target, its status and headers), and a file's announced size held
against the listing.

Why: the client blocks inside a read while a server (or a proxy in front of it) sends nothing, and its errors often
no longer say which URL answered what (a JSON parse error carries the body, not the URL; a refused redirect target
looks like the endpoint being down). So staging hooks into the client's ``httpx`` session, where every request and
answer passes, whatever proxy the environment sets:

- the time limit: each request's connect/read/write timeouts are at most the budget's time left, a request started
  with none left is refused (``TimeUp``), and at the limit a timer shuts the sockets of the answers read under the
  watch, which ends a read blocked on a stalled or trickling server at once (measured: a 1 B/s answer stops within
  ~0.1 s of the limit, where the client alone waited until the bytes came again);
- the answers: the last ones are kept (``last``, ``last_for``) so that an error can name the URL and what came;
- sizes: while a file is fetched (``expecting``), a HEAD of it whose ``X-Linked-Size``/``Content-Length`` differs
  from the listing's size raises ``SizeDisagrees`` before a byte is fetched (a proxy rewriting the header; a
  download checked against it would fail as if the repository's file were corrupt).

Installed by ``client.hf_client`` with ``huggingface_hub.set_client_factory`` around the client's default session
(its own hooks kept, and the environment's proxies), once per process; outside a ``watch`` block it only records.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from sft_grid.core import human
from sft_grid.stages.staging.values import Budget, HubError

log = logging.getLogger(__name__)

KEEP = 64  # answers kept: an error names one of the last few


class TimeUp(Exception):
    """The time budget is spent: a request was refused, or an answer's socket was shut at the limit."""


class SizeDisagrees(HubError):
    """A server announced a file's size other than the listing's (a proxy rewriting the header)."""


@dataclass(frozen=True)
class HubAnswer:
    method: str
    url: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    at: float = field(default_factory=time.monotonic)

    @property
    def host(self) -> str:
        return host_of(self.url)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()


def host_of(url: str) -> str:
    return urlsplit(url).netloc


@dataclass
class _State:
    budget: Budget | None = None
    timer: threading.Timer | None = None
    sockets: list[socket.socket] = field(default_factory=list)
    answers: deque[HubAnswer] = field(default_factory=lambda: deque(maxlen=KEEP))
    expect: tuple[str, int] | None = None  # (a file's path in the repo, its size in the listing)
    cut: bool = False  # the timer fired: the sockets were shut at the limit
    current: Any = None  # the request last sent (staging asks one thing at a time)
    done: bool = True  # whether its answer was read to the end (or it failed)
    stalled: bool = False  # the limit came while a request was waiting for its answer or its body
    mutex: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()
_INSTALLED = False


def install(hf: Any) -> None:
    """Hook into the client's session (once per process): its default session with our two hooks added."""
    global _INSTALLED
    if _INSTALLED or not hasattr(hf, "set_client_factory"):
        return
    from huggingface_hub.utils import _http

    default = getattr(_http, "default_client_factory", None)
    if default is None:
        return

    def factory() -> Any:
        client = default()
        client.event_hooks["request"].append(_on_request)
        client.event_hooks["response"].append(_on_response)
        return client

    hf.set_client_factory(factory)
    _INSTALLED = True


def _on_request(request: Any) -> None:
    budget = _STATE.budget
    if budget is None:
        return
    left = budget.left()
    if left <= 0:
        raise TimeUp(f"the time budget was spent before {request.method} {request.url}")
    _STATE.current, _STATE.done = request, False
    timeouts = dict(request.extensions.get("timeout") or {})
    for k in ("connect", "read", "write", "pool"):
        timeouts[k] = min(left, timeouts.get(k) or left)
    request.extensions["timeout"] = timeouts


def _on_response(response: Any) -> None:
    request = response.request
    answer = HubAnswer(
        request.method, str(request.url), response.status_code, {k.lower(): v for k, v in response.headers.items()}
    )
    with _STATE.mutex:
        _STATE.answers.append(answer)
        if _STATE.budget is not None:
            stream = response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                _STATE.sockets.append(sock)
            if request is _STATE.current:  # its body is read next: done when the stream closes
                response.stream = _body_stream(response.stream, request)
    _check_size(answer)


def _body_stream(inner: Any, request: Any) -> Any:
    """``inner``, an answer's body stream, that says when it was read to the end or closed (an ``httpx`` stream
    class, made here: httpx is imported only once the client is)."""
    import httpx

    class _Body(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield from inner
            self._done()

        def close(self) -> None:
            self._done()
            inner.close()

        def _done(self) -> None:
            if _STATE.current is request:
                _STATE.done = True

    return _Body()


def _check_size(a: HubAnswer) -> None:
    expect = _STATE.expect
    if expect is None or a.method != "HEAD" or not 200 <= a.status < 400 or "/resolve/" not in a.url:
        return
    path, size = expect
    if not a.url.endswith("/" + path):
        return
    if a.status != 200 and "x-linked-size" not in a.headers:
        return  # a redirect's own Content-Length is its message's (the Hub's 302 to its CDN has X-Linked-Size)
    header = "x-linked-size" if "x-linked-size" in a.headers else "content-length"
    said = a.headers.get(header)
    if said is None or not said.strip().isdigit() or int(said) == size:
        return  # a missing header is the client's to report (it names it)
    raise SizeDisagrees(
        f"{a.url} answered HEAD with {header.title()}: {said}, but the repository's listing says {path} has"
        f" {size} bytes ({human.size(size)}): something between this node and the repository rewrites the size header"
        " (a proxy or cache answering for another object, or with a compressed length); the repository is not at"
        " fault and nothing was fetched. Fix: ask the proxy's operator to pass X-Linked-Size and Content-Length"
        " through unchanged for HEAD requests, or stage from another endpoint (HF_ENDPOINT)."
    )


def _shut() -> None:
    """At the limit: end every read in flight (a blocked recv returns at once), and refuse new requests."""
    with _STATE.mutex:
        _STATE.cut = True
        _STATE.stalled = _STATE.current is not None and not _STATE.done
        for sock in _STATE.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        _STATE.sockets.clear()


@contextlib.contextmanager
def watch(budget: Budget | None) -> Iterator[None]:
    """Bound every request of the client by ``budget`` within this block (nothing when None)."""
    if budget is None:
        yield
        return
    timer = threading.Timer(max(0.0, budget.left()), _shut)
    timer.daemon = True
    with _STATE.mutex:
        outer = _STATE.budget, _STATE.timer
        _STATE.budget, _STATE.timer, _STATE.cut, _STATE.stalled = budget, timer, False, False
        _STATE.current, _STATE.done = None, True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with _STATE.mutex:
            _STATE.budget, _STATE.timer = outer
            _STATE.sockets.clear()
            _STATE.cut = _STATE.stalled = False
            _STATE.current = None


def time_up(e: BaseException | None = None) -> bool:
    """The budget under watch is spent (or ``e`` says so): an error now is the limit's doing, not the server's."""
    node: BaseException | None = e
    while node is not None:
        if isinstance(node, TimeUp):
            return True
        node = node.__cause__ or node.__context__
    budget = _STATE.budget
    return _STATE.cut or (budget is not None and budget.left() <= 0)


def stalled() -> bool:
    """The limit came while a request was still waiting for its answer or its body (a server that stalled), not
    between requests (a limit too short for what this process does)."""
    return _STATE.stalled


@contextlib.contextmanager
def expecting(path: str, size: int) -> Iterator[None]:
    """While ``path`` is fetched, a HEAD of it must announce ``size`` bytes (its size in the listing)."""
    _STATE.expect = (path, size)
    try:
        yield
    finally:
        _STATE.expect = None


def last(method: str | None = None, contains: str = "") -> HubAnswer | None:
    """The latest answer recorded (of ``method``, to a URL containing ``contains``)."""
    with _STATE.mutex:
        for a in reversed(_STATE.answers):
            if method in (None, a.method) and contains in a.url:
                return a
    return None
