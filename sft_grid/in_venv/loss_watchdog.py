"""Loss watchdog: stop a training run whose loss is NaN/inf, diverged, or collapsed to a uniform guess.

Runs inside a backend's environment (standalone: stdlib + transformers there; never imports sft_grid).

Rules, checked on every logged loss (transformers' on_log):
- non_finite: a NaN or infinite loss stops the run at once (class nan_loss).
- above_k:    the loss stays above k times its starting value (the first loss the run logged, kept across
              a resume through the trainer's log history) for p logged steps in a row (class diverged).
- uniform:    the loss sits within tol * ln(V) of ln(V), the loss of a uniform guess over the vocabulary
              (V: the model's vocab size), for p logged steps in a row (class diverged). A collapsed model
              (every logit equal) scores ln(V) to float rounding (measured: 1e-7 off), so tol is small
              (default 1e-4): a randomly initialised model's first losses are measurably off ln(V) (the
              tiny test Llama's first batches: 0.005 and 0.0095 off; the band is +-0.0007 at V=1000) and
              a healthy run passes through ln(V) rather than sitting on it. A run whose first loss is
              already inside the band cannot be told from a collapse: the rule stays off for it.
On a trigger every rank stops at the same logged step (the logged loss is the mean over ranks, the same
everywhere, so no rank waits in a collective for one that left). Rank 0 first writes
<output_dir>/watchdog.json ({"class", "step", "loss", "rule", "detail"}) atomically and prints one line,
"sft_grid watchdog: <class> at step N: ...", which sft_grid's failure triage recognises. The run then
exits with status 3 (SystemExit, raised from the callback) before the backend saves a final model, so the
orchestrator never takes the cell for completed; checkpoints written earlier stay.

Settings: WatchdogSettings, from SFT_GRID_WATCHDOG_K / _P / _TOL / _VOCAB (axolotl drops unknown config
keys, so the plugin reads the environment) or from the hook's arguments.

Hooks:
    LLaMA-Factory:  run_exp(args, callbacks=llamafactory_callbacks())
    axolotl:        plugins: [loss_watchdog.LossWatchdogPlugin]   (this file's directory on PYTHONPATH)
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

try:  # the backend environments have transformers; unit tests of the rules run without it
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - depends on the environment
    TrainerCallback = object

VERDICT_FILE = "watchdog.json"
EXIT_STATUS = 3
ENV_PREFIX = "SFT_GRID_WATCHDOG_"


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to sys.stderr as it is when the line is logged (a launcher or a test may have replaced it)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


log = logging.getLogger("sft_grid.watchdog")
if not log.handlers:
    # the backends configure their own loggers; this line must reach the job's log whatever they do
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


@dataclass(frozen=True)
class WatchdogSettings:
    k: float = 4.0  # diverged: above k x the starting loss ...
    p: int = 3  # ... for p logged steps in a row (also the uniform rule's run length)
    tol: float = 1e-4  # uniform: within tol * ln(V) of ln(V)
    vocab_size: int | None = None  # V; None: read from the model's config at train begin

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> WatchdogSettings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, kind in (("k", float), ("p", int), ("tol", float), ("vocab_size", int)):
            raw = env.get(ENV_PREFIX + ("VOCAB" if name == "vocab_size" else name.upper()))
            if raw not in (None, ""):
                values[name] = kind(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = cls(**values)
        if settings.k <= 1 or settings.p < 1 or settings.tol <= 0:
            raise ValueError(f"watchdog settings out of range (k > 1, p >= 1, tol > 0): {settings}")
        return settings


@dataclass(frozen=True)
class Verdict:
    klass: str  # nan_loss | diverged
    step: int
    loss: float
    rule: str  # non_finite | above_k | uniform
    detail: str

    def to_json(self) -> dict[str, Any]:
        loss: float | str = self.loss if math.isfinite(self.loss) else str(self.loss)  # JSON has no NaN
        return {"class": self.klass, "step": self.step, "loss": loss, "rule": self.rule, "detail": self.detail}

    def line(self, path: Path | None = None) -> str:
        where = f"; see {path}" if path else ""
        return (
            f"sft_grid watchdog: {self.klass} at step {self.step}: {self.detail} (rule {self.rule}); "
            f"stopping without a final model, checkpoints kept{where}"
        )


class LossRules:
    """The rules over the stream of logged losses (pure: no trainer, no I/O)."""

    def __init__(self, settings: WatchdogSettings) -> None:
        self.settings = settings
        self.start: float | None = None
        self.ln_v: float | None = math.log(settings.vocab_size) if settings.vocab_size else None
        self._above = self._uniform = 0

    def set_vocab(self, vocab_size: int | None) -> None:
        if vocab_size and self.ln_v is None:
            self.ln_v = math.log(vocab_size)

    def set_start(self, loss: float) -> None:
        if self.start is None and math.isfinite(loss):
            self.start = loss

    @property
    def uniform_armed(self) -> bool:
        return self.ln_v is not None and self.start is not None and not self._near_uniform(self.start)

    def _near_uniform(self, loss: float) -> bool:
        return self.ln_v is not None and abs(loss - self.ln_v) <= self.settings.tol * self.ln_v

    def observe(self, step: int, loss: float) -> Verdict | None:
        s = self.settings
        if not math.isfinite(loss):
            return Verdict("nan_loss", step, loss, "non_finite", f"loss is {loss} at step {step}")
        self.set_start(loss)
        assert self.start is not None
        self._above = self._above + 1 if loss > s.k * self.start else 0
        if self._above >= s.p:
            return Verdict(
                "diverged",
                step,
                loss,
                "above_k",
                f"loss {loss:.4g} above {s.k:g} x its starting value {self.start:.4g} for {s.p} logged steps",
            )
        self._uniform = self._uniform + 1 if self.uniform_armed and self._near_uniform(loss) else 0
        if self._uniform >= s.p:
            assert self.ln_v is not None  # counted only while armed, which needs ln(V)
            return Verdict(
                "diverged",
                step,
                loss,
                "uniform",
                f"loss {loss:.4g} within {s.tol * self.ln_v:.3g} of ln(V)={self.ln_v:.4g} (a uniform "
                f"guess: the model collapsed) for {s.p} logged steps",
            )
        return None


def write_verdict(output_dir: str | Path, verdict: Verdict) -> Path:
    """<output_dir>/watchdog.json, written whole or not at all (a temp file renamed over it)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = out / VERDICT_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{VERDICT_FILE}.", dir=out)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(verdict.to_json(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _vocab_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return int(size) if size else None


