"""Benchmark: the Delphi grid's GPU-hours, as sft_grid rendered it before the GPU layout and as it renders
it now, per model size, with what each change saved. One run, every figure from the same cost model.

What it runs: the real dry run of the Delphi grid on Leonardo (`sft-grid run -m +sweep=delphi_scaling dry_run=true`,
a scratch runs root), then reads each of the 72 cells' cell.yaml: its model and the layout sft_grid chose for it
(nodes, sharding, checkpointing, packing, attention, Liger). Each cell is then priced by planning/estimate.py's
default throughput (the layout's compute, dispatch, exchange and offload on Leonardo's A100s and 50 GB/s network)
in five layouts, each adding one change to the one before:

  0. as rendered before: plain data parallel on 1/2/4 nodes by size (the old `by_size` rule), one example a micro
     step, LLaMA-Factory's default checkpointing, sdpa, no Liger: the 3.4B and 9.7B cells out of memory at step 0
     (priced as if they ran with ZeRO-3 at the same nodes, as the failure's advice would have it);
  1. + packing (16 sequences of 4096 tokens a step, no attention across examples);
  2. + the fewest nodes that fit, with the lightest sharding (the layout's nodes and sharding);
  3. + the site's kernels (FlashAttention 2, Liger's fused loss) and checkpointing only where memory needs it: the
     layout as rendered now.
Beside them, what the dry run used to say of the old layout: a flat 30% MFU, nothing else priced.

Tokens: magpie's are marin's count (313,007,558 for 500,000 rows under the Delphi template, conf/dataset/magpie.yaml).
The warmup data (laion/...-le3000tok-100k, at most 3,000 tokens a row) and the WildChat arm have no published count:
their mean lengths are ASSUMED (WARMUP_MEAN, WILDCHAT_MEAN, the research's figures), and said so in the output.

    python benchmarks/bench_delphi_cost.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sft_grid.planning.estimate import (  # noqa: E402
    CellPlan,
    Layout,
    Model,
    Source,
    estimate_cell,
    mixed_rows,
    throughput,
)

MAGPIE = (500_000, 313_007_558 / 500_000)  # rows, mean tokens (marin's count)
WARMUP_ROWS, WARMUP_MEAN = 100_000, 1_500.0  # ASSUMED mean: at most 3,000 tokens a row by construction
WILDCHAT_ROWS, WILDCHAT_MEAN = 385_700, 1_500.0  # ASSUMED mean after the 4,096-token cap
OLD_MFU = 0.3  # what planning/estimate.py assumed for every cell before the GPU layout
STEPS = ("0 before", "1 +packing", "2 +fewest nodes", "3 +kernels, ckpt where needed")


def old_nodes(params: float) -> int:
    return 1 if params <= 1.0e9 else 2 if params <= 2.6e9 else 4


def dry_run(root: Path) -> list[dict]:
    env = {
        **os.environ,
        "SFT_GRID_LEONARDO_ACCOUNT": "bench",
        "SFT_GRID_LEONARDO_RUNS": str(root),
        "SFT_GRID_LEONARDO_ENV": str(root / "env"),
        "PYTHONPATH": str(REPO),
    }
    (root / "env" / "bin").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "sft_grid", "run", "-m", "+sweep=delphi_scaling", "dry_run=true"]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"the dry run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    cells = [yaml.safe_load(p.read_text()) for p in sorted((root / "delphi_scaling").glob("*/cell.yaml"))]
    if len(cells) != 72:
        raise SystemExit(f"expected 72 cells, found {len(cells)}")
    return cells


def sources(conf: dict) -> tuple[Source, ...]:
    first = next(iter(conf["dataset"]))
    rows, mean = MAGPIE if first == "magpie" else (WILDCHAT_ROWS, WILDCHAT_MEAN)
    per = mixed_rows([rows, WARMUP_ROWS], "interleave_under", [0.9, 0.1])
    return (Source(first, per[0], (mean,)), Source("delphi_warmup", per[1], (WARMUP_MEAN,)))


def plans(conf: dict) -> list[CellPlan]:
    m = conf["model"]
    params = float(m["params"])
    model = Model(params=params, n_layers=int(m["num_layers"]), d_attn=int(m["hidden_size"]))
    lay = conf["layout"]
    base = CellPlan(
        name=m["name"],
        model=model,
        sources=sources(conf),
        cutoff_len=int(conf["cutoff_len"]),
        global_batch_size=int(conf["global_batch_size"]),
        epochs=float(conf["epochs"]),
        gpus=4 * old_nodes(params),
        packing=False,
        layout=Layout(
            gpus_per_node=4,
            nodes=old_nodes(params),
            micro_batch_size=1,
            layers=model.n_layers,
            checkpointing=True,  # LLaMA-Factory's default
            sharding="zero3" if params > 3e9 else "none",  # the 3.4B and 9.7B ran out of memory otherwise
            fp32_gradients=params <= 3e9,
            internode_gbps=conf["cluster"]["internode_gbps"],
        ),
    )
    assert base.layout is not None
    packed = replace(base, packing=True)
    now = conf["nodes"]
    nodes = replace(
        packed,
        gpus=4 * now,
        layout=replace(base.layout, nodes=now, sharding=lay["sharding"], fp32_gradients=lay["sharding"] == "none"),
    )
    assert nodes.layout is not None
    kernels = replace(nodes, layout=replace(nodes.layout, checkpointing=lay["checkpointing"], liger=lay["liger"]))
    return [base, packed, nodes, kernels]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_delphi_cost-") as tmp:
        cells = dry_run(Path(tmp))
    a100 = throughput("leonardo", "A100-64GB")
    assert a100 is not None
    flat = replace(a100, per_flop_s=1.0 / (OLD_MFU * a100.peak)) if a100.peak else a100
    by_size: dict[float, dict[str, float]] = {}
    layouts: dict[float, str] = {}
    for conf in cells:
        size = round(float(conf["model"]["params"]) / 1e9, 2)
        row = by_size.setdefault(size, dict.fromkeys(("old estimate", *STEPS), 0.0))
        steps = plans(conf)
        old = estimate_cell(replace(steps[0], layout=None), flat)  # the old estimator: FLOPs at 30%, nothing else
        row["old estimate"] += old.gpu_hours or 0.0
        for name, plan in zip(STEPS, steps, strict=True):
            row[name] += estimate_cell(plan, a100).gpu_hours or 0.0
        lay = conf["layout"]
        layouts[size] = (
            f"{conf['nodes']}n {lay['sharding']}{' ckpt' if lay['checkpointing'] else ''}"
            f"{' liger' if lay['liger'] else ''} {lay['attention']}"
        )
    cols = ("old estimate", *STEPS)
    print("Delphi grid on Leonardo (4 x A100 64 GB, 50 GB/s a node), 72 cells, A100 GPU-hours")
    print(f"assumed mean tokens a row: warmup {WARMUP_MEAN:.0f}, wildchat {WILDCHAT_MEAN:.0f} (magpie: marin's count)")
    header = f"{'size (B)':>8}  {'layout now':<28}" + "".join(f"{c:>31}" for c in cols)
    print(header)
    totals = dict.fromkeys(cols, 0.0)
    for size in sorted(by_size):
        row = by_size[size]
        print(f"{size:>8}  {layouts[size]:<28}" + "".join(f"{row[c]:>31.0f}" for c in cols))
        for c in cols:
            totals[c] += row[c]
    print(f"{'grid':>8}  {'':<28}" + "".join(f"{totals[c]:>31.0f}" for c in cols))
    saved = [f"{STEPS[i]}: -{totals[STEPS[i - 1]] - totals[STEPS[i]]:.0f} GPU-h" for i in range(1, len(STEPS))]
    print("what each change saved: " + "; ".join(saved))
    before, now = totals[STEPS[0]], totals[STEPS[-1]]
    print(f"before -> now: {before:.0f} -> {now:.0f} GPU-h ({before / now:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"by_size": by_size, "layouts": layouts, "totals": totals}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
