"""Slurm wall-time strings."""

from __future__ import annotations

import re

_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<h>\d+):(?P<m>\d{1,2})(?::(?P<s>\d{1,2}))?$")


def parse_minutes(text: str) -> float:
    """'HH:MM:SS', 'HH:MM', 'D-HH:MM:SS' or plain minutes -> minutes. Raises ValueError, also for a zero time:
    Slurm reads a time limit of 0 as no limit at all, never as "stop at once"."""
    text = str(text).strip()
    if text.isdigit():
        minutes = float(text)
    else:
        m = _TIME.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a wall time like 04:00:00 or 1-12:00:00")
        days, hours, mins, seconds = (int(m.group(g) or 0) for g in "dhms")
        minutes = days * 1440 + hours * 60 + mins + seconds / 60
    if minutes <= 0:
        raise ValueError(f"{text!r} is a zero wall time, which Slurm reads as no time limit at all")
    return minutes
