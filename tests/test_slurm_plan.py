"""How cells become job arrays and sbatch scripts (pure: no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from sft_grid import slurm


def request(**cluster) -> slurm.SlurmRequest:
    spec = type("Spec", (), {})()
    spec.nodes = cluster.pop("nodes", 1)
    spec.cluster = type("Cluster", (), {
        "cpus_per_node": 8, "sbatch_extra": {}, "partition": "gpu", "account": None, "qos": None,
        "constraint": None, "exclude": None, "mem_gb": None, "gpus_per_node": 4, "gpu_directive": "gpus_per_node",
        "max_requeues": 3, **cluster})()
    return slurm.request_for(spec, timeout_min=600)


def test_cells_with_equal_requests_share_arrays_split_at_max_array_size():
    a, b = request(), request(nodes=2)
    items = [(Path(f"/r/a{i}"), a) for i in range(5)] + [(Path(f"/r/b{i}"), b) for i in range(2)]
    chunks = slurm.plan_arrays(items, max_size=2)
    assert [len(c.cell_dirs) for c in chunks] == [2, 2, 1, 2]
    assert [c.request for c in chunks] == [a, a, a, b]
    assert len({c.name for c in chunks}) == 4 and all(c.name.startswith("sft_grid-") for c in chunks)


def test_sbatch_script_of_an_array():
    (chunk,) = slurm.plan_arrays([(Path(f"/r/c{i}"), request(gpu_directive="gres")) for i in range(3)], 1001)
    script = slurm.sbatch_preview(chunk, concurrency=2, folder=Path("/r/.submitit") / chunk.name)
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --gres=gpu:4", "#SBATCH --partition=gpu", "#SBATCH --requeue",
                 "#SBATCH --time=600", "#SBATCH --signal=USR2@120", "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --job-name={chunk.name}", "--kill-on-bad-exit=1"):
        assert line in script, line
    assert "--gpus-per-node" not in script


def test_a_request_without_gpus_asks_for_none():
    script = slurm.sbatch_preview(slurm.plan_arrays([(Path("/r/x"), request(gpus_per_node=0))], 10)[0], None,
                                  Path("/r/.submitit/x"))
    assert "--gres" not in script and "--gpus" not in script
