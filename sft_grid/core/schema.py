"""The typed config schema: a cell (`CellConf`, registered with Hydra's ConfigStore as ``base_config``) and an
evaluation suite (`EvalConf`), as Hydra structured configs.

conf/config.yaml lists ``base_config`` first in its defaults, so every group option and every override is
merged onto these dataclasses: an unknown key or a value of the wrong type fails at compose time. A key
added with `+` gets past Hydra (that is what `+` is for), so the planner checks every composed key against
these dataclasses too: only the mappings (`extra`, `vars`, `env`, ...) take keys of their own.

Each numeric key carries its range and each key with a fixed set of values carries that set (taken from what
the backends accept), in the field's metadata: one generic validation rule (planning/schema_rules.py) reads them, so
no value a backend would refuse or misread at job time reaches a GPU node. The schemas describe *inputs*; values
derived from them (gradient accumulation, identity, directories) are computed by the planner and never written
back. In order: the fields' helpers and value sets, the evaluation suite's schema, the cell's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import MISSING

from sft_grid.core.templates import TEMPLATES, TOKENIZER_FAMILIES


@dataclass(frozen=True)
class Range:
    """Allowed numbers: lo <= x <= hi (open ends excluded); `none_ok`: null means "not set"."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def admits(self, x: float) -> bool:
        if not math.isfinite(x):  # nan compares false with everything, and no key means infinity
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


