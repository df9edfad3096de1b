"""Build tiny Llama-3-style models of several sizes, for grids over model size (the report's scaling tests).

Standalone like build_tiny.py, whose recipe it reuses (runs in a backend's environment, never imports sft_grid):

    <backend env>/bin/python build_sizes.py OUT_DIR

writes OUT_DIR/sizes/tiny-llama3-<size>/ for each size below: the tokenizer of tiny-llama3 (the same recipe and
seed, so the same tokenizer and the same chat template) and a LlamaForCausalLM of that shape with seeded random
weights. With tiny-llama3 itself (hidden 64, 2 layers, ~0.2M parameters) they span about 15x in size, and each
step of the largest still takes milliseconds on a CPU.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_tiny import llama3_model, llama3_tokenizer, recipe_start, save_atomically

SIZES = {
    "m": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4},
    "l": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4},
}


def main(argv: list[str]) -> int:
    start = recipe_start(argv, "sizes")
    if start is None:
        return 2
    out, lines = start
    tok = llama3_tokenizer(lines)
    for i, (size, shape) in enumerate(SIZES.items()):
        torch.manual_seed(100 + i)
        model = llama3_model(tok, **shape)
        path = save_atomically(out, f"tiny-llama3-{size}", tok, model)
        print(path, sum(p.numel() for p in model.parameters()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
