"""What a cell will cost before it is launched: tokens, training FLOPs, GPU-hours, wall time, disk. Pure, stdlib.

Tokens (what the GPUs process, prompt tokens included: masking a token out of the loss does not skip its
forward and backward pass). Each data source comes with the tokenised lengths of a sample of its rows (the
loss-mask probe's, through the backend's own preprocessing, chat template applied) and the rows the cell takes
from it per epoch (after mixing). Lengths are capped at cutoff_len (longer examples are truncated). Then
  * epochs:    D = epochs * sum_s rows_s * mean_s(min(len, cutoff)); steps = ceil(epochs * ceil(rows / gbs))
  * max_steps: D = max_steps * global_batch * mean length, the mean over the mix weighted by rows
               (max_steps > 0 wins over epochs, as in the HF Trainer)
  * packing:   examples are concatenated into cutoff_len blocks, so a step is global_batch * cutoff tokens and a
               global batch counts blocks, not conversations.

FLOPs = 6 N D + 12 n_layers d_attn sum_seq s^2.
  * 6 N D: forward 2 N + backward 4 N per token (Kaplan et al. 2020, "Scaling Laws for Neural Language
    Models", sec. 2.1). N is the model's stated parameter count (params_b), as Hoffmann et al. 2022 count.
  * attention: PaLM's accounting (Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per token, H Q = d_attn,
    T the attended length; QK^T and AV, forward and backward, no discount for the causal mask). Unpacked, a
    token attends within its own example, so T summed over tokens is sum over examples of s^2. Packed, T is
    the same: sft_grid packs so that no example attends to another (planning/gpus.py), so a packed token attends
    within its own example too.
    MFU figures are quoted in this same convention, so a default MFU and this count agree.

Time comes from a `Throughput` (below): a per-cluster calibration from completed cells, or a
stated default MFU x the GPU type's peak.

Disk: a checkpoint holds the weights (2 bytes/param in bf16/fp16, 4 in fp32) and, when the optimizer is
saved, Adam's two fp32 moments (8 bytes/param) plus, for 16-bit weights, the fp32 master copy that mixed
precision keeps (4 bytes/param; DeepSpeed writes it in its optimizer shards). Checkpoints kept =
min(save_total_limit, ceil(total_steps / save_steps)) (one every save_steps and one at the last step), or
every one when the limit is unset. The final model (weights only) comes on top.

Time, by default (no calibration yet), prices what is rendered (`Layout`, from the cell's layout in planning/gpus.py):
  * compute: the FLOPs executed at DEFAULT_MFU of the GPU's dense bf16 peak. Activation checkpointing executes one
    more forward pass (8/6 of the FLOPs; the reported MFU stays in model FLOPs, 6ND + attention); Liger's fused
    kernels save LIGER_SPEEDUP of it.
  * dispatch: each micro step launches a few hundred kernels a layer (forward, recompute, backward), about
    DISPATCH_S_PER_LAYER a layer, whatever the tokens in it: what makes a micro step of one ~700-token conversation
    slow on a small model, and what packing (a full cutoff_len of tokens a micro step) removes.
  * exchange: per optimizer step, the gradients (and under ZeRO-3 the parameters) cross the nodes' network
    (cluster.internode_gbps): data parallel or ZeRO-2, a ring all-reduce of the gradients, 2 (n-1)/n of their
    bytes through each node (fp32 under LLaMA-Factory's data parallel, bf16 otherwise); ZeRO-3, the parameters'
    all-gather in the forward and the backward pass and the gradients' reduce-scatter, 3 (n-1)/n of the bf16
    parameters. Within a node NVLink is taken as free; no overlap with compute is assumed (the conservative end).
    A network the cluster does not state is not priced (said so).
  * offload: the optimizer states cross PCIe each step (OFFLOAD_GBPS) and CPU Adam updates them.
The MFU the estimate then comes to (model FLOPs / (time x GPUs x peak)) is said with it. A calibration from
completed cells replaces all of it (it measured the whole run).

Not counted: evaluation, checkpoint write time, padding within a batch. Start-up (loading, tokenising) is counted
where a calibration measured it.

How fast a cluster trains (`Throughput`, `throughput`) is below: a calibration fitted to completed cells (start-up,
per-token and per-FLOP cost; CPU time on CPU-only nodes), or a stated default MFU of the cluster's GPU type.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

BYTES_PER_WEIGHT = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAM_MOMENT_BYTES = 8  # exp_avg and exp_avg_sq, fp32
MASTER_WEIGHT_BYTES = 4  # fp32 master copy kept beside 16-bit weights


@dataclass(frozen=True)
class Source:
    """One data source of a cell: its rows per epoch (after mixing) and a sample of its tokenised lengths."""

    name: str
    rows: float
    lengths: tuple[float, ...]  # tokens of each sampled row (or a stated mean)


@dataclass(frozen=True)
class Model:
    params: float  # N in 6ND
    n_layers: int
    d_attn: int  # attention width: heads x head_dim (the hidden size for most models)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What the time of a step depends on besides its FLOPs: the cell's layout (planning/gpus.py) as the estimate
    reads it."""

    gpus_per_node: int
    nodes: int
    micro_batch_size: int
    layers: int
    checkpointing: bool = False
    sharding: str = "none"  # none, zero2, zero3
    offload: str = "none"  # none, optimizer, all
    liger: bool = False
    fp32_gradients: bool = False  # LLaMA-Factory's data parallel upcasts the trainable weights: fp32 gradients
    internode_gbps: float | None = None  # one node's network, GB/s; None: not known


