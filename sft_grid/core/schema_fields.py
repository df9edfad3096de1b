"""How a schema field carries its rule (a range, a set of values), how its value nests, and the value sets
the backends accept: what sft_grid/core/schema.py (the cell) and core/eval_schema.py (an evaluation suite) build
their fields from; one generic validation rule (planning/schema_rules.py) reads them back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Range:
    """Allowed numbers: lo <= x <= hi (open ends excluded); `none_ok`: null means "not set"."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def admits(self, x: float) -> bool:
        if isinstance(x, float) and math.isnan(x):
            return False
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def text(self) -> str:
        def show(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        lo = "" if self.lo == -math.inf else f"{'>' if self.lo_open else '>='} {show(self.lo)}"
        hi = "" if self.hi == math.inf else f"{'<' if self.hi_open else '<='} {show(self.hi)}"
        return " and ".join(p for p in (lo, hi) if p)


def num(default: Any, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
        hi_open: bool = False) -> Any:
    """A numeric key with its range."""
    return field(default=default, metadata={"range": Range(lo, hi, lo_open, hi_open)})


def one_of(default: Any, values: tuple[str, ...]) -> Any:
    """A key with a fixed set of values (for a list: of its items)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"choices": values})
    return field(default=default, metadata={"choices": values})


@functools.cache
def field_shapes(cls: type) -> tuple[tuple[str, str, Any, Any], ...]:
    """(name, how its value nests: dataclass | mapping | plain, the dataclass it holds, the field) of each field
    of a schema class; what building typed cells and checking unknown keys both walk."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Union:
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = inner[0] if len(inner) == 1 else hint
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            out.append((f.name, "dataclass", hint, f))
        elif typing.get_origin(hint) in (dict, typing.Dict) and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            out.append((f.name, "mapping", args[1], f))
        else:
            out.append((f.name, "plain", None, f))
    return tuple(out)


# what the backends accept, and what sft_grid renders for each
EXECUTORS = ("local", "slurm")
LAUNCHERS = ("torchrun", "accelerate")
PRECISIONS = ("fp32", "bf16")
CPU_ARCHS = ("x86_64", "aarch64")
GPU_DIRECTIVES = ("gpus_per_node", "gres", "none")
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")
FINETUNING = ("full", "lora", "freeze")
REPORT_TO = ("none", "wandb", "tensorboard")
# transformers' SchedulerType values that both backends pass on and that need no extra arguments
# (cosine_with_min_lr and warmup_stable_decay need scheduler kwargs; reduce_lr_on_plateau needs evaluation)
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")
# LLaMA-Factory's dataset formatting that carries conversations with per-dataset role tags (axolotl reads the
# same rows through its chat_template strategy)
FORMATTINGS = ("sharegpt",)
MODEL_NEEDS = ("delphi_tokenizer_prep", "zero3", "zero3_offload", "consolidate", "preprocessor_config",
               "transformers_ge_5_3")
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds are 32-bit
# where a site's Hub transfers run: the machine running the grid (a login node), or a Slurm job
STAGING_WHERE = ("login", "job")
