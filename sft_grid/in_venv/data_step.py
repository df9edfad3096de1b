"""The data step's record: when each process of a job prepared its training data, and what it cost.

Runs inside the backend environments (standalone: it never imports sft_grid). The data step is the backend's own
call that turns the configured data into what the trainer reads: LLaMA-Factory's `get_dataset`, axolotl's
`load_datasets` (for its preprocess command too). In a cell that shares a tokenization it only loads that; in a
cell that does not, and in the grid's tokenize job, it tokenizes.

With SFT_GRID_DATA_STEP naming a file (launch.sh and tokenize.sh export it), every call appends two JSON lines:

    {"event": "start", "what": "get_dataset", "rank": 0, "pid": 123, "job": "4711", "time": 1764561234.5}
    {"event": "end", ..., "ok": true, "wall_s": 0.84, "cpu_s": 0.79}

`cpu_s` is user + system time of the process and of the child processes it waited for (a multiprocess map's
workers) while the step ran. A `start` with no `end` is a process that died or was killed in its data step (the
"tokenization hang that looked like a 24 h timeout"). Without the variable nothing is recorded.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

ENV = "SFT_GRID_DATA_STEP"


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:  # one short line per write: appends from several ranks do not interleave
        fh.write(json.dumps(record) + "\n")


def timed(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """`fn`, recording each call in the data step file (once: wrapping a wrapped function changes nothing)."""
    if getattr(fn, "sft_grid_data_step", False):
        return fn

    @functools.wraps(fn)
    def step(*args: Any, **kwargs: Any) -> Any:
        path = os.environ.get(ENV)
        if not path:
            return fn(*args, **kwargs)
        who = {
            "what": what,
            "rank": int(os.environ.get("RANK", "0")),
            "pid": os.getpid(),
            "job": os.environ.get("SLURM_JOB_ID", ""),
        }
        _append(path, {"event": "start", **who, "time": round(time.time(), 3)})
        wall, cpu, ok = time.monotonic(), _cpu(), False
        try:
            result = fn(*args, **kwargs)
            ok = True
            return result
        finally:
            _append(
                path,
                {
                    "event": "end",
                    **who,
                    "time": round(time.time(), 3),
                    "ok": ok,
                    "wall_s": round(time.monotonic() - wall, 3),
                    "cpu_s": round(_cpu() - cpu, 3),
                },
            )

    step.sft_grid_data_step = True  # type: ignore[attr-defined]
    return step


def wrap(name: str, modules: tuple[str, ...]) -> None:
    """Time `name` in the first module, and rebind it in the others that already imported it by name."""
    source = sys.modules.get(modules[0])
    if source is None or not hasattr(source, name):
        return
    wrapped = timed(getattr(source, name), name)
    for module_name in modules:
        module = sys.modules.get(module_name)
        if module is not None and name in vars(module):
            setattr(module, name, wrapped)


def patch_llamafactory() -> None:
    """LLaMA-Factory's get_dataset, where its sft workflow and sft_grid's tokenize call it from."""
    import llamafactory.data.loader  # the modules below bind the name at their import
    import llamafactory.train.sft.workflow  # noqa: F401

    wrap("get_dataset", ("llamafactory.data.loader", "llamafactory.data", "llamafactory.train.sft.workflow"))


def patch_axolotl() -> None:
    """axolotl's load_datasets, where its train and preprocess commands call it from (the train command looks
    it up in axolotl.common.datasets at call time; preprocess imported it by name)."""
    import axolotl.common.datasets  # noqa: F401

    wrap("load_datasets", ("axolotl.common.datasets", "axolotl.cli.preprocess", "axolotl.cli.train"))
