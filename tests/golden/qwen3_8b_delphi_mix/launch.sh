#!/usr/bin/env bash
# sft_grid cell qwen3_8b_magpie+delphi_warmup_strategyinterleave_under-0a4a28e8 of grid 'default': qwen3_8b on magpie+delphi_warmup with llamafactory.
# Run by hand: bash launch.sh [key=value ...]  (extra arguments go to the backend;
# training resumes from the last checkpoint in output/). Secrets come from your environment only.
set -euo pipefail
cd /srv/runs/grid/qwen3_8b_magpie+delphi_warmup_strategyinterleave_under-0a4a28e8
export HF_HUB_OFFLINE=1
export OMP_NUM_THREADS=1
export TOKENIZERS_PARALLELISM=false
export WANDB_MODE=disabled
export WANDB_RUN_ID=default-0a4a28e8 WANDB_RESUME=allow
export SFT_GRID_WATCHDOG=on SFT_GRID_WATCHDOG_K=4 SFT_GRID_WATCHDOG_P=3 SFT_GRID_WATCHDOG_TOL=0.0001
export SFT_GRID_DATA_STEP=/srv/runs/grid/qwen3_8b_magpie+delphi_warmup_strategyinterleave_under-0a4a28e8/data_step.jsonl
export PATH=/opt/sft_grid_cache/envs/llamafactory-152db18b7a8b/bin:"$PATH"
export HF_DATASETS_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
exec /opt/sft_grid_cache/envs/llamafactory-152db18b7a8b/bin/python <repo>/sft_grid/in_venv/sft_grid_lf.py train /srv/runs/grid/qwen3_8b_magpie+delphi_warmup_strategyinterleave_under-0a4a28e8/train_config.yaml "$@"