class WatchdogCallback(TrainerCallback):
    """transformers TrainerCallback applying LossRules to every logged loss."""

    def __init__(self, settings: WatchdogSettings | None = None) -> None:
        self.rules = LossRules(settings or WatchdogSettings.from_env())
        self.verdict: Verdict | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.rules.set_vocab(_vocab_size(model))
        # a resumed run keeps the starting loss of its first leg (the trainer state's log history)
        for entry in getattr(state, "log_history", None) or []:
            if isinstance(entry.get("loss"), (int, float)):
                self.rules.set_start(float(entry["loss"]))
                break

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        if loss is None or isinstance(loss, bool):
            return
        try:
            value = float(loss)
        except (TypeError, ValueError):
            return
        verdict = self.rules.observe(int(state.global_step), value)
        if verdict is not None:
            self.stop(args, state, verdict)

    def stop(self, args: Any, state: Any, verdict: Verdict) -> None:
        self.verdict = verdict
        if getattr(state, "is_world_process_zero", True):
            path = write_verdict(args.output_dir, verdict)
            log.error(verdict.line(path))
        # SystemExit passes the trainer's and the backends' `except Exception` handlers: nothing saves after it
        raise SystemExit(EXIT_STATUS)


def llamafactory_callbacks(
    k: float | None = None, p: int | None = None, tol: float | None = None, vocab_size: int | None = None
) -> list[Any]:
    """The callbacks to pass to llamafactory.train.tuner.run_exp(args, callbacks=...); arguments left None
    come from SFT_GRID_WATCHDOG_* or the defaults."""
    return [WatchdogCallback(WatchdogSettings.from_env(k=k, p=p, tol=tol, vocab_size=vocab_size))]


def _plugin_class() -> type:
    from axolotl.integrations.base import BasePlugin

    class LossWatchdogPlugin(BasePlugin):
        """axolotl plugin adding WatchdogCallback (settings from SFT_GRID_WATCHDOG_*)."""

        def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
            return [WatchdogCallback(WatchdogSettings.from_env())]

    LossWatchdogPlugin.__module__ = __name__
    return LossWatchdogPlugin


def __getattr__(name: str) -> Any:
    # axolotl imports this module and then takes the class by name: only then is axolotl imported, so the
    # module also loads in LLaMA-Factory's environment and without any backend
    if name == "LossWatchdogPlugin":
        cls = _plugin_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# LossWatchdogPlugin is left out: a star import must not import axolotl
__all__ = ["LossRules", "Verdict", "WatchdogCallback", "WatchdogSettings", "llamafactory_callbacks", "write_verdict"]
