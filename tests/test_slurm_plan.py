"""How cells become job arrays and sbatch scripts (pure: no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from sft_grid.core.submission import Role, SlurmJob, SlurmRequest
from sft_grid.grid.jobs import request_for
from sft_grid.schedulers import slurm


def request(**cluster) -> SlurmRequest:
    spec = type("Spec", (), {})()
    spec.nodes = cluster.pop("nodes", 1)
    spec.sites = []
    spec.cluster = type(
        "Cluster",
        (),
        {
            "cpus_per_node": 8,
            "sbatch_extra": {},
            "partition": "gpu",
            "account": None,
            "qos": None,
            "constraint": None,
            "exclude": None,
            "mem_gb": None,
            "gpus_per_node": 4,
            "gpu_directive": "gpus_per_node",
            "max_requeues": 3,
            "client_env": {},
            **cluster,
        },
    )()
    return request_for(spec, timeout_min=600)


def job(targets, req, throttle=None, dependency=None) -> SlurmJob:
    return SlurmJob(
        "sft_grid-abc",
        Role.TRAIN,
        tuple(targets),
        req,
        Path("/r/.submitit/sft_grid-abc"),
        throttle,
        dependency,
        checkpointable=True,
    )


def test_sbatch_script_of_an_array():
    script = slurm.sbatch_script(job([Path(f"/r/c{i}") for i in range(3)], request(gpu_directive="gres"), 2), None)
    for line in (
        "#SBATCH --array=0-2%2",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --partition=gpu",
        "#SBATCH --requeue",
        "#SBATCH --time=600",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --job-name=sft_grid-abc",
        "--kill-on-bad-exit=1",
    ):
        assert line in script, line
    assert "--gpus-per-node" not in script


def test_a_request_without_gpus_asks_for_none_and_one_target_is_a_single_job():
    script = slurm.sbatch_script(job([Path("/r/x")], request(gpus_per_node=0)), "afterok:12")
    assert "--gres" not in script and "--gpus" not in script and "--array" not in script
    assert "#SBATCH --dependency=afterok:12" in script and "#SBATCH --kill-on-invalid-dep=yes" in script
