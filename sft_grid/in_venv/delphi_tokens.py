"""The Delphi think/tool tokens written into Llama-3's reserved slots of saved tokenizer files (stdlib only).

Shared by the prep of a model (prep_delphi.py, in the backend environment) and by the orchestrator, which
prepares a checkpoint's tokenizer alone before anything is queued, so the grid's checks and its tokenize-once
stage read exactly the tokenizer the prepared model will carry. Imports nothing of sft_grid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

RESERVED_PREFIX = "<|reserved_special_token_"
# A Delphi checkpoint's tokenizer has no pad token. Left unset, each backend picks one itself: LLaMA-Factory sets
# pad = eos, and its delphi template makes eos the turn's end, <|eot_id|>; a collator or a probe that masks the
# pad's id would then mask the very token that teaches the model to stop. Llama-3.1 reserves an id for padding:
# the prep names it, so every backend pads with a token no conversation contains.
PAD_TOKEN = "<|finetune_right_pad_id|>"
PAD_ID = 128004


class PrepError(RuntimeError):
    pass


def rename_tokens(tok_dir: Path, tokens: Mapping[str, int]) -> None:
    """Rewrite the reserved slots' content in the saved tokenizer files (tokenizer.json, and the config's
    added_tokens_decoder where transformers wrote one). Idempotent."""
    path = tok_dir / "tokenizer.json"
    data = json.loads(path.read_text())
    by_id = {t["id"]: t for t in data["added_tokens"]}
    for token, token_id in tokens.items():
        entry = by_id.get(token_id)
        if entry is None:
            raise PrepError(f"id {token_id} is not an added token of this tokenizer: not a Llama-3 tokenizer?")
        if entry["content"] == token:
            continue  # prepared before: idempotent
        if not entry["content"].startswith(RESERVED_PREFIX):
            raise PrepError(
                f"id {token_id} is {entry['content']!r}, not a reserved Llama-3 slot: refusing to rename it"
            )
        entry["content"], entry["special"] = token, True
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2))
    config_path = tok_dir / "tokenizer_config.json"
    if not config_path.is_file():
        return
    config = json.loads(config_path.read_text())
    decoder = config.get("added_tokens_decoder")
    if decoder:
        for token, token_id in tokens.items():
            if str(token_id) in decoder:
                decoder[str(token_id)].update(content=token, special=True)
        config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))


def prepare_files(tok_dir: Path, tokens: Mapping[str, int]) -> None:
    """Everything the prep changes in the saved tokenizer files: the reserved slots renamed (`rename_tokens`)
    and, where the tokenizer has no pad token, Llama-3.1's padding token named as its pad (`set_pad`)."""
    rename_tokens(tok_dir, tokens)
    set_pad(tok_dir)


def set_pad(tok_dir: Path) -> None:
    """Name PAD_TOKEN as the pad token in tokenizer_config.json when none is set. Idempotent; a pad the tokenizer
    already has is kept."""
    data = json.loads((tok_dir / "tokenizer.json").read_text())
    by_id = {t["id"]: t["content"] for t in data["added_tokens"]}
    if by_id.get(PAD_ID) != PAD_TOKEN:
        raise PrepError(
            f"id {PAD_ID} is {by_id.get(PAD_ID)!r}, not Llama-3.1's {PAD_TOKEN}: not a Llama-3.1 tokenizer?"
        )
    config_path = tok_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if config.get("pad_token"):
        return
    config["pad_token"] = PAD_TOKEN
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))
