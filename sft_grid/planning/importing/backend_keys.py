"""Where each key of a backend's config goes in sft_grid: the keys its renderer derives (never carried in `extra`:
backends/extra.py refuses those), the keys sft_grid decides for every cell and why, the hyperparameters it models
with the backend's default where a key is absent, and the backend's own `train_defaults`. Each backend's names for
sft_grid's other choices (attention kernels, chat templates) are read where its config is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sft_grid.core import project
from sft_grid.planning.importing.terms import AX, LF

# -- what each backend's renderer derives ------------------------------------------------------------------------

LF_DERIVED = frozenset(
    [
        "model_name_or_path",
        "template",
        "finetuning_type",
        "dataset_dir",
        "dataset",
        "cutoff_len",
        "output_dir",
        "run_name",
        "logging_steps",
        "save_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "num_train_epochs",
        "lr_scheduler_type",
        "warmup_ratio",
        "weight_decay",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "seed",
        "report_to",
        "push_to_hub",
        "max_steps",
        "save_total_limit",
        "deepspeed",
        "model_revision",
        "tokenized_path",
        "mix_strategy",
        "interleave_probs",
        "bf16",
        "flash_attn",
        "disable_gradient_checkpointing",
        "packing",
        "neat_packing",
        "enable_liger_kernel",
        "optim",
    ]
)
AX_LIGER = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
AX_DERIVED = frozenset(
    [
        "base_model",
        "chat_template",
        "chat_template_jinja",
        "eot_tokens",
        "datasets",
        "dataset_prepared_path",
        "tokenizer_config",
        "output_dir",
        "sequence_len",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "learning_rate",
        "num_epochs",
        "lr_scheduler",
        "warmup_ratio",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "max_grad_norm",
        "seed",
        "logging_steps",
        "save_steps",
        "auto_resume_from_checkpoints",
        "attn_implementation",
        "gradient_checkpointing",
        "sample_packing",
        "optimizer",
        "bf16",
        "bfloat16",
        "fp16",
        "tf32",
        "use_wandb",
        "wandb_project",
        "wandb_name",
        "wandb_mode",
        "use_tensorboard",
        "adapter",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_linear",
        "tokenizer_save_jinja_files",
        "plugins",
        "max_steps",
        "save_total_limit",
        "deepspeed",
        "revision_of_model",
        *AX_LIGER,
    ]
)
DERIVED = {LF: LF_DERIVED, AX: AX_DERIVED}

# -- what sft_grid decides for every cell ---------------------------------------------------------------------------

# keys sft_grid decides for every cell, and why (a derived key not named here gets the generic reason)
DECIDED = {
    "output_dir": "each cell trains into its own <runs_root>/<sweep>/<cell>/output",
    "run_name": "the cell's name",
    "logging_dir": "the trainer's logs go under the cell's own output",
    "overwrite_output_dir": "a rerun moves the old output aside (transformers 5 rejects this key)",
    "dataset_dir": "the cell's own dataset_info.json, rendered from the dataset options",
    "dataset_prepared_path": "each distinct input is tokenized once, under runs_root/_tokenized (tokenize once)",
    "tokenized_path": "each distinct input is tokenized once, under runs_root/_tokenized (tokenize once)",
    "tokenizer_config": "the tokenizer is the model's (or the shared tokenized dataset's copy of it)",
    "resume_from_checkpoint": "a cell that died resumes from its newest checkpoint by itself",
    "auto_resume_from_checkpoints": "sft_grid turns it on for every axolotl cell",
    "optim": "AdamW: adamw_torch_fused on GPU sites (the layout's fused_adamw)",
    "optimizer": "AdamW: adamw_torch_fused on GPU sites, adamw_torch on the CPU (the layout's fused_adamw)",
    "bf16": "the cluster's precision: bf16 on GPU sites, fp32 on the CPU",
    "bfloat16": "the cluster's precision: bf16 on GPU sites, fp32 on the CPU",
    "fp16": "the cluster's precision: bf16 on GPU sites, fp32 on the CPU (never fp16)",
    "tf32": "the cluster's precision: tf32 on with bf16",
    "tokenizer_save_jinja_files": "off: the template goes into tokenizer_config.json, where serving stacks read it",
    "chat_template_jinja": "the model option's template (sft_grid's own jinja for templates axolotl lacks)",
    "eot_tokens": "the model option's template",
    "wandb_name": "the cell's name",
    "wandb_mode": "the cluster's WANDB_MODE (online unless it says otherwise)",
    "wandb_project": "the grid's name (sweep_name), one W&B run a cell",
    "use_wandb": "report_to",
    "use_tensorboard": "report_to",
    "saves_per_epoch": "sft_grid saves every save_steps (axolotl refuses both at once)",
    "lora_r": "sft_grid's LoRA: rank 8, alpha 16, dropout 0, every linear layer (finetuning_type=lora)",
    "lora_alpha": "sft_grid's LoRA: rank 8, alpha 16, dropout 0, every linear layer (finetuning_type=lora)",
    "lora_dropout": "sft_grid's LoRA: rank 8, alpha 16, dropout 0, every linear layer (finetuning_type=lora)",
    "lora_target_linear": "sft_grid's LoRA: rank 8, alpha 16, dropout 0, every linear layer (finetuning_type=lora)",
    "template": "the model option's template",
    "chat_template": "the model option's template",
}


def train_defaults(kind: str, cwd: Path) -> dict[str, Any]:
    """The backend's `train_defaults` (conf/backend/<kind>.yaml, the team's option of that name first, as Hydra
    composes it): keys every rendered config holds already, so an original's key that says the same is sft_grid's
    to set, not one to carry in `extra` (where it would be part of the cell's identity for nothing)."""
    path = project.find_option("backend", kind, cwd)
    try:
        data = yaml.safe_load(path.read_text()) if path is not None else None
    except (OSError, yaml.YAMLError):
        return {}
    defaults = data.get("train_defaults") if isinstance(data, dict) else None
    return dict(defaults) if isinstance(defaults, dict) else {}


def same_value(ours: Any, theirs: Any) -> bool:
    """Equal as the backend reads them: 0 is 0.0, and a boolean is equal only to a boolean (True is not 1)."""
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return type(ours) is type(theirs) and ours == theirs
    return bool(ours == theirs)


# -- modelled hyperparameters ---------------------------------------------------------------------------------------

# backend key -> (the cell's key, the backend's default where the key is absent; None: no default known here,
# sft_grid's own applies). Both backends name the optimizer's and the seed's keys alike, with the same defaults.
SHARED_SCALARS: dict[str, tuple[str, Any]] = {
    "warmup_ratio": ("warmup_ratio", 0.0),
    "weight_decay": ("weight_decay", 0.0),
    "max_grad_norm": ("max_grad_norm", 1.0),
    "adam_beta1": ("adam_beta1", 0.9),
    "adam_beta2": ("adam_beta2", 0.999),
    "seed": ("seed", 42),
}
LF_SCALARS: dict[str, tuple[str, Any]] = {
    "learning_rate": ("lr", 5.0e-5),
    "num_train_epochs": ("epochs", 3.0),
    "max_steps": ("max_steps", None),
    "cutoff_len": ("cutoff_len", 2048),
    "lr_scheduler_type": ("scheduler", "linear"),
    **SHARED_SCALARS,
    "finetuning_type": ("finetuning_type", "lora"),
    "logging_steps": ("logging_steps", 500),
    "save_steps": ("save_steps", 500),
    "save_total_limit": ("save_total_limit", None),
}
AX_SCALARS: dict[str, tuple[str, Any]] = {
    "learning_rate": ("lr", None),
    "num_epochs": ("epochs", 1.0),
    "max_steps": ("max_steps", None),
    "sequence_len": ("cutoff_len", None),
    "lr_scheduler": ("scheduler", "cosine"),
    **SHARED_SCALARS,
    "logging_steps": ("logging_steps", None),
    "save_steps": ("save_steps", None),
    "save_total_limit": ("save_total_limit", None),
}
# the cell's keys whose values are numbers (a YAML `2e-5` reads as text: axolotl's pydantic casts it, so does this)
FLOATS = {"lr", "epochs", "warmup_ratio", "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2"}
INTS = {"max_steps", "cutoff_len", "seed", "logging_steps", "save_steps", "save_total_limit"}