def num(
    default: Any, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False
) -> Any:
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
    out: list[tuple[str, str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # Optional[X] or X | None
            inner = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = inner[0] if len(inner) == 1 else hint
        args = typing.get_args(hint)
        if dataclasses.is_dataclass(hint):
            out.append((f.name, "dataclass", hint, f))
        elif typing.get_origin(hint) is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
            out.append((f.name, "mapping", args[1], f))
        else:
            out.append((f.name, "plain", None, f))
    return tuple(out)


# -- plain data -> the schema's dataclasses ---------------------------------------------------------------


# A grid's cells share their group sections, so each distinct section is made typed once and every cell holding
# it holds the same object. Keyed on the section's value, its repr (exact for the types a composed config holds:
# 1, 1.0, "1" and True stay apart), not on the identity of the dict it came from.
_TYPED: dict[tuple[type, str], Any] = {}
T = TypeVar("T")
_FINGERPRINT = "_sft_grid_fingerprint"


def typed(cls: type[T], data: Mapping[str, Any]) -> T:
    """Build schema dataclass instances from resolved plain data (already validated by OmegaConf). Its sections
    are shared by every cell composed with the same values: nothing may change them."""
    kwargs: dict[str, Any] = {}
    klass: type = cls
    for name, how, inner, _ in field_shapes(klass):
        if name not in data:
            continue
        value = data[name]
        if value is None or how == "plain":
            kwargs[name] = value
        elif how == "dataclass":
            kwargs[name] = _shared(inner, value)
        else:
            kwargs[name] = {k: _shared(inner, v) for k, v in value.items()}
    return cls(**kwargs)


def _shared(cls: type, data: Mapping[str, Any]) -> Any:
    key = (cls, repr(data))
    hit = _TYPED.get(key)
    if hit is None:
        if len(_TYPED) > 8192:
            _TYPED.clear()
        hit = _TYPED[key] = typed(cls, data)
    return hit


def fingerprint(value: Any) -> str:
    """A value as a cache key: its repr, which for a section of the schema (a dataclass instance, shared by the
    cells that hold it) is computed once and kept on the object itself; what is derived per section (the cell's
    environment, its checks, its findings) is keyed on it."""
    held = getattr(value, "__dict__", None)
    if held is None or not dataclasses.is_dataclass(value):
        return repr(value)
    found = held.get(_FINGERPRINT)
    if found is None:
        found = held[_FINGERPRINT] = repr(value)
    return str(found)


# what the backends accept, and what sft_grid renders for each
EXECUTORS = ("local", "slurm")
LAUNCHERS = ("torchrun", "accelerate")
PRECISIONS = ("fp32", "bf16")
# the dtypes of checkpoints on disk, as config.json names them (torch_dtype)
WEIGHT_DTYPES = ("bfloat16", "float16", "float32")
# bytes a parameter of each
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
CPU_ARCHS = ("x86_64", "aarch64")
GPU_DIRECTIVES = ("gpus_per_node", "gres", "none")
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")
FINETUNING = ("full", "lora", "freeze")
REPORT_TO = ("none", "wandb", "tensorboard")
# transformers' SchedulerType values that both backends pass on and that need no extra arguments
# (cosine_with_min_lr and warmup_stable_decay need scheduler kwargs; reduce_lr_on_plateau needs evaluation)
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)
# LLaMA-Factory's dataset formatting that carries conversations with per-dataset role tags (axolotl reads the
# same rows through its chat_template strategy)
FORMATTINGS = ("sharegpt",)
MODEL_NEEDS = (
    "delphi_tokenizer_prep",
    "zero3",
    "zero3_offload",
    "consolidate",
    "preprocessor_config",
    "transformers_ge_5_3",
)
# fast kernels a site's environment may have (cluster.kernels): the package each is imported as
KERNELS = ("flash_attn", "liger_kernel")
# how a cell's training state is spread over its GPUs (planning/gpus.py): none (each GPU holds everything: DDP),
# DeepSpeed ZeRO stage 2 (gradients and optimizer states sharded) or 3 (parameters too); auto: the lightest that fits
SHARDINGS = ("auto", "none", "zero2", "zero3")
# what of a ZeRO cell's state lives in CPU memory: none, the optimizer states, or the parameters as well
OFFLOADS = ("auto", "none", "optimizer", "all")
# the attention kernel: eager (the CPU's), torch's sdpa, FlashAttention 2 or 3 (needs cluster.kernels flash_attn)
ATTENTIONS = ("auto", "eager", "sdpa", "fa2", "fa3")
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds are 32-bit
# where a site's Hub transfers run: the machine running the grid (a login node), or a Slurm job
STAGING_WHERE = ("login", "job")


HARNESSES = ("lm_eval",)
# hf: transformers (CPU or GPU); vllm: where the site's harness environment has vllm (cluster.backend_venvs.lm_eval)
EVAL_ENGINES = ("hf", "vllm")
EVAL_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EvalTaskConf:
    # the harness's task name; unset: this task's key in the suite (so one task can be listed twice, say 0- and 5-shot)
    task: str | None = None
    num_fewshot: int = num(0, 0)
    # score at most this many documents (a count >= 1) or this fraction of them (< 1); null: all
    limit: float | None = num(None, 0, lo_open=True)
    # generation settings passed to the harness as they are (max_gen_toks, temperature, until, ...)
    gen_kwargs: dict[str, Any] = field(default_factory=dict)
    # format prompts with the chat template the cell trained with (train == serve is checked first)
    apply_chat_template: bool = True
    # few-shot examples as earlier turns of the chat (needs apply_chat_template)
    fewshot_as_multiturn: bool = False
    # hub datasets the task reads: staged with the grid's inputs, since evaluation jobs run offline
    datasets: list[str] = field(default_factory=list)


@dataclass
class EvalResourcesConf:
    # null: the cluster's partition
    partition: str | None = None
    time: str = "01:00:00"
    # 0: the evaluation runs on the CPU
    gpus: int = num(0, 0)
    cpus: int = num(1, 1)
    mem_gb: int | None = num(None, 1)


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
    include_path: str | None = None
    # also score each cell's base model, once per grid, so the table shows what fine-tuning gained
    base_models: bool = False
    # also score the cell's saved checkpoints, each in a job of its own after it exists: null (the final
    # model only), "checkpoint" (every checkpoint), or N (the checkpoints at multiples of N steps)
    along: Any = None
    # task label -> its settings
    tasks: dict[str, EvalTaskConf] = field(default_factory=dict)
    resources: EvalResourcesConf = field(default_factory=EvalResourcesConf)


@dataclass
class VenvSpecConf:
    """Pinned packages of a managed virtual environment (sft-grid venv build <backend>)."""

    python: str = "python3.11"
    packages: list[str] = field(default_factory=list)
    packages_no_deps: list[str] = field(default_factory=list)
    drop_native_libs: list[str] = field(default_factory=list)
    check: str = ""


@dataclass
class BackendConf:
    name: str = MISSING
    # argv of the backend's CLI, relative to the virtual environment's bin/ directory
    entrypoint: list[str] = field(default_factory=list)
    venv: VenvSpecConf = field(default_factory=VenvSpecConf)
    # keys merged into every rendered backend config; the cell's `extra` wins over them
    train_defaults: dict[str, Any] = field(default_factory=dict)
    # what the managed virtual environment has: model needs it meets (transformers_ge_5_3) and deepspeed
    provides: list[str] = field(default_factory=list)


@dataclass
class StagingConf:
    """How a site stages the Hub models and datasets of a grid before anything is queued (stages/staging/)."""

    # where the transfers run: login (the machine running the grid, or `sft-grid stage`) or job (a
    # Slurm job on `partition`, e.g. a transfer partition whose nodes reach the Hub; its cells wait for it)
    where: str = one_of("login", STAGING_WHERE)
    partition: str | None = None
    # shell lines a staging job runs first (a module load, a proxy or tunnel to the Hub); one line of bash each
    setup: list[str] = field(default_factory=list)
    # wall time of a staging job, "HH:MM:SS" or "D-HH:MM:SS"
    time: str = "04:00:00"
    # seconds after which the machine running the grid kills a process (Leonardo's login node: about 100);
    # staging there stops cleanly before it, and a rerun continues; null: no limit
    time_limit_s: int | None = num(None, 10)
    # whether the machine running the grid reads the staged files (mounts the cache's filesystem); false:
    # the checks that read them wait for the jobs' first step
    readable_here: bool = True


@dataclass
class RemoteConf:
    """A site reached over OpenSSH from the machine the grid is launched from (sft_grid/sites/remote.py)."""

    # a Host of the user's ssh config (its keys, agent and jump hosts apply); null: the site is this machine
    host: str | None = None
    # where sft_grid keeps its code snapshots on the site (<root>/code/<commit>); the cells stay under runs_root
    root: str | None = None
    # the site's python with sft_grid's dependencies (a module load or an environment's bin/python)
    python: str = "python3"
    # another ssh config file than ~/.ssh/config (ssh -F); null: the user's own
    ssh_config: str | None = None
    # seconds to make the connection (ssh's ConnectTimeout: the connect and the banner); a made connection silent for
    # alive_interval_s x alive_count_max seconds is dead (ServerAliveInterval, ServerAliveCountMax). null: the ssh
    # config's own for the host, else 30, 15 and 4
    connect_timeout_s: int | None = num(None, 1)
    alive_interval_s: int | None = num(None, 1)
    alive_count_max: int | None = num(None, 1)
    # the bound of each command that answers (the site's python checked, a snapshot sent, a status, a pull of
    # results or report), and of a launch's run on the site (its checks, its staging, its sbatch calls) streamed here
    timeout_s: int = num(300, 1)
    launch_timeout_s: int = num(43200, 1)


@dataclass
class SiteNeedsConf:
    """What a cell needs of the site it is placed on (a grid across sites, `sites=[...]`); unset: anything."""

    cpu_arch: str | None = None
    # a GPU model the site's gpu_type must start with (H100 matches H100-SXM)
    gpu_type: str | None = None
    gpu_mem_gb: int | None = num(None, 1)
    # false: the cell may run where compute nodes have no internet (its inputs are staged before it is queued)
    internet: bool = False


@dataclass
class ClusterConf:
    name: str = MISSING
    # local: submitit's local executor on this machine; slurm: submitit's Slurm executor
    executor: str = one_of("local", EXECUTORS)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    # 0 means a CPU-only node: one training process per node
    gpus_per_node: int = num(0, 0)
    # the GPU model, for estimates before launch: A100, H100, GH200, H200, B200 (a name that starts with one, like
    # A100-64GB, counts as it), or CPU for CPU-only nodes; another model needs gpu_peak_tflops
    gpu_type: str | None = None
    # one GPU's dense bf16 peak in TFLOP/s, for a GPU model sft_grid does not know (wins over the table)
    gpu_peak_tflops: float | None = num(None, 0, lo_open=True)
    cpus_per_node: int = num(1, 1)
    mem_gb: int | None = num(None, 1)
    # longest wall time a job may ask for, "HH:MM:SS" or "D-HH:MM:SS"
    max_time: str = "24:00:00"
    cpu_arch: str = one_of("x86_64", CPU_ARCHS)
    internet_on_compute: bool = False
    # shell lines run before training (module loads, virtual environment activation); each is one line of bash
    setup: list[str] = field(default_factory=list)
    # environment variables every job of this cluster exports
    env: dict[str, str] = field(default_factory=dict)
    # how multi-node and multi-GPU training is started: torchrun or accelerate
    launcher: str = one_of("torchrun", LAUNCHERS)
    # bf16 on GPU sites; CPU runs train in fp32
    precision: str = one_of("fp32", PRECISIONS)
    runs_root: str = "runs"
    # backend (or harness) name -> the site's own environment: a virtualenv's or conda environment's directory (with
    # bin/python), or a conda environment's name (`sft311`, or `conda:sft311`: found as conda finds it); unset: the
    # managed one. Checked before anything is queued: there, its python runs, the backend importable (docs/setup.md)
    # (each backend's key is there, null: so `cluster.backend_venvs.axolotl=<dir>` sets it without Hydra's `+`)
    backend_venvs: dict[str, str | None] = field(
        default_factory=lambda: dict.fromkeys(("llamafactory", "axolotl", "lm_eval"))
    )
    # model need -> backend name -> a virtual environment that meets it, e.g. the team's transformers >= 5.3
    # one for Qwen3.5: need_venvs: {transformers_ge_5_3: {llamafactory: /path/to/venv}}
    need_venvs: dict[str, dict[str, str]] = field(default_factory=dict)
    # deprecated spellings of backend_venvs and need_venvs (earlier versions); read as if they were those
    backend_envs: dict[str, str] = field(default_factory=dict)
    need_envs: dict[str, dict[str, str]] = field(default_factory=dict)
    # the site's Hugging Face hub cache (HF_HUB_CACHE), a per-user directory on a shared filesystem, e.g.
    # ${user_env:SFT_GRID_LEONARDO_HF_CACHE}; null: HF_HUB_CACHE or HF_HOME/hub of the environment
    hf_cache: str | None = None
    staging: StagingConf = field(default_factory=StagingConf)
    # a partition whose nodes reach the internet: post-training jobs that upload to the Hub run there on a
    # site without internet on compute nodes; unset there: the upload waits for `sft-grid post`
    # run from the login node
    post_partition: str | None = None
    # Slurm: node features (--constraint), nodes to avoid (--exclude), any other sbatch option by name
    constraint: str | None = None
    exclude: str | None = None
    sbatch_extra: dict[str, Any] = field(default_factory=dict)
    # Slurm: how GPUs are requested: gpus_per_node (--gpus-per-node), gres (--gres=gpu:N) or none (whole nodes)
    gpu_directive: str = one_of("gpus_per_node", GPU_DIRECTIVES)
    # Slurm: how often a cell that hits its time limit or is preempted is requeued before it counts as failed
    max_requeues: int = num(3, 0)
    # a running cell whose training makes no progress (no step, no checkpoint file, no data step record, no move of
    # a progress bar; a log that only grows is none) for this many seconds is hung: its job's runner ends it with
    # the failure `hang` and the policy's next step (a requeue from the last checkpoint). Longer than the longest
    # healthy wait between two steps (a ZeRO-3 checkpoint save, an evaluation); null: no watch
    hang_after_s: int | None = num(900, 10)
    # ... or this many times the cell's own time between two logged steps, once it has logged some, when longer
    hang_multiple: float = num(10.0, 1)
    # ... and before a job's training logs its first step (imports from a cold shared file system, loading a large
    # model, the rendezvous), this long at least
    hang_startup_s: int = num(1800, 10)
    # local executor: cells trained at once on this machine
    max_parallel: int = num(1, 1)
    # local executor: block until the grid is done and print its final states
    wait: bool = True
    # a remote site: everything site-side over ssh; unset: the grid runs where it is launched
    remote: RemoteConf = field(default_factory=RemoteConf)
    # grids across sites (sft_grid/sites/placement.py): the site's facts a placement weighs.
    # the most nodes one job may ask for; null: no limit known
    max_nodes: int | None = num(None, 1)
    # one GPU's memory in GB as nvidia-smi totals it (the vendor's "80GB" is 80 GiB there); null: not known (a cell
    # that needs some is not placed here, and no cell's memory is checked against it). The layout of every GPU cell
    # is chosen to fit it (sft_grid/planning/gpus.py)
    gpu_mem_gb: int | None = num(None, 1)
    # one node's inter-node bandwidth in GB/s (all its network adapters together, one direction): what the gradient
    # and parameter exchange of a cell spread over nodes costs in the estimate; null: not known (not priced)
    internode_gbps: float | None = num(None, 0, lo_open=True)
    # the fast kernels the site's backend environments have installed: flash_attn (FlashAttention 2/3, chosen by
    # `layout.attention: auto`) and liger_kernel (Liger's fused RMSNorm, RoPE, SwiGLU and linear cross-entropy,
    # chosen by `layout.liger: null`); the managed CPU environments have neither
    kernels: list[str] = one_of([], KERNELS)
    # node-hours the account has left where the site reports it; null: not reported (no limit weighed)
    allocation_node_h: float | None = num(None, 0)
    # whether staging reaches the Hub (or its mirror) from this site; false: only cells whose inputs are staged
    hub_reachable: bool = True
    # the environment of the site's Slurm client commands (sbatch, squeue, sacct, scancel), e.g. SLURM_CONF of a
    # second cluster on one login node; its jobs inherit it
    client_env: dict[str, str] = field(default_factory=dict)
    # when a grid across sites calls this site's controller down (sft_grid/sites/facts.py, moves.py): each look at
    # the site asks it (sinfo) up to this many times, 2 s, 4 s, ... apart; a look that gets no answer records when
    # the silence began (the grid's sites.json) ...
    site_answer_tries: int = num(3, 1)
    # ... and the site is down, its queued cells moved to another site, only once that silence has lasted this many
    # seconds, at a later look; 0: at the first look without an answer
    site_down_after_s: int = num(600, 0)


@dataclass
class ModelConf:
    name: str = MISSING
    # a Hugging Face hub id (used on the clusters) ...
    hub_id: str | None = None
    # ... or a local directory; when set it is what the backend loads
    path: str | None = None
    # the Hub revision to train (a branch, tag or 40-hex commit); null: the repository's `main` as staging finds it.
    # Part of the cell's identity when set: another commit is another model.
    revision: str | None = None
    # False: the hub id is not confirmed by its publisher's records (a name that follows the pattern of the confirmed
    # ones); its cells are queued only once staging (or `sft-grid check`) has resolved it on the site's Hub
    confirmed: bool = True
    # the size in billions of parameters: node sizing, the FLOPs and time estimates, the scaling fit's x-axis
    params_b: float = num(MISSING, 0, lo_open=True)
    # the exact parameter count, where the publisher gives it (or its shape determines it); wins over params_b
    # where an exact count matters (the FLOPs estimate, the scaling fit)
    params: int | None = num(None, 1)
    # the shape, where the publisher gives it (its config.json): checked against the checkpoint's config.json, and
    # what the GPU memory model reads (planning/gpus.py: activations per layer, the logits, the largest layer)
    num_layers: int | None = num(None, 1)
    hidden_size: int | None = num(None, 1)
    num_heads: int | None = num(None, 1)
    # key/value heads (grouped-query attention); null: num_heads
    num_kv_heads: int | None = num(None, 1)
    # the MLP's inner width; null: 4 x hidden_size
    intermediate_size: int | None = num(None, 1)
    # the vocabulary (the logits' width); null: the tokenizer family's
    vocab_size: int | None = num(None, 1)
    # the pretraining compute in FLOPs, where the publisher gives it (Delphi's "2e19" bucket is really 1.8e19): the
    # report's compute axis; unset, it is read from a name like delphi-3e18-...
    compute_budget: float | None = num(None, 0, lo_open=True)
    # how the weights are stored on the Hub: the download and the prepared copy weigh this many bytes a parameter
    # (Delphi checkpoints are float32: 4 bytes a parameter); training loads them in the cluster's precision
    weights_dtype: str = one_of("bfloat16", WEIGHT_DTYPES)
    # llama3, qwen3, qwen3_5, delphi: which tokenizer the checkpoint carries
    tokenizer_family: str = one_of(MISSING, tuple(TOKENIZER_FAMILIES))
    # the chat template the backend renders with (LLaMA-Factory / axolotl template name)
    template: str = one_of(MISSING, tuple(TEMPLATES))
    # what the model needs, e.g. [zero3, consolidate] for 32B, [transformers_ge_5_3] for Qwen3.5
    needs: list[str] = one_of([], MODEL_NEEDS)


def exact_params(model: ModelConf) -> int:
    """The model's parameter count: the exact one where it is given, else its size in billions; 0 where neither is
    a number (params_b left out: `???`, refused by the schema's required rule, which this must not crash before)."""
    if model.params:
        return int(model.params)
    size = model.params_b
    return round(size * 1e9) if isinstance(size, int | float) and not isinstance(size, bool) else 0


def weights_bytes(model: ModelConf) -> int:
    """What the checkpoint's weights weigh as stored (a download, a prepared copy): its dtype's bytes a parameter."""
    return exact_params(model) * DTYPE_BYTES[model.weights_dtype]


@dataclass
class DatasetTags:
    role_tag: str = "role"
    content_tag: str = "content"
    user_tag: str = "user"
    assistant_tag: str = "assistant"
    system_tag: str | None = "system"
    observation_tag: str | None = None
    function_tag: str | None = None


@dataclass
class DatasetConf:
    # a hub id (rendered as hf_hub_url) or a local file or directory
    source: str = MISSING
    formatting: str = one_of("sharegpt", FORMATTINGS)
    # the column holding the conversation
    messages: str = "messages"
    tags: DatasetTags = field(default_factory=DatasetTags)
    split: str = "train"
    # the split's rows and its tokens under the cell's template, where a count is published: what the estimate uses
    # when the data cannot be read here (a Hub dataset not staged); read rows and a token sample win over them
    rows: int | None = num(None, 1)
    tokens: int | None = num(None, 1)
    # the chat template `tokens` was counted with: the count stands only for cells of that template (another
    # tokenizer splits the same text otherwise); null: any
    tokens_template: str | None = None


@dataclass
class MixConf:
    # concat, interleave_under (stop at the first exhausted source), interleave_over (at the last)
    strategy: str = one_of("concat", MIX_STRATEGIES)
    # one probability per dataset, in the order of `dataset`; interleave strategies only
    probs: list[float] | None = None


@dataclass
class WatchdogConf:
    """The loss watchdog inside training (both backends): a run whose logged loss is NaN/inf, stays above k
    times its first logged loss for p logged steps, or sits at ln(vocab size) (a collapsed model: a uniform
    guess) within tol * ln(V) for p logged steps stops early, keeps its checkpoints and records why."""

    enabled: bool = True
    k: float = num(4.0, 1, lo_open=True)
    p: int = num(3, 1)
    tol: float = num(1.0e-4, 0, 0.1, lo_open=True)


@dataclass
class NotifyConf:
    """Who hears when a cell ends (completed, or failed with its class) and when the whole grid is done:
    once each, across requeues and reruns."""

    # argv of a command; the event goes to its stdin as JSON and into its environment as SFT_GRID_EVENT_*
    command: list[str] = field(default_factory=list)
    # a webhook URL without credentials (an HTTP POST of the same JSON) ...
    webhook: str | None = None
    # ... or the name of an environment variable that holds one (a URL with a token never goes into a file)
    webhook_env: str | None = None


@dataclass
class LayoutConf:
    """How a cell is laid out on its GPUs (planning/gpus.py chooses each `auto`/null for the cell)."""

    sharding: str = one_of("auto", SHARDINGS)
    offload: str = one_of("auto", OFFLOADS)
    # activation checkpointing (recompute each layer in the backward pass); null: only where memory needs it
    checkpointing: bool | None = None
    attention: str = one_of("auto", ATTENTIONS)
    # Liger's kernels, its fused linear cross-entropy included (no full logits tensor); null: where installed
    liger: bool | None = None


@dataclass
class CellConf:
    cluster: ClusterConf = MISSING
    backend: BackendConf = MISSING
    model: ModelConf = MISSING
    # dataset name -> its config; several entries make a mix (`dataset=[a,b]`)
    dataset: dict[str, DatasetConf] = field(default_factory=dict)
    mix: MixConf = field(default_factory=MixConf)
    # the evaluation suite run after training (conf/eval; not identity): eval=none, the default, runs none
    eval: EvalConf = field(default_factory=EvalConf)

    # Values a sweep file defines for its own interpolations, e.g. a table of models and the row a cell
    # trains (sweeps/delphi_scaling.yaml). Not part of a cell's identity: the values they feed into are.
    vars: dict[str, Any] = field(default_factory=dict)

    # The grid this cell belongs to: its cells live under <runs_root>/<sweep_name>/.
    sweep_name: str = "default"
    runs_root: str | None = None

    # training hyperparameters (all part of the cell's identity)
    # above 1 no optimizer a backend offers trains (AdamW's step moves each weight by about lr): 2e5 is 2e-5 with its
    # exponent's minus lost, which would diverge at step 1 after the queue wait
    lr: float = num(1.0e-5, 0, 1, lo_open=True)
    epochs: float = num(1.0, 0)
    # > 0 stops after this many optimizer steps, overriding epochs; -1: train `epochs`
    max_steps: int = num(-1, -1)
    global_batch_size: int = num(16, 1)
    micro_batch_size: int = num(1, 1)
    cutoff_len: int = num(4096, 1)
    seed: int = num(42, 0, SEED_MAX)
    scheduler: str = one_of("cosine", SCHEDULERS)
    warmup_ratio: float = num(0.0, 0, 1, hi_open=True)
    # AdamW's decay is decoupled: each step multiplies every weight by (1 - lr * weight_decay). Fine-tunes use 0 to 0.1;
    # at 10, 10k steps at lr=2e-5 shrink the pretrained weights to e^-2 of themselves, and above 1 an lr the schema
    # admits (up to 1) turns the factor negative: 1e2 is 1e-2 with its exponent's minus lost
    weight_decay: float = num(0.0, 0, 1)
    # the gradient norm clipped to (0: no clipping, as the Trainer reads it); a norm above 100 clips nothing a
    # fine-tune produces, so 1e3 is 1e-3 with its exponent's minus lost
    max_grad_norm: float = num(1.0, 0, 100)
    adam_beta1: float = num(0.9, 0, 1, hi_open=True)
    adam_beta2: float = num(0.999, 0, 1, hi_open=True)
    finetuning_type: str = one_of("full", FINETUNING)
    # several examples concatenated into each cutoff_len sequence, none attending to another (planning/gpus.py):
    # a step then counts global_batch_size sequences of cutoff_len tokens; null: on for GPU clusters, off on CPU-only
    # ones. Part of the identity only when on (an unpacked cell keeps the identity it had before packing existed)
    packing: bool | None = None
    # backend config keys passed through as they are (identity-relevant)
    extra: dict[str, Any] = field(default_factory=dict)

    # checkpointing and logging (not identity)
    save_steps: int = num(500, 1)
    # checkpoints kept (the oldest are deleted as new ones are saved); null keeps every one
    save_total_limit: int | None = num(None, 1)
    # delete output/checkpoint-* once the final model is uploaded and verified (a post-training stage);
    # null: on where the cell uploads
    cleanup_checkpoints: bool | None = None
    logging_steps: int = num(10, 1)
    report_to: str = one_of("none", REPORT_TO)
    # upload output/ to the Hub after training (a post-training stage, never the trainer's own push)
    push_to_hub: bool = False
    # the Hub repository; {key} (the identity hash), {name}, {model} and {data} are filled in per cell
    hub_model_id: str | None = None
    # register the uploaded model in a database: off unless a grid turns it on; the hook runs
    # register_command (argv; {hub_model_id} {base_model} {datasets} {cell} are filled in) after the upload
    register_db: bool = False
    register_command: list[str] = field(default_factory=list)

    # resources and run control (not identity)
    # nodes a cell trains on; null: the fewest that fit its memory (planning/gpus.py)
    nodes: int | None = num(None, 1)
    # how the cell is spread over its GPUs and what keeps it in memory; each `auto`/null is chosen per cell, the
    # cheapest that fits the GPU's memory (planning/gpus.py); a value set here is kept, or refused when it cannot fit
    layout: LayoutConf = field(default_factory=LayoutConf)
    time: str = "04:00:00"
    # the most cells of this grid running at once on Slurm (the job array throttle, %N); null: no limit
    concurrency: int | None = num(None, 1)
    dry_run: bool = False
    # rerun cells that are already completed (their old output is moved aside, never deleted)
    force: bool = False
    # rerun cells whose last attempt failed
    rerun_failed: bool = False
    # what happens after a failure, per class (core/failures/policy.py): {node_failure: requeue:3, gpu_oom: stop}
    failure_policy: dict[str, Any] = field(default_factory=dict)
    watchdog: WatchdogConf = field(default_factory=WatchdogConf)
    notify: NotifyConf = field(default_factory=NotifyConf)
    # stage the grid's Hub inputs and stop: nothing is rendered or queued (sft-grid stage)
    stage_only: bool = False
    # `sft-grid check`: resolve every Hub input of the grid on the site's Hub or mirror and report; nothing else
    check_only: bool = False
    # cells whose data tokenizes the same share one tokenized dataset, built once before them (stages/tokenize.py);
    # false: each cell tokenizes in its own job
    tokenize_once: bool = True
    # grids that steer themselves (sft_grid/adaptive/spec.py documents and validates both blocks; not
    # identity): successive halving of the grid's cells, and the next cells from the fit. Empty: off.
    prune: dict[str, Any] = field(default_factory=dict)
    adaptive: dict[str, Any] = field(default_factory=dict)
    # queue Slurm jobs from a checkout whose conf/, sweeps/ or package has uncommitted changes: the changes ship in
    # the jobs' code snapshot and each cell's ledger names them (sft_grid/sites/snapshot.py); false: refused
    ship_dirty: bool = False
    # the sites (cluster profiles, conf/cluster/<name>.yaml) the grid's cells are placed on, each cell on
    # one where it is feasible, earliest expected start first (sft_grid/sites/placement.py); empty: the cell's
    # own cluster. Not identity: the same cell on another site is the same cell.
    sites: list[str] = field(default_factory=list)
    # what a cell needs of its site (any site when unset)
    site_needs: SiteNeedsConf = field(default_factory=SiteNeedsConf)
    # a grid across sites: a cell still queued this long after its submission ("HH:MM:SS") moves to another site
    # (sft_grid/sites/moves.py), as one whose site does not answer does; null: only the latter
    move_after: str | None = None
