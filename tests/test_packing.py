"""Packing with no example attending to another, proven with the real backends on the CPU.

The same six conversations (multi-turn, with system prompts, of different lengths) are trained for one optimizer step
at a negligible learning rate, so the logged loss is the loss of the untouched model over their assistant tokens:

  * unpacked: one micro batch of the six, padded (micro batch 6, global batch 6): the token-weighted mean of each
    example's loss, each example attending only to itself;
  * packed: one sequence of 1,024 tokens holding all six (`packing=true`, micro batch 1, global batch 1), rendered as
    sft_grid renders a packed cell: LLaMA-Factory's `neat_packing`, axolotl's multipack.

With no attention across examples and the loss mask training the same assistant tokens, the two are the same
number (measured: bit-identical on both backends). A packing that leaks is caught by the same comparison:
LLaMA-Factory's plain `packing` without `neat_packing` lets each example attend to the ones before it in the
sequence, and its loss moves by ~1e-3 of itself (6.9411 against 6.9485 with the tiny Llama). A packed step that held
fewer examples would not match either: one example fewer moved axolotl's loss by 5.4e-4 of itself, fifty times the
tolerance (measured once; not rerun in CI, where a third axolotl process costs about a minute). axolotl has no leaking
mode on these attention kernels: its multipack gives eager and sdpa attention a block-diagonal mask.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sft_grid.backends.llamafactory import WRAPPER
from sft_grid.planning.environments import VenvSpec

from .conftest import run_sft

# how close packed and unpacked must be (fp32 on the CPU; measured: equal to the bit), and a difference ten times as
# large is a difference (a leak measured 1.1e-3 of the loss; one example fewer, 5.4e-4)
REL = 1e-5


def six_examples(tiny_assets: Path, into: Path) -> Path:
    rows = (tiny_assets / "data" / "tiny_messages.jsonl").read_text().splitlines()[:6]
    assert len({len(r) for r in rows}) > 1 and any(json.loads(r)["messages"][0]["role"] == "system" for r in rows)
    path = into / "examples6.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def one_step_loss(root: Path, sweep: str, data: Path, backend: str, *overrides: str) -> tuple[float, Path]:
    proc = run_sft(
        "model=tiny_llama",
        f"backend={backend}",
        f"dataset.tiny_messages.source={data}",
        "max_steps=1",
        "lr=1e-12",
        "cutoff_len=1024",
        "logging_steps=1",
        f"runs_root={root}",
        f"sweep_name={sweep}",
        *overrides,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cell,) = [d for d in (root / sweep).iterdir() if d.is_dir() and not d.name.startswith(".")]
    return logged_loss(cell / "output"), cell


def logged_loss(output: Path) -> float:
    state = json.loads((output / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    assert len(losses) == 1, state["log_history"]
    return float(losses[0])


def rerun_llamafactory(cell: Path, lf_python: Path, out: Path, **changes: object) -> float:
    """The packed cell's own train_config.yaml with some keys changed, trained by LLaMA-Factory in its environment
    (through sft_grid's wrapper, as the job does)."""
    config = yaml.safe_load((cell / "train_config.yaml").read_text())
    config.update(changes, output_dir=str(out / "output"))
    out.mkdir(parents=True)
    path = out / "train_config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"DISABLE_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1", "PATH": str(lf_python.parent) + ":/usr/bin:/bin"}
    proc = subprocess.run(
        [str(lf_python), str(WRAPPER), "train", str(path)], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return logged_loss(out / "output")


@pytest.mark.backend
def test_llamafactory_packs_without_attention_across_examples_and_plain_packing_would_leak(tiny_assets, tmp_path):
    data = six_examples(tiny_assets, tmp_path)
    unpacked, _ = one_step_loss(tmp_path, "unpacked", data, "llamafactory", "global_batch_size=6", "micro_batch_size=6")
    packed, cell = one_step_loss(tmp_path, "packed", data, "llamafactory", "packing=true", "global_batch_size=1")
    config = yaml.safe_load((cell / "train_config.yaml").read_text())
    assert config["packing"] is True and config["neat_packing"] is True
    assert packed == pytest.approx(unpacked, rel=REL)
    lf = VenvSpec.load("llamafactory").path / "bin" / "python"
    # sdpa, the GPU sites' kernel where they have no flash-attn, keeps the examples apart as well
    sdpa = rerun_llamafactory(cell, lf, tmp_path / "sdpa", flash_attn="sdpa")
    assert sdpa == pytest.approx(unpacked, rel=REL)
    # plain packing: the examples attend to the ones before them in the sequence, and the loss moves
    leaking = rerun_llamafactory(cell, lf, tmp_path / "leak", neat_packing=False)
    assert abs(leaking - unpacked) > 10 * REL * unpacked


@pytest.mark.backend
def test_axolotl_packs_without_attention_across_examples(axolotl_env, tiny_assets, tmp_path):
    data = six_examples(tiny_assets, tmp_path)
    unpacked, _ = one_step_loss(tmp_path, "unpacked", data, "axolotl", "global_batch_size=6", "micro_batch_size=6")
    packed, cell = one_step_loss(tmp_path, "packed", data, "axolotl", "packing=true", "global_batch_size=1")
    config = yaml.safe_load((cell / "axolotl_config.yaml").read_text())
    assert config["sample_packing"] is True and config["attn_implementation"] == "eager"
    # equal to the unpacked step over all six, each alone: the packed step held all six and kept them apart
    assert packed == pytest.approx(unpacked, rel=REL)