@dataclass(frozen=True, kw_only=True)
class CellPlan:
    name: str
    model: Model
    sources: tuple[Source, ...]
    cutoff_len: int
    global_batch_size: int
    epochs: float = 1.0
    max_steps: int = 0  # > 0 wins over epochs
    packing: bool = False
    gpus: int = 1  # nodes x GPUs per node (a CPU-only node counts as one)
    precision: str = "bf16"  # the saved weights' dtype: bf16, fp16 or fp32
    save_steps: int = 0  # 0: no checkpoints
    save_total_limit: int | None = None
    save_optimizer: bool = True
    max_time_s: float | None = None  # the cell's wall-time limit per job
    requeues: int = 0  # how many times a job that hits the limit is resubmitted (resuming)
    layout: Layout | None = None  # None: a CPU-only node (the throughput is all there is)


@dataclass(frozen=True)
class Tokens:
    sequences: int  # examples (or packed blocks) processed
    steps: int
    tokens: float
    attended: float  # sum over tokens of the attended length (sum of s^2 unpacked)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    cell: str
    tokens: Tokens
    flops: float
    flops_dense: float
    flops_attention: float
    throughput: Throughput | None  # None: no calibration and no known peak (see notes)
    gpu_hours: float | None
    wall_seconds: float | None
    checkpoint_bytes: float
    checkpoints_kept: int
    disk_bytes: float  # kept checkpoints + the final model
    wall_budget_seconds: float | None  # max_time_s x (1 + requeues)
    exceeds_wall: bool
    notes: tuple[str, ...]
    # the parts of the wall time a default throughput priced (compute, dispatch, exchange, offload; seconds) and the
    # MFU that comes to; empty and None under a calibration
    parts: tuple[tuple[str, float], ...] = ()
    mfu: float | None = None

    def to_json(self) -> dict[str, object]:
        tp = self.throughput
        return {
            "tokens": self.tokens.tokens,
            "sequences": self.tokens.sequences,
            "steps": self.tokens.steps,
            "attended": self.tokens.attended,
            "flops": self.flops,
            "flops_dense": self.flops_dense,
            "flops_attention": self.flops_attention,
            "gpu_hours": self.gpu_hours,
            "wall_seconds": self.wall_seconds,
            "throughput": None if tp is None else tp.to_json(),
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoints_kept": self.checkpoints_kept,
            "disk_bytes": self.disk_bytes,
            "wall_budget_seconds": self.wall_budget_seconds,
            "exceeds_wall": self.exceeds_wall,
            "notes": list(self.notes),
            "parts": dict(self.parts),
            "mfu": self.mfu,
        }


