"""A LLaMA-Factory training config (or the old launcher's command line over one) read as sft_grid's options: its
`template`, its datasets by name with their dataset_info.json entries (or the launcher's schema flags for a Hub
dataset that has none), and its layout keys (`flash_attn`, gradient checkpointing, packing, Liger, reporting)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.importing.backend_keys import LF_SCALARS
from sft_grid.planning.importing.old_launcher import SCHEMA_FLAGS
from sft_grid.planning.importing.terms import Refused
from sft_grid.planning.importing.translation import Translation

# LLaMA-Factory's attention names (its AttentionFunction) -> the layout's
LF_ATTENTION = {"disabled": "eager", "eager": "eager", "sdpa": "sdpa", "fa2": "fa2", "fa3": "fa3", "auto": "auto"}
# LLaMA-Factory's sharegpt columns where a dataset_info entry names none (the old launcher's defaults too)
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}


class LlamaFactoryYaml(Translation):
    model_key = "model_name_or_path"
    revision_key = "model_revision"
    micro_key = "per_device_train_batch_size"
    micro_default = 8
    scalar_keys = LF_SCALARS
    packing_key = "packing"

    def refuse_other_training(self) -> None:
        stage = self.config.get("stage")
        if stage not in (None, "sft"):
            raise Refused(f"stage: {stage}: sft_grid trains supervised fine-tuning only (stage: sft)")

    def template(self, model: str) -> str | None:
        name = self.take("template")
        if name is None:
            self.problems.append("template: not set (sft_grid needs the chat template: template: qwen3, ...)")
            return None
        if not isinstance(name, str) or name not in TEMPLATES:
            self.problems.append(f"template: {name}: sft_grid knows the templates {', '.join(TEMPLATES)}")
            return None
        self.mapped("template", "model.template")
        return str(name)

    # -- datasets --

    def dataset_entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each LLaMA-Factory dataset name with its dataset_info.json entry (from `dataset_dir`), as a DatasetConf."""
        names = self.take("dataset")
        if isinstance(names, list):
            names = ",".join(map(str, names))
        if not names:
            return
        self.mapped("dataset", "the dataset options (defaults: - override /dataset)")
        info, folder = self.dataset_info()
        schema = {k: self.take(k) for k in (*SCHEMA_FLAGS, "observation_tag", "function_tag") if self.has(k)}
        if schema:
            self.mapped(", ".join(schema), "each dataset option's messages and tags (the launcher's schema flags)")
        for name in (n.strip() for n in str(names).split(",")):
            if not name:
                continue
            entry = info.get(name)
            if entry is not None and not isinstance(entry, dict):
                self.problems.append(f"dataset_info {name}: {entry!r}: an entry (a mapping)")
                continue
            if entry is None:
                if "/" not in name:
                    where = (
                        f"not in {folder}/dataset_info.json" if folder else "no dataset_dir is given to look it up in"
                    )
                    self.problems.append(
                        f"dataset {name}: {where}, and not a Hub id (org/name): give the original's dataset_dir, or"
                        " the Hub id"
                    )
                    continue
                yield name, self.online(name, schema)
                continue
            yield name, self.entry(name, entry, folder)

    def dataset_info(self) -> tuple[dict[str, Any], Path | None]:
        folder = self.take("dataset_dir")
        if folder is not None:
            self.mapped("dataset_dir", "each dataset option's source (its dataset_info.json entry)")
        if folder in (None, "ONLINE"):
            return {}, None
        _, tried = self.find(str(folder))
        for path in tried:
            info = path / "dataset_info.json"
            if info.is_file():
                try:
                    data = json.loads(info.read_text())
                except (OSError, ValueError) as exc:
                    self.problems.append(f"{info}: not JSON ({exc})")
                    return {}, path
                return (data if isinstance(data, dict) else {}), path.resolve()
        self.problems.append(f"dataset_dir: {folder}: no dataset_info.json there (looked in {tried[0]})")
        return {}, None

    def online(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """A Hub dataset with no dataset_info entry: the launcher's schema flags, else its defaults."""
        if self.orig.launched:
            defaults = {"messages": "conversations", **SHAREGPT_TAGS}
            said = "the old launcher's defaults (conversations, from/value, human/gpt)"
        else:
            defaults = {}
            said = "sft_grid's defaults (messages, role/content, user/assistant)"
        values = {**defaults, **schema}
        if not schema.keys() >= {"messages", "role_tag", "content_tag"}:
            self.result.assumed.append(f"dataset {name}: no dataset_info entry: its columns and tags are {said}")
        if values.get("formatting", "sharegpt") != "sharegpt":
            self.problems.append(f"dataset {name}: formatting {values['formatting']}: sft_grid trains conversations")
        tags = {
            k: values[k] for k in ("role_tag", "content_tag", "user_tag", "assistant_tag", "system_tag") if k in values
        }
        return {"source": name, "formatting": "sharegpt", "messages": values.get("messages", "messages"), "tags": tags}

    def entry(self, name: str, entry: Mapping[str, Any], folder: Path | None) -> dict[str, Any]:
        """A dataset_info.json entry as a DatasetConf: its source, formatting, messages column and tags."""
        out: dict[str, Any] = {"formatting": "sharegpt"}
        if entry.get("formatting", "alpaca") != "sharegpt":
            self.problems.append(
                f"dataset {name}: formatting {entry.get('formatting', 'alpaca (the default)')}: sft_grid trains"
                " conversations (formatting: sharegpt)"
            )
        if entry.get("ranking"):
            self.problems.append(f"dataset {name}: ranking data (preference pairs): sft_grid trains SFT only")
        if entry.get("hf_hub_url"):
            out["source"] = str(entry["hf_hub_url"])
        elif entry.get("file_name"):
            file = Path(str(entry["file_name"]))
            out["source"] = str(file if file.is_absolute() else ((folder or self.orig.base) / file).resolve())
        else:
            self.problems.append(f"dataset {name}: neither hf_hub_url nor file_name (ms_hub_url is not read)")
            out["source"] = ""
        if entry.get("split"):
            out["split"] = str(entry["split"])
        columns = self.mapping(entry.get("columns"), f"dataset_info {name}.columns")
        out["messages"] = str(columns.pop("messages", "conversations"))
        for column in columns:
            self.result.not_carried.append(
                (f"dataset_info {name}.columns.{column}", "a dataset option has one column, its conversation")
            )
        tags = self.mapping(entry.get("tags"), f"dataset_info {name}.tags")
        # LLaMA-Factory's sharegpt defaults where the entry names no tag
        defaults = {
            **SHAREGPT_TAGS,
            "observation_tag": "observation",
            "function_tag": "function_call",
            "system_tag": "system",
        }
        out["tags"] = {k: tags.get(k, defaults[k]) for k in defaults}
        for key in ("subset", "folder", "num_samples", "ms_hub_url", "om_hub_url", "load_from"):
            if key in entry:
                self.result.not_carried.append((f"dataset_info {name}.{key}", "a dataset option cannot say it"))
        return {k: out[k] for k in ("source", "formatting", "messages", "tags", "split") if k in out}

    # -- layout --

    def attention(self) -> None:
        for key in ("flash_attn", "attn"):
            value = self.take(key)
            if value is None:
                continue
            layout = LF_ATTENTION.get(str(value))
            if layout is None:
                self.problems.append(f"{key}: {value}: sft_grid's attention kernels are eager, sdpa, fa2, fa3")
                return
            self.set("layout.attention", layout, f"{key}: {value}")
            self.mapped(key, f"layout.attention={layout}")
            return
        self.result.assumed.append("flash_attn not set (LLaMA-Factory's auto): sft_grid picks the site's kernel")

    def checkpointing(self) -> None:
        disable = self.take("disable_gradient_checkpointing")
        enable = self.take("gradient_checkpointing")
        if disable is not None:
            on = not disable
            self.mapped("disable_gradient_checkpointing", f"layout.checkpointing={str(on).lower()}")
        elif enable is not None:
            on = bool(enable)
        else:
            on = True
        if enable is not None:
            self.mapped("gradient_checkpointing", f"layout.checkpointing={str(on).lower()}")
        note = "LLaMA-Factory's default (on), pinned" if disable is None and enable is None else "pinned"
        self.set("layout.checkpointing", on, note)

    def packing(self) -> None:
        super().packing()
        on = bool(self.config.get(self.packing_key))
        neat = self.take("neat_packing")
        if neat is not None and on and not neat:
            self.drop("neat_packing", "false: sft_grid packs with neat_packing (no example attends to another)")
        elif neat is not None:
            self.decide("neat_packing", "sft_grid packs with neat_packing where it packs")

    def liger(self) -> None:
        value = self.take("enable_liger_kernel")
        self.set("layout.liger", bool(value), "enable_liger_kernel" if value is not None else "not set: off")
        if value is not None:
            self.mapped("enable_liger_kernel", f"layout.liger={str(bool(value)).lower()}")

    # -- reporting --

    def report_to(self) -> None:
        value = self.take("report_to")
        if value is not None:
            chosen = self.report(value)
            self.set("report_to", chosen, f"report_to: {value}")
            self.mapped("report_to", f"report_to={chosen}")
        push = self.take("push_to_hub")
        if push is not None:
            self.set("push_to_hub", bool(push), "push_to_hub: sft_grid's upload stage, after training")
            self.mapped("push_to_hub", "push_to_hub (the cell's upload stage; the trainer's own push stays off)")
