"""Headless Chromium driven over the DevTools protocol, stdlib only, for the report's browser test.

Transport: `--remote-debugging-pipe` (the protocol's JSON messages, NUL-terminated, on fds 3 and 4 of the
browser; what Playwright and Puppeteer use too). It needs no websocket client and no free port, so there
is no dependency to add and no port race between parallel test runs. A reader thread routes replies to
their callers and keeps every event for the test to inspect. Nothing is downloaded: the browser is the
system's /usr/bin/chromium (Debian package `chromium`).

Also here: a small PNG decoder (zlib + the five scanline filters, numpy for the rows) for screenshot pixel
checks, so the test needs no imaging library either.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# The flags without which headless Chromium tries to reach Google's servers, plus the pipe.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium; `page()` opens a tab and returns its session id for `call(..., session=)`."""

    def __init__(self, exe: str, profile: Path, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._next = 0
        self._closed = False
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # runs in the child before exec: the browser expects the pipe on fds 3 and 4
            # via fds >= 10 first: a pipe end may already be fd 3 or 4, and dup2 onto itself would leave
            # it close-on-exec
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.log = open(profile.parent / "chromium.log", "wb")  # noqa: SIM115 (closed by close(): the browser's life)
        self.proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            close_fds=False,
            preexec_fn=wire,  # noqa: PLW1509 (before the reader thread)
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cond.notify_all()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        with self._cond:
            self._next += 1
            ident = self._next
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise CDPError(f"{method}: no reply ({'browser gone' if self._closed else 'timeout'})")
                self._cond.wait(left)
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str | None = None, since: int = 0) -> dict[str, Any]:
        """The first `method` event from events[since:] on, waiting for it if need be."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while True:
                for e in self.events[since:]:
                    if e.get("method") == method and (session is None or e.get("sessionId") == session):
                        return e
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise CDPError(f"no {method} event ({'browser gone' if self._closed else 'timeout'})")
                self._cond.wait(left)

    def page(self) -> str:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        return self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def evaluate(self, session: str, expression: str, wait: bool = False) -> Any:
        """The expression's value in the page; `wait`: a promise's, once it settles."""
        out = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": wait}, session
        )
        if "exceptionDetails" in out:
            raise CDPError(f"page script failed: {out['exceptionDetails']}")
        return out["result"].get("value")

    def close(self) -> None:
        with suppress(CDPError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        for fd in (self._to_child, self._from_child):
            with suppress(OSError):
                os.close(fd)
        self.log.close()


def decode_png(data: bytes) -> Any:
    """RGB(A) 8-bit PNG -> numpy array (height, width, channels). Enough for Chromium's screenshots."""
    import numpy as np

    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, [], 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}, interlace {interlace}")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.uint8)
    prev = np.zeros(width * channels, dtype=np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 1:  # Sub: a running sum per channel
            line = np.cumsum(line.reshape(width, channels), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            line = (line + prev) & 255
        elif kind in (3, 4):  # Average, Paeth: each byte needs the one decoded before it
            cur = line.tolist()
            up = prev.tolist()
            for i in range(len(cur)):
                left = cur[i - channels] if i >= channels else 0
                if kind == 3:
                    cur[i] = (cur[i] + (left + up[i]) // 2) & 255
                else:
                    ul = up[i - channels] if i >= channels else 0
                    p = left + up[i] - ul
                    pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else up[i] if pb <= pc else ul
                    cur[i] = (cur[i] + pred) & 255
            line = np.array(cur, dtype=np.int32)
        out[y] = line
        prev = line
    return out.reshape(height, width, channels)


# -- a report page, opened and looked at ----------------------------------------------------------------------


@contextmanager
def opened(page: Path, profile: Path) -> Iterator[tuple[Browser, str]]:
    """The page loaded in a fresh headless Chromium: (browser, session), events recorded from the start."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError(
            "headless Chromium is not installed: apt-get update && apt-get install -y chromium (make setup does it)"
        )
    browser = Browser(exe, profile)
    try:
        s = browser.page()
        for domain in ("Page", "Network", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session=s)
        browser.call("Page.navigate", {"url": page.as_uri()}, s)
        browser.wait_event("Page.loadEventFired", s)
        yield browser, s
    finally:
        browser.close()


def errors(browser: Browser) -> list[dict[str, Any]]:
    """Uncaught exceptions, console errors and assertions, and the browser's own error log entries."""
    return [
        e
        for e in browser.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]


def requests(browser: Browser) -> list[str]:
    return [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]


def plot_pixels(browser: Browser, session: str) -> dict[str, int]:
    """Each plot (its aria-label, numbered when repeated) -> its coloured pixels in a screenshot of its box.
    Data marks are coloured; frame, grid, labels and the modebar's icons are grey: a blank plot has none."""
    import numpy as np

    boxes = browser.evaluate(
        session,
        """[...document.querySelectorAll('div.plot')].map(e => {
        const r = e.getBoundingClientRect();
        return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height, title: e.getAttribute('aria-label')};
    })""",
    )
    out: dict[str, int] = {}
    for i, box in enumerate(boxes):
        shot = browser.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": box["x"], "y": box["y"], "width": box["w"], "height": box["h"], "scale": 1},
            },
            session,
        )
        px = decode_png(base64.b64decode(shot["data"]))[:, :, :3].astype(np.int32)
        if px.shape[0] < 0.9 * box["h"] or px.shape[1] < 0.9 * box["w"]:
            raise AssertionError(f"plot {box['title']}: screenshot {px.shape} smaller than its box {box}")
        out[f"{i}: {box['title']}"] = int(((px.max(axis=2) - px.min(axis=2)) > 60).sum())
    return out


def click(browser: Browser, session: str, header: str) -> None:
    """A real mouse click (pressed + released) on the cells table's header with this text."""
    box = browser.evaluate(
        session,
        f"""(() => {{
        const th = [...document.querySelectorAll('#cells th')].find(h => h.textContent === {json.dumps(header)});
        th.scrollIntoView({{block: 'center'}});
        const r = th.getBoundingClientRect();
        return {{x: r.left + r.width / 2, y: r.top + r.height / 2}};
    }})()""",
    )
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        browser.call(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": box["x"], "y": box["y"], "button": "left", "clickCount": 1},
            session,
        )


def names(browser: Browser, session: str) -> list[str]:
    """The cells table's first column, in the order shown."""
    return browser.evaluate(session, "[...document.querySelectorAll('#cells tbody td.name')].map(t => t.textContent)")


# -- plotly's figures, used as a person uses them: the mouse over a point, on a legend entry, dragged -----------


def _mouse(browser: Browser, session: str, kind: str, x: float, y: float, buttons: int = 0) -> None:
    browser.call(
        "Input.dispatchMouseEvent",
        {
            "type": kind,
            "x": x,
            "y": y,
            "button": "left" if buttons or kind != "mouseMoved" else "none",
            "buttons": buttons,
            "clickCount": 1,
        },
        session,
    )


def _wait(browser: Browser, session: str, expression: str, timeout: float = 5.0) -> Any:
    """The expression's value once it is truthy (plotly answers the mouse on its next animation frame, a legend
    click after its double-click delay); its last value after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = browser.evaluate(session, expression)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def point_at(browser: Browser, session: str, figure: str, trace: int, point: int) -> dict[str, float]:
    """Where a data point of a figure is on the screen (viewport pixels), the figure scrolled into view first."""
    return browser.evaluate(
        session,
        f"""(() => {{
        const gd = document.getElementById({json.dumps(figure)});
        gd.scrollIntoView({{block: 'center'}});
        const t = gd._fullData[{trace}], xa = gd._fullLayout.xaxis;
        const ya = gd._fullLayout[t.yaxis === 'y2' ? 'yaxis2' : 'yaxis'];
        const r = gd.getBoundingClientRect();
        return {{x: r.left + xa._offset + xa.l2p(xa.d2l(t.x[{point}])),
                 y: r.top + ya._offset + ya.l2p(ya.d2l(t.y[{point}]))}};
    }})()""",
    )


def hover(browser: Browser, session: str, figure: str, trace: int, point: int) -> str:
    """A real mouse move onto a data point; the text of the hover label plotly shows for it ("" if none)."""
    at = point_at(browser, session, figure, trace, point)
    _mouse(browser, session, "mouseMoved", 1, 1)  # off the figure first, so the next move is a move
    time.sleep(0.1)  # plotly handles one hover per 50 ms (HOVERMINTIME): a move within it is dropped
    _mouse(browser, session, "mouseMoved", at["x"], at["y"])
    return _wait(
        browser,
        session,
        f"""[...document.getElementById({json.dumps(figure)})
        .querySelectorAll('.hoverlayer .hovertext')].map(h => h.textContent).join(' | ')""",
    )


def legend_click(browser: Browser, session: str, figure: str, entry: str) -> list[Any]:
    """A real click on a legend entry (by its text); then the `visible` of each trace of the entry's group, once
    plotly has acted on the click."""
    box = browser.evaluate(
        session,
        f"""(() => {{
        const gd = document.getElementById({json.dumps(figure)});
        gd.scrollIntoView({{block: 'center'}});
        const item = [...gd.querySelectorAll('.legend .traces')].find(t =>
            t.querySelector('.legendtext').textContent === {json.dumps(entry)});
        const r = item.getBoundingClientRect();
        return {{x: r.left + 20, y: r.top + r.height / 2}};
    }})()""",
    )
    group = f"""(() => {{ const gd = document.getElementById({json.dumps(figure)});
        const named = gd._fullData.find(t => t.name === {json.dumps(entry)} && t.showlegend !== false);
        return gd._fullData.filter(t => t.legendgroup === named.legendgroup).map(t => t.visible); }})()"""
    before = json.dumps(browser.evaluate(session, group), separators=(",", ":"))  # as JSON.stringify writes it
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        _mouse(browser, session, kind, box["x"], box["y"], 0 if kind == "mouseMoved" else 1)
    _wait(browser, session, f"JSON.stringify({group}) !== {json.dumps(before)}", timeout=3.0)
    return browser.evaluate(session, group)


def drag(browser: Browser, session: str, figure: str, start: tuple[float, float], end: tuple[float, float]) -> None:
    """A real mouse drag across a figure's plot area, between two points given as fractions of it (0..1, from the
    top left): plotly's default drag zooms to the box."""
    area = browser.evaluate(
        session,
        f"""(() => {{
        const gd = document.getElementById({json.dumps(figure)});
        gd.scrollIntoView({{block: 'center'}});
        const r = gd.getBoundingClientRect(), s = gd._fullLayout._size;
        return {{x: r.left + s.l, y: r.top + s.t, w: s.w, h: s.h}};
    }})()""",
    )
    (x0, y0), (x1, y1) = ((area["x"] + fx * area["w"], area["y"] + fy * area["h"]) for fx, fy in (start, end))
    _mouse(browser, session, "mouseMoved", x0, y0)
    _mouse(browser, session, "mousePressed", x0, y0, 1)
    for k in range(1, 6):
        _mouse(browser, session, "mouseMoved", x0 + (x1 - x0) * k / 5, y0 + (y1 - y0) * k / 5, 1)
    _mouse(browser, session, "mouseReleased", x1, y1, 1)
