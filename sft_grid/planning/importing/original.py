"""Reading an original training YAML: its text, its keys, and which backend wrote it (`detect`, from the keys only
one backend's config has). Input it cannot read is `Refused` in one line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sft_grid.planning.importing.terms import ARTICLE, AX, LF, TITLE, Original, Refused

# keys only one backend's config has: two of them (or one of the decisive ones) say which wrote the file
MARKERS = {
    LF: frozenset(
        [
            "model_name_or_path",
            "stage",
            "finetuning_type",
            "cutoff_len",
            "per_device_train_batch_size",
            "num_train_epochs",
            "lr_scheduler_type",
            "dataset",
            "dataset_dir",
            "template",
            "flash_attn",
        ]
    ),
    AX: frozenset(
        [
            "base_model",
            "datasets",
            "sequence_len",
            "micro_batch_size",
            "num_epochs",
            "lr_scheduler",
            "sample_packing",
            "chat_template",
            "dataset_prepared_path",
            "flash_attention",
        ]
    ),
}
DECISIVE = {"model_name_or_path": LF, "base_model": AX}


def detect(config: Mapping[str, Any]) -> str | None:
    """Which backend's config this is (LF or AX), or None when neither's keys are there."""
    decided = {DECISIVE[k] for k in config if k in DECISIVE}
    if len(decided) == 1:
        return decided.pop()
    counts = {kind: len(keys & set(config)) for kind, keys in MARKERS.items()}
    best = max(counts, key=lambda k: counts[k])
    others = [n for k, n in counts.items() if k != best]
    return best if counts[best] >= 2 and all(n < counts[best] for n in others) else None


def read_text(path: Path) -> str:
    """A file's text; `Refused` for one that is missing, a folder, or not text."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise Refused(f"{path}: no such file") from None
    except IsADirectoryError:
        raise Refused(f"{path}: a folder, not a training config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{path}: cannot be read ({exc})") from None


def yaml_mapping(text: str, path: Path, what: str) -> dict[str, Any]:
    """A file's YAML, which must be a mapping of keys; `Refused` for anything else."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise Refused(f"{path}: not YAML ({' '.join(str(exc).split())[:160]})") from None
    duplicated = _duplicated_key(text, path)
    if duplicated:  # PyYAML keeps the later value without a word: which of the two the original meant is not known
        raise Refused(duplicated)
    if data is None:
        raise Refused(
            f"{path}: the file is empty (no keys); {what} is a mapping of keys (model_name_or_path: ..., or axolotl's"
            " base_model: ...): name the file that holds yours"
        )
    if not isinstance(data, dict):
        held = {"str": "plain text", "list": "a list", "int": "a number", "float": "a number", "bool": "true or false"}
        raise Refused(
            f"{path}: {what} is a mapping of keys (model_name_or_path: ..., or axolotl's base_model: ...), and this"
            f" file holds {held.get(type(data).__name__, type(data).__name__)}: name the training YAML (a launcher's"
            " command goes after `--`: sft-grid import -- <command>)"
        )
    return data


def _duplicated_key(text: str, path: Path) -> str:
    """`<file>:<line>:<column>: ...` where a mapping names a key twice (OmegaConf's loader, as Hydra and LLaMA-Factory
    read a config, refuses it), with the fix; "" where none is."""
    from omegaconf._utils import get_yaml_loader

    from sft_grid.planning.conf_files import yaml_error_line

    try:
        yaml.load(text, Loader=get_yaml_loader())
    except yaml.YAMLError as exc:
        line = yaml_error_line(exc, str(path))
        return f"{line}; nothing written" if "duplicate key" in line else ""
    return ""


def from_yaml(path: Path, text: str) -> Original:
    """A training YAML of either backend, as the original; `Refused` when it is neither's."""
    config = yaml_mapping(text, path, "a training config")
    kind = detect(config)
    if kind is None:
        raise Refused(
            f"{path}: neither a LLaMA-Factory config (model_name_or_path, cutoff_len, ...) nor an axolotl one"
            " (base_model, datasets, sequence_len, ...), nor the old launcher's command line (python -m hpc.launch)"
        )
    return Original(kind, config, path.parent, f"{ARTICLE[kind]} {TITLE[kind]} training config", file_stem=path.stem)
