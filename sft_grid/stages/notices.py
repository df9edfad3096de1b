"""Who hears about a grid: one notification when a cell ends (completed, or failed with its class) and one
when the whole grid is done, each sent once (stages/notify.py sends them).

Once: each notification has a key (the cell, its outcome, and which run of it: a rerun is a new run, a
requeue is not). Whoever first sees an end sends it (the cell's own job, or `status` and the grid command
for a job the scheduler ended), after taking the key with an exclusive create of a marker file, so two
processes that see the same end at once send it once; the ledger then records it (`notified`).
A failure the policy requeues is no end: nothing is sent until the cell completes or stops.
The webhook's URL is read from the environment variable the grid names (notify.webhook_env) when it carries
a token, so no secret is written into cell.yaml or a log.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.failures.cell import REQUEUE_NOTE, cell_config
from sft_grid.core.failures.policy import RemedyKind
from sft_grid.core.layout import LOGS_DIR
from sft_grid.core.state import CellState, State
from sft_grid.stages import notify

log = logging.getLogger(__name__)

MARKERS = "notified"  # under the cell's logs/ (a grid's own under <sweep>/.notified)
ENDED = (State.COMPLETED, State.FAILED, State.CANCELLED)


def config_of(settings: Mapping[str, Any] | None) -> notify.NotifyConfig:
    settings = dict(settings or {})
    variable = settings.pop("webhook_env", None)
    if variable and not settings.get("webhook"):
        settings["webhook"] = os.environ.get(variable) or None
    return notify.NotifyConfig.from_mapping(settings)


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


def settings_for(cell_dir: Path) -> notify.NotifyConfig:
    """The grid's notification settings, from a cell's cell.yaml."""
    return config_of(cell_config(cell_dir).get("notify"))


def _ended(state: CellState) -> bool:
    """Whether a cell has ended: a failure its policy requeues is no end."""
    return state.state in ENDED and not (state.state is State.FAILED and state.action is RemedyKind.REQUEUE)


def cell_ended(cell_dir: Path, state: CellState, history: Sequence[Event] | None = None,
               settings: notify.NotifyConfig | None = None) -> bool:
    """Notify the end of a cell once; True when this call sent it."""
    if not _ended(state):
        return False
    settings = settings_for(cell_dir) if settings is None else settings
    if not settings.enabled:
        return False
    history = events.read(cell_dir) if history is None else history
    event = notify.cell_event(cell_dir.parent.name, cell_dir.name, state.state.value, run_number(history),
                              state.failure_class or "", _summary(cell_dir, state), job_id=state.job_id,
                              step=state.progress.step, total=state.progress.total)
    if not _take(cell_dir / LOGS_DIR / MARKERS, event.key):
        return False
    notify.send(event, settings)
    events.append(cell_dir, Event(Kind.NOTIFIED, key=event.key))
    return True


def _summary(cell_dir: Path, state: CellState) -> str:
    if state.state is State.COMPLETED:
        return f"{cell_dir.name}: completed" + (f" at step {state.progress.step}" if state.progress.step else "")
    text = f"{cell_dir.name}: {state.state.value}"
    if state.failure_class:
        text += f" ({state.failure_class})"
    return f"{text}: {state.reason}" if state.reason else text


def grid_ended(sweep_dir: Path, states: Mapping[Path, CellState],
               histories: Mapping[Path, Sequence[Event]] | None = None) -> bool:
    """Notify once that every cell of the grid has ended (after any of its cells ran again, once more)."""
    if not states or not all(_ended(st) for st in states.values()):
        return False
    settings = settings_for(next(iter(states)))
    if not settings.enabled:
        return False
    runs = sorted(f"{d.name}:{run_number((histories or {}).get(d) or events.read(d))}:{st.state.value}"
                  for d, st in states.items())
    counts: dict[str, int] = {}
    for st in states.values():
        counts[st.state.value] = counts.get(st.state.value, 0) + 1
    event = notify.grid_event(sweep_dir.name, counts, _digest(runs))
    if not _take(sweep_dir / f".{MARKERS}", event.key):
        return False
    notify.send(event, settings)
    return True


def _digest(items: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:12]
