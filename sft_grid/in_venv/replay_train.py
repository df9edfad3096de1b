"""The `replay` backend's trainer: it replays a measured fine-tuning curve; it trains nothing and loads no model.

The curve (replay.json `points`: the test loss of a model fine-tuned on n examples, for the measured n up to the
cell's `examples`) is written as the trainer log a real cell writes (output/trainer_log.jsonl, checkpoints with
their trainer_state.json, output/trainer_state.json and a weights file, all_results.json, the log lines on
stdout), so that everything around training runs on it as on a real cell. At step s of `max_steps` the run has
seen examples * s / max_steps examples, and logs the measured curve there (interpolated linearly in log n between
measured sizes; before the first measured size, its value): a run's loss after seeing n examples stands in for the
loss of a run fine-tuned on n examples, which is what the curve measured. The last tenth of the steps logs the
measured value at `examples` itself, so the cell's final loss as the report reads it (the mean logged loss of the
last tenth) is the measured number. Deterministic: a resumed run writes the same numbers again.

Standalone (the standard library only) and importable (benchmarks/bench_adaptive.py evaluates the same curve).

Run: python3 replay_train.py <replay.json> [resume_from_checkpoint=<dir>] [stop_at_step=<step>]
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:  # beside this file, as the job runs it (its folder first on the path)
    import synthetic_train as _sim
except ImportError:  # imported as part of the package (the tests, the benchmark)
    from sft_grid.in_venv import synthetic_train as _sim

FINAL_SHARE = 0.1


def curve_at(points: Sequence[Sequence[float]], seen: float) -> float:
    """The measured curve at `seen` examples: linear in log n between measured sizes, flat beyond them."""
    pts = sorted((float(n), float(v)) for n, v in points)
    if seen <= pts[0][0]:
        return pts[0][1]
    for (n0, v0), (n1, v1) in itertools.pairwise(pts):
        if seen <= n1:
            w = math.log(seen / n0) / math.log(n1 / n0)
            return v0 + w * (v1 - v0)
    return pts[-1][1]


def logged_loss(cfg: dict[str, Any], step: int) -> float:
    """The loss the replayed run logs at `step`."""
    total = int(cfg.get("max_steps", 100))
    examples = float(cfg["examples"])
    points = cfg["points"]
    if step > (1 - FINAL_SHARE) * total:
        return curve_at(points, examples)
    return curve_at(points, examples * step / total)


def train(cfg: dict[str, Any], resume: Path | None = None) -> None:
    out = Path(cfg["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    total = int(cfg.get("max_steps", 100))
    save, every = int(cfg.get("save_steps") or 0), int(cfg.get("logging_steps") or 1)
    stop_at = int(cfg.get("stop_at_step") or 0)
    history: list[dict[str, Any]] = []
    start = 0
    if resume is not None:
        state = json.loads((resume / "trainer_state.json").read_text())
        start, history = int(state["global_step"]), list(state["log_history"])
        print(f"[replay] resuming from {resume} at step {start}", flush=True)
    if stop_at and start >= stop_at:
        return
    pause = float(cfg.get("step_seconds") or 0.0)
    log = out / "trainer_log.jsonl"
    kind, warmup = str(cfg.get("lr_scheduler_type", "cosine")), int(cfg.get("warmup_steps") or 0)
    for step in range(start + 1, total + 1):
        if pause:
            time.sleep(pause)
        if step % every == 0 or step == total:
            lr = float(cfg.get("learning_rate") or 0.0) * _sim.schedule(step, total, warmup, kind)
            rec = {"loss": round(logged_loss(cfg, step), 6), "learning_rate": lr, "epoch": round(step / total, 4)}
            rec["step"] = step
            history.append(rec)
            with log.open("a") as fh:
                fh.write(json.dumps({"current_steps": step, "total_steps": total, **rec}) + "\n")
            print(json.dumps(rec), flush=True)
        if (save and step % save == 0 and step < total) or (stop_at and step == stop_at and step < total):
            ckpt, part = out / f"checkpoint-{step}", out / f".checkpoint-{step}.partial"
            part.mkdir(exist_ok=True)
            _sim.write_json(
                part / "trainer_state.json", {"global_step": step, "max_steps": total, "log_history": history}
            )
            _sim.save_model(cfg, part, step, mark="replayed")
            os.replace(part, ckpt)
            if stop_at and step == stop_at:
                print(f"[replay] leg ends at step {step} (a rung): checkpoint {ckpt.name}", flush=True)
                return
    final = {"global_step": total, "max_steps": total, "log_history": history}
    _sim.write_json(
        out / "all_results.json", {"train_loss": history[-1]["loss"] if history else None, "replayed": True}
    )
    _sim.save_model(cfg, out, total, mark="replayed")
    _sim.write_json(out / "trainer_state.json", final)
    print(f"[replay] done: {total} steps, final loss {history[-1]['loss'] if history else None}", flush=True)


def main(argv: list[str]) -> int:
    return int(_sim.main(argv, train, "replay", ("stop_at_step",)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
