"""How fast a cluster trains: a calibration fitted from completed cells, or a stated default. Pure, stdlib.

A cell's run is modelled as

    seconds = start-up + (a * tokens + b * FLOPs) / GPUs      (FLOPs: 6 N D + attention, planning/estimate.py)

b is the inverse of the FLOP rate a GPU reaches on the model's matrix products; a is what each token costs
besides (data loading, kernel launches, the optimizer's per-step work spread over its tokens); the start-up is
loading, tokenising and what else a run does once. Large models are all b; the tiny test models are mostly
start-up and a. So tokens per second per GPU depend on the model's size, as measured: 1 / (a + b * FLOPs per
token).

`calibrate` fits start-up, a and b >= 0 per cluster to its completed cells (`Measured`: their tokens and FLOPs
counted as their estimate counted them, the seconds their completing run took, their GPUs), minimising the
relative error so that small and large cells weigh alike. Where the cells cannot tell two terms apart (cells of
one size, or all with the same tokens) the fit keeps the terms it can identify: of the models with the terms
{start-up, a, b} that have a unique non-negative solution and fewer terms than cells (one term: any number),
the one with the smallest error, ties going to fewer terms and then to b (a FLOP rate transfers across sizes: a calibration from small cells then
overestimates large ones, the safe side).

A run's seconds are its wall time on GPU clusters; on CPU-only nodes (gpu_type CPU, where CPU-hours stand in for
GPU-hours) its CPU time (user + system of the training's processes, recorded by the job), which other tenants'
load on a shared machine does not stretch as it stretches the wall clock.

Without a calibration: DEFAULT_MFU (or the type's DEFAULT_MFU_BY_GPU entry) x the GPU type's dense bf16 peak
(PEAK_FLOPS, or the cluster's own gpu_peak_tflops), start-up not counted. Every Throughput names its source.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# Dense (no sparsity) bf16 peak FLOP/s of one GPU, from the vendors' data sheets (the sparse figures are 2x).
# CPU: a 2-core machine like this one, 2 cores x ~2.0 GHz x 32 fp32 FLOP/cycle (AVX2: two 8-wide FMA units),
# the whole machine counted as one "GPU".
PEAK_FLOPS: dict[str, float] = {
    "A100": 312e12,  # SXM, 40/64/80 GB alike
    "H100": 989e12,  # SXM
    "GH200": 989e12,  # the Hopper GPU of a Grace Hopper superchip
    "H200": 989e12,
    "B200": 2250e12,
    "CPU": 1.28e11,
}
# Well-tuned pretraining reaches 40-50% MFU; SFT with ZeRO-3 sharding, unpacked variable-length batches and
# small models rarely does, so the default is the conservative end.
DEFAULT_MFU = 0.3
# CPU: the tiny test models are all overhead; a 20-step tiny-llama3 cell (0.2M params) on a 2-core machine did
# 4.3e9 FLOPs in 5.85 s of train_runtime, 0.74 GFLOP/s, about 0.6% of the CPU peak above.
DEFAULT_MFU_BY_GPU: dict[str, float] = {"CPU": 0.005}
# model sizes within 5% of each other count as one size
_SAME_SIZE = 1.05


@dataclass(frozen=True)
class Throughput:
    per_token_s: float  # a: GPU-seconds per token
    per_flop_s: float  # b: GPU-seconds per FLOP
    startup_s: float
    source: str  # "calibration" or "default"
    detail: str  # how the numbers were made, for a person

    def seconds(self, tokens: float, flops: float, gpus: int) -> float:
        return self.startup_s + (self.per_token_s * tokens + self.per_flop_s * flops) / max(1, gpus)

    def tokens_per_gpu_s(self, flops_per_token: float) -> float:
        cost = self.per_token_s + self.per_flop_s * flops_per_token
        return 1.0 / cost if cost > 0 else math.inf

    def to_json(self) -> dict[str, object]:
        return {"per_token_s": self.per_token_s, "per_flop_s": self.per_flop_s, "startup_s": self.startup_s,
                "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class Measured:
    """A completed cell's run as it went: the input of `calibrate`."""

    cell: str
    cluster: str
    gpu: str
    gpus: int
    params: float
    seconds: float  # the completing run: wall time (GPUs), CPU time (CPU-only nodes); start-up included
    tokens: float
    flops: float
    train_seconds: float | None = None  # the trainer's own train_runtime (wall), for reading only


