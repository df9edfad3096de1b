"""A cell as LLaMA-Factory's own files: train_config.yaml and dataset_info.json, and its command.

Every dataset of a mix gets its own dataset_info.json entry with its own columns and tags, so a mix of
ShareGPT (from/value) and role/content data keeps the assistant turns of both; LLaMA-Factory's global
role-tag keys are never written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sft_grid.backends import common, zero
from sft_grid.backends.base import Backend, MaskSpec
from sft_grid.core.paths import IN_VENV_DIR
from sft_grid.core.problems import Problem
from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.inputs import dataset_source, hub_revision, model_source

NAME = "llamafactory"
CONFIG_FILE = "train_config.yaml"
DATASET_INFO = "dataset_info.json"
# Runs LLaMA-Factory with sft_grid's own jinja templates registered in each training process
WRAPPER = IN_VENV_DIR / "sft_grid_lf.py"
# LLaMA-Factory data arguments that change what is trained (the rest of train_config does not)
MASK_KEYS = (
    "template",
    "train_on_prompt",
    "mask_history",
    "tool_format",
    "default_system",
    "enable_thinking",
    "preserve_thinking",
)


def template_file(cell: Cell) -> str | None:
    """The cell's copy of its template's jinja (a template LLaMA-Factory does not ship), if any: copied into
    the cell directory so that the job trains with the template as rendered, whatever conf/ or the
    checkout says later, and a person sees it next to train_config.yaml."""
    template = TEMPLATES.get(cell.spec.model.template)
    return f"{template.name}.jinja" if template is not None and template.jinja else None


def dataset_info(cell: Cell) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name, ds in cell.spec.dataset.items():
        entry: dict[str, Any] = {"formatting": ds.formatting, "columns": {"messages": ds.messages}}
        if is_local(ds.source):
            entry["file_name"] = str(Path(ds.source).expanduser())
        else:
            # a hub id, or its staged snapshot directory: LLaMA-Factory hands either to datasets.load_dataset,
            # which reads a snapshot offline (its file_name would list only the directory's top level)
            entry["hf_hub_url"] = dataset_source(cell, name)
            entry["split"] = ds.split
        tags = {k: v for k, v in dataclasses.asdict(ds.tags).items() if v is not None}
        entry["tags"] = tags
        info[name] = entry
    return info


def train_config(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    s = cell.spec
    cfg: dict[str, Any] = dict(s.backend.train_defaults)
    cfg.update(
        {
            "model_name_or_path": model_source(cell),
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
            # the upload is the cell's post-training stage (sft_grid/stages/post_training.py), after consolidation
            # and the tokenizer check, never the trainer's own push (which crashes on offline nodes)
            "push_to_hub": False,
        }
    )
    cfg.update(common.optional_keys(cell, cell_dir))
    if hub_revision(cell) and model_source(cell) == s.model.hub_id:
        cfg["model_revision"] = hub_revision(cell)  # a job that fetches the model itself fetches the pinned commit
    if cell.tokenized is not None:
        # the grid's shared tokenized dataset: LLaMA-Factory loads it and ignores its other data arguments
        cfg["tokenized_path"] = str(cell.tokenized.data_dir)
    if s.mix.strategy != "concat":
        cfg["mix_strategy"] = s.mix.strategy
        cfg["interleave_probs"] = ",".join(repr(float(p)) for p in s.mix.probs or ())
    if s.cluster.precision == "bf16":
        cfg["bf16"] = True
    cfg.update(layout_keys(cell))
    if not s.warmup_ratio:
        # transformers 5 deprecates warmup_ratio; zero needs no key at all
        del cfg["warmup_ratio"]
    cfg.update(s.extra)
    return cfg


# the layout's attention kernel in LLaMA-Factory's words (its extras/constants.py AttentionFunction)
ATTENTION = {"eager": "disabled", "sdpa": "sdpa", "fa2": "fa2", "fa3": "fa3"}
# Packing with no example attending to another (LLaMA-Factory's `neat_packing`: a block-diagonal attention mask,
# and position ids that restart at each example); the loss mask is still its supervised processor's
PACKING = {"packing": True, "neat_packing": True}


def layout_keys(cell: Cell) -> dict[str, Any]:
    """The cell's layout (planning/gpus.py) in LLaMA-Factory's keys: the attention kernel, activation
    checkpointing (said either way: LLaMA-Factory's default is on), packing, Liger's kernels and fused AdamW. The
    DeepSpeed file is common.optional_keys'."""
    lay = cell.layout
    out: dict[str, Any] = {
        "flash_attn": ATTENTION[lay.attention],
        "disable_gradient_checkpointing": not lay.checkpointing,
    }
    if lay.packing:
        out.update(PACKING)
    if lay.liger:
        out["enable_liger_kernel"] = True
    if lay.fused_adamw:
        out["optim"] = "adamw_torch_fused"
    return out


def files(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Structured files of the cell, as data: the renderer dumps each once (text as it is)."""
    out: dict[str, Any] = {CONFIG_FILE: train_config(cell, cell_dir), DATASET_INFO: dataset_info(cell)}
    jinja = template_file(cell)
    if jinja:
        out[jinja] = TEMPLATES[cell.spec.model.template].jinja_text()
    return out


def _command(cell: Cell, cell_dir: Path, env_bin: Path) -> list[str]:
    """The training command, always through the wrapper (in_venv/sft_grid_lf.py), which adds the loss watchdog's
    callbacks to LLaMA-Factory's run_exp and registers a template of sft_grid's own (a jinja file) in every
    process. Several ranks with `launcher: accelerate`: accelerate starts the wrapper on each node (the
    variables are set by launch.sh from the Slurm allocation); otherwise LLaMA-Factory's own launcher (its
    CLI's `train`), which starts torchrun itself when FORCE_TORCHRUN is set."""
    config = str(cell_dir / CONFIG_FILE)
    jinja = template_file(cell)
    wrapper = [str(WRAPPER), *(["--template", f"{cell.spec.model.template}={cell_dir / jinja}"] if jinja else [])]
    if cell.world_size > 1 and cell.spec.cluster.launcher == "accelerate":
        return [*common.accelerate(env_bin), *wrapper, config]
    return [str(env_bin / "python"), *wrapper, "train", config]


def mask_spec(cell: Cell) -> MaskSpec:
    """LLaMA-Factory's template and data arguments, and each dataset's dataset_info entry: what its
    SupervisedDatasetProcessor needs to reproduce training's mask."""
    config = train_config(cell, Path("."))
    shared: dict[str, Any] = {
        "data_args": {k: config[k] for k in MASK_KEYS if k in config},
        # mask_history trains only the last assistant turn, on purpose
        "last_turn_only": bool(config.get("mask_history")),
    }
    template = TEMPLATES.get(cell.spec.model.template)
    if template is not None and template.jinja_path is not None:
        # sft_grid's own template (delphi), registered in LLaMA-Factory's process as training does
        shared["templates"] = {template.name: str(template.jinja_path)}
    info = dataset_info(cell)
    return MaskSpec(
        str(config["model_name_or_path"] or ""),
        "llamafactory",
        {name: {**shared, "dataset_info": info[name]} for name in info},
    )


# keys that steer training, never the tokens: left out of a tokenized dataset's identity (every other key counts,
# the cell's `extra` included, so an unknown data key never makes two cells share what differs)
TRAIN_ONLY = (
    "model_name_or_path",
    "dataset_dir",
    "output_dir",
    "run_name",
    "logging_steps",
    "save_steps",
    "save_total_limit",
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
    "report_to",
    "push_to_hub",
    "max_steps",
    "deepspeed",
    "bf16",
    "finetuning_type",
    "dataloader_num_workers",
    "plot_loss",
    "do_train",
    "tokenized_path",
    "overwrite_cache",
    # the layout's keys that change how training runs, not its tokens (packing and neat_packing do change them)
    "flash_attn",
    "disable_gradient_checkpointing",
    "optim",
    "enable_liger_kernel",
)


def data_spec(cell: Cell) -> dict[str, Any]:
    """What decides LLaMA-Factory's tokens besides the tokenizer: its data arguments and each source's entry.
    The seed counts only where 0.9.5's data loading uses it (data_utils.py: interleaving sources, a streaming
    shuffle, splitting off a validation set); concatenated sources tokenize the same whatever the seed, so
    cells that differ only in their seed share one tokenization."""
    config = train_config(cell, Path("."))
    drop = set(TRAIN_ONLY)
    if config.get("mix_strategy", "concat") == "concat" and not config.get("streaming") and not config.get("val_size"):
        drop.add("seed")
    return {"config": {k: v for k, v in config.items() if k not in drop}, "dataset_info": dataset_info(cell)}


def tokenize_job(cell: Cell, tok_dir: Path, env_bin: Path) -> tuple[dict[str, Any], list[list[str]]]:
    """LLaMA-Factory's own preprocessing, once (the wrapper's `tokenize`: LLaMA-Factory's get_dataset with
    `tokenized_path` set saves the dataset there; no model is loaded). The tokenizer is the directory's copy."""
    out = files(cell, tok_dir)
    config = out[CONFIG_FILE]
    for key in ("deepspeed", "bf16"):
        config.pop(key, None)
    assert cell.tokenized is not None
    config.update(output_dir=str(tok_dir / "scratch"), run_name="tokenize", report_to="none")
    if cell.tokenized.tokenizer_dir is not None:
        config["model_name_or_path"] = str(cell.tokenized.tokenizer_dir)
    jinja = template_file(cell)
    wrapper = ["--template", f"{cell.spec.model.template}={tok_dir / jinja}"] if jinja else []
    return out, [[str(env_bin / "python"), str(WRAPPER), *wrapper, "tokenize", str(tok_dir / CONFIG_FILE)]]


def _resume_args(checkpoint: Path) -> list[str]:
    """LLaMA-Factory's CLI takes key=value overrides."""
    return [f"resume_from_checkpoint={checkpoint}"]


def problems(cell: Cell) -> Iterator[Problem]:
    """What LLaMA-Factory 0.9.5 refuses at start that the shared rules do not catch: an error before queueing."""
    if cell.layout.attention == "fa3":
        # its model_utils/attention.py maps auto, disabled, sdpa and fa2 (and FA3 for gpt-oss alone); any other
        # model stops at `NotImplementedError: Unknown attention type: fa3` as it loads
        yield Problem(
            cell=cell.name,
            key="layout.attention",
            value="fa3",
            rule="llamafactory-attention",
            message="LLaMA-Factory 0.9.5 has no FlashAttention-3 for this model: it stops at 'Unknown attention type:"
            " fa3' as it loads the model",
            fix="layout.attention=fa2 (or drop it), or backend=axolotl (flash_attention_3)",
        )


def _variables(cell: Cell) -> dict[str, str]:
    """One rank under DeepSpeed still goes through torchrun: LLaMA-Factory trains DeepSpeed only in a distributed
    process (its parser: "Please use `FORCE_TORCHRUN=1` to launch DeepSpeed training."), and launch.sh sets the
    variables for several ranks itself (backends/launch.py)."""
    if zero.needed(cell) and cell.world_size == 1:
        return {"FORCE_TORCHRUN": "1", "NNODES": "1", "NPROC_PER_NODE": "1"}
    return {}


# no pre-commands (it interleaves mixes itself)
BACKEND = Backend(
    name=NAME,
    config_file=CONFIG_FILE,
    files=files,
    command=_command,
    problems=problems,
    variables=_variables,
    mask_spec=mask_spec,
    resume_args=_resume_args,
    data_spec=data_spec,
    tokenize_job=tokenize_job,
    # a leg ends at its rung through the job runner's SFT_GRID_LEG_STOP (in_venv/leg_stop.py, added to run_exp's
    # callbacks by the wrapper): no arguments; no cooldown probe yet (`guard: position` only)
    legs=lambda stop, probe: [],
)
