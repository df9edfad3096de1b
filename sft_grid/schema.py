"""Typed schemas of the cell config, registered with Hydra's ConfigStore as ``base_config``.

conf/config.yaml lists ``base_config`` first in its defaults, so every group option and every override is
merged onto these dataclasses: an unknown key or a value of the wrong type fails at compose time.
The schemas describe *inputs*; values derived from them (gradient accumulation, identity, directories)
are computed in plan.py and never written back into the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING


@dataclass
class EnvSpecConf:
    """Pinned packages of a managed backend environment (see sft_grid/env.py)."""

    python: str = "python3.11"
    packages: List[str] = field(default_factory=list)
    packages_no_deps: List[str] = field(default_factory=list)
    drop_native_libs: List[str] = field(default_factory=list)
    check: str = ""


@dataclass
class BackendConf:
    name: str = MISSING
    # argv of the backend's CLI, relative to the environment's bin/ directory
    entrypoint: List[str] = field(default_factory=list)
    env: EnvSpecConf = field(default_factory=EnvSpecConf)
    # keys merged into every rendered backend config; the cell's `extra` wins over them
    train_defaults: Dict[str, Any] = field(default_factory=dict)
    # model needs (conf/model `needs`) that the managed environment meets, e.g. transformers_ge_5_3
    provides: List[str] = field(default_factory=list)


@dataclass
class ClusterConf:
    name: str = MISSING
    # local: submitit's local executor on this machine; slurm: submitit's Slurm executor
    executor: str = "local"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    # 0 means a CPU-only node: one training process per node
    gpus_per_node: int = 0
    cpus_per_node: int = 1
    mem_gb: Optional[int] = None
    # longest wall time a job may ask for, "HH:MM:SS" or "D-HH:MM:SS"
    max_time: str = "24:00:00"
    cpu_arch: str = "x86_64"
    internet_on_compute: bool = False
    # shell lines run before training (module loads, environment activation); each is one line of bash
    setup: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    # how multi-node and multi-GPU training is started: torchrun or accelerate
    launcher: str = "torchrun"
    # bf16 on GPU sites; CPU runs train in fp32
    precision: str = "fp32"
    runs_root: str = "runs"
    # backend name -> virtual environment (a directory with bin/); unset: the managed environment
    backend_envs: Dict[str, str] = field(default_factory=dict)
    # model need -> backend name -> an environment that meets it, e.g. the team's transformers >= 5.3
    # environment for Qwen3.5: need_envs: {transformers_ge_5_3: {llamafactory: /path/to/env}}
    need_envs: Dict[str, Dict[str, str]] = field(default_factory=dict)
    # a partition whose nodes reach the internet: post-training jobs that upload to the Hub run there on a
    # site without internet on compute nodes; unset there: the upload waits for `python -m sft_grid.post`
    # run from the login node
    post_partition: Optional[str] = None
    # Slurm: node features (--constraint), nodes to avoid (--exclude), any other sbatch option by name
    constraint: Optional[str] = None
    exclude: Optional[str] = None
    sbatch_extra: Dict[str, Any] = field(default_factory=dict)
    # Slurm: how GPUs are requested: gpus_per_node (--gpus-per-node), gres (--gres=gpu:N) or none (whole nodes)
    gpu_directive: str = "gpus_per_node"
    # Slurm: how often a cell that hits its time limit or is preempted is requeued before it counts as failed
    max_requeues: int = 3
    # local executor: cells trained at once on this machine
    max_parallel: int = 1
    # local executor: block until the grid is done and print its final states
    wait: bool = True


@dataclass
class ModelConf:
    name: str = MISSING
    # a Hugging Face hub id (used on the clusters) ...
    hub_id: Optional[str] = None
    # ... or a local directory; when set it is what the backend loads
    path: Optional[str] = None
    params_b: float = MISSING
    # llama3, qwen3, qwen3_5, delphi: which tokenizer the checkpoint carries
    tokenizer_family: str = MISSING
    # the chat template the backend renders with (LLaMA-Factory / axolotl template name)
    template: str = MISSING
    # what the model needs, e.g. [zero3, consolidate] for 32B, [transformers_ge_5_3] for Qwen3.5
    needs: List[str] = field(default_factory=list)


@dataclass
class DatasetTags:
    role_tag: str = "role"
    content_tag: str = "content"
    user_tag: str = "user"
    assistant_tag: str = "assistant"
    system_tag: Optional[str] = "system"
    observation_tag: Optional[str] = None
    function_tag: Optional[str] = None


@dataclass
class DatasetConf:
    # a hub id (rendered as hf_hub_url) or a local file or directory
    source: str = MISSING
    formatting: str = "sharegpt"
    # the column holding the conversation
    messages: str = "messages"
    tags: DatasetTags = field(default_factory=DatasetTags)
    split: str = "train"


@dataclass
class MixConf:
    # concat, interleave_under (stop at the first exhausted source), interleave_over (at the last)
    strategy: str = "concat"
    # one probability per dataset, in the order of `dataset`; interleave strategies only
    probs: Optional[List[float]] = None


@dataclass
class CellConf:
    cluster: ClusterConf = MISSING
    backend: BackendConf = MISSING
    model: ModelConf = MISSING
    # dataset name -> its config; several entries make a mix (`dataset=[a,b]`)
    dataset: Dict[str, DatasetConf] = field(default_factory=dict)
    mix: MixConf = field(default_factory=MixConf)

    # Values a sweep file defines for its own interpolations, e.g. a table of models and the row a cell
    # trains (sweeps/delphi_scaling.yaml). Not part of a cell's identity: the values they feed into are.
    vars: Dict[str, Any] = field(default_factory=dict)

    # The grid this cell belongs to: its cells live under <runs_root>/<sweep_name>/.
    sweep_name: str = "default"
    runs_root: Optional[str] = None

    # training hyperparameters (all part of the cell's identity)
    lr: float = 1.0e-5
    epochs: float = 1.0
    # > 0 stops after this many optimizer steps, overriding epochs
    max_steps: int = -1
    global_batch_size: int = 16
    micro_batch_size: int = 1
    cutoff_len: int = 4096
    seed: int = 42
    scheduler: str = "cosine"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    finetuning_type: str = "full"
    # backend config keys passed through as they are (identity-relevant)
    extra: Dict[str, Any] = field(default_factory=dict)

    # checkpointing and logging (not identity)
    save_steps: int = 500
    save_total_limit: Optional[int] = None
    logging_steps: int = 10
    report_to: str = "none"
    # upload output/ to the Hub after training (a post-training stage, never the trainer's own push)
    push_to_hub: bool = False
    # the Hub repository; {key} (the identity hash), {name}, {model} and {data} are filled in per cell
    hub_model_id: Optional[str] = None
    # register the uploaded model in a database: off unless a grid turns it on; the hook runs
    # register_command (argv; {hub_model_id} {base_model} {datasets} {cell} are filled in) after the upload
    register_db: bool = False
    register_command: List[str] = field(default_factory=list)

    # resources and run control (not identity)
    nodes: int = 1
    time: str = "04:00:00"
    # the most cells of this grid running at once on Slurm (the job array throttle, %N); null: no limit
    concurrency: Optional[int] = None
    dry_run: bool = False
    # rerun cells that are already completed (their old output is moved aside, never deleted)
    force: bool = False
    # rerun cells whose last attempt failed
    rerun_failed: bool = False


def register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="base_config", node=CellConf)
    from sft_grid import resolvers; resolvers.register()
