"""Each cell as the GPU runs it: its memory per GPU, and the layout chosen so that it fits. Pure, stdlib.

A cell's layout is how it is spread over GPUs and what keeps it in memory: nodes, sharding (none: plain data
parallel; DeepSpeed ZeRO-2: gradients and optimizer states sharded; ZeRO-3: parameters too), CPU offload,
activation checkpointing, packing, the attention kernel and Liger's fused kernels. Every `auto`/null of the
cell's `layout:` (and `nodes`, `packing`) is chosen here; what the cell sets is kept, and refused with the
numbers when it cannot fit (planning/validate.py). The same `Layout` is what both backends render, what the
dry run shows and what the estimate prices: one decision, read everywhere.

The memory model (bytes per GPU at the peak of a training step):

* Model states, as each backend holds them. LLaMA-Factory upcasts the trainable parameters to fp32 unless the
  run is pure bf16 or sharded by ZeRO-3 (its adapter.py: "Upcasting trainable params to float32"), so plain data
  parallel keeps fp32 weights, fp32 gradients and Adam's two fp32 moments: 16 bytes a parameter on every GPU.
  axolotl's `bf16: true` loads the model in bfloat16 with no fp32 master (axolotl has no pure_bf16 switch): 2 + 2
  + Adam's moments in the parameters' dtype, 4 = 8 bytes. Under DeepSpeed (either backend) the engine holds bf16
  parameters and gradients and an fp32 master copy with Adam's moments in its optimizer, and its own estimators
  count (deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs, stage_1_and_2.py
  estimate_zero2_model_states_mem_needs):
    ZeRO-2:                 2 N + 18 N / world          (bf16 parameters whole; 16- and 32-bit gradients, the
                                                         fp32 master and Adam's moments sharded)
    ZeRO-2, optimizer off:  2 N
    ZeRO-3:                 4 L + 18 N / world          (L: the largest layer's parameters, gathered with its
                                                         gradient while it computes)
    ZeRO-3, optimizer off:  4 L + 2 N / world
    ZeRO-3, all off:        4 L
  fp32 training (CPU-only clusters) is 16 bytes a parameter under every backend. A LoRA or freeze cell counts
  these for the parameters it trains (`trainable_params`) and its frozen weights in the compute dtype.
* Activations kept for the backward pass, per token and decoder layer, in the compute dtype (a Llama/Qwen
  layer: RMSNorm, q/k/v projections with grouped-query k/v, RoPE, attention, o projection, RMSNorm, SwiGLU MLP):
  the attention half saves its norm's input, the projections' input, q, k, v, the rotated q and k and the
  attention output (7 h + 3 kv values, kv = the key/value width); the MLP half its norm's input and output, the
  gate, up, activated gate and their product (2 h + 4 i); both RMSNorms also keep their input upcast to fp32
  (transformers' LlamaRMSNorm / Qwen3RMSNorm: 2 x 4 h bytes). Eager attention also keeps its scores and
  probabilities (2 x heads x sequence values a token); sdpa and FlashAttention keep only the output and a
  log-sum-exp. This is Korthikanti et al. 2022's count ("Reducing Activation Recomputation in Large Transformer
  Models", sec. 4.1) for a SwiGLU layer with memory-efficient attention. With checkpointing each layer keeps only
  its input (2 h bytes a token) and one layer at a time is recomputed in full: layers x 2 h + 2 x one layer.
  The tokens are micro batch x cutoff_len: packed sequences always fill it, and an unpacked batch does as soon as
  one example is as long as the cutoff (the first such example is where an unfitted cell dies, maybe hours in).
* The logits: tokens x vocabulary in bf16, their fp32 upcast for the loss (transformers' ForCausalLMLoss) and its
  gradient: 10 bytes an entry (fp32 training: 12). Liger's fused linear cross-entropy never makes the whole
  tensor: it computes the loss in chunks of about tokens / ceil(vocab / hidden) rows (its
  LigerFusedLinearCrossEntropyFunction), so what stays is about the hidden states and their gradient in fp32
  (8 bytes a hidden value) besides one chunk.
* The framework: the CUDA context, NCCL's buffers and cuBLAS's workspace (FRAMEWORK_GIB), and the caching
  allocator's fragmentation (FRAGMENTATION of the rest).

The GPU's memory is the cluster's `gpu_mem_gb` (GiB, as nvidia-smi totals it); a layout fits within USABLE of it.
A cell on a CPU-only cluster has no GPU memory to model: its layout is what it sets (unset: one node, no sharding,
no checkpointing, unpacked).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sft_grid.core.schema import CellConf, exact_params

GIB = float(2**30)
FRAMEWORK_GIB = 2.0
FRAGMENTATION = 0.10
# A layout fits when its predicted peak is within this share of the GPU's memory: the margin for what the model does
# not count (a longer-than-usual sequence's buffers, NCCL's growth, a collective's staging), since a cell that runs out
# of memory does so at the first such step, possibly hours in
USABLE = 0.95
# the logits' width where the model states no vocab_size: its tokenizer family's
FAMILY_VOCAB = {"llama3": 128256, "delphi": 128256, "qwen3": 151936}
# ZeRO shardings and offloads, lightest first: the order the chooser tries them in
SHARDING_ORDER = ("none", "zero2", "zero3")
OFFLOAD_ORDER = ("none", "optimizer", "all")
# the shardings each CPU offload runs under: DeepSpeed offloads the optimizer states under ZeRO-2 and 3 and the
# parameters (offload_param) under ZeRO-3 alone; without DeepSpeed nothing is offloaded
OFFLOADS_UNDER = {"optimizer": ("zero2", "zero3"), "all": ("zero3",)}
# most nodes the chooser tries when the cluster states no max_nodes
NODE_CAP = 64


@dataclass(frozen=True)
class Shape:
    """What the memory model reads of a model."""

    params: int
    layers: int | None
    hidden: int | None
    heads: int | None
    kv_heads: int | None
    intermediate: int | None
    vocab: int | None

    @property
    def known(self) -> bool:
        """Whether activations and logits can be modelled (the layers and hidden size are stated)."""
        return bool(self.layers and self.hidden)

    @property
    def largest_layer(self) -> int:
        """The largest single module's parameters (what ZeRO-3 gathers whole): the embedding or an MLP matrix."""
        if not self.hidden:
            return 0
        return max((self.vocab or 0) * self.hidden, self.hidden * (self.intermediate or 4 * self.hidden))


