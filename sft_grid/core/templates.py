"""Chat templates the backends render with, and which tokenizers they fit.

A template renders conversations with special tokens; if the model's tokenizer does not have them as
single tokens, every example is shredded into pieces of those strings and training silently learns
garbage (the users' guide calls this template x tokenizer mismatch "the #1 silent ruin").
"""

from __future__ import annotations

import hashlib
import json
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
    def end_of_turn(self) -> str:
        """The token that ends an assistant turn, which training must teach (the loss-mask check asserts it)."""
        return self.eot or END_OF_TURN[self.family]

    @property
    def jinja_path(self) -> Path | None:
        return JINJA_DIR / self.jinja if self.jinja else None

    def jinja_text(self) -> str | None:
        path = self.jinja_path
        if path is None:
            return None
        # read once per content, not once per cell that renders it (keyed by its stat: an edit is read again)
        st = path.stat()
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _JINJA:
            _JINJA[key] = path.read_text()
        return _JINJA[key]


_JINJA: dict[tuple[str, int, int, int], str] = {}


# the end of every turn in each template family
END_OF_TURN = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>"}
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
        Template("qwen3", "chatml", (*_CHATML, "<think>", "</think>"), axolotl="qwen3"),
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


TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def _config_template(model_dir: Path) -> str | None:
    """The default template inside tokenizer_config.json, or None (no file, no key, no default entry)."""
    path = model_dir / TOKENIZER_CONFIG
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(value, list):
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value.strip() else None


def _jinja_template(model_dir: Path) -> str | None:
    path = model_dir / CHAT_TEMPLATE_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    return text if text.strip() else None


def effective_template(model_dir: str | Path) -> str | None:
    """The chat template a served model would use (chat_template.jinja first, then tokenizer_config.json), or None."""
    model_dir = Path(model_dir)
    jinja = _jinja_template(model_dir)
    return jinja if jinja is not None else _config_template(model_dir)


def template_digest(text: str) -> str:
    """A stable identity of a template: sha256 hex of its text less one trailing newline (Jinja drops it)."""
    return hashlib.sha256(text.removesuffix("\n").encode("utf-8")).hexdigest()


def template_matches(model_dir: str | Path, trained_digest: str) -> tuple[bool, str]:
    """Whether every template copy saved with the model is the trained one; the message says what differs, and the
    fix."""
    model_dir = Path(model_dir)
    copies = {
        model_dir / CHAT_TEMPLATE_FILE: _jinja_template(model_dir),
        model_dir / TOKENIZER_CONFIG: _config_template(model_dir),
    }
    present = {path: text for path, text in copies.items() if text is not None}
    if not present:
        return False, (
            f"{model_dir} has no chat template (neither {CHAT_TEMPLATE_FILE} nor a `chat_template` in"
            f" {TOKENIZER_CONFIG}), but it was trained with one (digest {trained_digest[:12]}):"
            " an evaluation would format prompts unlike training. Fix: save the template the cell trained with"
            f" as {model_dir / CHAT_TEMPLATE_FILE} (or retrain the cell), or evaluate without"
            " apply_chat_template"
        )
    wrong = {path: template_digest(text) for path, text in present.items() if template_digest(text) != trained_digest}
    if not wrong:
        names = " and ".join(path.name for path in present)
        return True, f"{model_dir}: {names} carry the trained chat template (digest {trained_digest[:12]})"
    parts = [f"{path.name} has digest {digest[:12]}" for path, digest in wrong.items()]
    return False, (
        f"{model_dir}: chat template differs from the one trained with (digest {trained_digest[:12]}): "
        + "; ".join(parts)
        + ". An evaluation would format prompts unlike training. Fix: write the template"
        " the cell trained with into "
        + " and ".join(str(path) for path in wrong)
        + " (or retrain the cell), then evaluate again"
    )
