#!/usr/bin/env bash
# The GPU check, in one call (benchmarks/gpu_check.py says what it measures: Delphi-shaped cells' predicted and measured
# peak memory, tokens/s and MFU, packed and unpacked, Liger on and off): on a machine with one NVIDIA GPU and a Python
# with LLaMA-Factory's packages (the managed environment, or SFT_GRID_GPU_ENV=<a virtualenv>; liger-kernel in it adds
# the Liger arm), and sft_grid's own (requirements.lock). Packages the machine lacks travel as wheels in .whl/
# (installed here into /tmp/site first), e.g. `pip download liger-kernel --no-deps -d .whl` before the call.
#   bash benchmarks/gpu_check.sh [--steps N]        # results on stdout and in $OUT/gpu_check.json
#   bash benchmarks/gpu_check.sh --cpu              # the same on the CPU, few steps: a check of the script
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
exec env PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py "$@"