def shape_of(spec: CellConf) -> Shape:
    m = spec.model
    return Shape(
        params=exact_params(m),
        layers=m.num_layers,
        hidden=m.hidden_size,
        heads=m.num_heads,
        kv_heads=m.num_kv_heads or m.num_heads,
        intermediate=m.intermediate_size,
        vocab=m.vocab_size or FAMILY_VOCAB.get(m.tokenizer_family),
    )


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU at the peak of a step, by part (module docstring)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float | None  # None: the model's shape is not stated
    logits: float | None
    framework: float

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.states + (self.activations or 0.0) + (self.logits or 0.0) + self.framework

    def parts(self) -> list[tuple[str, float | None]]:
        return [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer", self.optimizer),
            ("activations", self.activations),
            ("logits", self.logits),
            ("framework", self.framework),
        ]

    def text(self) -> str:
        """'weights 19.4 + gradients ... = 61.2 GiB'."""
        shown = " + ".join(f"{name} {'?' if v is None else f'{v / GIB:.1f}'}" for name, v in self.parts())
        return f"{shown} = {self.total / GIB:.1f} GiB"


@dataclass(frozen=True)
class Layout:
    """How one cell runs: what both backends render, the dry run shows and the estimate prices."""

    nodes: int
    gpus_per_node: int  # 0: a CPU-only node (one process)
    sharding: str  # none, zero2, zero3
    offload: str  # none, optimizer, all
    checkpointing: bool
    packing: bool
    attention: str  # eager, sdpa, fa2, fa3
    liger: bool
    fused_adamw: bool
    memory: Memory | None  # None on CPU-only clusters
    gpu_mem_gb: float | None  # the GPU's memory; None: not stated (nothing is checked)
    # (key, value) of what the cell set itself, of nodes, sharding, offload and checkpointing: the rest was chosen
    fixed: tuple[tuple[str, object], ...] = ()

    @property
    def world(self) -> int:
        return self.nodes * max(1, self.gpus_per_node)

    @property
    def deepspeed(self) -> bool:
        return self.sharding != "none"

    @property
    def fits(self) -> bool:
        if self.memory is None or not self.gpu_mem_gb:
            return True
        return self.memory.total <= USABLE * self.gpu_mem_gb * GIB

    def summary(self) -> str:
        """'2 x 4 GPUs, ZeRO-3, optimizer offload, checkpointing, packed, fa2, liger'."""
        parts = [f"{self.nodes} x {self.gpus_per_node} GPUs" if self.gpus_per_node else f"{self.nodes} node(s), CPU"]
        if self.sharding != "none":
            parts.append(self.sharding.replace("zero", "ZeRO-"))
        if self.offload != "none":
            parts.append(f"{self.offload} offload")
        parts += [p for p, on in (("checkpointing", self.checkpointing), ("packed", self.packing)) if on]
        parts.append(self.attention)
        if self.liger:
            parts.append("liger")
        return ", ".join(parts)


