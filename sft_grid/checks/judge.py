"""Whether a loss mask is right, from the probe's token data (pure): every assistant turn is trained, with its
think block and the token that ends it (a model that never trains its end-of-turn token never learns to stop),
and nothing of the system or user prompt; no row is dropped, skipped as "last turn is not trainable", or trains
zero tokens. A failure says which row went wrong and the likeliest fix.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sft_grid.core.cellfiles import Verdict

_THINK = re.compile(r"(<think>.*?</think>|<\|start_think\|>.*?<\|end_think\|>)", re.DOTALL)

@dataclass(frozen=True)
class RowVerdict:
    row: int
    problems: tuple[str, ...]


def _strip_think(text: str) -> str:
    return _THINK.sub("", text).strip()


def trained_text(segments: Sequence[Sequence[Any]]) -> str:
    """The trained text of a row; \\x00 between runs that are not adjacent in the sequence."""
    parts: list[str] = []
    last_trained = False
    for text, trained, _markup in segments:
        if trained:
            parts.append(text)
        elif last_trained:
            parts.append("\x00")
        last_trained = bool(trained)
    return "".join(parts)


def judge_row(row: Mapping[str, Any], last_turn_only: bool = False) -> list[str]:
    """What is wrong with one row's mask, from the probe's token data (empty: nothing)."""
    said = f" (backend said: {'; '.join(w[:100] for w in row['warnings'][:2])})" if row.get("warnings") else ""
    if row.get("dropped"):
        return ["dropped by the backend" + said]
    if not row.get("n_trained"):
        return ["0 trained tokens" + said]
    segments = row["segments"]
    full = "".join(s[0] for s in segments)
    trained = trained_text(segments)
    problems = []
    unmatched = list(dict.fromkeys(role for (kind, _), role in zip(row["messages"], row.get("roles") or [])
                                   if kind == "other"))
    if unmatched:
        problems.append(f"role(s) {', '.join(map(repr, unmatched))} match no tag of the dataset (the backend renders"
                        " them as they are, never as the template's user or assistant)")
    if any("not trainable" in w for w in row.get("warnings") or []):
        problems.append("the backend skipped the last turn as not trainable" + said)
    rest = trained
    assistant = [c for kind, c in row["messages"] if kind == "assistant"]
    required = assistant[-1:] if last_turn_only else assistant
    for i, content in enumerate(assistant):
        text = content.strip()
        if not text:
            continue
        if text in rest:
            if content in required and not _ends_trained(rest, text):
                problems.append(f"the end of assistant turn {i + 1} is not trained (the model never learns to stop)")
            rest = rest.replace(text, "\x00", 1)
            continue
        plain = _strip_think(text)
        if plain and plain in rest and plain != text:
            rest = rest.replace(plain, "\x00", 1)
            problems.append(f"the think block of assistant turn {i + 1} is not trained")
        elif content not in required:
            continue
        elif text in full or (plain and plain in full):
            problems.append(f"assistant turn {i + 1} is masked (not trained): {_short(text)}")
        else:
            problems.append(f"assistant turn {i + 1} does not appear in the rendered text: {_short(text)}")
    leaked = _leak(rest, [s[0] for s in segments if s[2]])
    if leaked:
        prompt = [(kind, c.strip()) for kind, c in row["messages"] if kind in ("user", "system") and c.strip()]
        which = sorted({kind for kind, c in prompt if c in trained}) or ["template"]
        # a function call is trained as the template renders it (not verbatim): only prompt text is a leak there
        if which != ["template"] or not any(kind == "function" for kind, _ in row["messages"]):
            problems.append(f"{'/'.join(which)} text trained: {_short(leaked)}")
    return problems


def _ends_trained(rest: str, text: str) -> bool:
    """Whether the trained run holding an assistant turn goes on past its content: the end-of-turn token
    (or the tool call after it) is trained with it."""
    after = rest[rest.index(text) + len(text):]
    return bool(after.split("\x00", 1)[0].strip())


def _leak(rest: str, markup: Sequence[str]) -> str:
    """Trained text that is neither assistant content nor the template's special tokens or whitespace."""
    for token in sorted(set(markup), key=len, reverse=True):
        rest = rest.replace(token, "\x00")
    pieces = [p.strip() for p in rest.split("\x00")]
    return " | ".join(p for p in pieces if p)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "...")


def judge(rows: Sequence[Mapping[str, Any]], tags: Mapping[str, str], last_turn_only: bool = False) -> Verdict:
    """The verdict of a loss-mask check from the probe's rows: every row must pass."""
    if not rows:
        return Verdict(False, "the sample has no rows", "point the dataset at non-empty data")
    verdicts = [RowVerdict(i, tuple(judge_row(r, last_turn_only))) for i, r in enumerate(rows)]
    bad = [v for v in verdicts if v.problems]
    if not bad:
        return Verdict(True)
    n = len(rows)
    zero = sum(1 for r in rows if not r.get("n_trained"))
    kinds = Counter(p.split(":")[0].split(" (")[0] for v in bad for p in v.problems)
    first = bad[0]
    summary = (f"{zero}/{n} sampled rows train 0 tokens" if zero else f"{len(bad)}/{n} sampled rows are trained wrongly")
    detail = f"row {first.row}: {'; '.join(first.problems)}"
    message = f"{summary} ({', '.join(f'{k}: {c}' for k, c in kinds.most_common(3))}); {detail}"
    return Verdict(False, message, _fix(rows, tags, bad))


def _fix(rows: Sequence[Mapping[str, Any]], tags: Mapping[str, str], bad: Sequence[RowVerdict]) -> str:
    """The likeliest fix, from the role values the rows use and what went wrong."""
    roles = Counter(role for r in rows for role in r.get("roles") or [] if role != "None")
    unmatched = Counter(role for r in rows for (kind, _), role in zip(r["messages"], r.get("roles") or [])
                        if kind == "other")
    role_tag = tags.get("role_tag", "role")
    assistant_turns = sum(1 for r in rows for kind, _ in r["messages"] if kind == "assistant")
    seen = ", ".join(repr(k) for k, _ in roles.most_common(6))
    if not roles:
        return (f"no message of the rows has a {role_tag!r} key: set this dataset's `messages:` column and"
                " tags.role_tag/content_tag to the rows' own keys")
    if not assistant_turns:
        return (f"role tag {role_tag!r} values seen: {seen}; none equals assistant_tag {tags.get('assistant_tag')!r}:"
                " set tags.assistant_tag (and user_tag) of this dataset to the values its rows use")
    if unmatched:
        values = ", ".join(repr(k) for k in unmatched)
        return (f"role value(s) {values} match no tag (user_tag={tags.get('user_tag')!r},"
                f" assistant_tag={tags.get('assistant_tag')!r}, system_tag={tags.get('system_tag')!r}): set the"
                " matching tag of this dataset to them")
    problems = " ".join(p for v in bad for p in v.problems)
    if "template text trained" in problems and "user" not in problems and "system" not in problems:
        return ("the template writes markup the tokenizer does not have as special tokens, or the backend trains"
                " template text: use the template of the model's own family (llama3 for Llama-3/Delphi, qwen3 for"
                " ChatML tokenizers)")
    if "text trained" in problems:
        return ("the prompt is trained: use the model's own template and do not set train_on_prompt"
                " (or train_on_inputs / roles_to_train with user or system roles)")
    return "check the template against the model's tokenizer and `python -m sft_grid.show` the cell to see what is trained"