def count_tokens(plan: CellPlan) -> Tokens:
    """Sequences, optimizer steps, tokens processed and attended length of one cell (module docstring)."""
    if not plan.sources:
        raise ValueError(f"{plan.name}: no data source")
    stats = []
    for s in plan.sources:
        if not s.lengths:
            raise ValueError(f"{plan.name}: source {s.name!r} has no sampled lengths")
        capped = [min(n, plan.cutoff_len) for n in s.lengths]
        stats.append((s.rows, statistics.fmean(capped), statistics.fmean(c * c for c in capped)))
    rows = sum(r for r, _, _ in stats)
    if rows <= 0:
        raise ValueError(f"{plan.name}: the sources have no rows")
    per_epoch = sum(r * m for r, m, _ in stats)
    sq_per_epoch = sum(r * q for r, _, q in stats)
    gbs, cutoff = plan.global_batch_size, plan.cutoff_len
    if plan.max_steps > 0:
        steps = plan.max_steps
        sequences = steps * gbs
        if plan.packing:
            tokens = float(sequences * cutoff)
            # each token attends within its own example: the examples' s^2 per token they hold
            return Tokens(sequences, steps, tokens, tokens * sq_per_epoch / per_epoch)
        return Tokens(sequences, steps, sequences * per_epoch / rows, sequences * sq_per_epoch / rows)
    if plan.packing:
        blocks = math.ceil(per_epoch / cutoff)
        steps = math.ceil(plan.epochs * math.ceil(blocks / gbs))
        tokens = plan.epochs * per_epoch
        return Tokens(math.ceil(plan.epochs * blocks), steps, tokens, plan.epochs * sq_per_epoch)
    steps = math.ceil(plan.epochs * math.ceil(rows / gbs))
    return Tokens(math.ceil(plan.epochs * rows), steps, plan.epochs * per_epoch, plan.epochs * sq_per_epoch)


def training_flops(model: Model, tokens: float, attended: float) -> tuple[float, float]:
    """(6 N D, 12 n_layers d_attn sum T): the dense and attention FLOPs of training (module docstring)."""
    return 6.0 * model.params * tokens, 12.0 * model.n_layers * model.d_attn * attended


def mixed_rows(rows: Sequence[float], strategy: str, probs: Sequence[float] | None) -> list[float]:
    """Rows each source contributes per epoch after mixing: all of them (concat); interleaving with
    probabilities p stops at the first exhausted source (interleave_under: T = min rows/p) or the last
    (interleave_over: T = max rows/p, oversampling the others), each source giving p x T rows."""
    if strategy == "concat" or not probs or len(probs) != len(rows):
        return list(rows)
    ratios = [r / p for r, p in zip(rows, probs, strict=True) if p > 0]
    if not ratios:
        return list(rows)
    total = min(ratios) if strategy == "interleave_under" else max(ratios)
    return [p * total for p in probs]


def checkpoint_bytes(plan: CellPlan) -> float:
    try:
        weight = BYTES_PER_WEIGHT[plan.precision]
    except KeyError:
        raise ValueError(
            f"{plan.name}: precision {plan.precision!r} is not one of {sorted(BYTES_PER_WEIGHT)}"
        ) from None
    optim = (ADAM_MOMENT_BYTES + (MASTER_WEIGHT_BYTES if weight < 4 else 0)) if plan.save_optimizer else 0
    return plan.model.params * (weight + optim)


def disk_bound(plan: CellPlan) -> float | None:
    """The most a cell can keep when its steps are unknown: save_total_limit checkpoints and the final model
    (None without a limit: every checkpoint is kept, however many there are)."""
    if plan.save_total_limit is None:
        return None
    return plan.save_total_limit * checkpoint_bytes(plan) + plan.model.params * BYTES_PER_WEIGHT[plan.precision]


