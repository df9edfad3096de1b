"""Resuming a multi-process training on CPU (standalone: imported by the backends' hooks in their environment).

transformers' Trainer loads a checkpoint's optimizer state with map_location=args.device when several
processes train; on CPU that device is `cpu:<rank>`, which torch.load cannot map a storage to ("don't know how
to restore data location of torch.storage.UntypedStorage (tagged with cpu:0)", measured with torch 2.13 and
the pinned transformers: a two-node CPU cell requeued from its checkpoint failed on every rank). On CPU every
rank shares the host's memory, so `cpu:<n>` means `cpu`: torch.load is given that. Nothing changes where a GPU
is present.
"""

from __future__ import annotations

from typing import Any


def patch() -> None:
    import torch

    if torch.cuda.is_available() or getattr(torch.load, "sft_grid_cpu", False):
        return
    load = torch.load

    def load_on_cpu(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        on_cpu = isinstance(map_location, torch.device) and map_location.type == "cpu"
        if on_cpu or (isinstance(map_location, str) and map_location.startswith("cpu:")):
            map_location = "cpu"
        return load(f, map_location, *args, **kwargs)

    load_on_cpu.sft_grid_cpu = True  # type: ignore[attr-defined]
    torch.load = load_on_cpu
