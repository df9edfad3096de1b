"""An axolotl training config (or the old launcher's command line over one) read as sft_grid's options: its
`chat_template` in sft_grid's names, its `datasets:` entries of type chat_template (roles, property mappings), its
adapter (full, or sft_grid's plain LoRA), and its layout keys (the attention kernel, gradient checkpointing, sample
packing, the Liger plugin, W&B or TensorBoard). FSDP is refused: sft_grid shards with DeepSpeed ZeRO."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.importing.backend_keys import AX_LIGER, AX_SCALARS, DECIDED, LIGER_PLUGIN
from sft_grid.planning.importing.terms import Refused
from sft_grid.planning.importing.translation import Translation

# axolotl's attention names (transformers') -> the layout's
AX_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "fa2", "flash_attention_3": "fa3"}
# axolotl's template names -> sft_grid's (templates.py: each template's axolotl name)
AX_TEMPLATES = {t.axolotl: t.name for t in reversed(TEMPLATES.values()) if t.axolotl}
AX_TEMPLATES["delphi"] = "delphi"  # the team's axolotl fork ships delphi.jinja under this name
# what sft_grid's axolotl LoRA is (backends/axolotl.py finetuning): an original that says the same loses nothing
AX_LORA = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
# a dataset entry's keys that the dataset option says in its own words
_ENTRY_READ = {
    "path",
    "type",
    "field_messages",
    "message_property_mappings",
    "message_field_role",
    "message_field_content",
    "roles",
    "split",
    "ds_type",
}
# a dataset entry's keys with the value sft_grid writes for every source
_ENTRY_SAME = {"roles_to_train": ["assistant"], "train_on_eos": "turn"}


class AxolotlYaml(Translation):
    model_key = "base_model"
    revision_key = "revision_of_model"
    micro_key = "micro_batch_size"
    micro_default = 1
    scalar_keys = AX_SCALARS
    packing_key = "sample_packing"

    def refuse_other_training(self) -> None:
        if self.config.get("rl"):
            raise Refused(f"rl: {self.config['rl']}: sft_grid trains supervised fine-tuning only")

    def template(self, model: str) -> str | None:
        name = self.take("chat_template")
        if name in (None, "tokenizer_default"):
            guess = "llama3" if "llama" in model.lower() else "qwen3" if "qwen" in model.lower() else None
            if guess is None:
                self.problems.append("chat_template: not set, and the model's name does not say which template fits")
                return None
            self.result.assumed.append(f"chat_template not set (the tokenizer's own): the {guess} template")
            return guess
        if not isinstance(name, str) or name not in AX_TEMPLATES:
            known = ", ".join(sorted(AX_TEMPLATES))
            self.problems.append(f"chat_template: {name}: sft_grid's templates in axolotl's names are {known}")
            return None
        self.mapped("chat_template", f"model.template ({AX_TEMPLATES[name]})")
        return AX_TEMPLATES[name]

    # -- datasets --

    def dataset_entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each axolotl `datasets` entry of type chat_template as a DatasetConf."""
        entries = self.take("datasets")
        if entries is None:
            return
        if not isinstance(entries, list):
            self.problems.append("datasets: a list of entries (path, type, ...)")
            return
        self.mapped("datasets", "the dataset options (defaults: - override /dataset)")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not entry.get("path"):
                self.problems.append(f"datasets[{i}]: an entry with a path")
                continue
            kind = entry.get("type")
            if kind != "chat_template":
                self.problems.append(
                    f"datasets[{i}] ({entry['path']}): type {kind}: sft_grid trains conversations (type: chat_template)"
                )
                continue
            yield str(entry["path"]), self.entry(i, entry)

    def dataset_stem(self, label: str) -> str:
        """An entry's path's last part: a hub id's name, a file's stem."""
        return Path(label).stem

    def entry(self, i: int, entry: Mapping[str, Any]) -> dict[str, Any]:
        path = str(entry["path"])
        found, tried = self.find(path)
        hub = "/" in path and not path.startswith(("/", "./", "../", "~")) and found is None
        source = path if hub else str(found or tried[0].resolve())
        mapping = self.mapping(entry.get("message_property_mappings"), f"datasets[{i}].message_property_mappings")
        role = mapping.pop("role", entry.get("message_field_role", "role"))
        content = mapping.pop("content", entry.get("message_field_content", "content"))
        for key in mapping:
            self.result.not_carried.append(
                (f"datasets[{i}].message_property_mappings.{key}", "a dataset option maps a role and a content")
            )
        roles = {
            k: list(v) if isinstance(v, list) else [v]
            for k, v in self.mapping(entry.get("roles"), f"datasets[{i}].roles").items()
        }
        tags: dict[str, Any] = {"role_tag": role, "content_tag": content}
        for target, tag in (
            ("user", "user_tag"),
            ("assistant", "assistant_tag"),
            ("system", "system_tag"),
            ("tool", "observation_tag"),
        ):
            values = roles.get(target) or ([target] if target != "tool" else [])
            if values:
                tags[tag] = values[0]
        if len(roles.get("assistant") or []) > 1:
            tags["function_tag"] = roles["assistant"][1]
        out: dict[str, Any] = {
            "source": source,
            "formatting": "sharegpt",
            "messages": str(entry.get("field_messages", "messages")),
            "tags": tags,
        }
        if hub:
            out["split"] = str(entry.get("split", "train"))
        for key, value in entry.items():
            if key in _ENTRY_READ:
                continue
            if key in _ENTRY_SAME and value == _ENTRY_SAME[key]:
                self.result.decided.append((f"datasets[{i}].{key}", f"{value}: what sft_grid writes for every source"))
                continue
            why = (
                "sft_grid trains the assistant turns, each with its end of turn"
                if key in _ENTRY_SAME
                else ("a dataset option cannot say it")
            )
            self.result.not_carried.append((f"datasets[{i}].{key}", why))
        for extra_role in set(roles) - {"user", "assistant", "system", "tool"}:
            self.result.not_carried.append((f"datasets[{i}].roles.{extra_role}", "a dataset option maps four roles"))
        for target, values in roles.items():
            if len(values) > (2 if target == "assistant" else 1):
                self.result.not_carried.append(
                    (f"datasets[{i}].roles.{target}", f"a dataset option maps one value to {target}: {values[0]}")
                )
        return out

    # -- the adapter --

    def scalars(self) -> None:
        super().scalars()
        self.adapter()

    def adapter(self) -> None:
        adapter = self.take("adapter")
        if adapter in (None, ""):
            self.set("finetuning_type", "full", "no adapter: full fine-tuning")
            for key in AX_LORA:
                if key in self.config:
                    self.decide(key, "no adapter: full fine-tuning")
            return
        if adapter != "lora" or self.config.get("load_in_4bit") or self.config.get("load_in_8bit"):
            self.problems.append(f"adapter: {adapter} (quantized): sft_grid fine-tunes full or with a plain LoRA")
            return
        self.set("finetuning_type", "lora", "adapter: lora")
        self.mapped("adapter", "finetuning_type=lora")
        for key, ours in AX_LORA.items():
            if key in self.config:
                value = self.take(key)
                if value != ours:
                    self.drop(key, f"{value}: {DECIDED[key]}")
                else:
                    self.decide(key)

    # -- layout --

    def layout(self) -> None:
        super().layout()
        fsdp = self.take("fsdp")
        fsdp_config = self.take("fsdp_config")
        if fsdp or fsdp_config:
            self.problems.append("fsdp: sft_grid shards with DeepSpeed ZeRO (layout.sharding), never FSDP")

    def attention(self) -> None:
        implementation = self.take("attn_implementation")
        flash, sdp = self.take("flash_attention"), self.take("sdp_attention")
        xformers = self.take("xformers_attention")
        if implementation is not None:
            layout = AX_ATTENTION.get(str(implementation))
            if layout is None:
                self.problems.append(f"attn_implementation: {implementation}: sft_grid's are {', '.join(AX_ATTENTION)}")
                return
            self.set("layout.attention", layout, f"attn_implementation: {implementation}")
            self.mapped("attn_implementation", f"layout.attention={layout}")
        elif flash:
            self.set("layout.attention", "fa2", "flash_attention: true")
            self.mapped("flash_attention", "layout.attention=fa2 (attn_implementation: flash_attention_2)")
        elif sdp:
            self.set("layout.attention", "sdpa", "sdp_attention: true")
            self.mapped("sdp_attention", "layout.attention=sdpa")
        else:
            self.result.assumed.append("no attention kernel named: sft_grid picks the site's")
        if xformers:
            self.drop("xformers_attention", "sft_grid's attention kernels are eager, sdpa, fa2 and fa3")
        for key, value in (("flash_attention", flash), ("sdp_attention", sdp)):
            if value is not None and implementation is not None:
                self.decide(key, "attn_implementation says the kernel")
            elif value is False:
                self.mapped(key, "(off)")

    def checkpointing(self) -> None:
        value = self.take("gradient_checkpointing")
        on = bool(value) and value != "false"
        self.set("layout.checkpointing", on, "gradient_checkpointing" if value is not None else "axolotl's default")
        if value is not None:
            self.mapped("gradient_checkpointing", f"layout.checkpointing={str(on).lower()}")

    def liger(self) -> None:
        plugins = self.take("plugins") or []
        if not isinstance(plugins, list):
            self.problems.append(f"plugins: {plugins!r}: a list of plugin names")
            return
        plugins = [str(p) for p in plugins]
        flags = {k: self.take(k) for k in AX_LIGER if k in self.config}
        on = LIGER_PLUGIN in plugins and any(flags.values())
        self.set("layout.liger", on, "the Liger plugin and its liger_* keys" if on else "no Liger plugin: off")
        if flags:
            self.mapped(", ".join(flags), f"layout.liger={str(on).lower()}")
        if on and not all(flags.get(k) for k in AX_LIGER):
            off = [k for k in AX_LIGER if not flags.get(k)]
            self.drop(", ".join(off), "sft_grid's Liger turns on all four kernels")
        others = [p for p in plugins if p != LIGER_PLUGIN]
        if others:
            self.drop(f"plugins: {', '.join(others)}", "sft_grid writes its own plugins (and Liger's)")
        elif plugins:
            self.decide("plugins", "sft_grid's own plugins, and Liger's where layout.liger is on")

    # -- reporting, the Hub --

    def report_to(self) -> None:
        said = {k: self.config.get(k) for k in ("wandb_project", "use_wandb", "use_tensorboard") if k in self.config}
        self.done.update(said)
        reporter = "wandb" if said.get("wandb_project") or said.get("use_wandb") else None
        reporter = reporter or ("tensorboard" if said.get("use_tensorboard") else None)
        if reporter:
            self.set("report_to", reporter, ", ".join(k for k, v in said.items() if v))
        for key, value in said.items():
            if key == "wandb_project" and value:
                self.mapped(key, f"report_to={reporter} (W&B's project is the grid's name: sweep_name)")
            elif value and reporter:
                self.mapped(key, f"report_to={reporter}")
            else:
                self.decide(key, f"report_to ({reporter or 'none'})")

    def hub(self) -> None:
        super().hub()
        if self.config.get("hub_model_id") is not None:
            self.set("push_to_hub", True, "hub_model_id: axolotl pushes where it is set")