def estimate_cell(plan: CellPlan, throughput: Throughput | None) -> Estimate:
    tok = count_tokens(plan)
    dense, attn = training_flops(plan.model, tok.tokens, tok.attended)
    flops = dense + attn
    notes: list[str] = []
    gpu_hours = wall = mfu = None
    parts: tuple[tuple[str, float], ...] = ()
    if throughput is None:
        notes.append("no throughput: the cluster names no GPU type with a known peak and has no calibration")
    elif throughput.source == "default" and plan.layout is not None:
        parts = layout_seconds(plan, tok, flops, throughput, notes)
        wall = throughput.startup_s + sum(v for _, v in parts)
        gpu_hours = wall * plan.gpus / 3600.0
        if throughput.peak:
            mfu = flops / (wall * plan.gpus * throughput.peak)
    else:
        wall = throughput.seconds(tok.tokens, flops, plan.gpus)
        gpu_hours = wall * plan.gpus / 3600.0
    # a checkpoint every save_steps, and one at the last step (the HF Trainer saves when training stops)
    saves = math.ceil(tok.steps / plan.save_steps) if plan.save_steps > 0 else 0
    kept = saves if plan.save_total_limit is None else min(plan.save_total_limit, saves)
    ckpt = checkpoint_bytes(plan)
    final = plan.model.params * BYTES_PER_WEIGHT[plan.precision]
    budget = plan.max_time_s * (1 + plan.requeues) if plan.max_time_s else None
    exceeds = wall is not None and budget is not None and wall > budget
    if exceeds:
        assert wall is not None and budget is not None and plan.max_time_s
        notes.append(
            f"estimated {wall / 3600:.1f} h exceeds the wall time {plan.max_time_s / 3600:.1f} h "
            f"x (1 + {plan.requeues} requeue(s)) = {budget / 3600:.1f} h"
        )
    return Estimate(
        cell=plan.name,
        tokens=tok,
        flops=flops,
        flops_dense=dense,
        flops_attention=attn,
        throughput=throughput,
        gpu_hours=gpu_hours,
        wall_seconds=wall,
        checkpoint_bytes=ckpt,
        checkpoints_kept=kept,
        disk_bytes=kept * ckpt + final,
        wall_budget_seconds=budget,
        exceeds_wall=exceeds,
        notes=tuple(notes),
        parts=parts,
        mfu=mfu,
    )


def layout_seconds(
    plan: CellPlan, tok: Tokens, flops: float, throughput: Throughput, notes: list[str]
) -> tuple[tuple[str, float], ...]:
    """The wall time of a cell under a default throughput, by part (module docstring): compute, dispatch, exchange
    and offload, in seconds."""
    lay = plan.layout
    assert lay is not None
    gpus = max(1, plan.gpus)
    executed = flops * (RECOMPUTE if lay.checkpointing else 1.0) * (1.0 - LIGER_SPEEDUP if lay.liger else 1.0)
    compute = executed * throughput.per_flop_s / gpus
    micro_steps = math.ceil(tok.sequences / (gpus * max(1, lay.micro_batch_size)))
    dispatch = micro_steps * lay.layers * DISPATCH_S_PER_LAYER * (1.5 if lay.checkpointing else 1.0)
    n = plan.model.params
    exchange = 0.0
    if lay.nodes > 1:
        if lay.internode_gbps:
            spread = (lay.nodes - 1) / lay.nodes
            if lay.sharding == "zero3":
                volume = 3 * 2 * n * spread
            else:
                volume = 2 * (4 if lay.fp32_gradients else 2) * n * spread
            exchange = tok.steps * volume / (lay.internode_gbps * 1e9)
        else:
            notes.append(f"the exchange between {lay.nodes} nodes is not priced: the cluster states no internode_gbps")
    offload = 0.0
    if lay.offload != "none":
        # the optimizer states (fp32 master and Adam's moments, 12 bytes a parameter) of each GPU's shard to the CPU
        # and back, and the fp32 gradients to it, over PCIe
        offload = tok.steps * 16 * n / gpus / (OFFLOAD_GBPS * 1e9)
    return (("compute", compute), ("dispatch", dispatch), ("exchange", exchange), ("offload", offload))


