"""Build a tiny Llama-3-style and a tiny Qwen3-style model with their tokenizers, locally and deterministically.

Tests and the demo need real models and tokenizers, but no machine they run on can reach the Hugging Face
Hub. This script runs inside a backend's virtual environment (it needs torch, transformers and tokenizers,
which the orchestrator must never import), so it is standalone: it does not import sft_grid.

    <backend env>/bin/python build_tiny.py OUT_DIR

writes OUT_DIR/models/tiny-llama3/, OUT_DIR/models/tiny-qwen3/ and OUT_DIR/models/tiny-delphi/ (a Delphi
checkpoint in miniature: a Qwen3 architecture with Llama-3.1's tokenizer layout, as every real one is). The recipe,
including the order of its steps (which fixes the random weights), matters: it was measured to give the same
weights and losses on every run (byte-level BPE of vocab 1000 on 3,200 synthetic lines; 2-layer models of ~0.2M
parameters).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB = 1000

WORDS = (  # noqa: SIM905 (a word list reads best as the words)
    "the a an tool model data train step loss answer question user assistant system think call result what is how "
    "why when where value number add sum two three four five six seven eight nine ten hello world python function "
    "json list dict file run output input token chat template reason because so first then finally compute check "
    "return yes no please thanks"
).split()

LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",  # LLaMA-Factory's llama3 template adds it as a stop word; without it the vocab grows at train time
    "<|finetune_right_pad_id|>",
    "<|start_think|>",
    "<|end_think|>",
    "<|tool_call|>",
    "<|tool_result|>",
]
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

QWEN3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
QWEN3_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Llama-3's layout, as Delphi checkpoints carry it: 128000 BPE entries, then 256 special tokens at fixed ids,
# most of them reserved slots (the Delphi tokenizer prep renames six of those to its think/tool tokens)
LLAMA3_BPE_SIZE = 128000
LLAMA3_NAMED = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128004: "<|finetune_right_pad_id|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
    128010: "<|python_tag|>",
}
# Llama-3's pre-tokenizer split (digits in groups of three, newlines apart)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def llama3_specials() -> list[str]:
    """The 256 special tokens of Llama-3 in id order: the named ones, the rest reserved_special_token_<n>."""
    names, reserved = [], 0
    for token_id in range(LLAMA3_BPE_SIZE, LLAMA3_BPE_SIZE + 256):
        if token_id in LLAMA3_NAMED:
            names.append(LLAMA3_NAMED[token_id])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def training_lines() -> list[str]:
    lines = [
        " ".join(random.choice(WORDS) for _ in range(random.randint(4, 20))).capitalize()
        + random.choice([".", "?", "!", ""])
        + f" {random.randint(0, 999)}"
        for _ in range(3000)
    ]
    # Tool-call JSON, so that braces and quotes get merges of their own as in real chat data.
    lines += [json.dumps({"name": "add", "arguments": {"a": i, "b": i + 1}}) for i in range(200)]
    return lines


def train_bpe(lines: list[str], specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def llama3_tokenizer(lines: list[str]) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(lines, LLAMA3_SPECIALS),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        additional_special_tokens=[
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eom_id|>",
            "<|start_think|>",
            "<|end_think|>",
            "<|tool_call|>",
            "<|tool_result|>",
        ],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


# the size of every tiny model: a few hundred thousand parameters, a training step in milliseconds on CPU
TINY_SIZES = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def llama3_model(tok: PreTrainedTokenizerFast, **overrides: object) -> LlamaForCausalLM:
    settings = dict(
        vocab_size=len(tok),
        **TINY_SIZES,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    )
    return LlamaForCausalLM(LlamaConfig(**{**settings, **overrides}))


def qwen3_tokenizer(lines: list[str]) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(lines, QWEN3_SPECIALS),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def qwen3_model(tok: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(
        vocab_size=len(tok),
        **TINY_SIZES,
        head_dim=16,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(cfg)


def delphi_tokenizer(lines: list[str]) -> PreTrainedTokenizerFast:
    """A Llama-3-layout tokenizer without a chat template, like a Delphi base checkpoint: a small trained BPE
    padded to 128000 entries with filler that no merge can produce, then Llama-3's 256 specials."""
    split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    trained.train_from_iterator(
        lines,
        trainers.BpeTrainer(
            vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    state = json.loads(trained.to_str())["model"]
    vocab = dict(state["vocab"])
    for i in range(len(vocab), LLAMA3_BPE_SIZE):
        vocab[f"<filler_{i}>"] = i  # unreachable: no merge produces it
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in llama3_specials()])
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<|begin_of_text|> $A",
                pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                special_tokens=[("<|begin_of_text|>", LLAMA3_BPE_SIZE)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


# Delphi's RoPE: theta 500000 with Llama-3's frequency scaling, the same at every size (the models' cards)
DELPHI_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def delphi_model(tok: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A Delphi checkpoint in miniature: Qwen3ForCausalLM (QK-norm, no biases), heads of 128/8 = 16 with as many
    key-value heads (no GQA), an SwiGLU of 4 x hidden, untied embeddings over Llama-3.1's 128,256 ids, bos 128000,
    eos 128001 and no pad token, float32. Hidden 32: the two embedding matrices are most of its ~8M parameters."""
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_parameters=dict(DELPHI_ROPE),
        attention_bias=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(cfg).to(torch.float32)


def save_atomically(
    models_dir: Path, name: str, tok: PreTrainedTokenizerFast, model: torch.nn.Module, shard: str | None = None
) -> Path:
    """Write into a sibling temp dir and rename it into place, so a killed build never leaves a dir that looks whole.
    `shard`: the largest weights file (a size like "20MB"): the weights in shards with their index, as every Delphi
    checkpoint above 447M is stored."""
    models_dir.mkdir(parents=True, exist_ok=True)
    final = models_dir / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models_dir))
    try:
        tok.save_pretrained(tmp)
        model.save_pretrained(tmp, **({"max_shard_size": shard} if shard else {}))
        _share(tmp)
        old = None
        if final.exists():
            # rename() cannot replace a non-empty dir: move the old one aside, then drop it once the new one is in.
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=models_dir))
            final.rename(old / name)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _share(tree: Path) -> None:
    """Give the tree the modes the umask allows: mkdtemp (and the weights writer) make owner-only files, while
    the assets sit in a cache other users and jobs of the same site read."""
    umask = os.umask(0)
    os.umask(umask)
    tree.chmod(0o777 & ~umask)
    for path in tree.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def recipe_start(argv: list[str], part: str) -> tuple[Path, list[str]] | None:
    """OUT_DIR/<part> from the command line (None after printing the usage) and the tokenizers' training lines,
    with the seeds set first: every later weight depends on how much randomness came before."""
    if len(argv) != 1:
        print(f"usage: {Path(sys.argv[0]).name} OUT_DIR", file=sys.stderr)
        return None
    random.seed(0)
    torch.manual_seed(0)
    return Path(argv[0]) / part, training_lines()


def main(argv: list[str]) -> int:
    start = recipe_start(argv, "models")
    if start is None:
        return 2
    models_dir, lines = start

    llama_tok = llama3_tokenizer(lines)
    print(save_atomically(models_dir, "tiny-llama3", llama_tok, llama3_model(llama_tok)))

    qwen_tok = qwen3_tokenizer(lines)
    print(save_atomically(models_dir, "tiny-qwen3", qwen_tok, qwen3_model(qwen_tok)))

    # last, so that the two models above keep their weights; seeded on its own
    torch.manual_seed(1)
    delphi_tok = delphi_tokenizer(lines)
    print(save_atomically(models_dir, "tiny-delphi", delphi_tok, delphi_model(delphi_tok), shard="20MB"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
