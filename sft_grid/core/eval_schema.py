"""The typed schema of an evaluation suite (`conf/eval/<suite>.yaml`, the cell's `eval` section).

A suite names the harness (conf/harness/<harness>.yaml: the pinned virtual environment the evaluation runs in),
the inference engine, its tasks with their settings, and the resources an evaluation job asks for. `eval=none`
(the default) has no task. A suite is not part of a cell's identity: what it trains does not depend on it, so
`eval=a,b` as an axis evaluates one trained cell twice instead of training two (planning/evals.py).

A task's settings below (and the suite's dtype and seed) are part of each of its scores' identity; the engine,
the batch size and the resources are how the score is computed, not what it is, and are not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from sft_grid.core.schema_fields import SEED_MAX, num, one_of

HARNESSES = ("lm_eval",)
# hf: transformers (CPU or GPU); vllm: where the site's harness environment has vllm (cluster.backend_venvs.lm_eval)
EVAL_ENGINES = ("hf", "vllm")
EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EvalTaskConf:
    # the harness's task name; unset: this task's key in the suite (so one task can be listed twice, say 0- and 5-shot)
    task: Optional[str] = None
    num_fewshot: int = num(0, 0)
    # score at most this many documents (a count >= 1) or this fraction of them (< 1); null: all
    limit: Optional[float] = num(None, 0, lo_open=True)
    # generation settings passed to the harness as they are (max_gen_toks, temperature, until, ...)
    gen_kwargs: Dict[str, Any] = field(default_factory=dict)
    # format prompts with the chat template the cell trained with (train == serve is checked first)
    apply_chat_template: bool = True
    # few-shot examples as earlier turns of the chat (needs apply_chat_template)
    fewshot_as_multiturn: bool = False
    # hub datasets the task reads: staged with the grid's inputs, since evaluation jobs run offline
    datasets: List[str] = field(default_factory=list)


@dataclass
class EvalResourcesConf:
    # null: the cluster's partition
    partition: Optional[str] = None
    time: str = "01:00:00"
    # 0: the evaluation runs on the CPU
    gpus: int = num(0, 0)
    cpus: int = num(1, 1)
    mem_gb: Optional[int] = num(None, 1)


@dataclass
class EvalConf:
    name: str = "none"
    harness: str = one_of("lm_eval", HARNESSES)
    engine: str = one_of("hf", EVAL_ENGINES)
    # a count, or "auto" (the harness finds the largest that fits)
    batch_size: Any = 1
    dtype: str = one_of("auto", EVAL_DTYPES)
    seed: int = num(1234, 0, SEED_MAX)
    # a directory of the team's own task YAMLs (lm-eval's --include_path); the project's tiny_* tasks need none
    include_path: Optional[str] = None
    # also score each cell's base model, once per grid, so the table shows what fine-tuning gained
    base_models: bool = False
    # task label -> its settings
    tasks: Dict[str, EvalTaskConf] = field(default_factory=dict)
    resources: EvalResourcesConf = field(default_factory=EvalResourcesConf)
