"""Notifications when a cell ends (completed, or failed with its class) and when a whole grid is done.

A grid names a command (an argv list: the event goes to its stdin as JSON and into its environment as
SFT_GRID_EVENT_* variables), a webhook URL (an HTTP POST of the same JSON), or both.

Invariants:
- Never raises into the caller: every outcome is a Delivery (ok or not), logged; a notification is a
  courtesy, the cell's own state lives in its ledger.
- Once per outcome: dedup_key(identity, outcome, attempt) names an event; the caller records sent keys in
  the cell's ledger and asks should_send() first, so a requeued job or a runner called on every node does
  not notify twice, while a rerun (a new attempt) does.
- No secret in logs: a webhook URL may carry a token in its userinfo, query or path (Slack and Discord put
  it in the path), so logs show redact_url(url) only, and error texts are scrubbed of the URL. Userinfo is
  sent as an HTTP Basic Authorization header.
- Bounded: a short timeout per try and a few retries with exponential backoff (connection errors, timeouts, 429
  and 5xx only: any other answer is final); the command gets the same timeout and no retry (it may have side
  effects). The POST is httpx's (installed with huggingface_hub); the retry loop is ours, because httpx's transport
  retries only failed connections, not a 429 or a 5xx answer.

Who hears what (`cell_ended`, `grid_ended`, the settings a cell's directory names) follows the delivery: one
notification when a cell ends and one when the whole grid has, whoever notices first (the job, `status`, the
next invocation), recorded in the ledger so that none is sent twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.cell import REQUEUE_NOTE, cell_config
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import LOGS_DIR
from sft_grid.core.secrets import redact_url, token_like
from sft_grid.core.state import CellState, State

log = logging.getLogger(__name__)

ENV_PREFIX = "SFT_GRID_EVENT_"
USER_AGENT = "sft_grid-notify/1"


def dedup_key(identity: str, outcome: str, attempt: int | str) -> str:
    """The name of one notification: a cell (or grid) identity, its outcome and the attempt it ended."""
    return f"notify:{identity}:{outcome}:{attempt}"


def should_send(key: str, already_sent: set[str] | frozenset[str]) -> bool:
    return key not in already_sent


@dataclass(frozen=True, kw_only=True)
class Notice:
    """What one notification says: a cell's end, or the grid's."""

    kind: str  # cell | grid
    grid: str
    outcome: str  # completed | failed (cells), done (grids)
    cell: str = ""  # the cell's identity (its name) for kind=cell
    attempt: int | str = 1  # which run of the cell (or grid) ended: a rerun is a new attempt, a requeue is not
    failure_class: str = ""  # a FailureClass value when failed
    summary: str = ""  # one line for a person
    details: Mapping[str, Any] = field(default_factory=dict)  # e.g. step, total, job_id, counts

    @property
    def identity(self) -> str:
        return f"{self.grid}/{self.cell}" if self.kind == "cell" else f"grid:{self.grid}"

    @property
    def key(self) -> str:
        return dedup_key(self.identity, self.outcome, self.attempt)

    def payload(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "grid": self.grid,
            "cell": self.cell,
            "outcome": self.outcome,
            "class": self.failure_class,
            "summary": self.summary,
            "attempt": self.attempt,
            "key": self.key,
            "details": dict(self.details),
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def environ(self) -> dict[str, str]:
        out = {
            "KIND": self.kind,
            "GRID": self.grid,
            "CELL": self.cell,
            "OUTCOME": self.outcome,
            "CLASS": self.failure_class,
            "SUMMARY": self.summary,
            "ATTEMPT": str(self.attempt),
            "KEY": self.key,
        }
        for name, value in self.details.items():
            if isinstance(value, (str, int, float, bool)) and re.fullmatch(r"[A-Za-z_]\w*", name):
                out.setdefault(name.upper(), str(value))
        return {ENV_PREFIX + k: v.replace("\0", "") for k, v in out.items()}


def cell_event(
    grid: str, cell: str, outcome: str, attempt: int = 1, failure_class: str = "", summary: str = "", **details: Any
) -> Notice:
    return Notice(
        kind="cell",
        grid=grid,
        outcome=outcome,
        cell=cell,
        attempt=attempt,
        failure_class=failure_class,
        summary=summary or f"{cell}: {outcome}",
        details=details,
    )


def grid_event(grid: str, counts: Mapping[str, int], attempt: int | str = 1) -> Notice:
    """The grid is done: counts of its cells by final state."""
    text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n) or "no cells"
    return Notice(
        kind="grid",
        grid=grid,
        outcome="done",
        cell="",
        attempt=attempt,
        failure_class="",
        summary=f"grid {grid} done: {text}",
        details={"counts": dict(counts)},
    )


@dataclass(frozen=True)
class NotifyConfig:
    command: tuple[str, ...] = ()
    webhook: str | None = None
    timeout_s: float = 10.0
    retries: int = 2
    backoff_s: float = 1.0

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any] | None) -> NotifyConfig:
        m = m or {}
        command = m.get("command") or ()
        if isinstance(command, str):
            raise ValueError("notify.command must be an argv list, not a shell string")
        return cls(
            tuple(str(a) for a in command),
            m.get("webhook") or None,
            float(m.get("timeout_s", 10.0)),
            int(m.get("retries", 2)),
            float(m.get("backoff_s", 1.0)),
        )

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.webhook)


@dataclass(frozen=True)
class Delivery:
    channel: str  # command | webhook
    ok: bool
    attempts: int
    detail: str  # what happened, secrets removed


def _scrub(text: str, url: str) -> str:
    secrets = [url]
    try:
        parts = urlsplit(url)
        secrets += [s for s in (parts.password, parts.username, parts.query, parts.fragment) if s]
        secrets += [seg for seg in parts.path.split("/") if token_like(seg)]
    except ValueError:
        pass
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _target(url: str) -> tuple[str, tuple[str, str] | None]:
    """The URL without its userinfo, and the userinfo as (user, password) for Basic auth."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username), unquote(parts.password or ""))


