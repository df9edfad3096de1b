"""The hang watch (sft_grid/job/hang.py) on a real LLaMA-Factory training, through the grid and the job's runner
(submitit's local executor): what counts is the training's progress, never the log's growth.

What the training does is injected into LLaMA-Factory's own process: a sitecustomize.py on the PYTHONPATH the job
passes on to launch.sh adds a Trainer callback to its run_exp (as sft_grid_lf.py adds the loss watchdog's). The
callback starts a thread that prints what a hung rank's log keeps printing (NCCL's watchdog, a retry loop counting
its attempts), then either stalls the training at a step (the main thread waits forever, as a rank in a collective
whose peer is gone) or only slows it down (a slow start, then seconds between steps). The stalled one is ended as
`hang` once the bound passed since its last step, the noise notwithstanding; the slow one completes.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from sft_grid.core.layout import iter_cell_dirs

from .conftest import REPO_ROOT, run_sft
from .helpers import ledger

pytestmark = pytest.mark.backend

BOUND_S = 10  # cluster.hang_after_s: the schema's least; the tiny model's steps take milliseconds
EVERY_S = 0.5  # between two rounds of noise

INJECT = r'''
"""Test injection (tests/test_hang_training.py): in LLaMA-Factory's training process only (the one that imports its
tuner), a Trainer callback that prints a hung rank's noise and stalls or slows the training, as SFT_GRID_TEST_HANG
(JSON) says; without it, nothing."""
import importlib.abc
import importlib.util
import itertools
import json
import os
import sys

PLAN = json.loads(os.environ.get("SFT_GRID_TEST_HANG") or "null")
NOISE = {
    "nccl": "[rank0]:[W{stamp} ProcessGroupNCCL.cpp:1669] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog: "
    "WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=202048, Timeout(ms)=1800000) still running after {ms} ms",
    "retry": "WARNING storage: read of /lustre/scratch/shard-00017.arrow timed out; retry {n}/1000 [backoff 0.5 s]",
}


def say(text):
    print(f"sft_grid test: {text}", file=sys.stderr, flush=True)


def callbacks():
    import threading
    import time

    from transformers import TrainerCallback

    def noise():
        n = 0
        while True:
            n += 1
            stamp = time.strftime("%m%d %H:%M:%S") + f".{n:06d}"
            for kind in PLAN["noise"]:
                print(NOISE[kind].format(n=n, stamp=stamp, ms=n * 500), file=sys.stderr, flush=True)
            time.sleep(PLAN["every_s"])

    class Plan(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            threading.Thread(target=noise, daemon=True).start()
            say(f"train begins at {time.time():.3f}")
            time.sleep(PLAN.get("begin_s", 0))

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == PLAN.get("stall_at"):
                say(f"stalled at step {state.global_step} at {time.time():.3f}")
                threading.Event().wait()
            say(f"step {state.global_step} at {time.time():.3f}")
            time.sleep(PLAN.get("step_s", 0))

    return [Plan()]


class AfterImport(importlib.abc.MetaPathFinder):
    """LLaMA-Factory's tuner, its run_exp wrapped to add the callback once the module ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "llamafactory.train.tuner":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            run_exp = module.run_exp

            def with_plan(args=None, callbacks_=None):
                return run_exp(args, [*(callbacks_ or []), *callbacks()])

            module.run_exp = with_plan

        spec.loader.exec_module = exec_module
        return spec


if PLAN is not None:
    sys.meta_path.insert(0, AfterImport())
'''


def _train(tmp_path: Path, plan: dict[str, Any], max_steps: int) -> tuple[Path, str]:
    """Train a tiny Llama cell with the plan injected; its directory and its training log."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(INJECT)
    root = tmp_path / "runs"
    run_sft(
        "model=tiny_llama",
        f"max_steps={max_steps}",
        "save_steps=2",
        "global_batch_size=2",
        "micro_batch_size=2",
        "scheduler=constant",
        f"cluster.hang_after_s={BOUND_S}",
        f"runs_root={root}",
        env={
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(inject)]),
            "SFT_GRID_TEST_HANG": json.dumps({"every_s": EVERY_S, **plan}),
        },
        timeout=900,  # the grid returns once the cell ended: no sleep here (the old watch never ended this one)
    )
    (cell,) = iter_cell_dirs(root / "default")
    return cell, (cell / "logs" / "train.log").read_text()


def _said(log: str, what: str) -> list[tuple[int | None, float]]:
    """The callback's own lines: (step, time) of each `what` ("step", "stalled at step", "train begins")."""
    found = re.findall(rf"sft_grid test: {what} (?:(\d+) )?at (\d+\.\d+)", log)
    return [(int(step) if step else None, float(at)) for step, at in found]


@pytest.mark.parametrize("noise", ["nccl", "retry"])
def test_a_stalled_training_whose_log_keeps_growing_is_ended_as_a_hang(tmp_path, tiny_assets, noise):
    """The training stops at step 4 while its log keeps growing (a line every half second): ended at the bound
    after its last step, recorded as `hang` with that step, requeued by the policy."""
    cell, log = _train(tmp_path, {"noise": [noise], "stall_at": 4}, max_steps=200)
    (stalled,) = _said(log, "stalled at step")
    assert stalled[0] == 4, stalled
    failed = [e for e in ledger(cell) if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["class"] == "hang" and failed[0]["action"] == "requeue", failed
    hung = failed[0]
    # within the bound: ended once BOUND_S passed since the last progress (step 3, just before the stall), at the
    # next poll (1 s), with room for a slow machine's runner waking late
    assert hung["bound_s"] == BOUND_S and BOUND_S <= hung["silent_s"] <= BOUND_S + 15, hung
    assert "last logged step 3 of 200" in hung["evidence"], hung["evidence"]
    # the log grew all through those seconds: the noise went on until the runner ended the training
    after = log.split("sft_grid test: stalled at step 4", 1)[1]
    ended = after.index("--- sft_grid: ")
    lines = [line for line in after[:ended].splitlines() if ("Watchdog" in line or "retry" in line)]
    assert len(lines) >= BOUND_S / EVERY_S / 2, (len(lines), after[:2000])
    assert f"no training progress for {hung['silent_s']}" in after[ended:], after[ended:]


def test_a_slow_training_that_makes_steps_is_not_ended(tmp_path, tiny_assets):
    """A start slower than the step bound (the start-up bound holds before the first step) and two seconds between
    steps, with both kinds of noise all along: the training's own steps are its progress, and it completes."""
    cell, log = _train(tmp_path, {"noise": ["nccl", "retry"], "begin_s": BOUND_S + 3, "step_s": 2}, max_steps=5)
    history = ledger(cell)
    assert not [e for e in history if e["event"] == "failed"], history
    assert history[-1]["event"] == "completed" or any(e["event"] == "completed" for e in history), history
    # what the training did, by its own clock: a start past the step bound, then a step every 2 s or more
    ((_, began),) = _said(log, "train begins")
    steps = _said(log, "step")
    assert [s for s, _ in steps] == [1, 2, 3, 4, 5], steps
    assert steps[0][1] - began >= BOUND_S + 3
    assert all(b[1] - a[1] >= 2 for a, b in itertools.pairwise(steps)), steps
    assert log.count("Watchdog: WorkNCCL") >= 10 and log.count("timed out; retry") >= 10
