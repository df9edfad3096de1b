"""Pre-launch estimates and the throughput calibration, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from sft_grid.planning.estimate import (
    CellPlan,
    Layout,
    Measured,
    Model,
    Source,
    calibrate,
    count_tokens,
    estimate_cell,
    leave_one_out,
    mixed_rows,
    peak_flops,
    throughput,
    training_flops,
)

ONE_B = Model(params=1e9, n_layers=24, d_attn=2048)
# capped at 1024: (100, 300, 1024), mean 474.67, mean of squares 382858.67; the other source: 200, 40000
SOURCES = (Source("long", rows=1000, lengths=(100, 300, 5000)), Source("short", rows=500, lengths=(200,)))


def plan(**kw) -> CellPlan:
    base = {"name": "c", "model": ONE_B, "sources": SOURCES, "cutoff_len": 1024, "global_batch_size": 16, "epochs": 2.0}
    return CellPlan(**{**base, **kw})


def measured(
    p: CellPlan,
    seconds: float | None = None,
    cluster: str = "leonardo",
    gpu: str = "A100",
    machine: tuple[float, float, float] | None = None,
) -> Measured:
    """A cell as it ran: `seconds`, or what a machine of (start-up, per-token, per-FLOP) cost takes for it."""
    tok = count_tokens(p)
    dense, attn = training_flops(p.model, tok.tokens, tok.attended)
    if machine is not None:
        s, a, b = machine
        seconds = s + (a * tok.tokens + b * (dense + attn)) / p.gpus
    assert seconds is not None
    return Measured(
        cell=p.name,
        cluster=cluster,
        gpu=gpu,
        gpus=p.gpus,
        params=p.model.params,
        seconds=seconds,
        tokens=tok.tokens,
        flops=dense + attn,
    )


def test_epoch_tokens_cap_each_example_at_cutoff_and_scale_to_rows() -> None:
    tok = count_tokens(plan())
    assert tok.sequences == 3000
    assert tok.steps == 2 * 94  # ceil(1500 / 16) per epoch
    assert tok.tokens == pytest.approx(2 * (1000 * 1424 / 3 + 500 * 200))
    assert tok.attended == pytest.approx(2 * (1000 * (100**2 + 300**2 + 1024**2) / 3 + 500 * 200**2))


def test_max_steps_tokens_are_steps_times_batch_times_mean_length() -> None:
    tok = count_tokens(plan(max_steps=10))
    assert (tok.sequences, tok.steps) == (160, 10)
    mean = (1000 * 1424 / 3 + 500 * 200) / 1500  # weighted by rows
    assert tok.tokens == pytest.approx(160 * mean)


def test_packing_fills_blocks_of_cutoff_tokens_whose_examples_attend_only_within_themselves() -> None:
    tok = count_tokens(plan(max_steps=10, packing=True))
    # a token attends within its own example (sft_grid packs with no attention across examples): the examples'
    # sum of s^2 per token they hold, not the block's cutoff
    per_token = (1000 * 382858.67 + 500 * 40000) / (1000 * 474.67 + 500 * 200)
    assert tok.tokens == 160 * 1024 and tok.attended == pytest.approx(160 * 1024 * per_token, rel=1e-4)
    epoch = count_tokens(plan(packing=True, epochs=1.0))
    assert epoch.sequences == 562  # ceil(574666.7 / 1024) blocks
    assert epoch.steps == 36  # ceil(562 / 16)
    assert epoch.tokens == pytest.approx(1000 * 1424 / 3 + 500 * 200)
    # the same attention as unpacked: packing changes the batches, not what each token attends to
    assert epoch.attended == pytest.approx(count_tokens(plan(epochs=1.0)).attended)


def test_mixing_takes_rows_as_interleave_datasets_does() -> None:
    assert mixed_rows([1000, 500], "concat", None) == [1000, 500]
    # 90/10 stopping at the first exhausted source: 500 / 0.1 = 5000 < 1000 / 0.9, so 1000 is the limit
    assert mixed_rows([1000, 500], "interleave_under", [0.9, 0.1]) == pytest.approx([1000, 1000 / 0.9 * 0.1])
    assert mixed_rows([1000, 500], "interleave_over", [0.9, 0.1]) == pytest.approx([4500, 500])


def test_flops_six_n_d_plus_palm_attention_term() -> None:
    # Chinchilla: 70B parameters, 1.4T tokens -> 5.88e23 FLOPs for the dense part
    dense, attn = training_flops(Model(70e9, 80, 8192), 1.4e12, 0.0)
    assert dense == pytest.approx(5.88e23) and attn == 0.0
    # one 2048-token sequence through 24 layers of width 2048: 12 * 24 * 2048 * 2048^2
    assert training_flops(ONE_B, 2048, 2048.0**2)[1] == pytest.approx(2.474e12, rel=1e-3)


def test_default_throughput_is_mfu_times_peak_and_says_so() -> None:
    tp = throughput("leonardo", "A100-64GB")
    assert tp is not None and tp.source == "default" and tp.startup_s == 0
    assert "MFU 0.45 (the default)" in tp.detail and "A100" in tp.detail and "312" in tp.detail
    e = estimate_cell(plan(gpus=4, epochs=2000.0), tp)  # no layout: the FLOPs at the default MFU alone
    rate = 0.45 * 312e12
    assert e.flops == pytest.approx(e.flops_dense + e.flops_attention)
    assert e.gpu_hours == pytest.approx(e.flops / rate / 3600)
    assert e.wall_seconds == pytest.approx(e.flops / rate / 4)
    assert e.flops_dense == pytest.approx(6e9 * 2000 * (1000 * 1424 / 3 + 500 * 200))
    own = throughput("x", "MI300X", peak_tflops=1307.0)
    assert own is not None and own.per_flop_s == pytest.approx(1 / (0.45 * 1307e12))
    assert throughput("x", "TPUv5") is None


def test_calibration_from_one_size_is_a_flop_rate_that_serves_every_size() -> None:
    small = Model(1e8, 12, 768)
    runs = [measured(plan(name=f"m{i}", model=small, gpus=4), seconds=160.0) for i in range(3)]
    cal = calibrate(runs)["leonardo"]
    # one size, one length of data: start-up, per-token and per-FLOP cost look alike; the FLOP rate is kept
    assert cal.sizes == 1 and cal.per_token_s == 0 and cal.startup_s == 0
    assert cal.flops_per_gpu_s == pytest.approx(runs[0].flops / (160.0 * 4))
    tp = throughput("leonardo", "A100", {"leonardo": cal})
    assert tp is not None and tp.source == "calibration"
    assert "per-FLOP cost fitted to the wall time of 3 completed cell(s) of 1 size(s)" in tp.detail
    big = plan(gpus=8, model=Model(7e9, 32, 4096))
    e = estimate_cell(big, tp)
    assert e.wall_seconds == pytest.approx(e.flops / cal.flops_per_gpu_s / 8)
    assert throughput("jupiter", "GH200", {"leonardo": cal}).source == "default"  # type: ignore[union-attr]


def test_calibration_over_sizes_and_lengths_recovers_start_up_per_token_and_per_flop_costs() -> None:
    # a machine that spends 30 s starting, 2 ms per token and 1e-10 s per FLOP (per GPU)
    machine = (30.0, 2e-3, 1e-10)
    runs = [
        measured(plan(name=f"s{i}", model=Model(n, 4, 256), gpus=g, epochs=ep), machine=machine)
        for i, (n, ep, g) in enumerate(((1e6, 1.0, 1), (4e6, 2.0, 2), (1.6e7, 1.0, 1), (6.4e7, 3.0, 4)))
    ]
    cal = calibrate(runs)["leonardo"]
    assert cal.sizes == 4
    assert (cal.startup_s, cal.per_token_s, cal.per_flop_s) == pytest.approx(machine, rel=1e-6)
    # a fifth size is predicted from the fit, not from a flop rate alone
    other = plan(name="new", model=Model(2.5e8, 4, 256), gpus=2, epochs=1.0)
    e = estimate_cell(other, cal.throughput())
    assert e.wall_seconds == pytest.approx(measured(other, machine=machine).seconds, rel=1e-6)
    # leaving a cell out fits the others only; every cell left out in turn, from the sums once, says the same
    assert calibrate(runs, leave_out="s2")["leonardo"].cells == ("s0", "s1", "s3")
    loo = leave_one_out(runs)
    for m in runs:
        alone = calibrate(runs, leave_out=m.cell)["leonardo"]
        assert loo[m.cell].cells == alone.cells
        assert (loo[m.cell].startup_s, loo[m.cell].per_token_s, loo[m.cell].per_flop_s) == pytest.approx(
            (alone.startup_s, alone.per_token_s, alone.per_flop_s), rel=1e-9, abs=1e-15
        )


def test_cells_of_one_data_length_calibrate_start_up_and_flop_rate() -> None:
    machine = (20.0, 0.0, 1e-10)
    runs = [
        measured(plan(name=f"s{i}", model=Model(n, 4, 256), gpus=1), machine=machine)
        for i, n in enumerate((1e6, 4e6, 1.6e7))
    ]
    cal = calibrate(runs)["leonardo"]  # the same tokens everywhere: start-up and per-token cost look alike
    assert cal.per_token_s == 0 and cal.startup_s == pytest.approx(20.0) and cal.per_flop_s == pytest.approx(1e-10)
    assert "start-up + per-FLOP cost" in cal.throughput().detail


def test_disk_is_checkpoint_size_times_checkpoints_kept_plus_the_final_model() -> None:
    # 188 steps, a checkpoint every 50 and one at the end -> 4 saves (50, 100, 150, 188)
    bf16 = estimate_cell(plan(save_steps=50, save_total_limit=2), None)
    assert bf16.checkpoint_bytes == 1e9 * (2 + 8 + 4)  # bf16 weights, Adam moments, fp32 master weights
    assert bf16.checkpoints_kept == 2 and bf16.disk_bytes == 2 * 14e9 + 2e9
    fp32 = estimate_cell(plan(save_steps=50, precision="fp32"), None)
    assert fp32.checkpoint_bytes == 12e9 and fp32.checkpoints_kept == 4 and fp32.disk_bytes == 4 * 12e9 + 4e9
    weights_only = estimate_cell(plan(save_steps=50, save_optimizer=False), None)
    assert weights_only.checkpoint_bytes == 2e9 and weights_only.disk_bytes == 5 * 2e9
    assert estimate_cell(plan(save_steps=188), None).checkpoints_kept == 1  # the last step's only
    assert estimate_cell(plan(), None).disk_bytes == 2e9  # no save_steps: the final model only
    with pytest.raises(ValueError, match="precision"):
        estimate_cell(plan(precision="int4"), None)


def test_wall_time_check_counts_the_requeue_budget() -> None:
    day = 24 * 3600.0
    tp = throughput("c", "H100")
    e = estimate_cell(plan(gpus=1, epochs=1.0), tp)
    assert e.wall_seconds is not None
    scale = 30 * 3600.0 / e.wall_seconds  # epochs that make the cell a 30-hour job
    long = estimate_cell(plan(gpus=1, epochs=scale, max_time_s=day), tp)
    assert long.wall_seconds == pytest.approx(30 * 3600.0, rel=1e-3)
    assert long.exceeds_wall and long.wall_budget_seconds == day
    assert "exceeds the wall time 24.0 h x (1 + 0 requeue(s)) = 24.0 h" in long.notes[0]
    requeued = estimate_cell(plan(gpus=1, epochs=scale, max_time_s=day, requeues=1), tp)
    assert not requeued.exceeds_wall and requeued.wall_budget_seconds == 2 * day


def test_no_throughput_means_no_hours_and_says_why() -> None:
    e = estimate_cell(plan(), None)
    assert e.gpu_hours is None and e.wall_seconds is None and not e.exceeds_wall and "no throughput" in e.notes[0]
    assert peak_flops("b200") == ("B200", 2250e12) and peak_flops("GH200-96GB") == ("GH200", 989e12)


def test_a_source_without_samples_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="'empty' has no sampled lengths"):
        count_tokens(plan(sources=(Source("empty", 10, ()),)))


def gpu_plan(**kw) -> CellPlan:
    """A 1B cell on 4 x A100 nodes as the layout renders it (planning/gpus.py), 2 epochs of the sources."""
    layout = {"gpus_per_node": 4, "nodes": 1, "micro_batch_size": 1, "layers": 24, **kw.pop("layout", {})}
    return plan(gpus=4 * layout["nodes"], layout=Layout(**layout), **kw)


A100 = throughput("leonardo", "A100-64GB")


def test_packing_is_priced_cheaper_than_one_example_a_micro_step() -> None:
    """The estimate once priced packing 9-15% dearer (attention counted over the whole block). Now a packed micro
    step carries cutoff_len tokens, so its launches weigh little, and the same tokens cost less."""
    unpacked, packed = estimate_cell(gpu_plan(), A100), estimate_cell(gpu_plan(packing=True), A100)
    assert packed.tokens.tokens == pytest.approx(unpacked.tokens.tokens)
    assert packed.flops == pytest.approx(unpacked.flops)
    assert packed.gpu_hours is not None and unpacked.gpu_hours is not None
    assert packed.gpu_hours < 0.8 * unpacked.gpu_hours
    assert packed.mfu is not None and unpacked.mfu is not None and packed.mfu > unpacked.mfu
    assert dict(unpacked.parts)["dispatch"] > 2 * dict(packed.parts)["dispatch"]  # ~2.7 examples a block here


def test_checkpointing_costs_a_forward_pass_more() -> None:
    off = estimate_cell(gpu_plan(packing=True), A100)
    on = estimate_cell(gpu_plan(packing=True, layout={"checkpointing": True}), A100)
    assert dict(on.parts)["compute"] == pytest.approx(dict(off.parts)["compute"] * 8 / 6)
    assert on.flops == pytest.approx(off.flops)  # the MFU stays in model FLOPs


def test_nodes_exchange_over_the_network_and_zero3_exchanges_more() -> None:
    one = estimate_cell(gpu_plan(packing=True), A100)
    slow = estimate_cell(gpu_plan(packing=True, layout={"nodes": 4, "internode_gbps": 12.5}), A100)
    fast = estimate_cell(gpu_plan(packing=True, layout={"nodes": 4, "internode_gbps": 100.0}), A100)
    zero3 = estimate_cell(
        gpu_plan(packing=True, layout={"nodes": 4, "internode_gbps": 12.5, "sharding": "zero3"}), A100
    )
    assert dict(one.parts)["exchange"] == 0.0
    assert dict(slow.parts)["exchange"] == pytest.approx(8 * dict(fast.parts)["exchange"])
    assert slow.gpu_hours is not None and one.gpu_hours is not None and slow.gpu_hours > one.gpu_hours
    assert dict(zero3.parts)["exchange"] > dict(slow.parts)["exchange"]
    unknown = estimate_cell(gpu_plan(packing=True, layout={"nodes": 4}), A100)
    assert dict(unknown.parts)["exchange"] == 0.0 and any("internode_gbps" in n for n in unknown.notes)


def test_offload_and_liger_are_priced() -> None:
    base = estimate_cell(gpu_plan(packing=True), A100)
    off = estimate_cell(gpu_plan(packing=True, layout={"offload": "optimizer", "sharding": "zero3"}), A100)
    liger = estimate_cell(gpu_plan(packing=True, layout={"liger": True}), A100)
    assert dict(off.parts)["offload"] > 0 and dict(base.parts)["offload"] == 0
    assert dict(liger.parts)["compute"] < dict(base.parts)["compute"]
