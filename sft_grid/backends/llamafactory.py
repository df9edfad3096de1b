"""A cell as LLaMA-Factory's own files: train_config.yaml and dataset_info.json, and its command.

Every dataset of a mix gets its own dataset_info.json entry with its own columns and tags, so a mix of
ShareGPT (from/value) and role/content data keeps the assistant turns of both; LLaMA-Factory's global
role-tag keys are never written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sft_grid.plan import Cell, is_local

NAME = "llamafactory"
CONFIG_FILE = "train_config.yaml"
DATASET_INFO = "dataset_info.json"


def dataset_info(cell: Cell) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name, ds in cell.spec.dataset.items():
        entry: dict[str, Any] = {"formatting": ds.formatting, "columns": {"messages": ds.messages}}
        if is_local(ds.source):
            entry["file_name"] = str(Path(ds.source).expanduser())
        else:
            entry["hf_hub_url"] = ds.source
            entry["split"] = ds.split
        tags = {k: v for k, v in vars(ds.tags).items() if v is not None}
        entry["tags"] = tags
        info[name] = entry
    return info


def train_config(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    s = cell.spec
    cfg: dict[str, Any] = dict(s.backend.train_defaults)
    cfg.update(
        {
            "model_name_or_path": s.model.path or s.model.hub_id,
            "template": s.model.template,
            "finetuning_type": s.finetuning_type,
            "dataset_dir": str(cell_dir),
            "dataset": ",".join(s.dataset),
            "cutoff_len": s.cutoff_len,
            "output_dir": str(cell_dir / "output"),
            "run_name": cell.name,
            "logging_steps": s.logging_steps,
            "save_steps": s.save_steps,
            "per_device_train_batch_size": s.micro_batch_size,
            "gradient_accumulation_steps": cell.grad_accum,
            "learning_rate": s.lr,
            "num_train_epochs": s.epochs,
            "lr_scheduler_type": s.scheduler,
            "warmup_ratio": s.warmup_ratio,
            "weight_decay": s.weight_decay,
            "max_grad_norm": s.max_grad_norm,
            "adam_beta1": s.adam_beta1,
            "adam_beta2": s.adam_beta2,
            "seed": s.seed,
            "report_to": s.report_to,
            "push_to_hub": s.push_to_hub,
        }
    )
    if s.max_steps > 0:
        cfg["max_steps"] = s.max_steps
    if s.save_total_limit is not None:
        cfg["save_total_limit"] = s.save_total_limit
    if s.hub_model_id:
        cfg["hub_model_id"] = s.hub_model_id
    if s.mix.strategy != "concat":
        cfg["mix_strategy"] = s.mix.strategy
        cfg["interleave_probs"] = ",".join(repr(float(p)) for p in s.mix.probs or ())
    if s.cluster.precision == "bf16":
        cfg["bf16"] = True
    if not s.warmup_ratio:
        # transformers 5 deprecates warmup_ratio; zero needs no key at all
        del cfg["warmup_ratio"]
    cfg.update(s.extra)
    return cfg


def files(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Structured files of the cell, as data: the renderer dumps each once."""
    return {CONFIG_FILE: train_config(cell, cell_dir), DATASET_INFO: dataset_info(cell)}


def command(cell: Cell, cell_dir: Path, env_bin: Path) -> list[str]:
    """The training command. Several ranks with `launcher: accelerate`: accelerate starts LLaMA-Factory's
    training module on each node (the variables are set by launch.sh from the Slurm allocation); otherwise
    LLaMA-Factory's CLI, which starts torchrun itself when FORCE_TORCHRUN is set."""
    config = str(cell_dir / CONFIG_FILE)
    if cell.world_size > 1 and cell.spec.cluster.launcher == "accelerate":
        device = ["--multi_gpu"]
        return [str(env_bin / "accelerate"), "launch", *device, "--num_machines=${NNODES}",
                "--machine_rank=${NODE_RANK}", "--main_process_ip=${MASTER_ADDR}", "--main_process_port=${MASTER_PORT}",
                "--num_processes=${WORLD_SIZE}", "-m", "llamafactory.launcher", config]
    return [str(env_bin / cell.spec.backend.entrypoint[0]), *cell.spec.backend.entrypoint[1:], config]
