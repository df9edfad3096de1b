"""An axolotl plugin for DeepSpeed ZeRO on a CPU-only node, one process (standalone: runs in the axolotl env).

axolotl 0.19 starts DeepSpeed's process group itself when the world size is 1, and always with NCCL, which a
CPU build of torch does not have (measured: a 1-process ZeRO-3 run on CPU fails in NCCL's init without this).
Starting it first, over gloo, makes axolotl's own call a no-op. Used for CPU runs of models that need ZeRO-3 (the
tests' tiny ZeRO-3 cells); on GPU nodes axolotl's own NCCL start is right and this plugin is not listed.

    plugins: [zero_cpu.GlooPreInit]      # with sft_grid/in_venv on PYTHONPATH, as launch.sh sets it
"""

from __future__ import annotations

import os
from typing import Any

from axolotl.integrations.base import BasePlugin


class GlooPreInit(BasePlugin):
    def register(self, cfg: dict[str, Any]) -> None:  # runs before axolotl's DeepSpeed setup
        if not cfg.get("deepspeed") or int(os.environ.get("WORLD_SIZE", "1")) != 1:
            return
        for key, value in (
            ("WORLD_SIZE", "1"),
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", str(29500 + os.getpid() % 1000)),
        ):
            os.environ.setdefault(key, value)
        import deepspeed.comm as dist

        dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, dist_init_required=True)
