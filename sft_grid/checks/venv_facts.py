"""What a backend's virtual environment can load: its transformers' model types and architectures, whether the
backend itself, an integration (`report_to`) or a fast kernel is importable, and which config keys the backend's
own parser takes (`config_keys`: what a cell's `extra` may set), and which task names an evaluation harness's own
index knows (`eval_tasks`: what a suite may ask for). Asked of the environment itself
(in_venv/env_facts.py, one process of its python: tens of milliseconds, ~3 s with transformers' import) rather than
recorded when it was built: a site's own environment was never built by sft_grid, and an environment changed by hand
(pip install wandb) answers as it is now. The answer is cached under the preflight cache, keyed by the environment's
python, its ready marker and its site-packages directories (rebuilt, or a package installed or removed: asked again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sft_grid.checks.cache import cache_dir, env_state
from sft_grid.checks.cache import stat_key as _stat
from sft_grid.core.paths import IN_VENV_DIR

SCRIPT = IN_VENV_DIR / "env_facts.py"
# report_to -> the module transformers' integration imports
INTEGRATIONS = {"wandb": "wandb", "tensorboard": "tensorboard"}
# a layout's fast kernels (planning/gpus.py) -> the module the backend imports for it
KERNELS = {"flash_attn": "flash_attn", "liger_kernel": "liger_kernel"}
# a backend or harness (conf/backend, conf/harness) -> the module its environment must have: what its jobs import
BACKEND_MODULES = {"llamafactory": "llamafactory", "axolotl": "axolotl", "lm_eval": "lm_eval"}
MODULES = sorted({*INTEGRATIONS.values(), *KERNELS.values(), *BACKEND_MODULES.values()})
# how long one process of the environment may take to answer (a cold shared file system is slow to import from)
TIMEOUT_S = 600


def facts(python: str, transformers: bool = False) -> dict[str, Any] | None:
    """The environment's answers (`transformers`: its model types and architectures too, seconds the first time),
    or None where its python is not on this machine (the job asks it there) or cannot answer (`answer` says why)."""
    found = answer(python, transformers)
    return found if isinstance(found, dict) else None


def answer(python: str, transformers: bool = False) -> dict[str, Any] | str:
    """The environment's answers, as `facts`; or why its python gave none: not there, or the last line it wrote
    as it failed (a python that does not run here, one too old for the script). A failure is not cached."""
    args = [*(["--transformers"] if transformers else []), *MODULES]
    return _ask(python, args, _cache_file(python, transformers))


def config_keys(python: str, backend: str) -> frozenset[str] | str | None:
    """The keys the backend's own config parser takes in this environment (in_venv/env_facts.py --config-keys:
    LLaMA-Factory's argument dataclasses, axolotl's config model and its bundled plugins' arguments); None where
    its python is not on this machine (the job asks it there); why, where it could not answer."""
    if not Path(python).is_file():
        return None
    found = _ask(python, ["--config-keys", backend], _cache_file(python, False, backend))
    return frozenset(found["config_keys"]) if isinstance(found, dict) else found


def config_kinds(python: str, backend: str) -> dict[str, dict[str, Any]]:
    """What each key of the backend's config takes where that is one plain kind (in_venv/env_facts.kind_of: an int,
    a float, a bool, one of a set of values); {} where the environment is not here or could not answer (asked with
    `config_keys`, one cached answer)."""
    if not Path(python).is_file():
        return {}
    found = _ask(python, ["--config-keys", backend], _cache_file(python, False, backend))
    return dict(found.get("config_kinds") or {}) if isinstance(found, dict) else {}


def eval_tasks(python: str, include: Sequence[str] = ()) -> frozenset[str] | str | None:
    """The task, group and tag names lm-eval's task index knows in this environment (in_venv/env_facts.py
    --lm-eval-tasks), its own and those under the `include` directories (a suite's include_path); None where its
    python is not on this machine (the job asks it there); why, where it could not answer. lm-eval's own (~13 s to
    index) are cached with the environment; a directory's, with the size and mtime of each YAML under it (an edit
    is seen at once, and costs milliseconds)."""
    found = eval_index(python, include)
    if found is None or isinstance(found, str):
        return found
    shipped, own = found
    return frozenset(shipped["tasks"]) | frozenset(own.get("tasks", ()))


def eval_index(python: str, include: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]] | str | None:
    """lm-eval's own task index and the one of the `include` directories ({} without), as in_venv/env_facts.py
    lm_eval_tasks answers them (names, files, the Hub datasets each reads, the YAMLs its index skips), cached as
    `eval_tasks` says; None where its python is not on this machine; why, where it could not answer."""
    if not Path(python).is_file():
        return None
    found = _ask(python, ["--lm-eval-tasks"], _cache_file(python, False, "lm_eval_tasks"))
    if isinstance(found, str) or not include:
        return (found, {}) if isinstance(found, dict) else found
    yamls = sorted(str(f) for d in include for f in Path(d).expanduser().rglob("*.y*ml"))
    state = [list(include), *(_stat(Path(f)) for f in yamls)]
    own = _ask(python, ["--lm-eval-tasks", *include], _cache_file(python, False, json.dumps(state)))
    return (found, own) if isinstance(own, dict) else own


def eval_datasets(python: str, name: str, include: Sequence[str] = ()) -> tuple[frozenset[str], bool] | None:
    """The Hub datasets lm-eval reads for a task, group or tag of this environment (a group's members, a tag's
    tasks, resolved as lm-eval resolves them; local files are not Hub datasets), and whether some of them only its
    code says (a Python task, a custom_dataset function: not counted); None where it cannot say here."""
    found = eval_index(python, include)
    if found is None or isinstance(found, str):
        return None
    for index in reversed(found):  # the include_path's own names first: lm-eval's index takes them over its own
        if name in index.get("datasets", {}):
            return frozenset(index["datasets"][name]), name in index.get("unknown", ())
    return None


def _ask(python: str, args: list[str], cached: Path) -> dict[str, Any] | str:
    if not Path(python).is_file():
        return f"no python at {python}"
    if cached.is_file():
        return dict(json.loads(cached.read_text()))
    with tempfile.TemporaryDirectory(prefix="sft_grid_venv_") as tmp:
        out = Path(tmp) / "facts.json"
        env = {**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
        try:
            proc = subprocess.run(
                [python, str(SCRIPT), str(out), *args], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return f"it gave no answer within {TIMEOUT_S} s"
        except OSError as exc:  # not an executable, a missing interpreter line, no permission
            return exc.strerror or str(exc)
        if proc.returncode != 0 or not out.is_file():
            lines = proc.stderr.strip().splitlines()
            return lines[-1][:300] if lines else f"it exited with status {proc.returncode} and said nothing"
        found = dict(json.loads(out.read_text()))
    _store(cached, found)
    return found


def wanted(python: str) -> bool:
    """Whether the environment's answers (with transformers') are not cached yet: a loss-mask probe about to run in
    that environment answers them too (`request`, `store`), so the grid's checks start one backend process, not
    two (each import of transformers costs seconds)."""
    return Path(python).is_file() and not _cache_file(python, True).is_file()


def request(out: Path) -> dict[str, Any]:
    """What a probe process is asked to answer besides its rows (in_venv/mask_probe.py runs env_facts.py's main)."""
    return {"out": str(out), "modules": MODULES, "transformers": True}


def store(python: str, out: Path) -> None:
    """Cache what a probe process answered for the environment (nothing when it could not answer)."""
    try:
        found = dict(json.loads(out.read_text()))
    except (OSError, ValueError):
        return
    if "modules" not in found:
        return
    _store(_cache_file(python, True), found)
    _store(_cache_file(python, False), {"modules": found["modules"]})


def _cache_file(python: str, transformers: bool, question: str = "") -> Path:
    parts = [_stat(Path(python)), env_state(python), _stat(SCRIPT), MODULES, transformers, *filter(None, [question])]
    key = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]
    return cache_dir() / "venv_facts" / f"{key}.json"


def _store(cached: Path, found: dict[str, Any]) -> None:
    """Cache an answer; a cache folder that cannot be written (a file on its way, no permission: named at start,
    core/project.py check_folder_vars) costs the answer's next asking, never the run."""
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(found))
        tmp.replace(cached)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
