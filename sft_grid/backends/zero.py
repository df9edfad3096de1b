"""DeepSpeed ZeRO for the cells whose layout shards (planning/gpus.py): the JSON every backend is pointed at
(`deepspeed:`).

The layout decides the stage (2: gradients and optimizer states sharded; 3: parameters too) and the CPU offload
(optimizer states, or parameters as well), from the model's size, the cutoff and the site's GPU memory: a model
that is too large for data parallelism alone gets ZeRO-3 without anyone remembering. Under ZeRO-3 the parameters
stay sharded at save time (`stage3_gather_16bit_weights_on_model_save: false`, as the team's 32B configs do:
gathering 32B on one rank runs out of memory), so the trainer writes ZeRO shards (global_stepN/) and the cell's
`consolidate` stage (sft_grid/stages/post_training.py) turns them into safetensors after training.

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


def needed(cell: Cell) -> bool:
    return cell.layout.deepspeed


def file_name(cell: Cell) -> str:
    """ds_zero2.json or ds_zero3.json: the stage in the name a person reads in the cell directory."""
    return f"ds_{cell.layout.sharding}.json"


def shards_at_save(cell: Cell) -> bool:
    """Whether the trainer saves ZeRO shards that the cell's consolidate stage turns into weights (ZeRO-3)."""
    return cell.layout.sharding == "zero3"


def config(cell: Cell) -> dict[str, Any]:
    s, lay = cell.spec, cell.layout
    zero: dict[str, Any] = {
        "stage": 3 if lay.sharding == "zero3" else 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if lay.sharding == "zero3":
        zero.update(
            {
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": 1e9,
                "stage3_max_reuse_distance": 1e9,
                "stage3_gather_16bit_weights_on_model_save": False,
            }
        )
    else:
        zero.update({"allgather_partitions": True, "reduce_scatter": True, "allgather_bucket_size": 5e8})
    if lay.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.offload == "all":
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
    """{ds_zero<stage>.json: config} for a cell whose layout shards, else nothing."""
    return {file_name(cell): config(cell)} if needed(cell) else {}


def path(cell: Cell, cell_dir: Path) -> str:
    """What a backend's `deepspeed:` key names."""
    return str(cell_dir / file_name(cell))
