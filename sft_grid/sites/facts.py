"""What `observe` asks each site of a grid across sites (issue 25): whether its controller answers, how many nodes
it has, and when its scheduler expects a job of each shape the grid's cells have to start (`sbatch --test-only`:
nothing is queued). One `sinfo` and one `sbatch --test-only` per distinct (nodes, wall time) a site."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from sft_grid.core.schema import ClusterConf
from sft_grid.core.submission import SlurmRequest
from sft_grid.schedulers import slurm
from sft_grid.sites.placement import Need, SiteFacts


def observe(sites: Mapping[str, ClusterConf], needs: Sequence[Need]) -> tuple[SiteFacts, ...]:
    out = []
    shapes = sorted({n.shape for n in needs})
    for name, cluster in sites.items():
        env = dict(cluster.client_env)
        try:
            nodes = slurm.node_count(env)
        except (OSError, subprocess.SubprocessError):
            out.append(SiteFacts(name=name, cluster=cluster, reachable=False))
            continue
        starts: dict[tuple[int, int], float] = {}
        for n_nodes, minutes in shapes:
            params = {"nodes": n_nodes, "time": minutes, "cpus_per_task": cluster.cpus_per_node}
            params.update({k: getattr(cluster, k) for k in ("partition", "account", "qos") if getattr(cluster, k)})
            start = slurm.test_only(SlurmRequest(tuple(sorted(params.items())), 0), env)
            if start is not None:
                starts[(n_nodes, minutes)] = start
        out.append(SiteFacts(name=name, cluster=cluster, nodes=max(1, nodes), starts=starts))
    return tuple(out)