@dataclass(frozen=True)
class Calibration:
    cluster: str
    gpu: str
    startup_s: float
    per_token_s: float
    per_flop_s: float
    cells: tuple[str, ...]
    sizes: int  # distinct model sizes among the cells
    peak: float | None  # the GPU type's peak, when known

    @property
    def flops_per_gpu_s(self) -> float:
        return 1.0 / self.per_flop_s if self.per_flop_s > 0 else math.inf

    def throughput(self, leave_out: str = "") -> Throughput:
        terms = [name for name, v in (("start-up", self.startup_s), ("per-token", self.per_token_s),
                                      ("per-FLOP", self.per_flop_s)) if v > 0]
        mfu = f", MFU {self.flops_per_gpu_s / self.peak:.2g}" if self.peak and self.per_flop_s > 0 else ""
        rate = f"{self.flops_per_gpu_s / 1e12:.3g} TFLOP/s per {self.gpu}{mfu}" if self.per_flop_s > 0 else \
            "no FLOP rate"
        token = f", {self.per_token_s * 1e3:.3g} ms a token" if self.per_token_s > 0 else ""
        what = "CPU time" if self.gpu == "CPU" else "wall time"
        return Throughput(self.per_token_s, self.per_flop_s, self.startup_s, "calibration",
                          f"{' + '.join(terms) or 'no'} cost fitted to the {what} of {len(self.cells)} completed"
                          f" cell(s) of {self.sizes} size(s) on {self.cluster}"
                          f"{' (without ' + leave_out + ')' if leave_out else ''}: {rate}{token},"
                          f" start-up {self.startup_s:.0f} s")


def peak_flops(gpu: str, override_tflops: float | None = None) -> tuple[str, float] | None:
    """(the table's key, peak FLOP/s) for a GPU name: the cluster's own figure, else the table's entry that the
    name equals or starts with, longest first ("A100-64GB" -> A100)."""
    if override_tflops:
        return gpu or "GPU", override_tflops * 1e12
    name = gpu.upper()
    keys = [k for k in PEAK_FLOPS if name == k or name.startswith(k)]
    if not keys:
        return None
    key = max(keys, key=len)
    return key, PEAK_FLOPS[key]


def _solve(a: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float] | None:
    """x with a x = rhs (the normal equations of a least-squares fit), None when singular. Solved on unit
    diagonal (start-up, tokens and FLOPs differ by many orders of magnitude), by Gauss-Jordan."""
    k = len(a)
    d = [math.sqrt(a[i][i]) or 1.0 for i in range(k)]
    m = [[a[i][j] / (d[i] * d[j]) for j in range(k)] + [rhs[i] / d[i]] for i in range(k)]
    for c in range(k):
        pivot = max(range(c, k), key=lambda r: abs(m[r][c]))
        if abs(m[pivot][c]) <= 1e-6:  # the terms' columns are (nearly) dependent: they cannot be told apart
            return None
        m[c], m[pivot] = m[pivot], m[c]
        for r in range(k):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][k] / m[i][i] / d[i] for i in range(k)]


# the models tried, fewest terms first, b before a: (start-up, a, b) switched on or off
_MODELS = ((0, 0, 1), (1, 0, 0), (0, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 0), (1, 1, 1))


def _rows(ms: Sequence[Measured]) -> list[tuple[float, float, float]]:
    """Each cell's (1, tokens / GPUs, FLOPs / GPUs), divided by its seconds: the fit is then rows . coef = 1."""
    return [(1.0 / m.seconds, m.tokens / (m.gpus * m.seconds), m.flops / (m.gpus * m.seconds)) for m in ms]


def _sums(rows: Sequence[Sequence[float]]) -> tuple[list[list[float]], list[float]]:
    return [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)], [sum(r[i] for r in rows)
                                                                                   for i in range(3)]


