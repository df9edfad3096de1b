#!/bin/bash
# The team's old launcher (OpenThoughts-Agent's hpc/launch.py: shared/research/seed_system.md, sections 1, 2 and 9)
# starting the 32k Qwen3-8B recipe on Leonardo: two nodes of four GPUs, the base YAML's dataset registry, a global
# batch of 64 (the launcher derives the accumulation from it), and flags written over the YAML's learning rate.
# The flags as its launch_base_sft.sh passes them (https://github.com/open-thoughts/OpenThoughts-Agent), written anew
# for sft_grid's import tests.
set -euo pipefail
DISABLE_VERSION_CHECK=1 python -m hpc.launch \
    --job_type sft \
    --job_name qwen3_8b_agent_sft \
    --train_config_path lf_qwen3_8b_32k_zero3.yaml \
    --time_limit 23:59:00 \
    --num_nodes 2 \
    --gpus_per_node 4 \
    --dataset_dir lf_data \
    --dataset magpie_pro,agent_traces \
    --learning_rate 2.0e-5 \
    --global_batch_size 64 \
    --max_restarts 2 \
    --internet_node
