"""The team's old launcher (`python -m hpc.launch --train_config_path X.yaml --num_nodes 2 ...`: OpenThoughts-Agent's
hpc/launch.py) as an original: its command line found in a script, its flags read as its argparse read them, and its
base YAML with the trainer flags written over it, as the launcher merged them. Its own flags (the world size, the
wall time, the site's) are kept apart on the `Original`, each with what sft_grid does instead (`LAUNCHER_ONLY`)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from sft_grid.planning.importing.backend_keys import AX_LIGER, LIGER_PLUGIN
from sft_grid.planning.importing.original import detect, read_text, yaml_mapping
from sft_grid.planning.importing.terms import ARTICLE, AX, LF, TITLE, Original, Refused

# the old launcher's switches that take no value
LAUNCHER_SWITCHES = frozenset(
    [
        "dry_run",
        "internet_node",
        "pretokenize",
        "pretok_large",
        "use_mca",
        "force_mutate",
        "allow_overwrite",
        "upload_to_database",
    ]
)
# the old launcher's own flags (not trainer keys): each is read below, or said not to be carried, with why
LAUNCHER_ONLY: dict[str, str] = {
    "experiments_dir": "each cell's files live in its own directory under runs_root",
    "checkpoints_dir": "each cell's output/ is under its own directory (runs_root)",
    "datasets_dir": "Hub datasets are staged into the site's Hugging Face cache (cluster.hf_cache)",
    "models_dir": "Hub models are staged into the site's Hugging Face cache (cluster.hf_cache)",
    "tokenized_dir": "tokenize once: each distinct input is tokenized once, under runs_root/_tokenized",
    "max_restarts": "a cell that hits its time limit is requeued and resumes (cluster.max_requeues)",
    "dependency": "sft_grid orders its own jobs (preps, tokenize, training, post-training)",
    "dry_run": "a run switch: sft-grid run ... dry_run=true",
    "conda_env": "the cluster names each backend's environment as a path (cluster.backend_venvs)",
    "internet_node": "the cluster says whether compute nodes reach the Hub (internet_on_compute, staging)",
    "pretokenize": "tokenize once is on by default (tokenize_once)",
    "pretok_large": "tokenize once is on by default (tokenize_once)",
    "account": "the cluster's (conf/cluster/<site>.yaml: a per-user ${user_env:...})",
    "partition": "the cluster's (conf/cluster/<site>.yaml)",
    "qos": "the cluster's (conf/cluster/<site>.yaml)",
    "name": "the cluster's (the sweep selects a cluster option: --cluster)",
    "cpus_per_node": "the cluster's (conf/cluster/<site>.yaml)",
    "cpus_per_gpu": "the cluster's (conf/cluster/<site>.yaml)",
    "gpus_type": "the cluster's gpu_type",
    "gpu_type": "the cluster's gpu_type",
    "total_partition_nodes": "the cluster's max_nodes",
    "ray_object_store_gb": "not used by the old launcher's SFT path",
    "num_gpus": "not used by the old launcher's SFT path (it reads --gpus_per_node)",
    "job_creator": "not used for training (the old launcher's run_summary.json)",
    "trace_agent_name": "not used for training (the old launcher's run_summary.json)",
    "image": "not used by the old launcher's SFT path",
    "chat_template": "not used by the old launcher's SFT path (the template is the YAML's)",
    "base_model": "not used by the old launcher's SFT path (the model is --model_name_or_path)",
    "force_mutate": "ignored for SFT by the old launcher",
    "allow_overwrite": "ignored for SFT by the old launcher",
    "upload_to_database": "an evaluation flag: a no-op for SFT",
    "use_mca": "inert in the old launcher's SFT path",
}
# trainer flags under their axolotl names, for an axolotl base YAML (the old launcher's translate_lf_to_axolotl)
AX_RENAMES = {
    "model_name_or_path": "base_model",
    "cutoff_len": "sequence_len",
    "num_train_epochs": "num_epochs",
    "lr_scheduler_type": "lr_scheduler",
    "packing": "sample_packing",
    "per_device_train_batch_size": "micro_batch_size",
    "optim": "optimizer",
}
# the launcher's dataset schema flags (applied to datasets that have no dataset_info entry)
SCHEMA_FLAGS = ("formatting", "messages", "role_tag", "content_tag", "user_tag", "assistant_tag", "system_tag")


def launcher_argv(text: str) -> list[str] | None:
    """The arguments after `hpc.launch` of the first command line that runs the old launcher, or None (continued
    lines joined; a YAML file never holds one)."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        if "hpc.launch" not in line or line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if "hpc.launch" in words:
            return words[words.index("hpc.launch") + 1 :]
        if "hpc/launch.py" in words:
            return words[words.index("hpc/launch.py") + 1 :]
    return None


