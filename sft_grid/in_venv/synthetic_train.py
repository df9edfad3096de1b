"""The `synthetic` backend's trainer: a SIMULATOR, not a training. It trains nothing and loads no model.

It writes the loss curve of a stated law, with seeded noise, through the same files a real trainer writes
(output/checkpoint-<step>/trainer_state.json, output/trainer_log.jsonl, output/trainer_state.json, a weights file,
all_results.json, the log lines on stdout), so that everything around training (Slurm arrays, the ledger,
requeue and resume from a checkpoint, scores along training, pruning, the scaling fit and the choice of the next
cells) runs for real against a known ground truth, in seconds, with no torch. Standalone: the standard library
only (it runs with any python3 on the node), and importable, so the in-process benchmarks
(benchmarks/bench_adaptive.py) evaluate the very same law.

The law (the loss after `step` of `total` steps at peak learning rate `lr`, for a model of N parameters that sees
`tokens_per_step` tokens a step):

    L = E + A / N^alpha + B / D^beta * (1 + c_lr * ln(lr / lr_opt(N))^2) + K * (lr / lr_opt(N)) * f(step)

* E + A/N^alpha + B/D^beta: Chinchilla's form (Hoffmann et al. 2022), D = tokens seen so far;
* lr_opt(N) = lr0 * (N / 1e9)^-gamma: the best learning rate falls with size (Porian et al. 2024; DeepSeek LLM);
  a learning rate off it costs a factor on the data term, quadratic in log lr (the "convex with a broad plateau"
  landscape of Step Law, Li et al. 2025);
* K * (lr / lr_opt) * f(step): the noise floor of a high learning rate, which vanishes as the schedule decays
  (f is the schedule's factor: linear warmup to 1, then cosine or linear decay to 0). A larger learning rate looks
  worse before decay and better after it, so rankings flip during decay (Wen et al. 2025, "Fantastic
  Optimizers"): what a pruner that compares cells before decay gets wrong;
* noise: each run has its own offset (seed variance: `run_noise`, relative, ~1% at 1e9 parameters, optionally
  falling with size as N^-noise_exponent), each logged point its own
  jitter (`step_noise`), both from a generator seeded by the cell's seed and identity, so a resumed run writes
  the same numbers again.

`score(...)` is the same law's "eval score" of a checkpoint: an accuracy-like number exp(-(L - E)), with its own
seeded jitter; the simulated eval of a checkpoint (synthetic harness) writes it.

Run: python3 synthetic_train.py <synthetic.json> [resume_from_checkpoint=<dir>]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the law's defaults: a Chinchilla-like surface in nats (Hoffmann et al. 2022's fitted E, A, alpha, B, beta)
LAW_DEFAULTS: dict[str, float] = {
    "E": 1.69,
    "A": 406.4,
    "alpha": 0.34,
    "B": 410.7,
    "beta": 0.28,
    "lr0": 3e-4,  # lr_opt at 1e9 parameters
    "gamma": 0.25,  # lr_opt(N) = lr0 * (N / 1e9)^-gamma
    "c_lr": 0.03,  # the data term's factor per squared e-fold off lr_opt
    "K": 0.3,  # the plateau's noise floor at lr_opt (nats), gone once the schedule has decayed
    "run_noise": 0.01,  # relative, per run (seed variance), at 1e9 parameters
    "noise_exponent": 0.0,  # the run noise scales as (N / 1e9)^-noise_exponent (0: the same at every size)
    "step_noise": 0.002,  # relative, per logged point
}


def lr_opt(law: dict[str, float], n: float) -> float:
    return float(law["lr0"] * (n / 1e9) ** (-law["gamma"]))


def schedule(step: int, total: int, warmup: int, kind: str) -> float:
    """The learning rate's factor at `step` (1-based): linear warmup, then cosine or linear decay to 0
    (transformers' schedules), or constant."""
    if warmup and step <= warmup:
        return step / warmup
    if kind in {"constant", "constant_with_warmup"}:
        return 1.0
    frac = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, 1.0 - frac)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))


