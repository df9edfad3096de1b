#!/usr/bin/env bash
# The GPU check, in one call (benchmarks/gpu_check.py says what it measures: Delphi-shaped cells' predicted and measured
# peak memory, tokens/s and MFU, packed and unpacked, Liger on and off): on a machine with one NVIDIA GPU whose python3
# has a CUDA torch. The environment the cells train in is SFT_GRID_GPU_ENV=<a virtualenv with LLaMA-Factory>, else one
# built here: a virtualenv that sees python3's own packages after its own (its CUDA torch, triton, numpy: a .pth file
# adds python3's site directories, which works where python3 is itself a virtualenv, as on the lent GPU machines, and
# --system-site-packages would not), with the wheels in .whl/ installed into it (`make gpu-wheels` fills it:
# LLaMA-Factory at the managed environment's pins, sft_grid's own needs, liger-kernel for the Liger arm).
#   bash benchmarks/gpu_check.sh [--steps N]        # results on stdout and in $OUT/gpu_check.json
#   bash benchmarks/gpu_check.sh --cpu              # the same on the CPU, few steps: a check of the script
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${SFT_GRID_GPU_ENV:-}" ]] && compgen -G ".whl/*.whl" >/dev/null; then
    venv=${GPU_CHECK_VENV:-/tmp/gpu_check_env}
    rm -rf "$venv" && python3 -m venv --without-pip "$venv"
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    python3 -c "import site; print(f'import site; [site.addsitedir(d) for d in {site.getsitepackages()!r}]')" \
        >"$site/_gpu_check_base.pth"
    "$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
    export SFT_GRID_GPU_ENV=$venv
fi
py=${SFT_GRID_GPU_ENV:+$SFT_GRID_GPU_ENV/bin/}python3
"$py" -c "import torch, transformers, llamafactory; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'llamafactory', llamafactory.__version__)"
exec env PYTHONUNBUFFERED=1 "$py" benchmarks/gpu_check.py "$@"
