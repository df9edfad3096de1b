"""Secrets: what a log or a file may show of one.

A webhook URL may carry a token in its userinfo, query or path (Slack and Discord put it in the path): a log
shows redact_url(url) only, and a URL that carries one is never written into a cell's files (validation
asks for the name of an environment variable instead).

A setting may carry one too: `cluster.env.HF_TOKEN=hf_...`, `+extra.hub_token=...`, a password in a mirror's URL.
What a cell sets is written into its files (cell.yaml, launch.sh, the backend's config) and the values it sweeps
into its name, so `secret_setting` finds them before anything is written: by the token's own shape (Hugging Face,
GitHub, OpenAI-style, Slack, AWS), by a password in a URL, or by a key that names a secret (a token, a password,
an API key) holding a value shaped like one (HF_HUB_DISABLE_IMPLICIT_TOKEN=1 is a switch, not a secret).
"""

from __future__ import annotations

import itertools
import re
from urllib.parse import urlsplit, urlunsplit

# tokens whose prefix says what they are: Hugging Face, GitHub (classic and fine-grained), OpenAI-style keys
# (sk-...), Slack, AWS access key ids
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|xox[abeprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
)
# the words of a key (split at _ . -, any case) that name a secret, alone or as a pair
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials"})
# what a credential is made of (a key naming a secret whose value holds anything else, "<|reserved_token_0|>", is a
# setting about tokens, not a credential)
_CREDENTIAL = re.compile(r"[A-Za-z0-9_\-.+/=:~]+")
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "key")})


def token_like(segment: str) -> bool:
    has_digit, has_alpha = any(c.isdigit() for c in segment), any(c.isalpha() for c in segment)
    return len(segment) >= 16 or (len(segment) >= 8 and has_digit and has_alpha)


def redact_url(url: str) -> str:
    """scheme://host:port/path with userinfo, query and fragment replaced by *** and token-like path
    segments (>= 16 characters, or >= 8 mixing letters and digits) too."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "<unparseable url>"
    if parts.username is not None or parts.password is not None:
        netloc = "***@" + netloc
    path = "/".join("***" if token_like(seg) else seg for seg in parts.path.split("/"))
    return urlunsplit((parts.scheme, netloc, path, "***" if parts.query else "", "***" if parts.fragment else ""))


def carries_secret(url: str) -> bool:
    return redact_url(url) != url


def names_secret(key: str) -> bool:
    """Whether a key's name says it holds a secret: HF_TOKEN, hub_token, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY
    (not TOKENIZERS_PARALLELISM: a word is matched whole)."""
    words = [w for w in re.split(r"[_.\-]+", key.lower()) if w]
    return any(w in _SECRET_WORDS for w in words) or any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def secret_setting(key: str, value: object) -> bool:
    """Whether a setting `key=value` carries a secret (see the module): a token by its shape anywhere in the value,
    a URL with a password, or a key that names a secret holding a value shaped like one."""
    text = str(value)
    if _TOKEN_SHAPES.search(text):
        return True
    if "://" in text:
        try:
            if urlsplit(text).password:
                return True
        except ValueError:
            pass
    return names_secret(key) and bool(_CREDENTIAL.fullmatch(text)) and token_like(text)
