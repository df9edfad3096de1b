"""End a leg of training at a pruning rung: the checkpoint of that step saved, nothing else.

Runs inside a backend's environment (standalone: stdlib + transformers there; never imports sft_grid).

sft_grid's successive halving (sft_grid/adaptive/) trains a cell in legs that end at its rungs. The job runner
(sft_grid/job/runner.py) sets SFT_GRID_LEG_STOP=<step> for a leg that ends at a rung; this callback then, at that
global step, asks the trainer to save its checkpoint (checkpoint-<step>, with optimizer, scheduler and RNG states)
and to stop. It changes nothing else: the learning-rate schedule is still the one of the cell's full max_steps (or
epochs), built by the trainer before the first step, so the next leg, resumed from the checkpoint by the existing
resume path, continues exactly where an unbroken run would be. Once the trainer's loop has ended it exits with
status 0 from on_train_end, before the backend saves a final model (LLaMA-Factory's run_sft and axolotl save one
right after trainer.train() returns): the output then holds no final weights, so sft_grid never takes the cell for
completed, and the runner marks it `planned`, waiting at its rung. A leg resumed at or past its stop step (a leg
cut after its checkpoint) exits at once in on_train_begin, training nothing.

Without SFT_GRID_LEG_STOP (a cell without rungs, its last leg, a person running launch.sh by hand) nothing is added.

Hooks:
    LLaMA-Factory:  run_exp(args, callbacks=[*, *callbacks()])     (sft_grid_lf.py)
    axolotl:        sft_grid_axolotl.OutputPlugin adds callbacks()  (sft_grid_axolotl.py)
"""

from __future__ import annotations

import os
import sys
from typing import Any

try:  # the backend environments have transformers; unit tests run without it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on the environment
    TrainerCallback = object

# the variable sft_grid/job/runner.py sets (sft_grid/backends/base.py LEG_ENV: the same name)
LEG_ENV = "SFT_GRID_LEG_STOP"


def stop_step(environ: Any = None) -> int | None:
    """The step this leg ends at, or None (train to the end)."""
    value = (os.environ if environ is None else environ).get(LEG_ENV, "").strip()
    if not value:
        return None
    step = int(value)
    if step <= 0:
        raise ValueError(f"{LEG_ENV}={value!r}: a leg ends at a positive step")
    return step


class LegStop(TrainerCallback):
    """Save and stop at `stop` (a global step); exit 0 once the trainer's loop is over."""

    def __init__(self, stop: int) -> None:
        self.stop = stop

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.stop:  # resumed at its rung: nothing left of this leg
            self._leave(state, "resumed at")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step >= self.stop:
            # the trainer's own save (after this callback, in the same step): checkpoint-<step>, every state in it
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.stop:
            self._leave(state, "at")

    def _leave(self, state: Any, how: str) -> None:
        if getattr(state, "is_world_process_zero", True):
            print(f"sft_grid leg: {how} its rung, step {state.global_step}: checkpoint saved, leg over", flush=True)
        sys.stdout.flush()
        # SystemExit passes the trainer's and the backends' `except Exception` handlers: no final model is saved
        raise SystemExit(0)


def callbacks(environ: Any = None) -> list[Any]:
    """The leg's callback, when this process trains a leg that ends at a rung."""
    stop = stop_step(environ)
    return [] if stop is None else [LegStop(stop)]
