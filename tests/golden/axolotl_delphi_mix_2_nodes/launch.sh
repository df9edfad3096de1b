#!/usr/bin/env bash
# sft_grid cell axolotl_delphi_magpie+delphi_warmup_strategyinterleave_under-4c21046b of grid 'default': delphi on magpie+delphi_warmup with axolotl.
# Run by hand: bash launch.sh [key=value ...]  (extra arguments go to the backend;
# training resumes from the last checkpoint in output/). Secrets come from your environment only.
set -euo pipefail
cd /srv/runs/grid/axolotl_delphi_magpie+delphi_warmup_strategyinterleave_under-4c21046b
export DISABLE_VERSION_CHECK=1
export HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=1
export TOKENIZERS_PARALLELISM=false
export WANDB_MODE=disabled
export WANDB_RUN_ID=default-4c21046b WANDB_RESUME=allow
export SFT_GRID_WATCHDOG=on SFT_GRID_WATCHDOG_K=4 SFT_GRID_WATCHDOG_P=3 SFT_GRID_WATCHDOG_TOL=0.0001
export SFT_GRID_DATA_STEP=/srv/runs/grid/axolotl_delphi_magpie+delphi_warmup_strategyinterleave_under-4c21046b/data_step.jsonl
# several ranks: torchrun on each node, c10d rendezvous at the first node of the allocation
export FORCE_TORCHRUN=1 NNODES=2 NPROC_PER_NODE=4 WORLD_SIZE=8
export NODE_RANK="${SLURM_NODEID:-0}" RDZV_ID="${SLURM_JOB_ID:-local}"
if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
  first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  MASTER_ADDR=$(scontrol show node "$first_node" | sed -n "s/.*NodeAddr=\([^ ]*\).*/\1/p")
fi
if [ -z "${MASTER_PORT:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)); fi
if [ -z "${MASTER_PORT:-}" ]; then
  MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}" MASTER_PORT
export PATH=/opt/sft_grid_cache/envs/axolotl-63a8c3de219a/bin:"$PATH"
export AXOLOTL_DO_NOT_TRACK=1
export HF_DATASETS_OFFLINE=1
export PYTHONPATH=<repo>/sft_grid/in_venv
export TRANSFORMERS_OFFLINE=1
/opt/sft_grid_cache/envs/axolotl-63a8c3de219a/bin/python <repo>/sft_grid/in_venv/mix_data.py /srv/runs/grid/axolotl_delphi_magpie+delphi_warmup_strategyinterleave_under-4c21046b/mix.json
exec /opt/sft_grid_cache/envs/axolotl-63a8c3de219a/bin/accelerate launch --multi_gpu "--num_machines=${NNODES}" "--machine_rank=${NODE_RANK}" "--main_process_ip=${MASTER_ADDR}" "--main_process_port=${MASTER_PORT}" "--num_processes=${WORLD_SIZE}" -m axolotl.cli.train /srv/runs/grid/axolotl_delphi_magpie+delphi_warmup_strategyinterleave_under-4c21046b/axolotl_config.yaml "$@"
