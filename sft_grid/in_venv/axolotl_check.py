"""Validate rendered axolotl configs with axolotl's own validation, loading no model (standalone: axolotl env).

    python axolotl_check.py [--gpu sm_90 --world-size 4] <axolotl_config.yaml> ...

For each config: the plugins are registered (so their keys are known), then axolotl's validate_config (the
pydantic schema with every model validator) runs with the capabilities of the site the cell is for: `--gpu`
stands for the GPUs of a GPU site, which this machine may not have. Prints one JSON line per config with
`ok`, the error, and a few values after validation (dtype, attention, datasets). Exit status 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def check(path: str, gpu: str | None, world_size: int) -> dict[str, Any]:
    import torch
    import yaml
    from axolotl.cli.config import prepare_plugins
    from axolotl.utils.config import resolve_dtype, validate_config
    from axolotl.utils.dict import DictDefault

    with open(path, encoding="utf-8") as fh:
        cfg = DictDefault(yaml.safe_load(fh))
    known = set(cfg)
    capabilities = {"bf16": bool(gpu), "fp8": False, "tf32": bool(gpu), "n_gpu": world_size, "compute_capability": gpu}
    env = {"torch_version": str(torch.__version__).split("+", maxsplit=1)[0]}
    try:
        prepare_plugins(cfg)
        valid = validate_config(cfg, capabilities=capabilities, env_capabilities=env)
        resolve_dtype(valid)
    except Exception as exc:  # the report names the config and axolotl's own message
        return {"config": path, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "config": path,
        "ok": True,
        # keys of the file that validation dropped (axolotl drops unknown keys silently)
        "dropped": sorted(k for k in known if k not in valid),
        "torch_dtype": str(valid.torch_dtype),
        "bf16": valid.bf16,
        "attn_implementation": valid.attn_implementation,
        "chat_template": str(valid.chat_template),
        "datasets": [dict(d) for d in valid.datasets or []],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default=None, help="compute capability of the site's GPUs, e.g. sm_90")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("configs", nargs="+")
    args = parser.parse_args(argv)
    results = [check(c, args.gpu, args.world_size) for c in args.configs]
    for r in results:
        print(json.dumps(r, default=str))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
