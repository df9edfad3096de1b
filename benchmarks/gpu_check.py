"""The GPU check: one cell's step time trained through sft_grid against the same config trained directly with
LLaMA-Factory's own command, on a GPU, with bf16 and SDPA as the GPU profiles set them; and the calibration the
estimates then use. Run by benchmarks/gpu_check.sh, on a machine with one NVIDIA GPU (the lent device), in one call:

    bash benchmarks/gpu_check.sh [--steps N] [--cpu]

Two models are built locally (no hub): the tiny Llama-3-style model of the tests, and a ~100M-parameter model of the
same family (hidden 768, 12 layers, 12 heads: 85M parameters besides the embeddings of the tiny tokenizer). Each is
trained for `--steps` steps (default 200), micro batch 8, cutoff 512, on the tiny role/content data:

  * orchestrated: `python -m sft_grid model=tiny_llama model.path=<model> cluster=local cluster.gpus_per_node=1
    cluster.gpu_type=<the GPU> cluster.precision=bf16 ...`: the cell's rendered train_config.yaml says bf16: true and
    flash_attn: sdpa;
  * direct: LLaMA-Factory's own `llamafactory-cli train` on a copy of that train_config.yaml (its own output_dir).

Step time = the trainer's own train_runtime / steps (all_results.json), over enough steps that start-up weighs little;
the target: orchestrated within 2% of direct. Then the calibration of planning/estimate.py fitted to the two
orchestrated cells (what the estimates of the next cells on this GPU use). Everything is printed and written to
$OUT/gpu_check.json. `--cpu` runs the same on the CPU with few steps: a check of the script, not of a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIG = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}
BUILD = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
from build_tiny import llama3_model, llama3_tokenizer, recipe_start, save_atomically, training_lines
import json
shape = json.loads(sys.argv[3])
tok = llama3_tokenizer(training_lines())
torch.manual_seed(7)
model = llama3_model(tok, **shape)
print(save_atomically(__import__("pathlib").Path(sys.argv[2]), "gpu-check-100m", tok, model),
      sum(p.numel() for p in model.parameters()))
"""


def run(argv: list[str], env: dict[str, str], log: Path) -> None:
    started = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode:
        raise SystemExit(
            f"{' '.join(argv[:4])} ... failed ({proc.returncode}) after"
            f" {time.monotonic() - started:.0f} s; see {log}:\n" + log.read_text()[-3000:]
        )


def runtime(output: Path) -> tuple[float, int]:
    results = json.loads((output / "all_results.json").read_text())
    state = json.loads((output / "trainer_state.json").read_text())
    return float(results["train_runtime"]), int(state["global_step"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--cpu", action="store_true", help="no GPU: check the script itself, with few steps")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/gpu_check"))
    args = p.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from sft_grid.planning.environments import VenvSpec

    env_dir = Path(os.environ.get("SFT_GRID_GPU_ENV") or VenvSpec.load("llamafactory").path)
    python = env_dir / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    gpu = (
        "CPU"
        if args.cpu
        else subprocess.run(
            [str(python), "-c", "import torch; print(torch.cuda.get_device_name(0).split()[-1])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    steps = 6 if args.cpu else args.steps
    run([sys.executable, "-m", "sft_grid", "assets", "build"], env, out / "assets.log")
    from sft_grid.core.paths import assets_dir

    models = out / "models"
    shape = (
        dict(
            BIG,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
        if args.cpu
        else BIG
    )
    built = subprocess.run(
        [str(python), "-c", BUILD, str(REPO / "sft_grid" / "in_venv"), str(models), json.dumps(shape)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    cases = {"tiny": (assets_dir() / "models" / "tiny-llama3", 0.0002), "100m": (Path(built[0]), int(built[1]) / 1e9)}
    site = [
        "cluster=local",
        f"cluster.gpus_per_node={0 if args.cpu else 1}",
        f"cluster.gpu_type={gpu}",
        f"cluster.precision={'fp32' if args.cpu else 'bf16'}",
        f"+cluster.backend_envs.llamafactory={env_dir}",
    ]
    report: dict[str, dict[str, float]] = {}
    for name, (model, params_b) in cases.items():
        runs = out / f"runs-{name}"
        shutil.rmtree(runs, ignore_errors=True)
        run(
            [
                sys.executable,
                "-m",
                "sft_grid",
                "model=tiny_llama",
                f"model.path={model}",
                f"model.params_b={params_b}",
                *site,
                f"max_steps={steps}",
                f"save_steps={steps}",
                "micro_batch_size=8",
                "global_batch_size=8",
                "cutoff_len=512",
                "tokenize_once=false",
                "epochs=1000",
                f"runs_root={runs}",
            ],
            env,
            out / f"{name}.log",
        )
        (cell,) = [d for d in (runs / "default").iterdir() if (d / "cell.yaml").is_file()]
        config = (cell / "train_config.yaml").read_text()
        if not args.cpu:
            assert "bf16: true" in config and "flash_attn: sdpa" in config, config
        direct = out / f"direct-{name}"
        shutil.rmtree(direct, ignore_errors=True)
        direct.mkdir()
        (direct / "train_config.yaml").write_text(config.replace(str(cell / "output"), str(direct / "output")))
        import yaml

        site_env = {
            k: str(v) for k, v in (yaml.safe_load((cell / "cell.yaml").read_text())["cluster"].get("env") or {}).items()
        }  # what the cell's launch.sh exports: the same for both
        run(
            [str(env_dir / "bin" / "llamafactory-cli"), "train", str(direct / "train_config.yaml")],
            {**env, **site_env, "DISABLE_VERSION_CHECK": "1"},
            out / f"direct-{name}.log",
        )
        (orch_s, orch_n), (dir_s, dir_n) = runtime(cell / "output"), runtime(direct / "output")
        report[name] = {
            "orchestrated_step_s": orch_s / orch_n,
            "direct_step_s": dir_s / dir_n,
            "ratio": (orch_s / orch_n) / (dir_s / dir_n),
        }
        print(
            f"{name}: step {1000 * orch_s / orch_n:.1f} ms through sft_grid, {1000 * dir_s / dir_n:.1f} ms direct:"
            f" {100 * (report[name]['ratio'] - 1):+.1f}% (target within 2%)",
            flush=True,
        )
    from sft_grid.grid.costs import calibrations

    fitted = {key: repr(c) for key, c in calibrations([out / f"runs-{n}" for n in cases]).items()}
    print(f"calibration the next estimates on this {gpu} use: {fitted}")
    (out / "gpu_check.json").write_text(
        json.dumps({"gpu": gpu, "steps": steps, "cases": report, "calibration": fitted}, indent=1) + "\n"
    )
    return 0 if args.cpu or all(abs(r["ratio"] - 1) <= 0.02 for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
