"""What a backend's virtual environment can load: its transformers' model types and architectures, and whether an
integration (`report_to`) is importable. Asked of the environment itself (in_venv/env_facts.py, one process of its
python, ~3 s for transformers' import) rather than recorded when it was built: a site's own environment was never
built by sft_grid, and an environment changed by hand (pip install wandb) answers as it is now. The answer is cached
under the preflight cache, keyed by the environment's python and its ready marker (rebuilt: asked again).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from sft_grid.checks.mask import _stat, _venv_marker, cache_dir
from sft_grid.core.paths import IN_VENV_DIR

SCRIPT = IN_VENV_DIR / "env_facts.py"
# report_to -> the module transformers' integration imports
INTEGRATIONS = {"wandb": "wandb", "tensorboard": "tensorboard"}


def facts(python: str, transformers: bool = False) -> dict[str, Any] | None:
    """The environment's answers (`transformers`: its model types and architectures too, seconds the first time),
    or None where its python is not on this machine (the job asks it there)."""
    if not Path(python).is_file():
        return None
    modules = sorted(set(INTEGRATIONS.values()))
    parts = [_stat(Path(python)), _stat(_venv_marker(python)), _stat(SCRIPT), modules, transformers]
    key = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]
    cached = cache_dir() / "venv_facts" / f"{key}.json"
    if cached.is_file():
        return dict(json.loads(cached.read_text()))
    with tempfile.TemporaryDirectory(prefix="sft_grid_venv_") as tmp:
        out = Path(tmp) / "facts.json"
        env = {**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        proc = subprocess.run(
            [python, str(SCRIPT), str(out), *(["--transformers"] if transformers else []), *modules],
            capture_output=True,
            text=True,
            env=env,
        )
        if proc.returncode != 0 or not out.is_file():
            return None  # an environment that cannot even run this: its own checks say why
        found = dict(json.loads(out.read_text()))
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(found))
    return found