# -- the memory model -------------------------------------------------------------------------------------------


def model_states(
    backend: str, precision: str, sharding: str, offload: str, shape: Shape, world: int, trainable: int | None = None
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU (module docstring). `trainable`: the parameters that train
    (LoRA's adapters, freeze's last layers; None: all): the rest is frozen weights in the compute dtype, sharded
    under ZeRO-3, with no gradient and no optimizer state."""
    world = max(1, world)
    if trainable is not None and trainable < shape.params:
        frozen = (shape.params - trainable) * (4.0 if precision == "fp32" else 2.0)
        if sharding == "zero3":
            frozen = 0.0 if offload == "all" else frozen / world
        w, g, o = model_states(
            backend, precision, sharding, offload, dataclasses.replace(shape, params=trainable), world
        )
        return w + frozen, g, o
    n = float(shape.params)
    if sharding == "none":
        if precision == "fp32" or backend != "axolotl":
            return 4 * n, 4 * n, 8 * n  # fp32 weights (LLaMA-Factory upcasts), fp32 gradients, Adam in fp32
        return 2 * n, 2 * n, 4 * n  # axolotl's pure bf16: Adam's moments in bf16 too
    if sharding == "zero2":
        if offload != "none":
            return 2 * n, 0.0, 0.0
        return 2 * n, 6 * n / world, 12 * n / world
    gathered = 4.0 * shape.largest_layer  # one layer's gathered bf16 parameters and gradient
    if offload == "all":
        return gathered, 0.0, 0.0
    if offload == "optimizer":
        return gathered + 2 * n / world, 0.0, 0.0
    return gathered + 2 * n / world, 4 * n / world, 12 * n / world


def trainable_params(spec: CellConf, shape: Shape) -> int:
    """The parameters a cell trains: all of them (full), LoRA's adapters on every linear layer of every decoder layer
    (rank 8, both backends' default here, or the rank `extra` gives LLaMA-Factory: lora_rank), or LLaMA-Factory's
    freeze tuning's last layers (freeze_trainable_layers, 2). All of them where the shape is not stated or `extra`
    trains more (additional_target, freeze_extra_modules): what cannot be counted is counted whole."""
    n, extra = shape.params, spec.extra or {}
    if spec.finetuning_type not in ("lora", "freeze") or not shape.known or not shape.layers:
        return n
    if extra.get("additional_target") or extra.get("freeze_extra_modules") or extra.get("lora_modules_to_save"):
        return n
    h = shape.hidden or 0
    kv = h * (shape.kv_heads or 1) // (shape.heads or 1) if shape.heads else h
    i = shape.intermediate or 4 * h
    if spec.finetuning_type == "lora":
        rank = extra.get("lora_rank", extra.get("lora_r", 8))
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else None
        if rank is None:
            return n
        # q and o: h -> h; k and v: h -> kv; gate and up: h -> i; down: i -> h; an adapter is rank x (in + out)
        return min(n, shape.layers * rank * (9 * h + 2 * kv + 3 * i))
    layers = extra.get("freeze_trainable_layers", 2)
    if not isinstance(layers, int) or isinstance(layers, bool) or not layers:
        return n
    return min(n, abs(layers) * (2 * h * h + 2 * h * kv + 3 * h * i))


def layer_activation_bytes(shape: Shape, seq: int, attention: str, dtype_bytes: int) -> float:
    """Bytes one decoder layer keeps for the backward pass, per token (module docstring)."""
    h = float(shape.hidden or 0)
    kv = h * (shape.kv_heads or 1) / (shape.heads or 1) if shape.heads else h
    i = float(shape.intermediate or 4 * h)
    values = 7 * h + 3 * kv + 2 * h + 4 * i
    if attention == "eager":
        values += 2 * (shape.heads or 1) * seq
    return dtype_bytes * values + 2 * 4 * h


def activations(shape: Shape, tokens: int, seq: int, attention: str, checkpointing: bool, precision: str) -> float:
    dtype_bytes = 4 if precision == "fp32" else 2
    layer = layer_activation_bytes(shape, seq, attention, dtype_bytes) * tokens
    if checkpointing:
        return (shape.layers or 0) * dtype_bytes * (shape.hidden or 0) * tokens + 2 * layer
    return (shape.layers or 0) * layer


def logits(shape: Shape, tokens: int, liger: bool, precision: str) -> float:
    if liger:
        return 8.0 * tokens * (shape.hidden or 0)
    per = 12 if precision == "fp32" else 10
    return float(per) * tokens * (shape.vocab or 0)


def memory(
    spec: CellConf,
    *,
    world: int,
    sharding: str,
    offload: str,
    checkpointing: bool,
    attention: str,
    liger: bool,
    shape: Shape | None = None,
) -> Memory:
    """A cell's bytes per GPU for one layout."""
    shape = shape or shape_of(spec)
    precision = spec.cluster.precision
    w, g, o = model_states(
        spec.backend.name, precision, sharding, offload, shape, world, trainable=trainable_params(spec, shape)
    )
    act = lgt = None
    if shape.known:
        tokens = spec.micro_batch_size * spec.cutoff_len
        act = activations(shape, tokens, spec.cutoff_len, attention, checkpointing, precision)
        lgt = logits(shape, tokens, liger, precision)
    rest = w + g + o + (act or 0.0) + (lgt or 0.0)
    return Memory(w, g, o, act, lgt, FRAMEWORK_GIB * GIB + FRAGMENTATION * rest)


# -- the chooser ------------------------------------------------------------------------------------------------


def _kernels(spec: CellConf) -> tuple[str, bool]:
    """(attention, liger) from the cell's choice, else what the cluster's environment has."""
    c, lay = spec.cluster, spec.layout
    gpu = c.gpus_per_node > 0
    attention = lay.attention
    if attention == "auto":
        attention = ("fa2" if "flash_attn" in c.kernels else "sdpa") if gpu else "eager"
    liger = lay.liger if lay.liger is not None else (gpu and "liger_kernel" in c.kernels)
    return attention, bool(liger)


def _node_options(spec: CellConf) -> list[int]:
    """Node counts to try, fewest first: the cell's own, else every count the global batch divides evenly."""
    if spec.nodes is not None:
        return [spec.nodes]
    c = spec.cluster
    per_node = max(1, c.gpus_per_node) * max(1, spec.micro_batch_size)
    cap = 1 if c.executor == "local" else min(c.max_nodes or NODE_CAP, NODE_CAP)
    even = [n for n in range(1, cap + 1) if spec.global_batch_size % (per_node * n) == 0]
    return even or [1]


def _sharding_options(spec: CellConf) -> list[str]:
    # a value outside SHARDING_ORDER (a typo: zero9) is chosen as auto: the schema's value rule refuses it with the
    # valid ones, and the grid's other rules, which read the layout, must not crash on it first
    if spec.layout.sharding in SHARDING_ORDER:
        return [spec.layout.sharding]
    if "zero3" in spec.model.needs:  # the model's own floor (its config says it never trains unsharded)
        return ["zero3"]
    # an offload the cell sets is DeepSpeed's: the optimizer's under ZeRO-2 or 3, the parameters' under ZeRO-3 only
    if spec.cluster.gpus_per_node and spec.layout.offload in OFFLOADS_UNDER:
        return list(OFFLOADS_UNDER[spec.layout.offload])
    return list(SHARDING_ORDER) if spec.cluster.gpus_per_node else ["none"]


def _offload_options(spec: CellConf, sharding: str) -> list[str]:
    if spec.layout.offload in OFFLOAD_ORDER:  # a typo (cpu) as auto: as in _sharding_options
        return [spec.layout.offload]
    if "zero3_offload" in spec.model.needs:
        return ["all"]
    return list(OFFLOAD_ORDER) if sharding == "zero3" else ["none"]


def _fixed(spec: CellConf) -> tuple[tuple[str, object], ...]:
    lay = spec.layout
    named = (
        ("nodes", spec.nodes, spec.nodes is not None),
        ("layout.sharding", lay.sharding, lay.sharding != "auto"),
        ("layout.offload", lay.offload, lay.offload != "auto"),
        ("layout.checkpointing", lay.checkpointing, lay.checkpointing is not None),
    )
    return tuple((k, v) for k, v, on in named if on)


def candidates(spec: CellConf) -> Iterator[Layout]:
    """Every layout the cell allows, cheapest first: no offload before offload (CPU memory and PCIe are slow), then
    the fewest nodes, then the lightest sharding (less to exchange), then no recompute."""
    c = spec.cluster
    attention, liger = _kernels(spec)
    packing = spec.packing if spec.packing is not None else c.gpus_per_node > 0
    shape = shape_of(spec)
    gpu = c.gpus_per_node > 0
    checkpoints = [spec.layout.checkpointing] if spec.layout.checkpointing is not None else [False, True]
    fixed = _fixed(spec)
    tried: list[tuple[str, int, str, bool]] = []
    for sharding in _sharding_options(spec):
        for offload in _offload_options(spec, sharding):
            for nodes, ckpt in itertools.product(_node_options(spec), checkpoints):
                tried.append((offload, nodes, sharding, ckpt))
    tried.sort(key=lambda t: (OFFLOAD_ORDER.index(t[0]), t[1], SHARDING_ORDER.index(t[2]), t[3]))
    for offload, nodes, sharding, ckpt in tried:
        world = nodes * max(1, c.gpus_per_node)
        mem = (
            memory(
                spec,
                world=world,
                sharding=sharding,
                offload=offload,
                checkpointing=ckpt,
                attention=attention,
                liger=liger,
                shape=shape,
            )
            if gpu
            else None
        )
        yield Layout(
            nodes=nodes,
            gpus_per_node=c.gpus_per_node,
            sharding=sharding,
            offload=offload,
            checkpointing=ckpt,
            packing=bool(packing),
            attention=attention,
            liger=liger,
            fused_adamw=gpu,
            memory=mem,
            gpu_mem_gb=c.gpu_mem_gb if gpu else None,
            fixed=fixed,
        )


def choose(spec: CellConf) -> Layout:
    """The cheapest layout that fits the GPU's memory (`candidates`' order); when none does, the one that needs the
    least memory, which validation refuses with its numbers. A CPU-only cell, or a GPU whose memory the cluster does
    not state, gets the first: nothing to fit."""
    options = list(candidates(spec))
    for option in options:
        if option.fits:
            return option
    return min(options, key=lambda o: o.memory.total if o.memory else 0.0)


def fixes(spec: CellConf, layout: Layout) -> list[str]:
    """What would make a cell that cannot fit fit, each tried against the model: the first of each kind that does."""
    found: list[str] = []

    def fits(**changes: Any) -> bool:
        lay = dataclasses.replace(
            spec.layout, **{k: v for k, v in changes.items() if k in ("sharding", "offload", "checkpointing", "liger")}
        )
        top = {k: v for k, v in changes.items() if k in ("nodes", "micro_batch_size", "cutoff_len")}
        return choose(dataclasses.replace(spec, layout=lay, **top)).fits

    if spec.layout.sharding != "auto" and fits(sharding="auto"):
        found.append("let sft_grid choose the sharding (drop layout.sharding)")
    if spec.layout.offload != "auto" and fits(offload="auto"):
        found.append("let sft_grid choose the offload (drop layout.offload)")
    if spec.layout.checkpointing is False and fits(checkpointing=None):
        found.append("layout.checkpointing=true (or drop it)")
    if spec.nodes is not None and fits(nodes=None):
        found.append("let sft_grid choose the nodes (drop nodes)")
    if not layout.liger and spec.layout.liger is not True and fits(liger=True):
        found.append("layout.liger=true (install liger-kernel in the site's environment: cluster.kernels)")
    if spec.micro_batch_size > 1 and fits(micro_batch_size=1):
        found.append("micro_batch_size=1")
    cutoff = spec.cutoff_len // 2
    while cutoff >= 512 and not fits(cutoff_len=cutoff):
        cutoff //= 2
    if cutoff >= 512 and cutoff < spec.cutoff_len:
        found.append(f"cutoff_len={cutoff}")
    if not found:
        found.append("a site whose GPUs have more memory (cluster=..., or sites=[...])")
    return found
