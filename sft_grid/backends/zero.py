"""DeepSpeed ZeRO-3 for the models that need it: the JSON every backend is pointed at (`deepspeed:`).

Models too large for data parallelism alone (Qwen3-32B, Qwen3.5-27B) say `needs: [zero3, consolidate]` in
conf/model/, so their cells get ZeRO-3 without anyone remembering: render writes this JSON into the cell
directory and the backend's config names it. The parameters are sharded at save time as well
(`stage3_gather_16bit_weights_on_model_save: false`, as the team's 32B configs do: gathering 32B on one rank
runs out of memory), so the trainer writes ZeRO shards (global_stepN/) and the cell's `consolidate` stage
(sft_grid/stages/post_training.py) turns them into safetensors after training.

The batch keys are explicit rather than "auto": they come from the same cell values as the backend's own
(micro batch, derived accumulation), and with explicit keys DeepSpeed on CPU/gloo does not trip over
accelerate's single-process world size (measured: a 2-process ZeRO-3 run on CPU with "auto" batch keys failed
DeepSpeed's `train_batch_size ... 2 != 2 * 1 * 2` assertion; with explicit keys it trained). No train_batch_size:
DeepSpeed derives it from the world size it sees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sft_grid.planning.cells import Cell

DS_FILE = "ds_zero3.json"
ZERO3 = "zero3"
# CPU offload of optimizer state and parameters (the team's ds_z3_offload_nomat for 32B/27B on 64 GB GPUs)
OFFLOAD = "zero3_offload"


def needed(cell: Cell) -> bool:
    return ZERO3 in cell.spec.model.needs


def config(cell: Cell) -> dict[str, Any]:
    s = cell.spec
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": False,
    }
    if OFFLOAD in s.model.needs:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": s.micro_batch_size,
        "gradient_accumulation_steps": cell.grad_accum,
        "gradient_clipping": s.max_grad_norm,
        "bf16": {"enabled": s.cluster.precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def files(cell: Cell) -> dict[str, Any]:
    """{DS_FILE: config} for a cell that needs ZeRO-3, else nothing."""
    return {DS_FILE: config(cell)} if needed(cell) else {}


def path(cell_dir: Path) -> str:
    """What a backend's `deepspeed:` key names."""
    return str(cell_dir / DS_FILE)
