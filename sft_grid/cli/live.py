"""What the grid command shows while it works: each phase that may take a while (staging, the loss-mask check, model
preps, tokenizing, the local cells' training), how far it is and for how long.

On a terminal each phase is one live line (tqdm's), rewritten in place, with how many of how many and the time so
far; a local cell's line follows its steps and its loss as it trains. In a log or a pipe, where a rewritten line
would be noise, each step is one line of its own, and a training cell's line is printed when its step changes (at
most every `every_s` seconds). A phase's line ends when the phase ends, so the summary printed after it starts on
a line of its own.

A log or a pipe also hears at least every `beat_s` seconds (2.5 s; the target is 3) while the command works: a
heartbeat thread repeats each open line with the time so far (a check's backend process importing its libraries, a
cell's start-up before its first step), or, with none open, says what the command is doing and for how long. On a
terminal the live lines show that already.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from sft_grid.core.state import CellState
from sft_grid.core.submission import LocalJob

if TYPE_CHECKING:
    from sft_grid.stages.staging.values import Progress

BEAT_S = 2.5


class Live:
    def __init__(self, stream: IO[str], every_s: float = 5.0, beat_s: float = BEAT_S) -> None:
        self.stream, self.every_s, self.beat_s = stream, every_s, beat_s
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.bars: dict[str, Any] = {}  # phase or cell -> its tqdm bar (terminal only)
        self.started: dict[str, float] = {}
        self.printed: dict[str, tuple[Any, float]] = {}  # what a log was last told of each line, and when
        # the heartbeat (a log or a pipe): each open line's text without its time, and what the command does now
        self.open: dict[str, str] = {}
        self.doing, self.doing_since = "", time.monotonic()
        self.last_write = time.monotonic()
        self.beats = 0  # heartbeat lines written
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._beat: threading.Thread | None = None

    def note(self, text: str, doing: str | None = None) -> None:
        """One line said once (what the command is about to do), above any live line still drawn. `doing`: what
        the heartbeat says the command does from now on, while no phase or cell line is open."""
        if doing is not None:
            self.working(doing)
        if self.bars:
            from tqdm import tqdm

            with self._lock:
                tqdm.write(text, file=self.stream)
        else:
            self._line(text)

    def working(self, doing: str) -> None:
        """What the command does from now on (the heartbeat's words while no phase or cell line is open)."""
        self.doing, self.doing_since = doing, time.monotonic()
        self._start_beat()

    def stop(self) -> None:
        """No more heartbeat (the command is done)."""
        self._stopped.set()

    # -- phases --------------------------------------------------------------------------------------------------

    def phase(self, name: str, done: int, total: int, detail: str = "") -> None:
        now = time.monotonic()
        start = self.started.setdefault(name, now)
        if self.tty:
            bar = self._bar(name, total, unit="")
            bar.n = done
            bar.set_postfix_str(detail, refresh=False)
            bar.refresh()
        else:
            self.open[name] = f"  {name}: {done}/{total}" + (f" {detail}" if detail else "")
            self._line(f"{self.open[name]} ({now - start:.1f} s)")
        if done >= total:
            self._close(name)

    # -- a transfer of the grid's Hub inputs -------------------------------------------------------------------------

    def transfer(self, p: Progress) -> None:
        """A staging transfer's progress (stages/staging's Progress): bytes, rate, time left, file k of n."""
        from sft_grid.core import human

        key = f"staging {p.repo_id}"
        if self.tty:
            bar = self._bar(key, p.total or 0, unit="B")
            bar.n = p.done
            bar.set_postfix_str(f"file {p.files_done}/{p.files_total} {p.file}", refresh=False)
            bar.refresh()
        else:
            edge = p.files_done == p.files_total
            last = self.printed.get(key)
            self.started.setdefault(key, time.monotonic())
            if edge or last is None or time.monotonic() - last[1] >= self.every_s:
                pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
                rate = f" at {human.size(p.rate_bps)}/s" if p.rate_bps else ""
                eta = f", {human.duration(p.eta_s)} left" if p.eta_s is not None else ""
                self.open[key] = (
                    f"  {key}: {human.size(p.done)} / {human.size(p.total)}{pct}{rate}{eta}, file"
                    f" {p.files_done}/{p.files_total} {p.file}"
                )
                self._line(self.open[key])
                self.printed[key] = (p.done, time.monotonic())
        if p.files_done == p.files_total:
            self._close(key)

    # -- local cells ---------------------------------------------------------------------------------------------

    def cells(self, running: Mapping[LocalJob, CellState]) -> None:
        """Each running local cell's step and loss (a line each)."""
        for job, st in running.items():
            key = f"training {job.label}"
            step, total, loss = st.progress.step, st.progress.total, st.progress.loss
            text = f"loss {loss:.4g}" if loss is not None else ("starting" if step is None else "")
            if self.tty:
                bar = self._bar(key, total or 0, unit="step")
                bar.n = step or 0
                bar.set_postfix_str(text, refresh=False)
                bar.refresh()
                continue
            now = time.monotonic()
            since = now - self.started.setdefault(key, now)
            last = self.printed.get(key)
            shown = f"step {step}/{total}" if step is not None else "no step yet"
            self.open[key] = f"  {key}: " + " ".join(w for w in (shown, text) if w)
            if last is None or (last[0] != step and now - last[1] >= min(self.every_s, 1.0)):
                self._line(f"{self.open[key]} ({since:.0f} s)")
                self.printed[key] = (step, now)

    def cell_done(self, job: LocalJob) -> None:
        self._close(f"training {job.label}")

    def end(self) -> None:
        """Every line still open ends (before an error or a summary is printed)."""
        for key in list(self.bars):
            self._close(key)

    # -- drawing -------------------------------------------------------------------------------------------------

    def _bar(self, key: str, total: int, unit: str) -> Any:
        bar = self.bars.get(key)
        if bar is None:
            from tqdm import tqdm

            scale = unit == "B"
            width = shutil.get_terminal_size((100, 20)).columns or 100  # 0 where the terminal's size is unknown
            bar = tqdm(
                total=total or None,
                desc=f"  {key}",
                file=self.stream,
                unit=unit or "it",
                unit_scale=scale,
                leave=True,
                ncols=min(width, 140),
                mininterval=0.2,
                bar_format="{desc}: {n_fmt}/{total_fmt} {bar:20} {elapsed}{postfix}" if not scale else None,
            )
            self.bars[key] = bar
        elif total and bar.total != total:
            bar.total = total
        return bar

    def _close(self, key: str) -> None:
        with self._lock:
            bar = self.bars.pop(key, None)
            if bar is not None:
                bar.close()
            self.started.pop(key, None)
            self.open.pop(key, None)

    def _line(self, text: str) -> None:
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last_write = time.monotonic()
        self._start_beat()

    # -- the heartbeat (a log or a pipe) -------------------------------------------------------------------------

    def _start_beat(self) -> None:
        if self.tty or self.beat_s <= 0 or self._beat is not None or self._stopped.is_set():
            return
        self._beat = threading.Thread(target=self._beating, name="sft_grid-heartbeat", daemon=True)
        self._beat.start()

    def _beating(self) -> None:
        while not self._stopped.wait(min(0.25, self.beat_s / 4)):
            with self._lock:
                now = time.monotonic()
                if now - self.last_write < self.beat_s:
                    continue
                for text in self.heartbeat(now):
                    self.stream.write(text + "\n")
                    self.beats += 1
                self.stream.flush()
                self.last_write = now

    def heartbeat(self, now: float) -> list[str]:
        """What a heartbeat says: each open line with its time so far, else what the command does."""
        if self.open:
            return [f"{text} ({now - self.started.get(key, now):.1f} s)" for key, text in list(self.open.items())]
        return [f"  {self.doing or 'working'} ({now - self.doing_since:.1f} s)"]
