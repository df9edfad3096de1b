"""What a cell will cost before it is launched: tokens, training FLOPs, GPU-hours, wall time, disk. Pure, stdlib.

Tokens (what the GPUs process, prompt tokens included: masking a token out of the loss does not skip its
forward and backward pass). Each data source comes with the tokenised lengths of a sample of its rows (the
loss-mask probe's, through the backend's own preprocessing, chat template applied) and the rows the cell takes
from it per epoch (after mixing). Lengths are capped at cutoff_len (longer examples are truncated). Then
  * epochs:    D = epochs * sum_s rows_s * mean_s(min(len, cutoff)); steps = ceil(epochs * ceil(rows / gbs))
  * max_steps: D = max_steps * global_batch * mean length, the mean over the mix weighted by rows
               (max_steps > 0 wins over epochs, as in the HF Trainer)
  * packing:   examples are concatenated into cutoff_len blocks, so a step is global_batch * cutoff tokens.

FLOPs = 6 N D + 12 n_layers d_attn sum_seq s^2.
  * 6 N D: forward 2 N + backward 4 N per token (Kaplan et al. 2020, "Scaling Laws for Neural Language
    Models", sec. 2.1). N is the model's stated parameter count (params_b), as Hoffmann et al. 2022 count.
  * attention: PaLM's accounting (Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per token, H Q = d_attn,
    T the attended length; QK^T and AV, forward and backward, no discount for the causal mask). Unpacked, a
    token attends within its own example, so T summed over tokens is sum over examples of s^2. Packed, T is
    cutoff_len for every token (attention crosses example boundaries within a block; the upper bound).
    MFU figures are quoted in this same convention, so a default MFU and this count agree.

Time comes from a `Throughput` (planning/throughput.py): a per-cluster calibration from completed cells, or a
stated default MFU x the GPU type's peak.

Disk: a checkpoint holds the weights (2 bytes/param in bf16/fp16, 4 in fp32) and, when the optimizer is
saved, Adam's two fp32 moments (8 bytes/param) plus, for 16-bit weights, the fp32 master copy that mixed
precision keeps (4 bytes/param; DeepSpeed writes it in its optimizer shards). Checkpoints kept =
min(save_total_limit, ceil(total_steps / save_steps)) (one every save_steps and one at the last step), or
every one when the limit is unset. The final model (weights only) comes on top.

Not counted: evaluation, checkpoint write time, padding within a batch, recomputation under activation
checkpointing (~+33% FLOPs when on). Start-up (loading, tokenising) is counted where a calibration measured it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from sft_grid.planning.throughput import Throughput

BYTES_PER_WEIGHT = {"bf16": 2, "fp16": 2, "fp32": 4}
ADAM_MOMENT_BYTES = 8  # exp_avg and exp_avg_sq, fp32
MASTER_WEIGHT_BYTES = 4  # fp32 master copy kept beside 16-bit weights


@dataclass(frozen=True)
class Source:
    """One data source of a cell: its rows per epoch (after mixing) and a sample of its tokenised lengths."""

    name: str
    rows: float
    lengths: tuple[int, ...]


@dataclass(frozen=True)
class Model:
    params: float  # N in 6ND
    n_layers: int
    d_attn: int  # attention width: heads x head_dim (the hidden size for most models)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Tokens:
    sequences: int  # examples (or packed blocks) processed
    steps: int
    tokens: float
    attended: float  # sum over tokens of the attended length (sum of s^2 unpacked)


@dataclass(frozen=True)
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

    def to_json(self) -> dict[str, object]:
        tp = self.throughput
        return {"tokens": self.tokens.tokens, "sequences": self.tokens.sequences, "steps": self.tokens.steps,
                "attended": self.tokens.attended, "flops": self.flops, "flops_dense": self.flops_dense,
                "flops_attention": self.flops_attention, "gpu_hours": self.gpu_hours,
                "wall_seconds": self.wall_seconds, "throughput": None if tp is None else tp.to_json(),
                "checkpoint_bytes": self.checkpoint_bytes, "checkpoints_kept": self.checkpoints_kept,
                "disk_bytes": self.disk_bytes, "wall_budget_seconds": self.wall_budget_seconds,
                "exceeds_wall": self.exceeds_wall, "notes": list(self.notes)}


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
            return Tokens(sequences, steps, tokens, tokens * cutoff)
        return Tokens(sequences, steps, sequences * per_epoch / rows, sequences * sq_per_epoch / rows)
    if plan.packing:
        blocks = math.ceil(per_epoch / cutoff)
        steps = math.ceil(plan.epochs * math.ceil(blocks / gbs))
        tokens = plan.epochs * per_epoch
        return Tokens(math.ceil(plan.epochs * blocks), steps, tokens, tokens * cutoff)
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
    ratios = [r / p for r, p in zip(rows, probs) if p > 0]
    if not ratios:
        return list(rows)
    total = min(ratios) if strategy == "interleave_under" else max(ratios)
    return [p * total for p in probs]


def checkpoint_bytes(plan: CellPlan) -> float:
    try:
        weight = BYTES_PER_WEIGHT[plan.precision]
    except KeyError:
        raise ValueError(f"{plan.name}: precision {plan.precision!r} is not one of "
                         f"{sorted(BYTES_PER_WEIGHT)}") from None
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
    gpu_hours = wall = None
    if throughput is None:
        notes.append("no throughput: the cluster names no GPU type with a known peak and has no calibration")
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
        notes.append(f"estimated {wall / 3600:.1f} h exceeds the wall time {plan.max_time_s / 3600:.1f} h "
                     f"x (1 + {plan.requeues} requeue(s)) = {budget / 3600:.1f} h")
    return Estimate(plan.name, tok, flops, dense, attn, throughput, gpu_hours, wall, ckpt, kept, kept * ckpt + final,
                    budget, exceeds, tuple(notes))


def total_hours(estimates: Iterable[Estimate]) -> float:
    return sum(e.gpu_hours for e in estimates if e.gpu_hours is not None)
