"""What a backend's environment can load (standalone: runs with the environment's python, never imports sft_grid).

    <backend env>/bin/python env_facts.py OUT.json [--transformers] MODULE...

OUT.json: {"modules": {MODULE: importable}} (found, not imported: milliseconds), and with --transformers also
{"transformers": version, "model_types": [...], "architectures": [...]}: the model types transformers' AutoConfig
knows and the architecture classes its Auto model mappings name, so a model directory's config.json can be checked
against what this environment's transformers would load (without importing the model classes: seconds).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any


def transformers_facts() -> dict[str, Any]:
    try:
        import transformers
        from transformers.models.auto import modeling_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except Exception as exc:  # an environment without transformers: the modules are still answered
        return {"error": f"{type(exc).__name__}: {exc}"}
    archs: set[str] = set()
    for name in dir(modeling_auto):
        mapping = getattr(modeling_auto, name)
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            for value in mapping.values():
                archs.update(value if isinstance(value, (list, tuple)) else [value])
    return {
        "transformers": transformers.__version__,
        "model_types": sorted(CONFIG_MAPPING_NAMES),
        "architectures": sorted(archs),
    }


def main(argv: list[str]) -> int:
    modules = [m for m in argv[1:] if m != "--transformers"]
    out: dict[str, Any] = {"modules": {m: importlib.util.find_spec(m) is not None for m in modules}}
    if "--transformers" in argv[1:]:
        out.update(transformers_facts())
    with open(argv[0], "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