# What activation checkpointing executes: one more forward pass, 2 of the 6 N D (8/6).
RECOMPUTE = 8.0 / 6.0
# Liger's fused RMSNorm, RoPE, SwiGLU and linear cross-entropy: its README measures +20% throughput on LLaMA-3-8B
# (bs 8, bf16, FSDP, 8 A100); half of that is taken here.
LIGER_SPEEDUP = 0.10
# Per micro step and decoder layer, the launches of eager PyTorch: ~50 kernels a layer a pass, forward and backward
# (~3 passes), ~10 us each = 1.5 ms; checkpointing adds the recomputed forward (x 1.5). On an 11-layer 447M model a
# micro step of one ~700-token conversation computes in ~20 ms at 40% of an A100: as long as its launches, so the
# unpacked small cells run at about half the MFU of packed ones (a micro step of 4,096 tokens computes in ~120 ms).
DISPATCH_S_PER_LAYER = 1.5e-3
# Host-device copies of an offloaded optimizer: PCIe 4.0 x16's ~25 GB/s less CPU Adam's own time, taken as 10 GB/s.
OFFLOAD_GBPS = 10.0


def total_hours(estimates: Iterable[Estimate]) -> float:
    return sum(e.gpu_hours for e in estimates if e.gpu_hours is not None)


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
# The compute part of a GPU's time (layout_seconds adds the layout's dispatch, exchange and offload to it): the
# fraction of its dense bf16 peak that the FLOPs executed reach once the kernels are busy. A tuned stack reaches 33-39%
# MFU on 8B Llama-3.1 on H100 with everything counted (torchtitan, benchmarks/llama3_h100_202412_torchtitan.md) and
# 57% on A100 (docs/performance.md); with the overheads priced apart, the compute part alone is taken at 0.45,
# between the two. A CPU-only node's is measured whole (DEFAULT_MFU_BY_GPU).
DEFAULT_MFU = 0.45
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
    peak: float | None = None  # the GPU's dense bf16 peak (FLOP/s), where known

    def seconds(self, tokens: float, flops: float, gpus: int) -> float:
        return self.startup_s + (self.per_token_s * tokens + self.per_flop_s * flops) / max(1, gpus)

    def tokens_per_gpu_s(self, flops_per_token: float) -> float:
        cost = self.per_token_s + self.per_flop_s * flops_per_token
        return 1.0 / cost if cost > 0 else math.inf

    def to_json(self) -> dict[str, object]:
        return {
            "per_token_s": self.per_token_s,
            "per_flop_s": self.per_flop_s,
            "startup_s": self.startup_s,
            "source": self.source,
            "detail": self.detail,
        }


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


@dataclass(frozen=True, kw_only=True)
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
        terms = [
            name
            for name, v in (
                ("start-up", self.startup_s),
                ("per-token", self.per_token_s),
                ("per-FLOP", self.per_flop_s),
            )
            if v > 0
        ]
        mfu = f", MFU {self.flops_per_gpu_s / self.peak:.2g}" if self.peak and self.per_flop_s > 0 else ""
        rate = (
            f"{self.flops_per_gpu_s / 1e12:.3g} TFLOP/s per {self.gpu}{mfu}" if self.per_flop_s > 0 else "no FLOP rate"
        )
        token = f", {self.per_token_s * 1e3:.3g} ms a token" if self.per_token_s > 0 else ""
        what = "CPU time" if self.gpu == "CPU" else "wall time"
        return Throughput(
            self.per_token_s,
            self.per_flop_s,
            self.startup_s,
            "calibration",
            f"{' + '.join(terms) or 'no'} cost fitted to the {what} of {len(self.cells)} completed"
            f" cell(s) of {self.sizes} size(s) on {self.cluster}"
            f"{' (without ' + leave_out + ')' if leave_out else ''}: {rate}{token},"
            f" start-up {self.startup_s:.0f} s",
        )


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


# the models tried, fewest terms first, b before a: (start-up, a, b) switched on or off
_MODELS = ((0, 0, 1), (1, 0, 0), (0, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 0), (1, 1, 1))


