"""Each cell judged as the GPU runs it (sft_grid/planning/gpus.py): the memory model, the layout chosen to fit, the
refusal of a cell that cannot fit, and both backends rendering the layout in their own keys. Pure: no GPU, no
backend (the model-state part is held against DeepSpeed's own estimator in tests/test_gpus_deepspeed.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from sft_grid.grid.render import render
from sft_grid.planning.gpus import GIB, Shape, choose, model_states
from sft_grid.planning.validate import validate

# a GPU node as Leonardo's: 4 x A100 64 GB, bf16 (the cluster profile's facts, set here so the test reads as it runs)
A100_NODE = [
    "cluster=slurm_local",
    "cluster.gpus_per_node=4",
    "cluster.gpu_mem_gb=64",
    "cluster.precision=bf16",
    "cluster.backend_venvs.llamafactory=/site/env",
    "cluster.backend_venvs.axolotl=/site/env",
]
# Delphi-1e22: 9.7B parameters, d 3840, 37 layers, 30 heads of 128, Llama-3.1's vocabulary (sweeps/delphi_scaling.yaml)
DELPHI_1E22 = [
    "model=delphi",
    "model.params=9714698752",
    "model.params_b=9.715",
    "model.num_layers=37",
    "model.hidden_size=3840",
    "model.num_heads=30",
    "model.intermediate_size=15360",
    "cutoff_len=4096",
]
DELPHI_3E18 = ["model=delphi", "model.intermediate_size=4096", "cutoff_len=4096"]
SHAPE = Shape(params=8_000_000_000, layers=36, hidden=4096, heads=32, kv_heads=8, intermediate=12288, vocab=151936)


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, [str(p) for p in problems]
    return found[0]


def test_model_states_as_each_backend_holds_them():
    n = SHAPE.params
    # LLaMA-Factory upcasts trainable parameters to fp32 without ZeRO-3: fp32 weights, gradients and Adam = 16 B
    assert sum(model_states("llamafactory", "bf16", "none", "none", SHAPE, 8)) == 16 * n
    # axolotl's bf16 is pure bf16: no master copy, Adam's moments in bf16 = 8 B
    assert sum(model_states("axolotl", "bf16", "none", "none", SHAPE, 8)) == 8 * n
    # fp32 training is 16 B whatever the backend
    assert sum(model_states("axolotl", "fp32", "none", "none", SHAPE, 8)) == 16 * n
    # DeepSpeed: ZeRO-2 2N + 18N/W; ZeRO-3 4L + 18N/W; offloads leave the GPU what DeepSpeed's estimators say
    assert sum(model_states("llamafactory", "bf16", "zero2", "none", SHAPE, 8)) == 2 * n + 18 * n / 8
    big = 4 * SHAPE.largest_layer
    assert SHAPE.largest_layer == 151936 * 4096  # the embedding, larger than any MLP matrix
    assert sum(model_states("axolotl", "bf16", "zero3", "none", SHAPE, 8)) == pytest.approx(big + 18 * n / 8)
    assert sum(model_states("axolotl", "bf16", "zero3", "optimizer", SHAPE, 8)) == pytest.approx(big + 2 * n / 8)
    assert sum(model_states("axolotl", "bf16", "zero3", "all", SHAPE, 8)) == big


def test_the_9_7b_delphi_cell_gets_zero3_on_one_node_where_data_parallel_ran_out_of_memory(make_cells):
    (cell,) = make_cells([*DELPHI_1E22, *A100_NODE])
    lay = cell.layout
    assert (lay.nodes, lay.sharding, lay.offload) == (1, "zero3", "none") and lay.fits
    assert lay.memory is not None and lay.memory.total <= 0.95 * 64 * GIB
    # what it replaces: plain data parallel on 4 nodes holds 16 B a parameter on every GPU, 155 GB
    (ddp,) = make_cells([*DELPHI_1E22, *A100_NODE, "nodes=4", "layout.sharding=none"])
    assert ddp.layout.memory is not None and ddp.layout.memory.states == 16 * 9714698752
    assert not ddp.layout.fits and ddp.layout.nodes == 4
    # ... and is refused before anything is written: the cell, the parts, the GPU's memory, the fix
    p = only(validate([ddp]), "gpu-memory")
    assert p.cell == ddp.name and p.key == "nodes" and p.value == 4
    assert "64 GiB" in p.message and "weights 36.2" in p.message
    assert "as set (nodes=4, layout.sharding=none)" in p.message
    assert "let sft_grid choose the sharding (drop layout.sharding)" in p.fix


def test_checkpointing_only_where_memory_needs_it(make_cells):
    small, big = make_cells([*DELPHI_3E18, *A100_NODE], [*DELPHI_1E22, *A100_NODE])
    assert small.layout.checkpointing is False and small.layout.sharding == "none"
    assert big.layout.checkpointing is True  # the 9.7B's activations at 4096 tokens need it on 64 GB
    # set by hand, it is kept when it fits, and refused with the numbers when it does not
    (kept,) = make_cells([*DELPHI_3E18, *A100_NODE, "layout.checkpointing=true"])
    assert kept.layout.checkpointing is True and not [p for p in validate([kept]) if p.rule == "gpu-memory"]
    fixed = ["layout.checkpointing=false", "layout.sharding=zero3", "layout.offload=none", "nodes=1"]
    (off,) = make_cells([*DELPHI_1E22, *A100_NODE, *fixed])
    p = only(validate([off]), "gpu-memory")
    assert "activations" in p.message and "layout.checkpointing=true" in p.fix


def test_a_long_context_cell_gets_checkpointing_and_a_fused_loss_where_the_site_has_liger(make_cells):
    """Qwen3-8B at 32k on 4 x 96 GB: without checkpointing the activations alone are ~200 GB, and the logits of
    32,768 x 151,936 in bf16 + fp32 + their gradient are ~50 GB; axolotl too must get checkpointing."""
    qwen = [
        "model=qwen3_8b",
        "model.num_layers=36",
        "model.hidden_size=4096",
        "model.num_heads=32",
        "model.num_kv_heads=8",
        "model.intermediate_size=12288",
        "model.vocab_size=151936",
        "cutoff_len=32768",
        *A100_NODE,
        "cluster.gpu_mem_gb=96",
    ]
    lf, ax = make_cells([*qwen, "+cluster.kernels=[liger_kernel]"], [*qwen, "backend=axolotl", "+cluster.kernels=[]"])
    # with the fused loss ZeRO-2 fits (the lightest sharding that does); without it only ZeRO-3 does
    assert lf.layout.liger and lf.layout.checkpointing and lf.layout.fits and lf.layout.sharding == "zero2"
    assert ax.layout.checkpointing and not ax.layout.liger and ax.layout.fits and ax.layout.sharding == "zero3"
    assert ax.layout.memory is not None and ax.layout.memory.logits == pytest.approx(10 * 32768 * 151936)
    # the fused loss removes the logits tensor: what stays is the hidden states' (8 bytes a value)
    assert lf.layout.memory is not None and lf.layout.memory.logits == 8 * 32768 * 4096
    lf_cfg = yaml.safe_load(render(lf, lf.sweep_dir / lf.name, []).files["train_config.yaml"])
    ax_cfg = yaml.safe_load(render(ax, ax.sweep_dir / ax.name, []).files["axolotl_config.yaml"])
    assert lf_cfg["disable_gradient_checkpointing"] is False and lf_cfg["enable_liger_kernel"] is True
    assert ax_cfg["gradient_checkpointing"] is True and ax_cfg["deepspeed"].endswith("ds_zero3.json")


def test_nodes_are_only_those_the_global_batch_divides(make_cells):
    # 24 sequences over 4-GPU nodes: 1, 2, 3 or 6 nodes; a 9.7B cell forced to plain data parallel fits on none
    (cell,) = make_cells([*DELPHI_1E22, *A100_NODE, "global_batch_size=24", "layout.sharding=zero2"])
    assert 24 % (cell.layout.nodes * 4) == 0
    assert not [p for p in validate([cell]) if p.rule == "batch-divisible"]


def test_both_backends_render_the_layout_in_their_own_keys(make_cells, tmp_path):
    lf, ax = make_cells(
        [*DELPHI_1E22, *A100_NODE, "+cluster.kernels=[flash_attn,liger_kernel]"],
        [*DELPHI_1E22, *A100_NODE, "backend=axolotl", "+cluster.kernels=[flash_attn,liger_kernel]"],
    )
    lf_files = render(lf, tmp_path / "lf", []).files
    lf_cfg = yaml.safe_load(lf_files["train_config.yaml"])
    assert lf_cfg["flash_attn"] == "fa2" and lf_cfg["packing"] is True and lf_cfg["neat_packing"] is True
    assert lf_cfg["enable_liger_kernel"] is True and lf_cfg["optim"] == "adamw_torch_fused"
    ds = json.loads(lf_files["ds_zero3.json"])
    assert lf_cfg["deepspeed"] == str(tmp_path / "lf" / "ds_zero3.json") and ds["zero_optimization"]["stage"] == 3
    assert "offload_optimizer" not in ds["zero_optimization"]
    assert json.loads(lf_files["post.json"])["stages"][0] == "consolidate"  # ZeRO-3 saves shards
    ax_files = render(ax, tmp_path / "ax", []).files
    ax_cfg = yaml.safe_load(ax_files["axolotl_config.yaml"])
    assert ax_cfg["attn_implementation"] == "flash_attention_2" and ax_cfg["sample_packing"] is True
    assert ax_cfg["optimizer"] == "adamw_torch_fused" and ax_cfg["liger_fused_linear_cross_entropy"] is True
    assert "axolotl.integrations.liger.LigerPlugin" in ax_cfg["plugins"]
    # cell.yaml says the layout as chosen: what the job runs and a person reads
    conf = yaml.safe_load(ax_files["cell.yaml"])
    assert conf["nodes"] == 1 and conf["packing"] is True
    assert conf["layout"] == {
        "sharding": "zero3",
        "offload": "none",
        "checkpointing": True,
        "attention": "fa2",
        "liger": True,
    }


def test_zero2_and_offload_as_deepspeed_reads_them(make_cells, tmp_path):
    two, off = make_cells(
        [*DELPHI_3E18, *A100_NODE, "layout.sharding=zero2"],
        [*DELPHI_3E18, *A100_NODE, "layout.sharding=zero3", "layout.offload=optimizer"],
    )
    ds2 = json.loads(render(two, tmp_path / "a", []).files["ds_zero2.json"])["zero_optimization"]
    assert ds2["stage"] == 2 and "stage3_gather_16bit_weights_on_model_save" not in ds2
    assert "consolidate" not in json.loads(render(two, tmp_path / "a", []).files["post.json"])["stages"]
    ds3 = json.loads(render(off, tmp_path / "b", []).files["ds_zero3.json"])["zero_optimization"]
    assert ds3["offload_optimizer"]["device"] == "cpu" and "offload_param" not in ds3


def test_kernels_the_site_lacks_are_refused(make_cells):
    fa, liger = make_cells([*DELPHI_3E18, *A100_NODE, "layout.attention=fa2"], [*DELPHI_3E18, "layout.liger=true"])
    p = only(validate([fa]), "kernel-missing")
    assert p.key == "layout.attention" and "kernels" in p.fix
    p = only(validate([liger]), "kernel-missing")
    assert p.key == "layout.liger" and "needs a GPU" in p.message


def test_a_cpu_cell_keeps_what_it_had(make_cells):
    (cell,) = make_cells(["model=tiny_llama"])
    lay = cell.layout
    assert lay.memory is None and lay.fits and lay.world == 1
    assert (lay.sharding, lay.checkpointing, lay.packing) == ("none", False, False)
    assert (lay.attention, lay.liger) == ("eager", False)
    (packed,) = make_cells(["model=tiny_llama", "packing=true"])
    assert packed.layout.packing and packed.key != cell.key  # packing trains another model: another identity


def test_packing_changes_the_identity_only_when_on(make_cells):
    """An unpacked cell keeps the identity it had before packing existed: a finished grid is not rerun."""
    off, explicit_off, gpu = make_cells(
        ["model=tiny_llama"], ["model=tiny_llama", "packing=false"], ["model=tiny_llama", *A100_NODE]
    )
    assert off.key == explicit_off.key
    assert gpu.layout.packing and gpu.key != off.key


def test_a_gpu_whose_memory_is_not_stated_is_not_checked(make_cells):
    (cell,) = make_cells([*DELPHI_1E22, *A100_NODE, "cluster.gpu_mem_gb=null"])
    assert cell.layout.fits and cell.layout.memory is not None and cell.layout.gpu_mem_gb is None
    assert not [p for p in validate([cell]) if p.rule == "gpu-memory"]


def test_choose_prefers_no_offload_then_fewest_nodes_then_the_lightest_sharding(make_cells):
    (cell,) = make_cells([*DELPHI_1E22, *A100_NODE, "cluster.gpu_mem_gb=32"])
    lay = choose(cell.spec)
    # 32 GB GPUs: ZeRO-3 across more nodes before any offload
    assert lay.offload == "none" and lay.nodes > 1 and lay.sharding == "zero3" and lay.fits


@pytest.mark.parametrize(
    "kernel, overrides", [("flash_attn", ["layout.attention=fa2"]), ("liger_kernel", ["layout.liger=true"])]
)
def test_a_kernel_the_cluster_lists_is_asked_of_the_backends_environment(
    make_cells, tmp_path, monkeypatch, kernel, overrides
):
    """The cluster says its environment has the kernel; where the environment is on this machine it is asked (the
    architecture check's way), and one that lacks it is refused before anything is queued."""
    import importlib.util
    import sys

    from sft_grid.checks.preflight import preflight

    assert importlib.util.find_spec(kernel) is None  # this python, the fake environment's, lacks it
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".sft_grid_ready").write_text("")
    (cell,) = make_cells(
        [
            *DELPHI_3E18,
            *A100_NODE,
            f"cluster.backend_venvs.llamafactory={venv}",
            f"cluster.kernels=[{kernel}]",
            *overrides,
        ]
    )
    problems = [p for p in preflight([cell]).problems if p.rule == "preflight-kernel"]
    assert len(problems) == 1 and problems[0].key == overrides[0].split("=")[0]
    assert "does not have it" in problems[0].message and f"pip install {kernel.replace('_', '-')}" in problems[0].fix