def post_webhook(
    url: str, payload: Mapping[str, Any], timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 1.0
) -> Delivery:
    """POST the payload as JSON; retried on connection errors, timeouts, 429 and 5xx."""
    import httpx

    shown = redact_url(url)
    try:
        target, auth = _target(url)
        if urlsplit(target).scheme not in ("http", "https") or not urlsplit(target).hostname:
            return Delivery("webhook", False, 0, f"{shown}: not an http(s) URL")
    except ValueError as e:
        return Delivery("webhook", False, 0, f"{shown}: {_scrub(str(e), url)}")
    body = json.dumps(payload, default=str).encode()
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    detail, tries = "", 0
    with httpx.Client(timeout=timeout_s, auth=auth, follow_redirects=False) as client:
        for tries in range(1, retries + 2):
            try:
                answer = client.post(target, content=body, headers=headers)
                if answer.is_success:
                    return Delivery("webhook", True, tries, f"{shown}: HTTP {answer.status_code}")
                detail = f"HTTP {answer.status_code}"
                if answer.status_code != 429 and answer.status_code < 500:
                    break
            except httpx.TimeoutException as e:
                detail = _scrub(f"{type(e).__name__}: timed out", url)
            except httpx.TransportError as e:  # refused, reset, unreachable
                detail = _scrub(f"{type(e).__name__}: {e}", url)
            except Exception as e:  # a notification never breaks the caller (a URL httpx cannot send to, ...)
                detail = _scrub(f"{type(e).__name__}: {e}", url)
                break
            if tries <= retries:
                time.sleep(backoff_s * 2 ** (tries - 1))
    return Delivery("webhook", False, tries, f"{shown}: {detail}")


def run_command(argv: Sequence[str], event: Notice, timeout_s: float = 10.0) -> Delivery:
    """Run the grid's command with the event as JSON on stdin and in SFT_GRID_EVENT_* variables."""
    try:
        proc = subprocess.run(
            list(argv),
            input=json.dumps(event.payload(), default=str),
            text=True,
            capture_output=True,
            timeout=timeout_s,
            env={**os.environ, **event.environ()},
        )
    except subprocess.TimeoutExpired:
        return Delivery("command", False, 1, f"{argv[0]}: no exit within {timeout_s:g} s (killed)")
    except OSError as e:
        return Delivery("command", False, 1, f"{argv[0]}: {e.strerror or e}")
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return Delivery("command", False, 1, f"{argv[0]}: exit {proc.returncode}: {tail[0][:300]}")
    return Delivery("command", True, 1, f"{argv[0]}: exit 0")


