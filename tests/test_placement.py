"""Placement of a grid across sites (sft_grid/sites/placement.py): pure, fast. The sites are cluster profiles built
here; the expected starts stand for what `sbatch --test-only` answers (tests/test_sites_spread.py asks the two real
local clusters), and the request it is asked with is the one the cell's job is submitted with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sft_grid.core.schema import ClusterConf
from sft_grid.sites.placement import Need, SiteFacts, place, profiles, refusal

CPU = ClusterConf(name="cpu", executor="slurm", cpus_per_node=2, max_nodes=1, max_time="01:00:00", max_requeues=0)
GPU = ClusterConf(
    name="gpu",
    executor="slurm",
    gpus_per_node=4,
    gpu_type="H100-SXM",
    gpu_mem_gb=80,
    cpu_arch="aarch64",
    max_nodes=2,
    max_time="02:00:00",
    max_requeues=1,
    internet_on_compute=True,
)


def site(cluster: ClusterConf, **kw: object) -> SiteFacts:
    return SiteFacts(name=cluster.name, cluster=cluster, **kw)  # type: ignore[arg-type]


def need(name: str = "c0", **kw: object) -> Need:
    return Need(cell=name, **{"nodes": 1, "minutes": 30, **kw})  # type: ignore[arg-type]


def test_every_cell_goes_where_it_is_feasible() -> None:
    needs = [
        need("h100", gpu_type="H100"),
        need("arm", cpu_arch="aarch64"),
        need("big", nodes=2),
        need("long", minutes=200),  # 2 h over one requeue: 4 h on gpu, 1 h on cpu
        need("net", internet=True),
        need("mem", gpu_mem_gb=64),
        need("any"),
    ]
    placed = place(needs, [site(CPU, starts={(1, 30): 0.0}), site(GPU, starts={(1, 30): 3600.0})])
    assert not placed.problems
    assert placed.sites == {
        "h100": "gpu",
        "arm": "gpu",
        "big": "gpu",
        "long": "gpu",
        "net": "gpu",
        "mem": "gpu",
        "any": "cpu",  # feasible on both; cpu starts now, gpu in an hour
    }


def test_earliest_expected_start_wins_and_ties_go_to_the_first_named() -> None:
    later = site(CPU, starts={(1, 30): 600.0})
    now = site(replace(CPU, name="b"), starts={(1, 30): 0.0})
    assert place([need()], [later, now]).sites == {"c0": "b"}
    assert place([need()], [site(CPU), site(replace(CPU, name="b"))]).sites == {"c0": "cpu"}


def test_queued_work_spreads_over_the_sites_nodes() -> None:
    """12 equal cells on an idle two-node site and an idle one-node site: 8 and 4 (each cell's start is the
    scheduler's estimate plus the work already placed there, over the site's nodes)."""
    two, one = site(CPU, nodes=2), site(replace(CPU, name="b"), nodes=1)
    placed = place([need(f"c{i}") for i in range(12)], [two, one])
    counts = {s: list(placed.sites.values()).count(s) for s in ("cpu", "b")}
    assert counts == {"cpu": 8, "b": 4}
    assert place([need(f"c{i}") for i in range(12)], [two, one]) == placed  # pure: the same answer again


@pytest.mark.parametrize(
    ("asked", "key", "value"),
    [
        ({"gpu_type": "B200"}, "site_needs.gpu_type", "B200"),
        ({"cpu_arch": "ppc64le"}, "site_needs.cpu_arch", "ppc64le"),
        ({"gpu_mem_gb": 141}, "site_needs.gpu_mem_gb", 141),
        ({"nodes": 3}, "nodes", 3),
        ({"minutes": 241}, "time", 241),
    ],
)
def test_a_cell_no_site_can_take_is_refused_with_every_sites_reason(asked: dict, key: str, value: object) -> None:
    placed = place([need("x", **asked), need("ok")], [site(CPU), site(GPU)])
    assert placed.sites == {"ok": "cpu"}
    (problem,) = placed.problems
    assert (problem.cell, problem.key, problem.value, problem.rule) == ("x", key, value, "site-feasible")
    assert "cpu" in problem.message and "gpu" in problem.message
    assert key in problem.fix and "sites=[" in problem.fix


def test_unreachable_site_offline_staging_and_allocation() -> None:
    down = site(GPU, reachable=False)
    assert refusal(need(), down) == ("sites", "gpu", "gpu did not answer")
    assert place([need()], [down, site(CPU)]).sites == {"c0": "cpu"}
    offline = replace(CPU, hub_reachable=False)
    assert refusal(need(hub=True), site(offline)) is not None
    assert refusal(need(hub=False), site(offline)) is None
    # one node-hour left: the first two 30-minute cells fit, the third goes elsewhere, a fourth nowhere
    small = site(replace(CPU, allocation_node_h=1.0), starts={(1, 30): 0.0})
    placed = place(
        [need(f"c{i}") for i in range(4)], [small, site(replace(GPU, allocation_node_h=0.5), starts={(1, 30): 1e4})]
    )
    assert placed.sites == {"c0": "cpu", "c1": "cpu", "c2": "gpu"}
    assert [p.cell for p in placed.problems] == ["c3"] and "allocation" in placed.problems[0].message


class _Cell:
    def __init__(self, sites: list[str]) -> None:
        self.name = "c"
        self.spec = type("S", (), {"sites": sites})()


def test_site_profiles_known_slurm_and_one_list() -> None:
    found, problems = profiles([_Cell(["slurm_local", "slurm_siteb"])])
    assert not problems and set(found) == {"slurm_local", "slurm_siteb"}
    assert found["slurm_siteb"].client_env["SLURM_CONF"] == "/etc/slurm-siteb/slurm.conf"
    _, problems = profiles([_Cell(["slurm_local", "nowhere"])])
    assert [(p.key, p.value, p.rule) for p in problems] == [("sites", "nowhere", "site-known")]
    _, problems = profiles([_Cell(["slurm_local", "local"])])
    assert [p.rule for p in problems] == ["site-slurm-here"]
    _, problems = profiles([_Cell(["slurm_local"]), _Cell(["slurm_siteb"])])
    assert [p.rule for p in problems] == ["one-sites-list"]
    assert profiles([_Cell([])]) == ({}, [])


def test_a_site_without_an_estimate_ranks_after_every_site_with_one() -> None:
    """A scheduler that refused the request or did not answer gives no estimate: unknown, never "at once". It ranks
    after a known estimate however late (here two hours), even named first; among unknown sites the work this
    placement put there decides; the placement says which starts are unknown."""
    unknown = site(replace(CPU, name="silent"))
    busy = site(CPU, starts={(1, 30): 7200.0})
    placed = place([need("c0"), need("c1")], [unknown, busy])
    assert placed.sites == {"c0": "cpu", "c1": "cpu"}
    assert placed.starts == {"c0": 7200.0, "c1": 7200.0 + 1800.0}
    # only unknown sites: by the work placed there alone, over their nodes (6 and 3 of 9 equal cells)
    two, one = site(replace(CPU, name="two"), nodes=2), site(replace(CPU, name="one"))
    spread = place([need(f"c{i}") for i in range(9)], [two, one])
    assert sorted(spread.sites.values()).count("two") == 6 and set(spread.starts.values()) == {None}


@pytest.mark.parametrize(
    ("cluster", "flags"),
    [
        (["cluster.gpus_per_node=4", "cluster.gpu_directive=gres"], {"--gres=gpu:4", "--partition=debug"}),
        (
            ["cluster.gpus_per_node=8", "cluster.gpu_directive=gpus_per_node", "cluster.mem_gb=480"],
            {"--gpus-per-node=8", "--mem=480GB"},
        ),
        (
            ["cluster.account=proj", "cluster.qos=normal", "cluster.constraint=a100", "cluster.exclude=n9"],
            {"--account=proj", "--qos=normal", "--constraint=a100", "--exclude=n9"},
        ),
        (
            ["+cluster.sbatch_extra.reservation=grid", "cluster.partition=boost", "nodes=2"],
            {"--reservation=grid", "--partition=boost", "--nodes=2"},
        ),
    ],
)
def test_the_start_is_asked_for_the_job_the_cell_would_submit(make_cells, cluster: list[str], flags: set[str]) -> None:
    """`sbatch --test-only` is asked with the request the cell's training job is submitted with on that site (its
    GPUs as the site asks for them, nodes, time, partition, account, qos, memory, constraint, the site's own sbatch
    options), not a bare (nodes, time): the request equals grid/jobs.py's for the cell, and the argv carries it."""
    from sft_grid.grid.jobs import request_for
    from sft_grid.schedulers import slurm
    from sft_grid.sites import facts
    from sft_grid.sites.placement import need_of

    (cell,) = make_cells(["cluster=slurm_local", "model=tiny_llama", "time=02:30:00", "sites=[slurm_local]", *cluster])
    n = need_of(cell)
    asked = facts.request_at(cell.spec.cluster, n.nodes, n.minutes, "slurm_local")
    assert asked == request_for(cell.spec, n.minutes)
    argv = slurm.test_only_argv(asked)
    assert argv[:2] == ["sbatch", "--test-only"] and "--time=150" in argv and f"--nodes={n.nodes}" in argv
    assert flags <= set(argv), argv
