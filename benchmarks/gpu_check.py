"""The GPU check: Delphi-shaped cells trained as sft_grid renders them, on one GPU, with their predicted and measured
peak memory, tokens/s and MFU, packed against unpacked, Liger on and off. Run by benchmarks/gpu_check.sh on a
machine with one NVIDIA GPU (the lent device), in one call, under 10 minutes on an H200:

    bash benchmarks/gpu_check.sh [--steps N] [--cpu]

Models: two shapes of the Delphi suite, random weights built here (no hub): 447M (d 1024, 11 layers, 8 heads of 128)
and 1.9B (d 2048, 21 layers, 16 heads), an SwiGLU of 4d, untied embeddings and Llama-3.1's 128,256-token vocabulary
(the logits are the real size), in bf16, as Llama-architecture models (Delphi's Qwen3 adds only a q/k-norm).
Data: chat conversations of the tiny tokenizer's words whose lengths follow the Delphi magpie mix (lognormal, mean
~710 tokens, cv 0.6), one data file.

Each arm is a real cell, `python -m sft_grid ... cluster=local cluster.gpus_per_node=1`, trained by LLaMA-Factory in
the site's environment (SFT_GRID_GPU_ENV, else the managed one): cutoff 4096, micro batch 1, global batch 8:
  * unpacked   one conversation a micro step
  * packed     packing=true (sft_grid's default on GPUs): 4096-token sequences, no attention across examples
  * liger      packed + layout.liger=true (where the environment has liger_kernel)
  * ckpt       packed + layout.checkpointing=true (recompute: less memory, more time)
Measured: the peak of the GPU's used memory (nvidia-smi, sampled every 0.2 s: what the allocator holds plus the CUDA
context, which is what the prediction's total counts), the trainer's tokens seen (include_num_input_tokens_seen)
over its train_runtime, and the MFU in the estimate's convention (6 N tokens / (runtime x the GPU's dense bf16 peak));
predicted: the cell's memory model (sft_grid/planning/gpus.py) from its own cell.yaml, and its estimate's MFU.
Printed as one table and written to $OUT/gpu_check.json. `--cpu` runs tiny shapes for a few steps on the CPU: a
check of the script, not of a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {  # the larger first: its memory is the prediction that matters most, and a call cut short keeps it
    "1.9B": {"hidden_size": 2048, "num_hidden_layers": 21, "num_attention_heads": 16},
    "447M": {"hidden_size": 1024, "num_hidden_layers": 11, "num_attention_heads": 8},
}
CPU_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 1}
VOCAB = 128256
BUILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from build_tiny import llama3_model, llama3_tokenizer, save_atomically, training_lines
shape = json.loads(sys.argv[3])
tok = llama3_tokenizer(training_lines())
torch.manual_seed(7)
d = shape["hidden_size"]
heads = shape["num_attention_heads"]
model = llama3_model(tok, vocab_size=int(sys.argv[5]), intermediate_size=4 * d, num_key_value_heads=heads,
                     head_dim=d // heads, max_position_embeddings=4096, **shape)
model = model.to(torch.bfloat16 if sys.argv[6] == "bf16" else torch.float32)
path = save_atomically(Path(sys.argv[2]), sys.argv[4], tok, model)
words = sorted({w for line in training_lines() for w in line.split()})
print(json.dumps({"path": str(path), "params": sum(p.numel() for p in model.parameters()), "words": words[:2000]}))
"""


def conversations(words: list[str], rows: int, seed: int = 0) -> list[dict]:
    """Role/content conversations whose lengths (in words, about a token each) follow the magpie mix's."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log(1 + 0.6**2))
    out = []
    for _ in range(rows):
        n = max(16, min(4000, int(rng.lognormvariate(math.log(711) - sigma**2 / 2, sigma))))
        prompt = max(4, n // 4)
        text = [rng.choice(words) for _ in range(n)]
        out.append(
            {
                "messages": [
                    {"role": "user", "content": " ".join(text[:prompt])},
                    {"role": "assistant", "content": " ".join(text[prompt:])},
                ]
            }
        )
    return out


class PeakMemory:
    """The GPU's used memory, sampled by nvidia-smi in a thread; `peak` in MiB."""

    def __init__(self, enabled: bool) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True) if enabled else None

    def _poll(self) -> None:
        while not self._stop.is_set():
            proc = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True,
                text=True,
            )
            if proc.returncode == 0 and proc.stdout.strip():
                self.peak = max(self.peak, float(proc.stdout.split()[0]))
            self._stop.wait(0.2)

    def __enter__(self) -> PeakMemory:
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()


