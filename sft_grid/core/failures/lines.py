"""A log's lines as triage reads them: its attempts, and each line with what launchers did to it undone.

Several ranks often write one log (torchrun, srun, DeepSpeed's pdsh), so a line may start with a launcher's label
(`[rank3]:`, `[default0]:`, `0: ` from srun --label, `[1,0]<stderr>:` from mpirun, a host), a logger's
timestamp or tag, or carry another rank's text spliced in (a progress bar, then `[rank3]: Traceback ...`; a
`raise` line, then the exception type, its message on the next line). A terminal may also have wrapped a long
line mid-word. `read_lines` gives each physical line its logical text (labels off, a split exception joined),
says whether it is source code a traceback quotes (a frame's line, a `raise`, an IPython listing: never a
message), and keeps the next line for a line a terminal cut. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sft_grid.core.failures import signs

# A launcher's or logger's prefix, taken off a line's start (repeatedly: `[80746] [rank0]:[E321 ...]`).
PREFIX = re.compile(
    r"""^(?:
    \[(?:rank|default)\d+\]:\s?                         # torchrun --tee / torch >= 2.2 ranks, elastic's local ranks
  | \d{1,5}:\s                                          # srun --label
  | \[\d+,\d+\]<(?:stdout|stderr)>:\s?                  # mpirun --tag-output
  | (?![\w.]*(?:Error|Exception):)[\w.-]+:\s(?=\s*(?:File\s|Traceback|\w+(?:Error|Exception)\b))  # pdsh's host
  | \d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*(?:-\s*\S+\s*-\s*\w+\s*-\s*)?  # a timestamp (logging's format)
  | [A-Z][a-z]{2}\s+\d+\s\d\d:\d\d:\d\d\s+             # syslog, Jenkins
  | [IWEF]\d{4}\s\d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+:\d+\]\s*  # glog (torch's C++ and torchrun's E-level lines)
  | \[[^\]\n]{1,80}\]:?\s*                              # a bracketed tag: [INFO], [E socket.cpp:793], [uuid]
  | [“”"'`>]+\s*                                         # quotes and a Markdown quote around a pasted message
)""",
    re.VERBOSE,
)
# A rank's label in the middle of a line: another rank's text spliced after this one's (a progress bar's).
MID_RANK = re.compile(r"(?<=\S)(?=\[rank\d+\]:)")
# A line that is source code a traceback quotes: a `raise` (also spliced after other text), an IPython listing.
RAISE = re.compile(r"(^|[\s)\]])raise\s+[\w.]+(\(|$)")
LISTING = re.compile(r"^\s*(?:-*>\s*)?\d+\s+\S")
# A quoted source line of a statement a traceback shows over several lines: an f-string, or a string with
# format placeholders ("Undefined dataset {} in {}."); a pasted message in quotes has neither.
SOURCE_STRING = re.compile(r"""^(?:[rRbBuU]?[fF][rR]?["']|["'].*\{[\w.!:]*\})""")
# An exception type ending a line whose message starts the next (two ranks' output spliced).
TRAILING_TYPE = re.compile(r"(?P<type>\b(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))$")
WRAP_MIN = 100  # a line a terminal cut is at least this long
# The start of a log line of its own (NCCL's host:pid:tid [dev], a logger's level): never a cut line's rest.
LINE_START = re.compile(r"^(?:[\w.-]+:\d+:\d+ \[\d+\]|\S+ (?:INFO|WARN|WARNING|ERROR)\b)")


@dataclass(frozen=True)
class Line:
    index: int  # position in the attempt's lines
    raw: str  # the physical line, stripped: what evidence quotes
    text: str  # the logical line: prefixes off, a split exception's type and message joined
    code: bool = False  # source code a traceback quotes, not a message
    frame: str = ""  # a traceback frame's file path ("" when the line is no frame)
    wrapped: str = ""  # this line and the next joined, when a terminal cut this one mid-word

    @property
    def quote(self) -> str:
        """What evidence quotes: the physical line, or the logical one where it joined a split exception."""
        return self.text if self.joined else self.raw

    @property
    def joined(self) -> bool:
        return self.text != strip_prefix(self.raw)


def strip_prefix(text: str) -> str:
    """The line without the labels and stamps launchers and loggers put before it (PREFIX, repeatedly)."""
    text = text.strip()
    while True:
        m = PREFIX.match(text)
        if not m or not m.group(0):
            return text
        text = text[m.end() :].lstrip()


def physical_lines(lines: Sequence[str]) -> list[str]:
    """The lines with a rank's text spliced mid-line split off (a progress bar, then `[rank3]: Traceback`)."""
    out: list[str] = []
    for line in lines:
        parts = [part for part in MID_RANK.split(line) if part.strip()]
        out.extend(parts or [line])  # a blank line stays: it ends a traceback's quoted source
    return out


def read_lines(lines: Sequence[str]) -> list[Line]:
    """Each physical line with its logical text, whether it is quoted source, its frame's path, its cut rest."""
    physical = physical_lines(lines)
    raw = [line.strip() for line in physical]
    stripped = [strip_prefix(line) for line in raw]
    out: list[Line] = []
    source = False  # inside a frame's quoted source (it runs on over several lines in Python 3.11+)
    for i, (line, text) in enumerate(zip(raw, stripped, strict=True)):
        frame = signs.FRAME.match(text)
        path = (frame.group("path") or frame.group("ipath") or "").replace("\\", "/") if frame else ""
        logical = text
        if text.startswith(":") and i and (m := TRAILING_TYPE.search(raw[i - 1])) and "Traceback" not in text:
            logical = m.group("type") + text  # `raise ...ValueError` / `: Undefined dataset ...`
        message = bool(signs.EXCEPTION_LINE.match(logical) or signs.WHAT.match(text))
        if frame or message or not text or text.startswith("Traceback") or signs.CHAINED.search(text):
            source = False
        # a joined exception is a message even though its first half was a `raise` line
        quoted = bool(RAISE.search(text)) and logical == text
        listing = bool(LISTING.match(physical[i])) and physical[i][:1] in " \t-"
        code = quoted or listing or source or bool(SOURCE_STRING.match(text))
        nxt = raw[i + 1] if i + 1 < len(raw) else ""
        cut = len(line) >= WRAP_MIN and line[-1:].isalnum() and nxt[:1].isalnum()
        wrapped = line + nxt if cut and not LINE_START.match(nxt) and strip_prefix(nxt) == nxt else ""
        out.append(Line(i, line, logical, code, path, wrapped))
        source = source or bool(frame)
    return out


def split_attempts(text: str) -> list[list[str]]:
    """A log's lines split into the attempts of a requeued cell, oldest first (never empty). An attempt ends at a
    requeue marker, before a start marker, and where a line is logged well after the scheduler ended the job
    (a preemption or time limit that Slurm requeued: the next run appends to the same log)."""
    attempts: list[list[str]] = [[]]
    ended: datetime | None = None  # when the scheduler ended the current attempt
    for line in text.splitlines():
        stamp = _timestamp(line)
        late = ended is not None and stamp is not None and (stamp - ended).total_seconds() > signs.KILL_GRACE_S
        if (signs.ATTEMPT_START.search(line) or late) and any(x.strip() for x in attempts[-1]):
            attempts.append([])
            ended = None
        attempts[-1].append(line)
        if signs.ATTEMPT_END.search(line):
            attempts.append([])
            ended = None
        elif m := signs.SCHEDULER_END.search(line):
            ended = _parse(m.group("time"))
    return [a for a in attempts if any(x.strip() for x in a)] or [[]]


def _timestamp(line: str) -> datetime | None:
    if signs.SCHEDULER_END.search(line):
        return None  # the end's own line
    m = signs.TIMESTAMP.search(line)
    return _parse(m.group("time")) if m else None


def _parse(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        return None
