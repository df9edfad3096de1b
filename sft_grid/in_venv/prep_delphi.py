"""Delphi tokenizer prep: the think/tool tokens in Llama-3's reserved slots, with mean-initialised rows.

Delphi checkpoints carry the plain Llama-3 tokenizer (vocab 128256, no chat template, untied lm_head). The
delphi chat template writes six tokens of its own; they are given Llama-3 reserved slots, so the vocabulary
does not grow and no embedding is resized (as the team's prepare_delphi_tokenizer.py does):

    <|start_think|> 128002   <|end_think|> 128003   <|tool_call|> 128005
    <|tool_call_end|> 128011 <|tool_result|> 128012 <|tool_result_end|> 128013

Each target id must really be a reserved token. Those input and output embedding rows are set to the mean
of the trained BPE rows (ids below 128000). A tokenizer without a pad token (every Delphi checkpoint) gets
Llama-3.1's padding token, <|finetune_right_pad_id|> 128004, as its pad, in the tokenizer files and the
model's config: never eos or <|eot_id|>, which padding would mask. The result is saved, reloaded and checked:
vocab size unchanged, each new token one id, the expected one, and the rows as set. The model is written beside
OUTPUT and renamed into place, then OUTPUT/prepared.json is written last: its presence means the prep is complete.

Runs inside the backend environment (standalone: it never imports sft_grid).

    python prep_delphi.py --model <hub id or dir> --output <dir>
        --tokens '{"<|start_think|>": 128002, ...}' [--version V]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from delphi_tokens import PAD_ID, PrepError, prepare_files
from transformers import AutoModelForCausalLM, AutoTokenizer

# token -> reserved id, given by the orchestrator (sft_grid.templates.DELPHI_TOKENS, --tokens)
TOKENS: dict[str, int] = {}
BPE_ROWS = 128000
MARKER = "prepared.json"


def rename_tokens(tok_dir: Path) -> None:
    """The reserved slots renamed and the pad named in the saved tokenizer files (delphi_tokens.py, shared with the
    orchestrator, which prepares a checkpoint's tokenizer alone for its checks)."""
    prepare_files(tok_dir, TOKENS)


def mean_init(model: torch.nn.Module) -> None:
    """The new tokens' input and output rows: the mean of the trained BPE rows."""
    if model.config.tie_word_embeddings:
        raise PrepError(
            "the model ties its input and output embeddings; Delphi checkpoints do not (tie_word_embeddings)"
        )
    ids = torch.tensor(sorted(TOKENS.values()))
    with torch.no_grad():
        for emb in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            emb[ids] = emb[:BPE_ROWS].float().mean(dim=0).to(emb.dtype)


def verify(out: Path, vocab_size: int) -> dict[str, int]:
    tok = AutoTokenizer.from_pretrained(out)
    if len(tok) != vocab_size:
        raise PrepError(f"vocab size changed: {vocab_size} -> {len(tok)}")
    if tok.pad_token_id in (tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")):
        raise PrepError(f"the pad token {tok.pad_token!r} is an end token: padding would mask where turns end")
    for token, token_id in TOKENS.items():
        got = tok.convert_tokens_to_ids(token)
        ids = tok.encode(token, add_special_tokens=False)
        if got != token_id or ids != [token_id]:
            raise PrepError(f"{token} is id {got} and encodes to {ids} after reload; expected the single id {token_id}")
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    for emb in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        mean = emb[:BPE_ROWS].float().mean(dim=0)
        for token_id in TOKENS.values():
            if not torch.allclose(emb[token_id].float(), mean, atol=1e-2, rtol=1e-2):
                raise PrepError(f"row {token_id} is not the mean of the BPE rows after reload")
    return dict(TOKENS)


def _share(tree: Path) -> None:
    """mkdtemp and the weights writer make owner-only files; the prepared model is read by every job."""
    umask = os.umask(0)
    os.umask(umask)
    tree.chmod(0o777 & ~umask)
    for path in tree.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def prepare(source: str, output: Path, version: str, revision: str | None = None) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        tok = AutoTokenizer.from_pretrained(source, revision=revision)
        vocab_size = len(tok)
        tok.save_pretrained(staging)
        rename_tokens(staging)
        model = AutoModelForCausalLM.from_pretrained(source, dtype="auto", revision=revision)
        mean_init(model)
        if model.config.pad_token_id is None and tok.pad_token is None:
            # the tokenizer files name it (prepare_files); the model's config and generation config say the same
            model.config.pad_token_id = PAD_ID
            if model.generation_config is not None:
                model.generation_config.pad_token_id = PAD_ID
        model.save_pretrained(staging)
        del model  # a 10B checkpoint: never two copies in memory
        ids = verify(staging, vocab_size)
        _share(staging)
        if output.exists():
            shutil.rmtree(output)  # an earlier attempt without its marker: never trusted
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # the marker goes last: its presence is the promise that everything before it was written
    (output / MARKER).write_text(
        json.dumps({"source": source, "version": version, "vocab_size": vocab_size, "tokens": ids}, indent=2) + "\n"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="hub id or local directory of the Delphi checkpoint")
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--tokens", required=True, help="JSON: each new token -> the reserved id it takes")
    parser.add_argument("--version", default="1", help="the prep version, recorded in the marker")
    parser.add_argument("--revision", help="the Hub commit of --model (a hub id) to prepare; default: main")
    args = parser.parse_args(argv)
    TOKENS.update(json.loads(args.tokens))
    try:
        prepare(args.model, args.output, args.version, args.revision)
    except PrepError as exc:
        print(f"delphi tokenizer prep failed: {exc}", file=sys.stderr)
        return 1
    print(f"prepared {args.model} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