def loss_at(law: dict[str, float], n: float, lr: float, tokens: float, factor: float) -> float:
    """The law's noiseless loss after `tokens` tokens, the schedule's factor being `factor` now."""
    ratio = lr / lr_opt(law, n)
    data = law["B"] / max(tokens, 1.0) ** law["beta"] * (1.0 + law["c_lr"] * math.log(ratio) ** 2)
    return float(law["E"] + law["A"] / n ** law["alpha"] + data + law["K"] * ratio * factor)


def _rng(seed: int, identity: str, what: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{identity}:{what}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def run_offset(law: dict[str, float], seed: int, identity: str, n: float = 1e9) -> float:
    """The run's own relative offset (seed variance), the same at every step of the run; smaller for larger models
    when `noise_exponent` > 0 (seed variance falls with scale: Choshen et al. 2025 find it largest for small models)."""
    sigma = law["run_noise"] * (n / 1e9) ** (-law.get("noise_exponent", 0.0))
    return _rng(seed, identity, "run").gauss(0.0, sigma)


def observed_loss(cfg: dict[str, Any], step: int) -> float:
    """The loss the run logs at `step`: the law, the run's offset and the point's jitter (all seeded)."""
    law = {**LAW_DEFAULTS, **cfg.get("law", {})}
    total, warmup = int(cfg.get("max_steps", 100)), int(cfg.get("warmup_steps", 0))
    factor = schedule(step, total, warmup, str(cfg.get("lr_scheduler_type", "cosine")))
    clean = loss_at(
        law, float(cfg["params"]), float(cfg["learning_rate"]), step * float(cfg.get("tokens_per_step", 1e6)), factor
    )
    identity, seed = str(cfg.get("identity", "")), int(cfg.get("seed", 0))
    jitter = _rng(seed, identity, f"step{step}").gauss(0.0, law["step_noise"])
    return clean * (1.0 + run_offset(law, seed, identity, float(cfg["params"])) + jitter)


def probe_loss(cfg: dict[str, Any], step: int, probe_steps: int) -> float:
    """The loss a short cooldown probe measures: from the checkpoint at `step`, `probe_steps` more steps with the
    learning rate decayed to 0 (the noise floor gone), the run's own offset and the probe's jitter. What a pruner
    compares instead of the pre-decay loss, so that the decay's flip does not mislead it."""
    law = {**LAW_DEFAULTS, **cfg.get("law", {})}
    tokens = (step + probe_steps) * float(cfg.get("tokens_per_step", 1e6))
    clean = loss_at(law, float(cfg["params"]), float(cfg["learning_rate"]), tokens, 0.0)
    identity, seed = str(cfg.get("identity", "")), int(cfg.get("seed", 0))
    jitter = _rng(seed, identity, f"probe{step}").gauss(0.0, law["step_noise"])
    return clean * (1.0 + run_offset(law, seed, identity, float(cfg["params"])) + jitter)


def score(cfg: dict[str, Any], step: int) -> float:
    """The simulated eval score of the checkpoint at `step` (higher is better): exp(-(L - E)), seeded jitter."""
    law = {**LAW_DEFAULTS, **cfg.get("law", {})}
    jitter = _rng(int(cfg.get("seed", 0)), str(cfg.get("identity", "")), f"score{step}").gauss(0.0, 0.002)
    return math.exp(-(observed_loss(cfg, step) - law["E"])) + jitter


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _empty_safetensors(path: Path, metadata: dict[str, str]) -> None:
    """A valid safetensors file with no tensors (its header's length, then the header): the simulator's weights."""
    header = json.dumps({"__metadata__": metadata}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


# what a trainer saves beside the weights: the tokenizer (the model's own), never a model config (nothing loads it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def save_model(cfg: dict[str, Any], where: Path, step: int, mark: str = "simulated") -> None:
    """The weights as an empty safetensors file marked `mark` (what wrote them), and the tokenizer's files."""
    _empty_safetensors(where / "model.safetensors", {mark: "true", "step": str(step)})
    source = Path(cfg.get("tokenizer_dir") or "")
    for name in TOKENIZER_FILES if cfg.get("tokenizer_dir") else ():
        if (source / name).is_file():
            (where / name).write_bytes((source / name).read_bytes())


def _probe(cfg: dict[str, Any], out: Path, step: int) -> None:
    """The cooldown probe from the checkpoint at `step` (when the leg asks for one): output/probe-<step>.json."""
    steps = int(cfg.get("probe_steps") or 0)
    if steps > 0:
        loss = probe_loss(cfg, step, steps)
        write_json(out / f"probe-{step}.json", {"step": step, "probe_steps": steps, "loss": round(loss, 6)})
        print(f"[synthetic] cooldown probe from step {step} over {steps} steps: loss {loss:.6f}", flush=True)


def train(cfg: dict[str, Any], resume: Path | None = None) -> None:
    out = Path(cfg["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    total, save, every = (
        int(cfg.get("max_steps", 100)),
        int(cfg.get("save_steps") or 0),
        int(cfg.get("logging_steps") or 1),
    )
    stop_at = int(cfg.get("stop_at_step") or 0)  # a leg that ends at a rung (pruning): its checkpoint is saved
    history: list[dict[str, Any]] = []
    start = 0
    if resume is not None:
        state = json.loads((resume / "trainer_state.json").read_text())
        start, history = int(state["global_step"]), list(state["log_history"])
        print(f"[synthetic] resuming from {resume} at step {start}", flush=True)
    log = out / "trainer_log.jsonl"
    pause = float(cfg.get("step_seconds") or 0.0)
    if stop_at and start >= stop_at:  # resumed at its rung (a leg cut after its checkpoint): only the probe is left
        _probe(cfg, out, stop_at)
        return
    for step in range(start + 1, total + 1):
        if pause:
            time.sleep(pause)  # a simulated step's duration (the tests' kills need a run that lasts)
        if step % every == 0 or step == total:
            loss = observed_loss(cfg, step)
            lr = float(cfg["learning_rate"]) * schedule(
                step, total, int(cfg.get("warmup_steps", 0)), str(cfg.get("lr_scheduler_type", "cosine"))
            )
            rec = {"loss": round(loss, 6), "learning_rate": lr, "epoch": round(step / total, 4), "step": step}
            history.append(rec)
            with log.open("a") as fh:
                fh.write(json.dumps({"current_steps": step, "total_steps": total, **rec}) + "\n")
            print(json.dumps(rec), flush=True)
        if (save and step % save == 0 and step < total) or (stop_at and step == stop_at and step < total):
            ckpt = out / f"checkpoint-{step}"
            part = out / f".checkpoint-{step}.partial"
            part.mkdir(exist_ok=True)
            write_json(part / "trainer_state.json", {"global_step": step, "max_steps": total, "log_history": history})
            save_model(cfg, part, step)
            os.replace(part, ckpt)  # a checkpoint appears whole or not at all
            if stop_at and step == stop_at:
                print(f"[synthetic] leg ends at step {step} (a rung): checkpoint {ckpt.name}", flush=True)
                _probe(cfg, out, step)
                return
    final = {"global_step": total, "max_steps": total, "log_history": history}
    write_json(out / "all_results.json", {"train_loss": history[-1]["loss"] if history else None, "simulated": True})
    save_model(cfg, out, total)
    write_json(out / "trainer_state.json", final)  # last: with the weights, the mark of a complete output
    print(f"[synthetic] done: {total} steps, final loss {history[-1]['loss'] if history else None}", flush=True)


def main(
    argv: list[str],
    trainer: Callable[[dict[str, Any], Path | None], None] = train,
    name: str = "synthetic",
    steps: tuple[str, ...] = ("stop_at_step", "probe_steps"),
) -> int:
    """The command line of a simulated trainer (this one, or the replay's: `trainer`, its `name`, the step arguments
    it takes): the cell's JSON, then resume_from_checkpoint=<dir> and the step arguments."""
    cfg = json.loads(Path(argv[0]).read_text())
    resume = None
    for arg in argv[1:]:
        key, _, value = arg.partition("=")
        if key == "resume_from_checkpoint":
            resume = Path(value)
        elif key in steps:
            cfg[key] = int(value)
        else:
            print(f"[{name}] unknown argument {arg!r}: expected resume_from_checkpoint=<dir>", file=sys.stderr)
            return 2
    trainer(cfg, resume)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
