"""Chat templates the backends render with, and which tokenizers they fit.

A template renders conversations with special tokens; if the model's tokenizer does not have them as
single tokens, every example is shredded into pieces of those strings and training silently learns
garbage (the users' guide calls this template x tokenizer mismatch "the #1 silent ruin").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Chat templates sft_grid owns, as jinja files: the one source of truth for every backend and for serving
JINJA_DIR = Path(__file__).resolve().parent.parent / "chat_templates"


@dataclass(frozen=True)
class Template:
    name: str
    # the token family the template writes: llama3 headers or ChatML
    family: str
    # strings that must each be one token of the model's tokenizer
    special_tokens: tuple[str, ...]
    # a jinja file under sft_grid/chat_templates/ for templates the backends do not ship: each backend is
    # given this text (LLaMA-Factory registers it in its own process, axolotl gets `chat_template: jinja`)
    jinja: str | None = None
    # axolotl's name for the same template (its ChatTemplate enum); unset: axolotl is given the jinja text
    axolotl: str | None = None
    # the token that ends every turn of a jinja template, trained with the assistant's content: axolotl
    # trains only the tokenizer's eos at a turn's end unless told (eot_tokens), and a Delphi base
    # tokenizer's eos is <|end_of_text|>
    eot: str | None = None

    @property
    def jinja_path(self) -> Path | None:
        return JINJA_DIR / self.jinja if self.jinja else None

    def jinja_text(self) -> str | None:
        path = self.jinja_path
        return path.read_text() if path is not None else None


_LLAMA3 = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
_CHATML = ("<|im_start|>", "<|im_end|>")
# Delphi's think and tool tokens, renamed into Llama-3's reserved slots by the tokenizer prep (sft_grid/stages/prep.py)
DELPHI_TOKENS = {
    "<|start_think|>": 128002,
    "<|end_think|>": 128003,
    "<|tool_call|>": 128005,
    "<|tool_call_end|>": 128011,
    "<|tool_result|>": 128012,
    "<|tool_result_end|>": 128013,
}

TEMPLATES = {
    t.name: t
    for t in (
        Template("llama3", "llama3", _LLAMA3, axolotl="llama3"),
        Template("delphi", "llama3", _LLAMA3 + tuple(DELPHI_TOKENS), jinja="delphi.jinja", eot="<|eot_id|>"),
        Template("qwen3", "chatml", _CHATML + ("<think>", "</think>"), axolotl="qwen3"),
        # plain ChatML: LLaMA-Factory's qwen3_nothink writes no think block either
        Template("qwen3_nothink", "chatml", _CHATML, axolotl="chatml"),
        Template("qwen", "chatml", _CHATML, axolotl="qwen_25"),
        Template("chatml", "chatml", _CHATML, axolotl="chatml"),
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
# ... and per tokenizer family where it is more specific than its template family
SUGGESTED_FOR_TOKENIZER = {"delphi": "delphi"}
