"""Secrets in URLs: what a log or a file may show of one.

A webhook URL may carry a token in its userinfo, query or path (Slack and Discord put it in the path): a log
shows redact_url(url) only, and a URL that carries one is never written into a cell's files (validation
asks for the name of an environment variable instead).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


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
