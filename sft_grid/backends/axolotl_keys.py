"""axolotl config keys that follow from the cell's model, cluster and reporting settings (pure): its chat template,
attention, precision, W&B or TensorBoard, and LoRA. sft_grid/backends/axolotl.py assembles the config."""

from __future__ import annotations

from typing import Any

from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.cells import Cell


def chat_template(cell: Cell) -> dict[str, Any]:
    """axolotl's template of the same name, or sft_grid's own jinja text inline (`chat_template: jinja`)."""
    template = TEMPLATES[cell.spec.model.template]
    if template.jinja:
        return {"chat_template": "jinja", "chat_template_jinja": template.jinja_text(),
                **({"eot_tokens": [template.eot]} if template.eot else {})}
    return {"chat_template": template.axolotl}


def attention(cell: Cell) -> str:
    """sdpa on GPUs: torch's own kernels (flash and memory-efficient attention inside), no flash-attn build
    to match each site's CUDA, and the only choice on aarch64 (GH200) where flash-attn wheels are missing;
    eager on CPU clusters, where sdpa buys nothing for tiny models."""
    if cell.spec.cluster.gpus_per_node == 0:
        return "eager"
    return "sdpa"


def precision(cell: Cell) -> dict[str, Any]:
    """bf16 weights on GPU sites. axolotl 0.19 has no `pure_bf16` key (an unknown key is silently dropped):
    `bf16: true` loads the model in bfloat16 (torch_dtype), so there are no fp32 master weights (which would
    OOM an 8B on 96 GiB). Elsewhere fp32, said explicitly: axolotl's bf16 `auto` falls back to fp16."""
    if cell.spec.cluster.precision == "bf16":
        return {"bf16": True, "bfloat16": True, "fp16": False, "tf32": True}
    return {"bf16": False, "fp16": False, "tf32": False}


def reporting(cell: Cell) -> dict[str, Any]:
    """W&B: one run per cell, named after it, in a project named after the grid; the run id comes from
    launch.sh (WANDB_RUN_ID), so a requeued job continues the same run."""
    s = cell.spec
    if s.report_to == "wandb":
        return {"use_wandb": True, "wandb_project": s.sweep_name, "wandb_name": cell.name,
                "wandb_mode": s.cluster.env.get("WANDB_MODE", "online")}
    out: dict[str, Any] = {"use_wandb": False, "wandb_mode": "disabled"}
    if s.report_to == "tensorboard":
        out["use_tensorboard"] = True
    return out


def finetuning(cell: Cell) -> dict[str, Any]:
    """LoRA as LLaMA-Factory's defaults have it (rank 8, alpha 16, every linear layer); full otherwise."""
    if cell.spec.finetuning_type == "lora":
        return {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
    return {}
