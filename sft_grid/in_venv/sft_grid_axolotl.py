"""sft_grid's axolotl plugins (standalone: imported by axolotl from PYTHONPATH, which launch.sh sets).

    plugins:
      - sft_grid_axolotl.TemplateIntegrityPlugin
      - sft_grid_axolotl.OutputPlugin

TemplateIntegrityPlugin: after every checkpoint save (output_dir/checkpoint-<step>) and at the end of
training (output_dir), tokenizer_config.json carries the chat template in effect (the tokenizer's, as axolotl
set it from the config) and any .jinja file beside it matches (template_integrity.repair). transformers
writes the template only to a side file, and serving stacks that read only the config drop tool calls.

OutputPlugin: the output contract every sft_grid backend keeps: trainer_state.json at the output root once
the final weights are there (axolotl writes it only inside checkpoint-N; LLaMA-Factory writes it at the root),
and trainer_log.jsonl with one line per log (current_steps, total_steps, loss), which sft_grid's status reads
while a cell trains. Both plugins act on rank 0 only and are idempotent (axolotl calls post_train twice:
after trainer.train() and again after the final save). OutputPlugin also ends a leg of a pruned grid at its rung
(leg_stop.py's callback, when the job runner set SFT_GRID_LEG_STOP): the rung's checkpoint saved, no
final model, the schedule the full run's; the next leg resumes through the config's auto_resume_from_checkpoints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cpu_resume
import data_step
import leg_stop
import template_integrity
from axolotl.integrations.base import BasePlugin
from transformers import TrainerCallback

# every axolotl process that loads these plugins (train and preprocess) records its data step (data_step.py)
data_step.patch_axolotl()

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def _rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _tokenizer(trainer: Any) -> Any:
    return getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)


def carry_template(directory: Path, tokenizer: Any) -> list[str]:
    """Repair `directory`'s tokenizer files to carry the tokenizer's template; saves the tokenizer first
    where a checkpoint holds none."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or not directory.is_dir():
        return []
    if not (directory / template_integrity.CONFIG).is_file():
        tokenizer.save_pretrained(str(directory), save_jinja_files=False)
    changed: list[str] = template_integrity.repair(directory, template)
    if changed:
        print(
            f"[sft_grid] template_integrity: wrote the chat template into {', '.join(changed)} in {directory}",
            flush=True,
        )
    return changed


class _CheckpointTemplate(TrainerCallback):
    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            tokenizer = kwargs.get("processing_class") or _tokenizer(self.trainer)
            carry_template(Path(args.output_dir) / f"checkpoint-{state.global_step}", tokenizer)


class _TrainerPlugin(BasePlugin):
    """A plugin that keeps the trainer (post_train gets only the model) and adds its callback."""

    def __init__(self) -> None:
        super().__init__()
        self.trainer: Any = None

    def callback(self, trainer: Any) -> Any:
        raise NotImplementedError

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        self.trainer = trainer
        return [self.callback(trainer)]


class TemplateIntegrityPlugin(_TrainerPlugin):
    """The chat template in tokenizer_config.json of every checkpoint and of the final output."""

    def callback(self, trainer: Any) -> Any:
        return _CheckpointTemplate(trainer)

    def post_train(self, cfg: Any, model: Any) -> None:
        if _rank0() and self.trainer is not None:
            carry_template(Path(cfg.output_dir), _tokenizer(self.trainer))


class _ProgressLog(TrainerCallback):
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record = {"current_steps": state.global_step, "total_steps": state.max_steps, **logs}
        with open(Path(args.output_dir) / "trainer_log.jsonl", "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")


class OutputPlugin(_TrainerPlugin):
    """trainer_state.json at the output root after the final save, and a per-log progress file; a multi-process
    CPU run resumes its optimizer state (cpu_resume.py)."""

    def callback(self, trainer: Any) -> Any:
        cpu_resume.patch()
        return _ProgressLog()

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        return [*super().add_callbacks_post_trainer(cfg, trainer), *leg_stop.callbacks()]

    def post_train(self, cfg: Any, model: Any) -> None:
        output = Path(cfg.output_dir)
        # the first post_train comes before the final weights are saved: the state follows them, never leads
        # (ZeRO-3 without gathering saves shards named by `latest`: the cell's consolidate stage makes weights)
        final = any((output / w).is_file() for w in WEIGHT_FILES) or (output / "latest").is_file()
        if _rank0() and self.trainer is not None and final:
            self.trainer.state.save_to_json(str(output / "trainer_state.json"))
