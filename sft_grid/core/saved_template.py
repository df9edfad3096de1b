"""Train == serve: the chat template a saved model would be served with must be the one it was trained with.

An evaluation with ``apply_chat_template`` formats every prompt with the tokenizer's own template, so a model
saved with another template (a backend that wrote its default instead of the cell's, a post stage that
rewrote one copy and not the other) is scored on prompts it never saw in training, and the score says nothing
about the cell. The evaluation stage therefore refuses such a model before it spends a job on it.

Where a saved model keeps its template (the rules transformers 5 applies when it loads a tokenizer):

- ``chat_template.jinja`` beside the tokenizer: transformers 5 saves the template there by default, and a
  loader that finds it uses it, whatever ``tokenizer_config.json`` says;
- else ``tokenizer_config.json``'s ``chat_template``: a string, or (the older form of several named templates)
  a list of ``{"name", "template"}`` of which ``default`` is the one used.

Serving stacks that read only ``tokenizer_config.json`` see the second copy even when the first exists, so every
copy present must match, not only the one transformers picks.

The trained template is the one the trainer saved with the model when training completed, before any post-training
stage ran: the training job records its digest in the ledger (job/runner.py), and the evaluation stage checks the
model it evaluates against it (stages/evaluate.py).

Invariants: stdlib only, reads files and nothing else; a digest ignores one trailing newline, which Jinja drops
when it renders (``keep_trailing_newline`` is off in transformers' environment), so a file saved with and a
string saved without it are the same template.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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
    """Whether every template copy saved with the model is the trained one; the message says what differs and the fix."""
    model_dir = Path(model_dir)
    copies = {
        model_dir / CHAT_TEMPLATE_FILE: _jinja_template(model_dir),
        model_dir / TOKENIZER_CONFIG: _config_template(model_dir),
    }
    present = {path: text for path, text in copies.items() if text is not None}
    if not present:
        return False, (f"{model_dir} has no chat template (neither {CHAT_TEMPLATE_FILE} nor a `chat_template` in"
                       f" {TOKENIZER_CONFIG}), but it was trained with one (digest {trained_digest[:12]}):"
                       " an evaluation would format prompts unlike training. Fix: save the template the cell trained with"
                       f" as {model_dir / CHAT_TEMPLATE_FILE} (or retrain the cell), or evaluate without"
                       " apply_chat_template")
    wrong = {path: template_digest(text) for path, text in present.items() if template_digest(text) != trained_digest}
    if not wrong:
        names = " and ".join(path.name for path in present)
        return True, f"{model_dir}: {names} carry the trained chat template (digest {trained_digest[:12]})"
    parts = [f"{path.name} has digest {digest[:12]}" for path, digest in wrong.items()]
    return False, (f"{model_dir}: chat template differs from the one trained with (digest {trained_digest[:12]}): "
                   + "; ".join(parts) + ". An evaluation would format prompts unlike training. Fix: write the template"
                   " the cell trained with into " + " and ".join(str(path) for path in wrong)
                   + " (or retrain the cell), then evaluate again")
