"""DeepSpeed's own estimators of the model states per GPU, for tests/test_gpus_deepspeed.py (runs in the axolotl
environment, which has DeepSpeed and transformers).

    python gpus_deepspeed_probe.py '<json: [{"name", "config": {...Qwen3Config kwargs}, "worlds": [[gpus, nodes]]}]>'

Each model is built from its config on the meta device (no memory, no weights), its parameters counted and its
largest layer found as DeepSpeed's own model_to_params finds it (every module's own parameters), and DeepSpeed's
estimate_zero2/zero3_model_states_mem_needs give the GPU bytes of each world size and offload. Prints JSON.
"""

from __future__ import annotations

import json
import sys


def main(spec: str) -> None:
    import torch
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from transformers import AutoModelForCausalLM, Qwen3Config

    out = []
    for model in json.loads(spec):
        with torch.device("meta"):
            net = AutoModelForCausalLM.from_config(Qwen3Config(**model["config"]))
        # model_to_params dedups parameters by data_ptr, which is 0 for every tensor on the meta device: count the
        # distinct tensors instead (untied embeddings: every one is distinct)
        total = sum(p.numel() for p in net.parameters())
        largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in net.modules())
        rows = []
        for gpus, nodes in model["worlds"]:
            z2 = estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=False)[1]
            z2_off = estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=True)[1]
            z3 = estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload=False)[1]
            z3_opt = estimate_zero3_model_states_mem_needs(
                total, largest, gpus, nodes, cpu_offload=True, cpu_offload_params=False
            )[1]
            z3_all = estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload=True)[1]
            rows.append(
                {
                    "gpus": gpus,
                    "nodes": nodes,
                    "zero2": z2,
                    "zero2_optimizer": z2_off,
                    "zero3": z3,
                    "zero3_optimizer": z3_opt,
                    "zero3_all": z3_all,
                }
            )
        out.append({"name": model["name"], "params": total, "largest_layer": largest, "worlds": rows})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