def send(event: Notice, config: NotifyConfig) -> list[Delivery]:
    """Deliver the event on every configured channel; never raises."""
    channels: list[tuple[str, Callable[[], Delivery]]] = []
    if config.command:
        channels.append(("command", lambda: run_command(config.command, event, config.timeout_s)))
    if config.webhook:
        url = config.webhook
        channels.append(
            ("webhook", lambda: post_webhook(url, event.payload(), config.timeout_s, config.retries, config.backoff_s))
        )
    out = []
    for channel, deliver in channels:
        try:
            out.append(deliver())
        except Exception as e:  # a notification never breaks the caller
            out.append(Delivery(channel, False, 1, _scrub(f"{type(e).__name__}: {e}", config.webhook or "")))
    for d in out:
        (log.info if d.ok else log.warning)(
            "notify %s via %s: %s (%d tr%s)",
            event.key,
            d.channel,
            d.detail,
            d.attempts,
            "y" if d.attempts == 1 else "ies",
        )
    return out


def send_once(event: Notice, config: NotifyConfig, already_sent: set[str] | frozenset[str]) -> list[Delivery]:
    """send() unless the event's key was already sent (then nothing, and an empty list). The caller then
    records event.key in the cell's ledger, whatever the deliveries' outcome: a failed notification is
    logged, not retried on every later pass."""
    if not config.enabled or not should_send(event.key, already_sent):
        return []
    return send(event, config)


MARKERS = "notified"  # under the cell's logs/ (a grid's own under <sweep>/.notified)
ENDED = (State.COMPLETED, State.FAILED, State.CANCELLED)


def config_of(settings: Mapping[str, Any] | None) -> NotifyConfig:
    settings = dict(settings or {})
    variable = settings.pop("webhook_env", None)
    if variable and not settings.get("webhook"):
        settings["webhook"] = os.environ.get(variable) or None
    return NotifyConfig.from_mapping(settings)


def run_number(history: Sequence[Event]) -> int:
    """Which run of the cell this is: its submissions, less those the failure policy made (requeues)."""
    return max(1, sum(e.kind is Kind.SUBMITTED and not e.note.startswith(REQUEUE_NOTE) for e in history))


def _take(folder: Path, key: str) -> bool:
    """Whether this process is the first to send `key` (an exclusive create of its marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / hashlib.sha256(key.encode()).hexdigest()[:20]
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def settings_for(cell_dir: Path) -> NotifyConfig:
    """The grid's notification settings, from a cell's cell.yaml."""
    return config_of(cell_config(cell_dir).get("notify"))


def _ended(state: CellState) -> bool:
    """Whether a cell has ended: a failure its policy requeues is no end."""
    return state.state in ENDED and not (state.state is State.FAILED and state.action is RemedyKind.REQUEUE)


def cell_ended(
    cell_dir: Path, state: CellState, history: Sequence[Event] | None = None, settings: NotifyConfig | None = None
) -> bool:
    """Notify the end of a cell once; True when this call sent it."""
    if not _ended(state):
        return False
    settings = settings_for(cell_dir) if settings is None else settings
    if not settings.enabled:
        return False
    history = events.read(cell_dir) if history is None else history
    event = cell_event(
        cell_dir.parent.name,
        cell_dir.name,
        state.state.value,
        run_number(history),
        state.failure_class or "",
        _summary(cell_dir, state),
        job_id=state.job_id,
        step=state.progress.step,
        total=state.progress.total,
    )
    if not _take(cell_dir / LOGS_DIR / MARKERS, event.key):
        return False
    send(event, settings)
    events.append(cell_dir, Event(Kind.NOTIFIED, key=event.key))
    return True


def _summary(cell_dir: Path, state: CellState) -> str:
    if state.state is State.COMPLETED:
        return f"{cell_dir.name}: completed" + (f" at step {state.progress.step}" if state.progress.step else "")
    text = f"{cell_dir.name}: {state.state.value}"
    if state.failure_class:
        text += f" ({state.failure_class})"
    return f"{text}: {state.reason}" if state.reason else text


def grid_ended(
    sweep_dir: Path, states: Mapping[Path, CellState], histories: Mapping[Path, Sequence[Event]] | None = None
) -> bool:
    """Notify once that every cell of the grid has ended (after any of its cells ran again, once more)."""
    if not states or not all(_ended(st) for st in states.values()):
        return False
    settings = settings_for(next(iter(states)))
    if not settings.enabled:
        return False
    runs = sorted(
        f"{d.name}:{run_number((histories or {}).get(d) or events.read(d))}:{st.state.value}"
        for d, st in states.items()
    )
    counts: dict[str, int] = {}
    for st in states.values():
        counts[st.state.value] = counts.get(st.state.value, 0) + 1
    event = grid_event(sweep_dir.name, counts, _digest(runs))
    if not _take(sweep_dir / f".{MARKERS}", event.key):
        return False
    send(event, settings)
    return True


def _digest(items: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:12]
