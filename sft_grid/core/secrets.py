"""Secrets: what a log or a file may show of one.

A webhook URL may carry a token in its userinfo, query or path (Slack and Discord put it in the path): a log
shows redact_url(url) only, and a URL that carries one is never written into a cell's files (validation
asks for the name of an environment variable instead).

A setting may carry one too: `cluster.env.HF_TOKEN=hf_...`, `+extra.hub_token=...`, a password in a mirror's URL.
What a cell sets is written into its files (cell.yaml, launch.sh, the backend's config) and the values it sweeps
into its name, so `secret_setting` finds them before anything is written: by the token's own shape (Hugging Face,
GitHub, GitLab, OpenAI-style, Slack, AWS, Google), by a password or a ?token=... in a URL, by a command line's
login or its --token/--password flag (`wandb login <key>`, `huggingface-cli login --token <token>`), or by a key
that names a secret (a token, a password, a key, an API key: WANDB_KEY, MY_PASS, DB_PASSWORD) holding a value
shaped like one.
Not a secret: a switch (HF_HUB_DISABLE_IMPLICIT_TOKEN=1), a number, a path (GOOGLE_APPLICATION_CREDENTIALS=
/home/me/sa.json), a key whose last word says it points at the secret (HF_TOKEN_PATH, PASSWORD_FILE, ..._DIR,
..._URL), and a reference the shell expands when the job runs (`--token $HF_TOKEN`).
"""

from __future__ import annotations

import itertools
import re
from urllib.parse import parse_qsl, urlsplit, urlunsplit

# tokens whose prefix says what they are: Hugging Face, GitHub (classic and fine-grained), GitLab, OpenAI-style
# keys (sk-...), Slack, AWS access key ids (long-lived and temporary), Google API keys
_TOKEN_SHAPES = re.compile(
    r"(?<![A-Za-z0-9])(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abeprs]-[A-Za-z0-9-]{10,}|A[KS]IA[0-9A-Z]{16}"
    r"|AIza[0-9A-Za-z_-]{35})"
)
# the words of a key (split at _ . -, any case) that name a secret, alone or as a pair
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "pwd", "apikey", "credential", "credentials"})
# words that name a password: any value that is not a switch, a number or a path is one (DB_PASSWORD=hunter2)
_PASSWORD_WORDS = frozenset({"password", "passwd", "pwd", "pass", "passphrase"})
# words that name a secret less surely (response_key=assistant_response is a column's name): the value must look
# generated, letters and digits mixed (WANDB_KEY=<40 hex digits>, MY_PASS=Sup3rSecret)
_LOOSE_WORDS = frozenset({"key", "pass", "passphrase", "auth", "private"})
# a key's last word that says its value points at the secret, not holds it (HF_TOKEN_PATH, PASSWORD_FILE)
_POINTER_WORDS = frozenset({"path", "file", "dir", "directory", "url", "uri", "endpoint", "host", "name", "env", "var"})
# a value that is a path (GOOGLE_APPLICATION_CREDENTIALS=/home/me/sa.json; a generated secret may hold a / but
# does not start with a lower-case directory): ~/, ./, ../, or /<lower-case directory>/
_PATH = re.compile(r"(?:~|\.\.?)/|/[a-z][a-z0-9_.-]*/")
_SWITCHES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})
# a command line's secret: the word after `login` and its flags (`wandb login <key>`, `huggingface-cli login
# --token <token>`; not a registry's host name, `docker login registry-1.docker.io`), or the value of a
# --token/--password/--api-key flag; not a reference the shell expands (`--token "$HF_TOKEN"`)
_COMMAND_SECRET = re.compile(
    r"(?<![\w-])(?:(login)(?:\s+--?[A-Za-z][\w-]*(?:=\S*)?)*+|--(token|auth-token|api-?key|key|secret|password|passwd"
    r"|pass))(?:\s+|=)['\"]?([^\s'\";|&$-][^\s'\";|&]*)"
)
# a URL in a value (a setup line may hold one: `wget https://host/data?token=...`)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")
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


def _words(key: str) -> list[str]:
    return [w for w in re.split(r"[_.\-]+", key.lower()) if w]


def names_secret(key: str) -> bool:
    """Whether a key's name says it holds a secret: HF_TOKEN, hub_token, WANDB_API_KEY, WANDB_KEY, DB_PASSWORD,
    AWS_SECRET_ACCESS_KEY (not TOKENIZERS_PARALLELISM: a word is matched whole; not HF_TOKEN_PATH: its last word says
    it points at the secret; not PWD, the shell's working directory)."""
    words = _words(key)
    if not words or words[-1] in _POINTER_WORDS or words == ["pwd"]:
        return False
    return any(w in _SECRET_WORDS | _LOOSE_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


def _holds_one(text: str, *, password: bool, loose: bool) -> bool:
    """Whether `text`, set under a name (or a flag) that says secret, is shaped like one: not a path, a switch, a
    number under a loose word (MY_PASS=3) or a reference the shell expands ($VAR), and a password of 4 characters
    or more (any but a space), or a token made of what a credential is made of (see token_like; under a loose word
    letters and digits mixed, as a generated key is)."""
    if not text or text.startswith("$") or _PATH.match(text) or text.lower() in _SWITCHES:
        return False
    if loose and re.fullmatch(r"[0-9.eE+-]+", text):
        return False
    if password:
        return len(text) >= 4 and not any(c.isspace() for c in text)
    has_both = any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    return bool(_CREDENTIAL.fullmatch(text)) and token_like(text) and (has_both or not loose)


def _url_secret(url: str) -> bool:
    """Whether a URL carries a password (https://bob:<password>@host) or a query parameter that names a secret
    (?token=..., &api_key=...)."""
    try:
        parts = urlsplit(url)
        if parts.password:
            return True
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return False
    return any(names_secret(name) and _holds_one(value, password=False, loose=False) for name, value in query)


def secret_setting(key: str, value: object) -> bool:
    """Whether a setting `key=value` carries a secret (see the module): a token by its shape anywhere in the value,
    a URL with a password or a query parameter naming a secret, a command line's login or --token/--password flag,
    or a key that names a secret holding a value shaped like one."""
    text = str(value)
    if _TOKEN_SHAPES.search(text):
        return True
    if any(_url_secret(url) for url in _URL.findall(text)):
        return True
    for login, flag, arg in _COMMAND_SECRET.findall(text):
        if login and "." in arg:
            continue  # a registry's or a host's name
        if _holds_one(arg, password=flag in _PASSWORD_WORDS, loose=bool(login) or flag == "key"):
            return True
    if not names_secret(key):
        return False
    words = _words(key)
    sure = any(w in _SECRET_WORDS for w in words) or any(p in _SECRET_PAIRS for p in itertools.pairwise(words))
    return _holds_one(text, password=words[-1] in _PASSWORD_WORDS, loose=not sure)


def shown_source(source: str) -> str:
    """A dataset's source or a model's id as a message may show it: a URL through redact_url (a token in its query
    stays out of the error output), anything else as it is."""
    return redact_url(source) if "://" in source else source
