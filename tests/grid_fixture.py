"""A grid's files as its cells leave them, written without training: the results table's and the report's fixtures
(tests/test_results.py, tests/test_report.py) and benchmarks/bench_report.py.

Cell directories come from the real renderer (grid/render.py); what a run leaves is written here in the formats
the job and the trainer write: the ledger (sft_grid.core.events), output/trainer_state.json (the HF Trainer's,
with its log_history and final train_runtime), trainer_log.jsonl (LLaMA-Factory's per-step log), a weights
file, all_results.json, and the evaluation's score files `<cell>/eval/<score_id>.json` (format).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import BASE_DIR, EVAL_DIR, OUTPUT_DIR, TRAINER_LOG, TRAINER_STATE

T0 = 1_790_000_000.0  # a fixed start: every run's times are offsets from it


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(t))


def curve(steps: int, floor: float, start: float = 3.0) -> list[tuple[int, float]]:
    """A loss falling from `start` towards `floor`: the shape training logs have."""
    return [(s, round(floor + (start - floor) * (0.5 ** (s / max(1.0, steps / 8))), 6)) for s in range(1, steps + 1)]


def run(
    cell_dir: Path,
    state: str,
    losses: Sequence[tuple[int, float]],
    total: int,
    start: float = T0,
    seconds: float = 100.0,
    train_runtime: float | None = None,
    reason: str = "",
    cpu_seconds: float | None = None,
) -> None:
    """What a run leaves: the ledger and, as far as it got, the trainer's output. `state`: completed, failed
    (after the steps given), running (the process standing for it is this one: alive)."""
    pid, host = os.getpid(), socket.gethostname()
    (cell_dir / OUTPUT_DIR).mkdir(exist_ok=True)
    events.append(cell_dir, Event(Kind.SUBMITTED, time=stamp(start - 5), pid=pid, host=host, executor="local"))
    events.append(cell_dir, Event(Kind.JOB, time=stamp(start - 5), job_id="1"))
    events.append(cell_dir, Event(Kind.RUNNING, time=stamp(start), pid=pid, host=host, job_id="1"))
    out = cell_dir / OUTPUT_DIR
    lines = [json.dumps({"current_steps": s, "total_steps": total, "loss": v, "lr": 1e-5}) for s, v in losses]
    (out / TRAINER_LOG).write_text("".join(line + "\n" for line in lines))
    if state == "completed":
        history: list[dict[str, Any]] = [{"step": s, "loss": v, "learning_rate": 1e-5} for s, v in losses]
        runtime = seconds * 0.8 if train_runtime is None else train_runtime
        history.append({"step": total, "train_runtime": runtime, "train_loss": losses[-1][1]})
        (out / TRAINER_STATE).write_text(
            json.dumps({"global_step": total, "max_steps": total, "log_history": history}, indent=2)
        )
        (out / "model.safetensors").write_bytes(b"\0" * 16)
        (out / "all_results.json").write_text(json.dumps({"train_runtime": runtime}))
        events.append(
            cell_dir,
            Event(
                Kind.COMPLETED,
                time=stamp(start + seconds),
                pid=pid,
                host=host,
                job_id="1",
                step=total,
                loss=losses[-1][1],
                details={} if cpu_seconds is None else {"cpu_seconds": cpu_seconds},
            ),
        )
    elif state == "failed":
        events.append(
            cell_dir,
            Event(
                Kind.FAILED,
                time=stamp(start + seconds),
                pid=pid,
                host=host,
                job_id="1",
                reason=reason or "backend exited with 1: RuntimeError: CUDA out of memory",
            ),
        )


def score(
    cell_dir: Path,
    task: str,
    metrics: dict[str, Any],
    score_id: str = "",
    when: str = "2026-12-01T00:00:00",
    base: bool = False,
    model: str = "",
    model_path: str = "",
) -> Path:
    """A score file as the evaluation stage writes it."""
    d = cell_dir / EVAL_DIR
    d.mkdir(parents=True, exist_ok=True)
    sid = score_id or f"{task}-{abs(hash((cell_dir.name, task))) % 10**8:08d}"
    data = {
        "score_id": sid,
        "task": task,
        "suite": "tiny",
        "settings": {"num_fewshot": 0},
        "harness": "lm-eval 0.4.13",
        "model": model or cell_dir.name,
        "model_path": model_path or str(cell_dir / OUTPUT_DIR),
        "template_digest": "0" * 16,
        "metrics": metrics,
        "time": when,
        "seconds": 12.5,
        **({"base": True} if base else {}),
    }
    path = d / f"{sid}.json"
    path.write_text(json.dumps(data))
    return path


def base_score(sweep_dir: Path, slug: str, model: str, model_path: str, task: str, metrics: dict[str, float]) -> Path:
    return score(sweep_dir / BASE_DIR / slug, task, metrics, base=True, model=model, model_path=model_path)


def eval_failed(cell_dir: Path, task: str, reason: str) -> None:
    events.append(cell_dir, Event(Kind.STAGE, stage="eval", state="failed", reason=reason, details={"task": task}))


def estimate(
    cell_dir: Path,
    params: float,
    tokens: float,
    steps: int,
    gpus: int = 1,
    cluster: str = "local",
    gpu: str = "CPU",
    gpu_hours: float | None = None,
) -> dict[str, Any]:
    """estimate.json as the grid writes it when it queues a cell (planning/costs.py): the estimate, and what
    it was made from (the calibration reads tokens, FLOPs, GPUs and size back)."""
    from sft_grid.planning.estimate import CellPlan, Model, Source, estimate_cell, throughput

    per_row = 50
    rows = tokens / per_row
    plan = CellPlan(
        name=cell_dir.name,
        model=Model(params, 4, 128),
        sources=(Source("data", rows, (per_row,) * 8),),
        cutoff_len=1024,
        global_batch_size=max(1, round(rows / steps)),
        epochs=1.0,
        gpus=gpus,
        precision="fp32",
        save_steps=10**6,
    )
    est = estimate_cell(plan, throughput(cluster, gpu))
    data = {
        "cluster": cluster,
        "gpu": gpu,
        "gpus": gpus,
        "params": params,
        "n_layers": 4,
        "d_attn": 128,
        **est.to_json(),
    }
    if gpu_hours is not None:
        data["gpu_hours"] = gpu_hours
    (cell_dir / "estimate.json").write_text(json.dumps(data, indent=1))
    return data


def render_cells(cells: Sequence[Any]) -> list[Path]:
    """The cells' directories as the grid writes them (grid/render.py), under their sweep directory."""
    from sft_grid.grid.render import render, write

    dirs = []
    for cell in cells:
        cell.sweep_dir.mkdir(parents=True, exist_ok=True)
        d = cell.sweep_dir / cell.name
        write(render(cell, d, []))
        dirs.append(d)
    return dirs
