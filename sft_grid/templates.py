"""Chat templates the backends render with, and which tokenizers they fit.

A template renders conversations with special tokens; if the model's tokenizer does not have them as
single tokens, every example is shredded into pieces of those strings and training silently learns
garbage (the users' guide calls this template x tokenizer mismatch "the #1 silent ruin").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    name: str
    # the token family the template writes: llama3 headers or ChatML
    family: str
    # strings that must each be one token of the model's tokenizer
    special_tokens: tuple[str, ...]


_LLAMA3 = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_CHATML = ("<|im_start|>", "<|im_end|>")

TEMPLATES = {
    t.name: t
    for t in (
        Template("llama3", "llama3", _LLAMA3),
        Template("qwen3", "chatml", _CHATML + ("<think>", "</think>")),
        Template("qwen3_nothink", "chatml", _CHATML),
        Template("qwen", "chatml", _CHATML),
        Template("chatml", "chatml", _CHATML),
    )
}

# tokenizer family of a model (conf/model/*.yaml `tokenizer_family`) -> the template family it speaks
TOKENIZER_FAMILIES = {
    "llama3": "llama3",
    # Delphi checkpoints carry the Llama-3 tokenizer (plus think/tool tokens in reserved slots)
    "delphi": "llama3",
    "qwen3": "chatml",
    "qwen3_5": "chatml",
}

# a template per template family, for the fix in error messages
SUGGESTED = {"llama3": "llama3", "chatml": "qwen3"}