def _value(text: str) -> Any:
    """A flag's value as the launcher's argparse typed it: true/false, a number, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def launcher_flags(argv: list[str]) -> dict[str, Any]:
    """--flag value / --flag=value / --switch as {flag: value}, dashes as underscores (the launcher's aliases);
    a repeated flag keeps its last value, as argparse did."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            raise Refused(f"the old launcher's command line: {word!r} is not a --flag (its flags are --key value)")
        key, eq, inline = word[2:].partition("=")
        key = key.replace("-", "_")
        if eq:
            flags[key] = _value(inline)
        elif key in LAUNCHER_SWITCHES and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            flags[key] = True
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            i += 1
            flags[key] = _value(argv[i])
        else:
            flags[key] = True  # a bare boolean trainer flag (argparse's Optional[bool] with nargs="?")
        i += 1
    return flags


def from_launcher(argv: list[str], base: Path, script: Path | None) -> Original:
    """The launcher's command line: its base YAML with the trainer flags written over it, as the launcher's
    _merge_launch_overrides did (only the flags given: its argparse defaults are not applied)."""
    flags = launcher_flags(argv)
    where = f"{script}: " if script else ""
    job_type = flags.pop("job_type", "sft")
    if job_type != "sft":
        raise Refused(f"{where}--job_type {job_type}: only SFT launches import (--job_type sft)")
    config_path = flags.pop("train_config_path", None)
    if not isinstance(config_path, str):
        raise Refused(f"{where}the old launcher's command line names no --train_config_path (its base YAML)")
    tried = [Path(config_path)] if Path(config_path).is_absolute() else [base / config_path]
    if script is not None and not Path(config_path).is_absolute():
        # the launcher ran from the repository's root: a script under it names the YAML from there
        tried += [parent / config_path for parent in script.resolve().parents]
    found = next((p for p in tried if p.is_file()), None)
    if found is None:
        raise Refused(f"{where}--train_config_path {config_path}: no such file (looked in {tried[0].parent})")
    config = yaml_mapping(read_text(found), found, "a training config")
    backend = flags.pop("sft_backend", None)
    kind = {"llamafactory": LF, "axolotl": AX}.get(str(backend)) if backend else detect(config) or LF
    if kind is None:
        raise Refused(f"{where}--sft_backend {backend}: the old launcher knew llamafactory and axolotl")
    out = Original(
        kind,
        config,
        found.parent,
        f"the old launcher's command line over {found.name}, {ARTICLE[kind]} {TITLE[kind]} config",
        file_stem=found.stem,
    )
    out.launched, out.script = True, script
    out.nodes = _int_flag(flags.pop("num_nodes", None), "--num_nodes", where)
    out.gpus_per_node = _int_flag(flags.pop("gpus_per_node", None), "--gpus_per_node", where)
    time = flags.pop("time_limit", None)
    out.time = str(time) if time is not None else None
    job_name = flags.pop("job_name", None)
    out.job_name = str(job_name) if job_name is not None else None
    for key in list(flags):
        if key in LAUNCHER_ONLY or key == "reservation":
            out.launcher[key] = flags.pop(key)
    for alias in ("model", "model_path"):
        if alias in flags:
            flags["model_name_or_path"] = flags.pop(alias)
    out.flags = frozenset(flags)
    if kind == AX:
        _over_axolotl(config, flags)
    config.update(flags)
    return out


def _int_flag(value: Any, flag: str, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise Refused(f"{where}{flag} {value}: a count of at least 1")
    return value


def _over_axolotl(config: dict[str, Any], flags: dict[str, Any]) -> None:
    """The trainer flags an axolotl base YAML took, in axolotl's words (the launcher's translator): renamed keys,
    Liger and the attention kernel as axolotl's keys, and `--dataset` as the `datasets:` list it rebuilt."""
    for lf_key, ax_key in AX_RENAMES.items():
        if lf_key in flags:
            flags[ax_key] = flags.pop(lf_key)
    if flags.pop("enable_liger_kernel", None) is True:
        flags.update(dict.fromkeys(AX_LIGER, True))
        flags["plugins"] = sorted({*(config.get("plugins") or []), LIGER_PLUGIN})
    attn = flags.pop("attn", None)
    if attn is not None:
        flags["attn_implementation"] = {"fa2": "flash_attention_2", "fa3": "flash_attention_3"}.get(attn, attn)
    names = flags.pop("dataset", None)
    schema = {k: flags.pop(k) for k in SCHEMA_FLAGS if k in flags}
    if names:
        role = schema.get("role_tag", "from")
        user, assistant = ("human", "gpt") if role == "from" else ("user", "assistant")
        flags["datasets"] = [
            {
                "path": name.strip(),
                "type": "chat_template",
                "field_messages": schema.get("messages", "conversations"),
                "message_property_mappings": {"role": role, "content": schema.get("content_tag", "value")},
                "roles": {
                    "user": [schema.get("user_tag", user)],
                    "assistant": [schema.get("assistant_tag", assistant)],
                },
            }
            for name in str(names).split(",")
            if name.strip()
        ]
