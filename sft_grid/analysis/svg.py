"""Inline SVG plots for the report, drawn by hand: axes, ticks, lines, markers, bands. Stdlib only.

Invariants: output depends only on the input (numbers are printed with fixed precision, nothing is random or
timed), so the same data renders to the same bytes; every text that comes from data is escaped; nothing
refers outside the document (no xlink, no external fonts: the page's CSS sets the font). A plot clips its
data to the frame, so a spike or a curve outside the range cannot draw over the axes. The SVG carries no
xmlns: inline SVG in HTML5 needs none, and the page then holds no URL at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Any, Callable, Sequence

CATEGORICAL = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
               "#9c755f", "#bab0ac")
# A viridis-like ramp, stopped short of its pale yellow end, which vanishes on white.
_RAMP = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
         (1.0, (190, 208, 30)))


def categorical(i: int) -> str:
    return CATEGORICAL[i % len(CATEGORICAL)]


def ramp(t: float) -> str:
    """Colour at t in [0, 1] on the sequential ramp (small models dark, large ones light)."""
    t = min(1.0, max(0.0, t))
    for (t0, c0), (t1, c1) in zip(_RAMP, _RAMP[1:]):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1))
    return "#bed01e"


def si(v: float) -> str:
    """Compact number for axes and legends: 447M, 1.4B, 12k, 0.25, 1e+20 beyond trillions."""
    a = abs(v)
    if a >= 1e15 or (0 < a < 1e-3):
        return f"{v:.2g}"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def sci(v: float) -> str:
    return f"{v:.0e}".replace("e+", "e") if v > 0 else "0"


@dataclass
class Axis:
    lo: float
    hi: float
    log: bool = False
    label: str = ""
    fmt: Callable[[float], str] = si

    def ticks(self) -> list[float]:
        if self.log:
            return _log_ticks(self.lo, self.hi)
        return _linear_ticks(self.lo, self.hi)


def axis_for(values: Sequence[float], *, log: bool = False, label: str = "", fmt: Callable[[float], str] = si,
             pad: float = 0.05) -> Axis:
    """An axis that holds the values with a margin; a single value gets a range around it."""
    vals = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not vals:
        return Axis(1.0, 10.0, log, label, fmt) if log else Axis(0.0, 1.0, log, label, fmt)
    lo, hi = min(vals), max(vals)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        if b - a < 1e-9:
            a, b = a - 0.5, b + 0.5
        m = (b - a) * pad
        return Axis(10 ** (a - m), 10 ** (b + m), True, label, fmt)
    if hi - lo < 1e-12 * max(1.0, abs(hi)):
        lo, hi = lo - max(abs(lo) * 0.1, 0.5), hi + max(abs(hi) * 0.1, 0.5)
    m = (hi - lo) * pad
    return Axis(lo - m, hi + m, False, label, fmt)


def _linear_ticks(lo: float, hi: float, want: int = 5) -> list[float]:
    raw = (hi - lo) / want
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 12) for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if b - a > 3 else (1, 2, 5) if b - a > 1 else (1, 2, 3, 5, 7)
    return [m * 10.0**e for e in range(a, b + 1) for m in mults if lo <= m * 10.0**e <= hi]


def decimate_index(y: Any, max_points: int) -> Any:
    """Indices of at most ~max_points of a curve's points (numpy array y), in order: the ends, and each bucket's
    lowest and highest y, so spikes survive. Vectorised: a 72-cell grid of 2000-step curves is 72 calls."""
    import numpy as np

    n = len(y)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    inner = y[1:-1]
    size = -(-len(inner) // buckets)
    padded = np.concatenate([inner, np.full(size * buckets - len(inner), inner[-1])]).reshape(buckets, size)
    base = np.arange(buckets) * size + 1
    keep = np.unique(np.clip(np.concatenate([base + padded.argmin(axis=1), base + padded.argmax(axis=1)]), 1, n - 2))
    return np.concatenate([[0], keep, [n - 1]])


def decimate(x: Any, y: Any, max_points: int) -> list[tuple[float, float]]:
    """The points of `decimate_index`, as (x, y) pairs."""
    idx = decimate_index(y, max_points)
    return list(zip(x[idx].tolist(), y[idx].tolist()))


@dataclass
class Plot:
    """One chart: collect marks with the data-space methods, then `svg()`."""

    ident: str  # unique in the page (the clip path's id)
    x: Axis
    y: Axis
    title: str = ""
    width: int = 460
    height: int = 290
    marks: list[str] = field(default_factory=list)
    left: int = 58
    right: int = 12
    top: int = 26
    bottom: int = 42

    def px(self, v: float) -> float:
        return self._maps()[0](v)

    def py(self, v: float) -> float:
        return self._maps()[1](v)

    def _maps(self) -> tuple[Callable[[float], float], Callable[[float], float]]:
        """Data -> pixel functions, their constants computed once (a curve has hundreds of points)."""
        x0, x1 = (math.log10(self.x.lo), math.log10(self.x.hi)) if self.x.log else (self.x.lo, self.x.hi)
        sx = (self.width - self.left - self.right) / (x1 - x0)
        sy = (self.height - self.top - self.bottom) / (self.y.hi - self.y.lo)
        left, base, y0, log10 = self.left, self.height - self.bottom, self.y.lo, math.log10
        if self.x.log:
            return (lambda v: left + (log10(v) - x0) * sx), (lambda v: base - (v - y0) * sy)
        return (lambda v: left + (v - x0) * sx), (lambda v: base - (v - y0) * sy)

    def _xy(self, x: float, y: float) -> str:
        return f"{self.px(x):.1f},{self.py(y):.1f}"

    def line(self, pts: Sequence[tuple[float, float]], colour: str, *, dash: str = "", width: float = 1.4,
             title: str = "", opacity: float = 1.0) -> None:
        fx, fy, isfinite, log = *self._maps(), math.isfinite, self.x.log
        coords = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts
                          if isfinite(x) and isfinite(y) and (x > 0 or not log))
        if not coords:
            return
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-opacity="{opacity}"' if opacity < 1 else ""
        self.marks.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width}"{extra} '
                          f'points="{coords}">{_tip(title)}</polyline>')

    def band(self, xs: Sequence[float], lo: Sequence[float], hi: Sequence[float], colour: str,
             title: str = "") -> None:
        pts = [(x, a, b) for x, a, b in zip(xs, lo, hi)
               if _ok(x, self.x.log) and math.isfinite(a) and math.isfinite(b)]
        if len(pts) < 2:
            return
        upper = " ".join(self._xy(x, b) for x, _, b in pts)
        lower = " ".join(self._xy(x, a) for x, a, _ in reversed(pts))
        self.marks.append(f'<polygon fill="{colour}" fill-opacity="0.18" stroke="none" points="{upper} {lower}">'
                          f"{_tip(title)}</polygon>")

    def point(self, x: float, y: float, colour: str, *, shape: str = "dot", title: str = "") -> None:
        """shape: dot (filled), ring (hollow: not final), cross (failed), diamond (reference)."""
        if not (_ok(x, self.x.log) and math.isfinite(y)):
            return
        cx, cy, tip = self.px(x), self.py(y), _tip(title)
        if shape == "ring":
            self.marks.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="#fff" stroke="{colour}" '
                              f'stroke-width="1.6">{tip}</circle>')
        elif shape == "cross":
            self.marks.append(_cross(cx, cy, colour, tip))
        elif shape == "diamond":
            d = f"M{cx:.1f},{cy - 5:.1f}L{cx + 5:.1f},{cy:.1f}L{cx:.1f},{cy + 5:.1f}L{cx - 5:.1f},{cy:.1f}Z"
            self.marks.append(f'<path d="{d}" fill="{colour}" stroke="#222" stroke-width="0.8">{tip}</path>')
        else:
            self.marks.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" fill="{colour}" stroke="#fff" '
                              f'stroke-width="0.8">{tip}</circle>')

    def rug(self, x: float, colour: str, *, shape: str = "tick", title: str = "") -> None:
        """A mark on the x axis for a cell with no y value yet (planned) or ever (failed)."""
        if not _ok(x, self.x.log):
            return
        cx, base = self.px(x), self.height - self.bottom
        if shape == "cross":
            self.marks.append(_cross(cx, base - 8, colour, _tip(title)))
        else:
            self.marks.append(f'<path d="M{cx:.1f},{base:.1f}V{base - 10:.1f}" stroke="{colour}" stroke-width="2">'
                              f"{_tip(title)}</path>")

    def svg(self) -> str:
        w, h, l, r, t, b = self.width, self.height, self.left, self.right, self.top, self.bottom
        pw, ph = w - l - r, h - t - b
        out = [f'<svg class="plot" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
               f'aria-label="{escape(self.title)}">',
               f'<defs><clipPath id="{escape(self.ident)}"><rect x="{l}" y="{t}" width="{pw}" height="{ph}"/>'
               f'</clipPath></defs>',
               f'<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
        for v in self.x.ticks():
            x = self.px(v)
            out.append(f'<path d="M{x:.1f},{t}V{t + ph}" stroke="#eee"/><text x="{x:.1f}" y="{t + ph + 14}" '
                       f'text-anchor="middle">{escape(self.x.fmt(v))}</text>')
        for v in self.y.ticks():
            y = self.py(v)
            out.append(f'<path d="M{l},{y:.1f}H{l + pw}" stroke="#eee"/><text x="{l - 5}" y="{y + 3:.1f}" '
                       f'text-anchor="end">{escape(self.y.fmt(v))}</text>')
        out.append(f'<g clip-path="url(#{escape(self.ident)})">{"".join(self.marks)}</g>')
        out.append(f'<text class="title" x="{l}" y="{t - 9}">{escape(self.title)}</text>')
        out.append(f'<text x="{l + pw / 2:.0f}" y="{h - 6}" text-anchor="middle">{escape(self.x.label)}</text>')
        mid = f"{t + ph / 2:.0f}"
        out.append(f'<text x="12" y="{mid}" text-anchor="middle" transform="rotate(-90 12 {mid})">'
                   f"{escape(self.y.label)}</text></svg>")
        return "".join(out)


def _tip(title: str) -> str:
    """A native tooltip (the browser shows it on hover; no script needed)."""
    return f"<title>{escape(title)}</title>" if title else ""


def _cross(cx: float, cy: float, colour: str, tip: str) -> str:
    d = f"M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}L{cx + 4:.1f},{cy - 4:.1f}"
    return f'<path d="{d}" stroke="{colour}" stroke-width="2">{tip}</path>'


def _ok(x: float, log: bool) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and (x > 0 or not log)
