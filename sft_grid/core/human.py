"""Numbers, sizes and durations as sft_grid writes them for a person: the one place each is formatted.

- counts (tokens, parameters, swept values in a legend): three significant digits and a suffix, 12, 4.5k, 1.23M,
  7.1B, 2.2T; beyond trillions or below a thousandth, two significant digits (1e+20, 2.5e-05).
- sizes: decimal units, kB MB GB TB PB (powers of 1000), three significant digits. Decimal, not binary, because
  the sizes people hold ours against are decimal: the Hugging Face Hub lists every file and repository size in
  decimal units (a 7B model in bf16 is "14 GB" there and here), and a checkpoint's size follows from a parameter
  count times bytes a parameter. Before this module the Hub staging messages wrote binary units (MiB, GiB) and the
  cost tables decimal ones, so the same file read 1.79 GB in one line and 1.7 GiB in the next.
- durations: Slurm's own form, [D-]HH:MM:SS, what squeue and sacct print and what `time=` takes; the same in the
  cost table, the report, a cell's elapsed time and a time limit sft_grid proposes.
- GPU-hours: 0.0123, 4.56, 78.9, 1234 (three significant digits, never 1.23e+03).
"""

from __future__ import annotations

_COUNT_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))
_SIZE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def count(v: float) -> str:
    """12, 4.5k, 1.23M, 7.1B, 2.2T; 1e+20 beyond trillions, 2.5e-05 below a thousandth."""
    a = abs(v)
    if a >= 1e15 or (0 < a < 1e-3):
        return f"{v:.2g}"
    for div, suffix in _COUNT_SUFFIXES:
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def size(b: float) -> str:
    """Bytes in decimal units: 512 B, 6.29 MB, 1.79 GB."""
    for div, unit in _SIZE_UNITS:
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def duration(seconds: float | None) -> str:
    """Slurm's [D-]HH:MM:SS: 00:05:00, 1-02:00:00; "?" when unknown."""
    if seconds is None:
        return "?"
    s = max(0, round(seconds))
    days, rest = divmod(s, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def hours(h: float | None) -> str:
    """GPU-hours: 0.0123, 4.56, 78.9, 1234; "?" when unknown."""
    if h is None:
        return "?"
    return f"{h:.0f}" if abs(h) >= 100 else f"{h:.3g}"