def _fit(s: Sequence[Sequence[float]], b: Sequence[float], n: int) -> tuple[float, float, float]:
    """(start-up, a, b) >= 0 minimising sum (row . coef - 1)^2 over n rows, from their sums s = sum row row^T and
    b = sum row (module docstring); the error of a coefficient vector is coef^T s coef - 2 coef . b + n."""
    best: tuple[float, tuple[float, ...]] | None = None
    for on in _MODELS:
        idx = [i for i in range(3) if on[i]]
        if len(idx) > 1 and len(idx) >= n:  # k terms need more than k cells, or they fit the noise exactly
            continue
        x = _solve([[s[i][j] for j in idx] for i in idx], [b[i] for i in idx])
        if x is None or min(x) < 0:
            continue
        coef = [0.0, 0.0, 0.0]
        for i, v in zip(idx, x):
            coef[i] = v
        loss = sum(coef[i] * coef[j] * s[i][j] for i in range(3) for j in range(3)) - 2 * sum(
            c * v for c, v in zip(coef, b)) + n
        if best is None or loss < best[0] * (1 - 1e-6) - 1e-12 * n:
            best = (loss, tuple(coef))
    return best[1] if best is not None else (0.0, 0.0, 0.0)  # type: ignore[return-value]


def _sizes(params: Iterable[float]) -> int:
    count, last = 0, 0.0
    for p in sorted(params):
        if p > last * _SAME_SIZE:
            count, last = count + 1, p
    return count


def calibrate(cells: Iterable[Measured], leave_out: str = "") -> dict[str, Calibration]:
    """One calibration per cluster from its measured cells (module docstring); `leave_out` names a cell not to
    use (what the calibration says of a cell it has not seen)."""
    by_cluster: dict[str, list[Measured]] = {}
    for m in cells:
        if m.cell != leave_out and m.seconds > 0 and m.gpus > 0 and m.flops > 0 and m.tokens > 0:
            by_cluster.setdefault(m.cluster, []).append(m)
    out = {}
    for cluster, ms in sorted(by_cluster.items()):
        out[cluster] = _calibration(cluster, ms, _rows(ms))
    return out


def _calibration(cluster: str, ms: Sequence[Measured], rows: Sequence[Sequence[float]],
                 sums: tuple[list[list[float]], list[float]] | None = None) -> Calibration:
    gpu = statistics.mode(m.gpu for m in ms)
    startup, a, b = _fit(*(sums or _sums(rows)), len(rows))
    peak = peak_flops(gpu)
    return Calibration(cluster, gpu, startup, a, b, tuple(m.cell for m in ms), _sizes(m.params for m in ms),
                       peak[1] if peak else None)


def leave_one_out(cells: Iterable[Measured]) -> dict[str, Calibration]:
    """Each cell -> its cluster's calibration from the other cells (the sums once, each cell's row taken out)."""
    by_cluster: dict[str, list[Measured]] = {}
    for m in cells:
        if m.seconds > 0 and m.gpus > 0 and m.flops > 0 and m.tokens > 0:
            by_cluster.setdefault(m.cluster, []).append(m)
    out = {}
    for cluster, ms in by_cluster.items():
        rows = _rows(ms)
        s, b = _sums(rows)
        for i, m in enumerate(ms):
            if len(ms) < 2:
                continue
            r = rows[i]
            sub = ([[s[p][q] - r[p] * r[q] for q in range(3)] for p in range(3)], [b[p] - r[p] for p in range(3)])
            others = ms[:i] + ms[i + 1:]
            out[m.cell] = _calibration(cluster, others, rows[:i] + rows[i + 1:], sub)
    return out


def throughput(cluster: str, gpu: str, calibrations: Mapping[str, Calibration] | None = None,
               peak_tflops: float | None = None, default_mfu: float | None = None,
               leave_out: str = "") -> Throughput | None:
    """The cluster's calibration if it has one, else default MFU (argument, else the GPU type's entry in
    DEFAULT_MFU_BY_GPU, else DEFAULT_MFU) x the GPU type's peak; None when the type is unknown too."""
    cal = (calibrations or {}).get(cluster)
    if cal is not None:
        return cal.throughput(leave_out)
    peak = peak_flops(gpu, peak_tflops)
    if peak is None:
        return None
    key, value = peak
    mfu = default_mfu if default_mfu is not None else DEFAULT_MFU_BY_GPU.get(key, DEFAULT_MFU)
    return Throughput(0.0, 1.0 / (mfu * value), 0.0, "default",
                      f"MFU {mfu:.3g} (the default) x {key} dense bf16 peak {value / 1e12:.4g} TFLOP/s"
                      f" (no completed cell on {cluster} yet; start-up not counted)")
