"""What the grid command shows while it works: each phase that may take a while (staging, the loss-mask check, model
preps, tokenizing, the local cells' training), how far it is and for how long.

On a terminal each phase is one live line (tqdm's), rewritten in place, with how many of how many and the time so
far; a local cell's line follows its steps and its loss as it trains. In a log or a pipe, where a rewritten line
would be noise, each step is one line of its own, and a training cell's line is printed when its step changes (at
most every `every_s` seconds). A phase's line ends when the phase ends, so the summary printed after it starts on
a line of its own.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any

from sft_grid.core.state import CellState
from sft_grid.core.submission import LocalJob

if TYPE_CHECKING:
    from sft_grid.stages.staging.values import Progress


class Live:
    def __init__(self, stream: IO[str], every_s: float = 5.0) -> None:
        self.stream, self.every_s = stream, every_s
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.bars: dict[str, Any] = {}  # phase or cell -> its tqdm bar (terminal only)
        self.started: dict[str, float] = {}
        self.printed: dict[str, tuple[Any, float]] = {}  # what a log was last told of each line, and when

    def note(self, text: str) -> None:
        """One line said once (what the command is about to do), above any live line still drawn."""
        if self.bars:
            from tqdm import tqdm

            tqdm.write(text, file=self.stream)
        else:
            self._line(text)

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
            self._line(f"  {name}: {done}/{total}" + (f" {detail}" if detail else "") + f" ({now - start:.1f} s)")
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
            if edge or last is None or time.monotonic() - last[1] >= self.every_s:
                pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
                rate = f" at {human.size(p.rate_bps)}/s" if p.rate_bps else ""
                eta = f", {human.duration(p.eta_s)} left" if p.eta_s is not None else ""
                self._line(
                    f"  {key}: {human.size(p.done)} / {human.size(p.total)}{pct}{rate}{eta}, file"
                    f" {p.files_done}/{p.files_total} {p.file}"
                )
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
            if last is None or (last[0] != step and now - last[1] >= min(self.every_s, 1.0)):
                shown = f"step {step}/{total}" if step is not None else "no step yet"
                self._line(f"  {key}: " + " ".join(w for w in (shown, text) if w) + f" ({since:.0f} s)")
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
        bar = self.bars.pop(key, None)
        if bar is not None:
            bar.close()
        self.started.pop(key, None)

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
