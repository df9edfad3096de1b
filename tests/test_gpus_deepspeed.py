"""The memory model's model states (sft_grid/planning/gpus.py) against DeepSpeed's own estimators
(estimate_zero2/zero3_model_states_mem_needs), called in the axolotl environment (which has DeepSpeed) on models
of the real shapes built on the meta device: the parameter count and the largest layer come from the model itself,
not from sft_grid's arithmetic. Within 10% for every shape, world size and offload."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sft_grid.planning.gpus import Shape, model_states

PROBE = Path(__file__).with_name("gpus_deepspeed_probe.py")


def qwen3(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> dict[str, object]:
    return {
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "head_dim": 128,
        "tie_word_embeddings": False,
    }


# (name, Qwen3Config, the exact parameter count its publisher states): Delphi 3e18 and 1e22 (the delphi suite's
# shapes: d/128 heads, no GQA, SwiGLU of 4d, Llama-3.1's vocabulary), Qwen3-8B and Qwen3-32B (their config.json)
MODELS = [
    ("delphi-3e18", qwen3(1024, 11, 8, 8, 4096, 128256), 447_244_032),
    ("delphi-1e22", qwen3(3840, 37, 30, 30, 15360, 128256), 9_714_698_752),
    ("qwen3-8b", qwen3(4096, 36, 32, 8, 12288, 151936), None),
    ("qwen3-32b", qwen3(5120, 64, 64, 8, 25600, 151936), None),
]
WORLDS = [[4, 1], [4, 2], [4, 4], [8, 2]]


@pytest.mark.backend
def test_model_states_agree_with_deepspeeds_estimators(axolotl_env):
    spec = [{"name": n, "config": c, "worlds": WORLDS} for n, c, _ in MODELS]
    proc = subprocess.run(
        [str(axolotl_env / "bin" / "python"), str(PROBE), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [a["name"] for a in answers] == [n for n, _, _ in MODELS]
    compared = 0
    for (_name, config, stated), ds in zip(MODELS, answers, strict=True):
        if stated:  # the suite's parameter formula reproduces the model the config builds
            assert ds["params"] == stated
        shape = Shape(
            params=ds["params"],
            layers=int(config["num_hidden_layers"]),
            hidden=int(config["hidden_size"]),
            heads=int(config["num_attention_heads"]),
            kv_heads=int(config["num_key_value_heads"]),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
        )
        # the largest layer sft_grid derives from the shape is the one DeepSpeed finds in the model
        assert shape.largest_layer == ds["largest_layer"]
        for row in ds["worlds"]:
            world = row["gpus"] * row["nodes"]
            for sharding, offload, key in (
                ("zero2", "none", "zero2"),
                ("zero2", "optimizer", "zero2_optimizer"),
                ("zero3", "none", "zero3"),
                ("zero3", "optimizer", "zero3_optimizer"),
                ("zero3", "all", "zero3_all"),
            ):
                for backend in ("llamafactory", "axolotl"):  # under DeepSpeed both hold what the engine holds
                    ours = sum(model_states(backend, "bf16", sharding, offload, shape, world))
                    assert ours == pytest.approx(row[key], rel=0.10), (ds["name"], world, sharding, offload)
                    compared += 1
    assert compared == len(MODELS) * len(WORLDS) * 5 * 2
