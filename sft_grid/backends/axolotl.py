"""A cell as axolotl's own file: axolotl_config.yaml, the data step an interleaved mix needs, and the command.

Every dataset gets its own `datasets` entry with its own column, role/content fields and role mapping, so a
ShareGPT (from/value, human/gpt) source and a role/content source both keep their assistant turns. axolotl
has no interleaving: a cell with `mix.strategy=interleave_*` runs a seeded data step first
(in_venv/mix_data.py, with the datasets library's own interleave_datasets, exactly as LLaMA-Factory mixes)
and the config trains on the one file it writes. The project's axolotl plugins (in_venv/sft_grid_axolotl.py)
keep the chat template in tokenizer_config.json of every checkpoint and write the trainer state at the output
root, as every backend's output must hold it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sft_grid.backends import common, zero
from sft_grid.backends.base import Backend, MaskSpec
from sft_grid.core.paths import IN_VENV_DIR
from sft_grid.core.problems import Problem
from sft_grid.core.schema import DatasetConf, DatasetTags
from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.inputs import dataset_source, hub_revision, model_source

NAME = "axolotl"
CONFIG_FILE = "axolotl_config.yaml"
MIX_SPEC = "mix.json"
MIX_DATA = "data/mix.jsonl"
PREPARED_DIR = "prepared"
MIX_SCRIPT = IN_VENV_DIR / "mix_data.py"
PLUGINS = ("sft_grid_axolotl.TemplateIntegrityPlugin", "sft_grid_axolotl.OutputPlugin")
ZERO_CPU_PLUGIN = "zero_cpu.GlooPreInit"
# the loss watchdog (in_venv/loss_watchdog.py): stops a NaN, diverging or collapsed run, keeping its checkpoints
WATCHDOG_PLUGIN = "loss_watchdog.LossWatchdogPlugin"
# the layout's attention kernel as transformers names it (axolotl passes attn_implementation on)
ATTENTION = {"eager": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2", "fa3": "flash_attention_3"}
# Packing with no example attending to another: axolotl's multipack sampler, whose collator gives each example its
# own position ids and (without FlashAttention's varlen kernel) a block-diagonal mask
PACKING = {"sample_packing": True}
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
LIGER = {
    "liger_rope": True,
    "liger_rms_norm": True,
    "liger_glu_activation": True,
    "liger_fused_linear_cross_entropy": True,
}


# the datasets library's stopping strategy of each interleave strategy, as LLaMA-Factory maps them
STOPPING = {"interleave_under": "first_exhausted", "interleave_over": "all_exhausted"}
# file suffix -> axolotl's ds_type for a local file
_DS_TYPES = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def role_map(tags: DatasetTags) -> dict[str, list[str]]:
    """axolotl's `roles` ({target role: [values in the data]}) from a dataset's tags. A function-call turn
    is the model's own output, trained like an assistant turn (as LLaMA-Factory does)."""
    roles: dict[str, list[str]] = {"user": [tags.user_tag], "assistant": [tags.assistant_tag]}
    if tags.function_tag:
        roles["assistant"].append(tags.function_tag)
    if tags.system_tag:
        roles["system"] = [tags.system_tag]
    if tags.observation_tag:
        roles["tool"] = [tags.observation_tag]
    return roles


def _chat_entry(path: str, messages: str, tags: DatasetTags) -> dict[str, Any]:
    return {
        "path": path,
        "type": "chat_template",
        "field_messages": messages,
        "message_property_mappings": {"role": tags.role_tag, "content": tags.content_tag},
        "roles": role_map(tags),
        "roles_to_train": ["assistant"],
        "train_on_eos": "turn",
    }


def dataset_entry(ds: DatasetConf, source: str | None = None) -> dict[str, Any]:
    """One `datasets` entry: a local file (ds_type from its suffix), or a hub id (`source`: its staged snapshot
    directory, which axolotl loads with datasets.load_dataset offline) with its split."""
    if is_local(ds.source):
        local = Path(ds.source).expanduser()
        entry = _chat_entry(str(local), ds.messages, ds.tags)
        if local.suffix in _DS_TYPES:
            entry["ds_type"] = _DS_TYPES[local.suffix]
    else:
        entry = _chat_entry(source or ds.source, ds.messages, ds.tags)
        entry["split"] = ds.split
    return entry


