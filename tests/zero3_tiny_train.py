"""A real DeepSpeed ZeRO-3 training run on the CPU, for tests/test_post.py (runs in the axolotl environment,
which has DeepSpeed; started with torchrun, one process, gloo).

    torchrun --nproc_per_node=1 zero3_tiny_train.py <model dir> <ds json> <output dir> <reference.safetensors>

HF Trainer trains the tiny model for 2 steps with the DeepSpeed JSON sft_grid rendered for a cell whose model
needs zero3 (no gathering at save), so the output holds ZeRO shards (global_step2/, `latest`), as a 32B run
does. The reference file holds every parameter gathered from the shards in the training process itself,
which the consolidate stage's result must equal.
"""

from __future__ import annotations

import json
import sys


def main(model_dir: str, ds_json: str, output_dir: str, reference: str) -> None:
    import deepspeed
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(model_dir)
    with open(ds_json) as f:
        ds = json.load(f)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=2,
        save_steps=2,
        per_device_train_batch_size=ds["train_micro_batch_size_per_gpu"],
        gradient_accumulation_steps=ds["gradient_accumulation_steps"],
        learning_rate=1e-3,
        logging_steps=1,
        deepspeed=ds_json,
        ddp_backend="gloo",
        report_to=[],
        use_cpu=False,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, len(tok) - 1, (16, 12)).tolist()]
    trainer = Trainer(model=model, args=args, train_dataset=rows, processing_class=tok)
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    engine = trainer.model_wrapped
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        gathered = {name: p.detach().clone().contiguous() for name, p in params.items()}
    save_file(gathered, reference)


if __name__ == "__main__":
    main(*sys.argv[1:])
