"""Round 10, a cell's layout as a GPU runs it: combinations the backend or DeepSpeed would refuse or misread at start
are refused before anything is queued, naming the key, the value and a fix; what is rendered is what was asked."""

from __future__ import annotations

import yaml

from sft_grid.grid.flow import _backend_rules
from sft_grid.grid.render import render
from sft_grid.planning.validate import validate

# a GPU node as Leonardo's (4 x A100 64 GB, bf16), with FlashAttention and Liger in the site's environment
A100_NODE = [
    "cluster=slurm_local",
    "cluster.gpus_per_node=4",
    "cluster.gpu_mem_gb=64",
    "cluster.gpu_type=A100-64GB",
    "cluster.precision=bf16",
    "cluster.backend_venvs.llamafactory=/site/env",
    "cluster.backend_venvs.axolotl=/site/env",
    "+cluster.kernels=[flash_attn,liger_kernel]",
]
SMALL = ["model=delphi", "model.intermediate_size=4096", "cutoff_len=4096"]


def rules(cell, *wanted):
    """The cell's problems of these rules, as the grid command finds them (the shared rules and the backend's)."""
    return [p for p in [*validate([cell]), *_backend_rules(cell)] if p.rule in wanted]


# -- 1. a CPU offload is DeepSpeed's: never dropped without a word --------------------------------------------------


def test_an_offload_asked_for_gets_the_sharding_that_does_it(make_cells, tmp_path):
    opt, full = make_cells([*SMALL, *A100_NODE, "layout.offload=optimizer"], [*SMALL, *A100_NODE, "layout.offload=all"])
    assert (opt.layout.sharding, full.layout.sharding) == ("zero2", "zero3")
    files = render(opt, tmp_path / "opt", []).files
    zero = yaml.safe_load(files["ds_zero2.json"])["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert not rules(opt, "layout-offload") and not rules(full, "layout-offload")


def test_an_offload_that_its_sharding_cannot_do_is_refused_with_the_sharding_that_can(make_cells):
    none, zero2, cpu = make_cells(
        [*SMALL, *A100_NODE, "layout.sharding=none", "layout.offload=optimizer"],
        [*SMALL, *A100_NODE, "layout.sharding=zero2", "layout.offload=all"],
        [*SMALL, "cluster=local", "layout.offload=optimizer"],
    )
    (p,) = rules(none, "layout-offload")
    assert (p.key, p.value) == ("layout.offload", "optimizer")
    assert "without DeepSpeed" in p.message and "layout.sharding=zero2 or layout.sharding=zero3" in p.fix
    (p,) = rules(zero2, "layout-offload")
    assert (p.key, p.value) == ("layout.offload", "all") and "ZeRO-3 only" in p.message
    assert p.fix.startswith("layout.sharding=zero3")
    (p,) = rules(cpu, "layout-offload")
    assert "trains on the CPU" in p.message and p.fix.startswith("layout.offload=none")


# -- 2. attention kernels the backend or the GPU does not have -------------------------------------------------------


def test_flash_attention_3_is_refused_by_llamafactory_and_on_ampere_gpus(make_cells):
    lf, ax, hopper = make_cells(
        [*SMALL, *A100_NODE, "layout.attention=fa3"],
        [*SMALL, *A100_NODE, "layout.attention=fa3", "backend=axolotl"],
        [*SMALL, *A100_NODE, "layout.attention=fa3", "backend=axolotl", "cluster.gpu_type=H100"],
    )
    found = {p.rule: p for p in rules(lf, "llamafactory-attention", "kernel-gpu")}
    assert set(found) == {"llamafactory-attention", "kernel-gpu"}
    p = found["llamafactory-attention"]
    assert (p.key, p.value) == ("layout.attention", "fa3") and "Unknown attention type: fa3" in p.message
    assert p.fix.startswith("layout.attention=fa2")
    (p,) = rules(ax, "llamafactory-attention", "kernel-gpu")
    assert p.rule == "kernel-gpu" and "A100-64GB" in p.message and p.fix.startswith("layout.attention=fa2")
    assert not rules(hopper, "llamafactory-attention", "kernel-gpu")


# -- 3. one rank under DeepSpeed still starts through torchrun in LLaMA-Factory ---------------------------------------


def test_a_one_gpu_deepspeed_cell_of_llamafactory_starts_through_torchrun(make_cells, tmp_path):
    one, ax, plain = make_cells(
        [*SMALL, *A100_NODE, "cluster.gpus_per_node=1", "layout.sharding=zero2"],
        [*SMALL, *A100_NODE, "cluster.gpus_per_node=1", "layout.sharding=zero2", "backend=axolotl"],
        [*SMALL, *A100_NODE, "cluster.gpus_per_node=1"],
    )
    assert one.world_size == 1 and one.layout.deepspeed
    script = render(one, tmp_path / "one", []).files["launch.sh"]
    assert "export FORCE_TORCHRUN=1" in script and "export NPROC_PER_NODE=1" in script
    # axolotl starts DeepSpeed's one-rank group itself; a cell without DeepSpeed runs in one process
    assert "FORCE_TORCHRUN" not in render(ax, tmp_path / "ax", []).files["launch.sh"]
    assert "FORCE_TORCHRUN" not in render(plain, tmp_path / "plain", []).files["launch.sh"]


# -- 4. a LoRA or freeze cell is modelled as it trains: frozen weights, no gradient or optimizer state for them -------


def test_lora_is_not_given_the_gpus_of_a_full_fine_tune_nor_refused_as_one(make_cells):
    full, lora, unsharded, freeze = make_cells(
        ["model=qwen3_32b", *A100_NODE],
        ["model=qwen3_32b", *A100_NODE, "finetuning_type=lora"],
        ["model=qwen3_8b", *A100_NODE, "finetuning_type=lora", "layout.sharding=none"],
        ["model=qwen3_8b", *A100_NODE, "finetuning_type=freeze", "layout.sharding=none"],
    )
    assert full.layout.nodes == 4 and (lora.layout.nodes, lora.layout.sharding) == (1, "zero3")
    assert lora.layout.memory.optimizer < full.layout.memory.optimizer / 100
    # 8B in bf16 with rank-8 adapters fits an A100 without DeepSpeed; so do its last two layers trained alone
    assert not rules(unsharded, "gpu-memory") and not rules(freeze, "gpu-memory")
    # a larger rank or a trained embedding counts: never below what trains
    big, embed = make_cells(
        ["model=qwen3_8b", *A100_NODE, "finetuning_type=lora", "layout.sharding=none", "+extra.lora_rank=1024"],
        ["model=qwen3_8b", *A100_NODE, "finetuning_type=lora", "layout.sharding=none", "+extra.additional_target=x"],
    )
    assert big.layout.memory.total > unsharded.layout.memory.total
    assert rules(embed, "gpu-memory")  # counted whole: 8B trained unsharded does not fit


def test_a_sharding_lighter_than_the_models_needs_is_refused(make_cells):
    """`needs: [zero3]` is the model's floor when the layout is chosen, but a layout.sharding set lighter used to win
    over it: the 27B trained under ZeRO-2 wherever it fit."""
    for sharding, refused in (("zero2", True), ("none", True), ("zero3", False), ("auto", False)):
        (cell,) = make_cells(["model=qwen3_5_27b", "cluster=jupiter", f"layout.sharding={sharding}"])
        told = [p for p in validate([cell]) if p.rule == "layout-needs"]
        assert bool(told) == refused, (sharding, told)
        if told:
            assert told[0].key == "layout.sharding" and told[0].fix.startswith("layout.sharding=zero3"), told[0]