def run(argv: list[str], env: dict[str, str], log: Path) -> tuple[int, float]:
    started = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    return proc.returncode, time.monotonic() - started


def predicted(cell: Path) -> tuple[float, dict[str, float], str]:
    """The cell's memory model from its own cell.yaml (its layout as chosen): total GiB, the parts, the layout."""
    import yaml

    sys.path.insert(0, str(REPO))
    from sft_grid.core.schema import CellConf, typed
    from sft_grid.planning.gpus import GIB, choose

    spec = typed(CellConf, yaml.safe_load((cell / "cell.yaml").read_text()))
    lay = choose(spec)
    if lay.memory is None:
        return 0.0, {}, lay.summary()
    return lay.memory.total / GIB, {k: (v or 0.0) / GIB for k, v in lay.memory.parts()}, lay.summary()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--cpu", action="store_true", help="no GPU: check the script itself, tiny shapes, few steps")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_check"))
    p.add_argument("--work", type=Path, default=Path("/tmp/gpu_check_work"), help="models, data, runs, logs")
    args = p.parse_args(argv)
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from sft_grid.planning.environments import VenvSpec
    from sft_grid.planning.estimate import PEAK_FLOPS

    env_dir = Path(os.environ.get("SFT_GRID_GPU_ENV") or VenvSpec.load("llamafactory").path)
    python = env_dir / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    probe = "import torch; print(torch.cuda.mem_get_info()[1] // 2**30, torch.cuda.get_device_name(0))"
    gpu, mem = "CPU", 0
    if not args.cpu:  # "NVIDIA H100 80GB HBM3", "NVIDIA H200": the word that names a GPU of PEAK_FLOPS
        said = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
        mem = int(said[0])
        gpu = next((w for w in said[1:] if any(w.startswith(k) for k in PEAK_FLOPS if k != "CPU")), said[-1])
    has_liger = not args.cpu and subprocess.run([str(python), "-c", "import liger_kernel"]).returncode == 0
    peak_flops = next((v for k, v in PEAK_FLOPS.items() if str(gpu).upper().startswith(k)), None)
    steps = 2 if args.cpu else args.steps
    shapes = {"tiny": CPU_SHAPE} if args.cpu else SHAPES
    vocab = 4096 if args.cpu else VOCAB
    arms = {
        "unpacked": ["packing=false"],
        "packed": ["packing=true"],
        **({"liger": ["packing=true", "layout.liger=true", "cluster.kernels=[liger_kernel]"]} if has_liger else {}),
        "ckpt": ["packing=true", "layout.checkpointing=true"],
    }
    rows: list[dict] = []
    for name, shape in shapes.items():
        built = json.loads(
            subprocess.run(
                [
                    *(str(python), "-c", BUILD, str(REPO / "sft_grid" / "in_venv"), str(work / "models")),
                    *(json.dumps(shape), f"delphi-{name}", str(vocab), "fp32" if args.cpu else "bf16"),
                ],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        data = work / f"data-{name}.jsonl"
        data.write_text("".join(json.dumps(c) + "\n" for c in conversations(built["words"], 8 * steps * 6)))
        d = shape["hidden_size"]
        model = [
            "model=tiny_llama",
            f"model.path={built['path']}",
            f"model.params={built['params']}",
            f"model.params_b={built['params'] / 1e9}",
            f"model.num_layers={shape['num_hidden_layers']}",
            f"model.hidden_size={d}",
            f"model.num_heads={shape['num_attention_heads']}",
            f"model.intermediate_size={4 * d}",
            f"model.vocab_size={vocab}",
        ]
        site = [
            "cluster=local",
            f"cluster.gpus_per_node={0 if args.cpu else 1}",
            f"cluster.gpu_type={gpu}",
            *([] if args.cpu else [f"cluster.gpu_mem_gb={mem}"]),
            f"cluster.precision={'fp32' if args.cpu else 'bf16'}",
            f"cluster.backend_venvs.llamafactory={env_dir}",
        ]
        for arm, overrides in arms.items():
            runs = work / f"runs-{name}-{arm}"
            shutil.rmtree(runs, ignore_errors=True)
            argv = [sys.executable, "-m", "sft_grid", *model, *site, *overrides]
            argv += [f"dataset.tiny_messages.source={data}", f"max_steps={steps}", f"save_steps={steps}"]
            # no checkpoint (a 1.9B one with its optimizer is ~23 GB to write): the final weights only
            argv += ["+extra.save_strategy=no"]
            argv += ["micro_batch_size=1", "global_batch_size=8", f"cutoff_len={512 if args.cpu else 4096}"]
            argv += ["tokenize_once=false", "+extra.include_num_input_tokens_seen=true", f"runs_root={runs}"]
            with PeakMemory(not args.cpu) as peak:
                rc, wall = run(argv, env, work / f"{name}-{arm}.log")
            grid = runs / "default"  # absent when sft_grid refused the cell before writing it (its log says why)
            cells = [c for c in grid.iterdir() if (c / "cell.yaml").is_file()] if grid.is_dir() else []
            total, parts, layout = predicted(cells[0]) if cells else (0.0, {}, "")
            row: dict = {"model": name, "arm": arm, "layout": layout, "predicted_gib": total}
            row |= {"predicted_parts_gib": parts, "measured_gib": peak.peak / 1024, "wall_s": wall}
            done = cells[0] / "output" / "all_results.json" if cells else None
            if rc or done is None or not done.is_file():  # an arm that fails (out of memory, say) is a result too
                tail = (work / f"{name}-{arm}.log").read_text()[-1500:]
                logs = sorted((cells[0] / "logs").glob("*.log"), key=lambda f: f.stat().st_mtime) if cells else []
                tail += "".join(f"\n--- {f.name}\n{f.read_text(errors='replace')[-2500:]}" for f in logs[-1:])
                rows.append(row | {"error": f"exit {rc}", "log_tail": tail})
                print(f"{name} {arm}: FAILED (exit {rc}), peak {peak.peak / 1024:.1f} GiB (predicted {total:.1f})")
                print(tail, flush=True)
            else:
                results = json.loads(done.read_text())
                seconds = float(results["train_runtime"])
                tokens = float(results.get("num_input_tokens_seen") or 0)
                rate = tokens / seconds if seconds else 0.0
                mfu = 6 * built["params"] * rate / peak_flops if peak_flops and not args.cpu else None
                rows.append(row | {"tokens": tokens, "tokens_per_s": rate, "mfu": mfu, "train_runtime_s": seconds})
                print(f"{name} {arm}: {rate:,.0f} tokens/s, peak {peak.peak / 1024:.1f} GiB (predicted {total:.1f})")
            shutil.rmtree(runs, ignore_errors=True)  # a 1.9B cell's weights are GBs: the disk holds one arm's
            sys.stdout.flush()
            report = {"gpu": gpu, "gpu_mem_gib": mem, "steps": steps, "rows": rows}
            (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")  # each arm: a cut call keeps them
    print(f"\nGPU check on {gpu} ({mem} GiB), {steps} steps a cell, cutoff 4096, global batch 8:")
    head = f"{'model':<6} {'arm':<9} {'predicted':>10} {'measured':>9} {'ratio':>6} {'tokens/s':>10} {'MFU':>6}  layout"
    print(head)
    for r in rows:
        ratio = r["measured_gib"] / r["predicted_gib"] if r["predicted_gib"] and r["measured_gib"] else float("nan")
        mfu = f"{r['mfu']:.0%}" if r.get("mfu") is not None else "-"
        speed = f"{r['tokens_per_s']:>10,.0f}" if "tokens_per_s" in r else f"{'failed':>10}"
        print(
            f"{r['model']:<6} {r['arm']:<9} {r['predicted_gib']:>9.1f}G {r['measured_gib']:>8.1f}G {ratio:>6.2f}"
            f" {speed} {mfu:>6}  {r['layout']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