def interleaved(cell: Cell) -> bool:
    return cell.spec.mix.strategy in STOPPING


def mix_spec(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """What in_venv/mix_data.py reads: each source with its own fields and role mapping, the probabilities,
    the seed and the stopping strategy; it writes role/content messages to MIX_DATA."""
    s = cell.spec
    sources = []
    for name, ds in s.dataset.items():
        local = is_local(ds.source)
        sources.append(
            {
                "name": name,
                "source": dataset_source(cell, name),
                "local": local,
                "split": ds.split,
                "messages": ds.messages,
                "role_tag": ds.tags.role_tag,
                "content_tag": ds.tags.content_tag,
                # value in the data -> role
                "roles": {value: role for role, values in role_map(ds.tags).items() for value in values},
            }
        )
    return {
        "sources": sources,
        "probs": [float(p) for p in s.mix.probs or ()],
        "seed": s.seed,
        "stopping_strategy": STOPPING[s.mix.strategy],
        "output": str(cell_dir / MIX_DATA),
    }


def datasets(cell: Cell, cell_dir: Path) -> list[dict[str, Any]]:
    if interleaved(cell):
        # the mix is written by the cell's own data step, or once by the grid's tokenize job that it shares
        mix = cell.tokenized.dir / MIX_DATA if cell.tokenized is not None else cell_dir / MIX_DATA
        entry = _chat_entry(str(mix), "messages", DatasetTags())
        entry["ds_type"] = "json"
        return [entry]
    return [dataset_entry(ds, dataset_source(cell, name)) for name, ds in cell.spec.dataset.items()]


def train_config(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    s = cell.spec
    cfg: dict[str, Any] = dict(s.backend.train_defaults)
    cfg.update(
        {
            # a prepared copy where the model needs one (the Delphi tokenizer prep), as for every backend
            "base_model": model_source(cell),
            **chat_template(cell),
            "datasets": datasets(cell, cell_dir),
            "dataset_prepared_path": str(cell.tokenized.prepared_dir if cell.tokenized else cell_dir / PREPARED_DIR),
            **shared_tokenizer(cell),
            "output_dir": str(cell_dir / "output"),
            "sequence_len": s.cutoff_len,
            "micro_batch_size": s.micro_batch_size,
            "gradient_accumulation_steps": cell.grad_accum,
            "learning_rate": s.lr,
            "num_epochs": s.epochs,
            "lr_scheduler": s.scheduler,
            "warmup_ratio": s.warmup_ratio,
            "weight_decay": s.weight_decay,
            "adam_beta1": s.adam_beta1,
            "adam_beta2": s.adam_beta2,
            "max_grad_norm": s.max_grad_norm,
            "seed": s.seed,
            "logging_steps": s.logging_steps,
            "save_steps": s.save_steps,
            "auto_resume_from_checkpoints": True,
            **layout_keys(cell),
            **precision(cell),
            **reporting(cell),
            **finetuning(cell),
            # the template goes into tokenizer_config.json (serving stacks read only that), never a side file
            "tokenizer_save_jinja_files": False,
            "plugins": plugins(cell),
        }
    )
    # no hub_model_id: the upload is the cell's post-training stage (sft_grid/stages/post_training.py), never the
    # trainer's
    cfg.update(common.optional_keys(cell, cell_dir))
    if hub_revision(cell) and model_source(cell) == s.model.hub_id:
        cfg["revision_of_model"] = hub_revision(cell)  # a job that fetches the model itself fetches the pinned commit
    cfg.update(s.extra)
    return cfg


def plugins(cell: Cell) -> list[str]:
    """The project's plugins, the loss watchdog unless the grid turns it off; on a CPU-only cluster a ZeRO-3 cell
    also gets DeepSpeed's process group started over gloo (axolotl 0.19 starts it with NCCL, which CPU torch
    lacks: in_venv/zero_cpu.py)."""
    extra = [ZERO_CPU_PLUGIN] if zero.needed(cell) and not cell.spec.cluster.gpus_per_node else []
    watchdog = [WATCHDOG_PLUGIN] if cell.spec.watchdog.enabled else []
    liger = [LIGER_PLUGIN] if cell.layout.liger else []
    return [*PLUGINS, *watchdog, *extra, *liger]


def files(cell: Cell, cell_dir: Path) -> dict[str, Any]:
    """Structured files of the cell, as data: the renderer dumps each once."""
    out: dict[str, Any] = {CONFIG_FILE: train_config(cell, cell_dir)}
    if interleaved(cell):
        out[MIX_SPEC] = mix_spec(cell, cell_dir)
    return out


def _variables(cell: Cell) -> dict[str, str]:
    """Variables launch.sh exports for axolotl (the cluster's own env wins): the project's plugins on the
    path, and no telemetry (the Hub's variables are every backend's: backends/launch.py)."""
    return {"PYTHONPATH": str(IN_VENV_DIR), "AXOLOTL_DO_NOT_TRACK": "1"}


def _pre_commands(cell: Cell, cell_dir: Path, env_bin: Path) -> list[list[str]]:
    """Steps launch.sh runs before training: the interleaved mix (idempotent: a second run keeps the file)."""
    if interleaved(cell) and cell.tokenized is None:
        return [[str(env_bin / "python"), str(MIX_SCRIPT), str(cell_dir / MIX_SPEC)]]
    return []


def _command(cell: Cell, cell_dir: Path, env_bin: Path) -> list[str]:
    """One process: axolotl's CLI with the plain python launcher (no accelerate start-up). Several ranks:
    torchrun or accelerate on each node (launch.sh sets the variables from the Slurm allocation) starting
    axolotl's training module, so arguments after it (launch.sh's "$@") still reach axolotl."""
    config = str(cell_dir / CONFIG_FILE)
    module = ["-m", "axolotl.cli.train", config]
    if cell.world_size > 1:
        launcher = common.accelerate if cell.spec.cluster.launcher == "accelerate" else common.torchrun
        return [*launcher(env_bin), *module]
    return [str(env_bin / "axolotl"), "train", config, "--launcher", "python"]


def shared_tokenizer(cell: Cell) -> dict[str, Any]:
    """A cell sharing a tokenized dataset loads the tokenizer from its directory's copy (same content as its own):
    axolotl finds a prepared dataset under a hash of the tokenizer's path, so every sharing cell names that one."""
    if cell.tokenized is not None and cell.tokenized.tokenizer_dir is not None:
        return {"tokenizer_config": str(cell.tokenized.tokenizer_dir)}
    return {}


# keys that steer training, never the tokens: left out of a tokenized dataset's identity (every other key counts,
# the cell's `extra` included)
TRAIN_ONLY = (
    "base_model",
    "tokenizer_config",
    "dataset_prepared_path",
    "output_dir",
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
    "logging_steps",
    "save_steps",
    "save_total_limit",
    "auto_resume_from_checkpoints",
    "attn_implementation",
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
    "deepspeed",
    "max_steps",
    "optimizer",
    "save_strategy",
    "save_safetensors",
    "gradient_checkpointing",
    "dataloader_num_workers",
    *LIGER,
)


def data_spec(cell: Cell) -> dict[str, Any]:
    """What decides axolotl's tokens besides the tokenizer: its data settings and sources (and the mix, seeded)."""
    config = train_config(cell, Path("."))
    out = {"config": {k: v for k, v in config.items() if k not in TRAIN_ONLY}}
    if interleaved(cell):
        out["mix"] = mix_spec(cell, Path("."))
    return out


def tokenize_job(cell: Cell, tok_dir: Path, env_bin: Path) -> tuple[dict[str, Any], list[list[str]]]:
    """axolotl's own preprocess command, once, into the shared dataset_prepared_path (after the seeded mix step
    of an interleaved mix). It needs no weights: the base model is the tokenizer copy (config included)."""
    out = files(cell, tok_dir)
    config = out[CONFIG_FILE]
    config.pop("deepspeed", None)
    config["output_dir"] = str(tok_dir / "scratch")
    if cell.tokenized is not None and cell.tokenized.tokenizer_dir is not None:
        config["base_model"] = str(cell.tokenized.tokenizer_dir)
    steps = [[str(env_bin / "python"), str(MIX_SCRIPT), str(tok_dir / MIX_SPEC)]] if interleaved(cell) else []
    return out, [*steps, [str(env_bin / "axolotl"), "preprocess", str(tok_dir / CONFIG_FILE), "--no-download"]]


# axolotl config keys that change what its chat_template strategy trains
MASK_KEYS = (
    "chat_template",
    "chat_template_jinja",
    "chat_template_kwargs",
    "train_on_inputs",
    "eot_tokens",
    "tokenizer_use_mistral_common",
    # what axolotl does with a row longer than sequence_len (drop, truncate): the probe truncates as the job does
    "excess_length_strategy",
    "min_sample_len",
)


def mask_spec(cell: Cell) -> MaskSpec:
    """axolotl's chat_template strategy: the config keys that decide the mask and each source's own entry."""
    config = train_config(cell, Path("."))
    cfg = {k: config[k] for k in MASK_KEYS if k in config}
    return MaskSpec(
        str(config["base_model"] or ""),
        "axolotl",
        {
            name: {"dataset": dataset_entry(ds, dataset_source(cell, name)), "cfg": cfg}
            for name, ds in cell.spec.dataset.items()
        },
    )


def problems(cell: Cell) -> Iterator[Problem]:
    """What axolotl cannot express is an error before queueing, never a silently different run."""
    s = cell.spec
    if s.finetuning_type == "freeze":
        yield Problem(
            cell=cell.name,
            key="finetuning_type",
            value=s.finetuning_type,
            rule="axolotl-finetuning",
            message="axolotl has no freeze fine-tuning (LLaMA-Factory's freeze_trainable_layers)",
            fix="finetuning_type=full or finetuning_type=lora, or backend=llamafactory",
        )
    template = TEMPLATES.get(s.model.template)
    if template is not None and not (template.axolotl or template.jinja):
        yield Problem(
            cell=cell.name,
            key="model.template",
            value=s.model.template,
            rule="axolotl-template",
            message="axolotl has no template of this name and sft_grid ships no jinja for it",
            fix="add its axolotl name (or a jinja file) to sft_grid/core/templates.py, or backend=llamafactory",
        )


def _resume_args(checkpoint: Path) -> list[str]:
    """Nothing: the config's `auto_resume_from_checkpoints` resumes from the newest checkpoint-N in output/
    (the one the runner found), also when a person runs launch.sh by hand."""
    return []


BACKEND = Backend(
    name=NAME,
    config_file=CONFIG_FILE,
    files=files,
    command=_command,
    problems=problems,
    mask_spec=mask_spec,
    resume_args=_resume_args,
    variables=_variables,
    pre_commands=_pre_commands,
    data_spec=data_spec,
    tokenize_job=tokenize_job,
    # a leg ends at its rung through the job runner's SFT_GRID_LEG_STOP (in_venv/leg_stop.py, added by the
    # OutputPlugin): no arguments; no cooldown probe yet (`guard: position` only)
    legs=lambda stop, probe: [],
)


def chat_template(cell: Cell) -> dict[str, Any]:
    """axolotl's template of the same name, or sft_grid's own jinja text inline (`chat_template: jinja`)."""
    template = TEMPLATES[cell.spec.model.template]
    if template.jinja:
        return {
            "chat_template": "jinja",
            "chat_template_jinja": template.jinja_text(),
            **({"eot_tokens": [template.eot]} if template.eot else {}),
        }
    return {"chat_template": template.axolotl}


def layout_keys(cell: Cell) -> dict[str, Any]:
    """The cell's layout (planning/gpus.py) in axolotl's keys: the attention kernel, activation checkpointing,
    packing, Liger's kernels (with its plugin: plugins()) and the optimizer. The DeepSpeed file is
    common.optional_keys'."""
    lay = cell.layout
    out: dict[str, Any] = {
        "attn_implementation": ATTENTION[lay.attention],
        "gradient_checkpointing": lay.checkpointing,
        "sample_packing": lay.packing,
        "optimizer": "adamw_torch_fused" if lay.fused_adamw else "adamw_torch",
    }
    if lay.packing:
        out.update(PACKING)
    if lay.liger:
        out.update(LIGER)
    return out


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
        return {
            "use_wandb": True,
            "wandb_project": s.sweep_name,
            "wandb_name": cell.name,
            "wandb_mode": s.cluster.env.get("WANDB_MODE", "online"),
        }
    out: dict[str, Any] = {"use_wandb": False, "wandb_mode": "disabled"}
    if s.report_to == "tensorboard":
        out["use_tensorboard"] = True
    return out


def finetuning(cell: Cell) -> dict[str, Any]:
    """LoRA as LLaMA-Factory's defaults have it (rank 8, alpha 16, every linear layer); full otherwise."""
    if cell.spec.finetuning_type == "lora":
        return {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
    return {}
