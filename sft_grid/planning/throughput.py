"""How fast a cluster trains: a calibration fitted from completed cells, or a stated default. Pure, stdlib.

A cell's time on one GPU is modelled as

    GPU-seconds = a * tokens + b * FLOPs           (FLOPs: 6 N D + attention, planning/estimate.py)
    wall        = start-up + GPU-seconds / GPUs

b is the inverse of the FLOP rate a GPU reaches on the model's matrix products; a is what each token costs
besides (data loading, kernel launches, the optimizer's per-step work spread over its tokens). Large models
are all b; the tiny test models are mostly a. So tokens per second per GPU depend on the model's size, as
measured: 1 / (a + b * FLOPs per token).

`calibrate` fits a and b per cluster from its completed cells (`Measured`: their tokens and FLOPs counted like
an estimate, their training-loop seconds from the trainer's log, their GPUs), minimising the relative error
so that small and large cells weigh alike, with a, b >= 0. With cells of one model size the two terms cannot
be told apart, and the whole time goes to b (a FLOP rate transfers across sizes; a per-token cost does not):
a calibration from small cells then overestimates large ones, the safe side. Start-up is the median over the
cells of their wall time (from the ledger) minus their training loop.

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
    """A completed cell's training as it ran: the input of `calibrate`."""

    cell: str
    cluster: str
    gpu: str
    gpus: int
    params: float
    seconds: float  # the training loop (the trainer's train_runtime), start-up excluded
    wall: float | None  # the whole run, from the ledger (start-up included)
    tokens: float
    flops: float


@dataclass(frozen=True)
class Calibration:
    cluster: str
    gpu: str
    per_token_s: float
    per_flop_s: float
    startup_s: float
    cells: tuple[str, ...]
    sizes: int  # distinct model sizes among the cells
    peak: float | None  # the GPU type's peak, when known

    @property
    def flops_per_gpu_s(self) -> float:
        return 1.0 / self.per_flop_s if self.per_flop_s > 0 else math.inf

    def throughput(self, leave_out: str = "") -> Throughput:
        how = "per-token and per-FLOP cost" if self.per_token_s > 0 and self.per_flop_s > 0 else "FLOP rate"
        mfu = f", MFU {self.flops_per_gpu_s / self.peak:.2g}" if self.peak and self.per_flop_s > 0 else ""
        rate = f"{self.flops_per_gpu_s / 1e12:.3g} TFLOP/s per {self.gpu}{mfu}" if self.per_flop_s > 0 else \
            f"{1 / self.per_token_s:.4g} tokens/s per {self.gpu}"
        return Throughput(self.per_token_s, self.per_flop_s, self.startup_s, "calibration",
                          f"{how} fitted to {len(self.cells)} completed cell(s) of {self.sizes} size(s) on "
                          f"{self.cluster}{' (without ' + leave_out + ')' if leave_out else ''}: {rate},"
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


def _fit(ms: Sequence[Measured], sizes: int) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum ((a tokens + b flops) / (seconds gpus) - 1)^2 (module docstring)."""
    u = [(m.tokens / (m.seconds * m.gpus), m.flops / (m.seconds * m.gpus)) for m in ms]
    s11 = sum(x * x for x, _ in u)
    s22 = sum(y * y for _, y in u)
    s12 = sum(x * y for x, y in u)
    r1, r2 = sum(x for x, _ in u), sum(y for _, y in u)
    flop_only = (0.0, r2 / s22)
    if sizes < 2:
        return flop_only
    candidates = [flop_only, (r1 / s11, 0.0)]
    det = s11 * s22 - s12 * s12
    if det > 1e-12 * s11 * s22:
        a, b = (r1 * s22 - r2 * s12) / det, (r2 * s11 - r1 * s12) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))

    def loss(ab: tuple[float, float]) -> float:
        return sum((ab[0] * x + ab[1] * y - 1.0) ** 2 for x, y in u)

    return min(candidates, key=loss)


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
        gpu = statistics.mode(m.gpu for m in ms)
        sizes = _sizes(m.params for m in ms)
        a, b = _fit(ms, sizes)
        starts = [m.wall - m.seconds for m in ms if m.wall is not None]
        startup = max(0.0, statistics.median(starts)) if starts else 0.0
        peak = peak_flops(gpu)
        out[cluster] = Calibration(cluster, gpu, a, b, startup, tuple(m.cell for m in ms), sizes,
                                   peak[1] if peak else None)
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