def _rows(ms: Sequence[Measured]) -> list[tuple[float, float, float]]:
    """Each cell's (1, tokens / GPUs, FLOPs / GPUs), divided by its seconds: the fit is then rows . coef = 1."""
    return [(1.0 / m.seconds, m.tokens / (m.gpus * m.seconds), m.flops / (m.gpus * m.seconds)) for m in ms]


def _fit(rows: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(start-up, a, b) >= 0 minimising sum (row . coef - 1)^2 over the rows (module docstring). Each model of
    _MODELS is solved by scipy's non-negative least squares on its terms' columns, scaled to unit length (start-up,
    tokens and FLOPs differ by many orders of magnitude); a model whose columns are (nearly) dependent is skipped
    (they cannot be told apart: a pivot of their unit-diagonal normal matrix at most 1e-6), and one with more terms
    is kept only where it fits clearly better than the fewer-term one before it."""
    n = len(rows)
    if n == 0:
        return 0.0, 0.0, 0.0
    import numpy as np  # only where completed cells are calibrated
    from scipy.linalg import lu
    from scipy.optimize import nnls

    a = np.asarray(rows, dtype=float)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    target = np.ones(n)
    best: tuple[float, tuple[float, float, float]] | None = None
    for on in _MODELS:
        idx = [i for i in range(3) if on[i]]
        if len(idx) > 1 and len(idx) >= n:  # k terms need more than k cells, or they fit the noise exactly
            continue
        cols = a[:, idx]
        if len(idx) > 1 and np.abs(np.diag(lu(cols.T @ cols, check_finite=False)[2])).min() <= 1e-6:
            continue
        x, rnorm = nnls(cols, target)
        loss = float(rnorm) ** 2
        if best is None or loss < best[0] * (1 - 1e-6) - 1e-12 * n:
            coef = [0.0, 0.0, 0.0]
            for i, v in zip(idx, x, strict=True):
                coef[i] = float(v) / float(scale[i])
            best = (loss, (coef[0], coef[1], coef[2]))
    return best[1] if best is not None else (0.0, 0.0, 0.0)


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


def _calibration(cluster: str, ms: Sequence[Measured], rows: Sequence[Sequence[float]]) -> Calibration:
    gpu = statistics.mode(m.gpu for m in ms)
    startup, a, b = _fit(rows)
    peak = peak_flops(gpu)
    return Calibration(
        cluster=cluster,
        gpu=gpu,
        startup_s=startup,
        per_token_s=a,
        per_flop_s=b,
        cells=tuple(m.cell for m in ms),
        sizes=_sizes(m.params for m in ms),
        peak=peak[1] if peak else None,
    )


def leave_one_out(cells: Iterable[Measured]) -> dict[str, Calibration]:
    """Each cell -> its cluster's calibration from the other cells."""
    by_cluster: dict[str, list[Measured]] = {}
    for m in cells:
        if m.seconds > 0 and m.gpus > 0 and m.flops > 0 and m.tokens > 0:
            by_cluster.setdefault(m.cluster, []).append(m)
    out = {}
    for cluster, ms in by_cluster.items():
        rows = _rows(ms)
        for i, m in enumerate(ms):
            if len(ms) < 2:
                continue
            out[m.cell] = _calibration(cluster, ms[:i] + ms[i + 1 :], rows[:i] + rows[i + 1 :])
    return out


def throughput(
    cluster: str,
    gpu: str,
    calibrations: Mapping[str, Calibration] | None = None,
    peak_tflops: float | None = None,
    default_mfu: float | None = None,
    leave_out: str = "",
) -> Throughput | None:
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
    return Throughput(
        0.0,
        1.0 / (mfu * value),
        0.0,
        "default",
        (
            f"MFU {mfu:.3g} (the default) x {key} dense bf16 peak {value / 1e12:.4g} TFLOP/s"
            if key == "CPU"
            else f"compute at MFU {mfu:.3g} (the default) of the {key}'s dense bf16 peak {value / 1e12:.4g} TFLOP/s,"
            " with the layout's recompute, dispatch, exchange and offload"
        )
        + f" (no completed cell on {cluster} yet; start-up not counted)",
        value,
    )
