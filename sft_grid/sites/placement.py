"""One grid across several sites: each cell placed on one site where it is feasible.

`sites: [a, b]` (a top-level key of the sweep; not identity) names cluster profiles (`conf/cluster/<name>.yaml`).
Each cell that is to be queued goes to one of them:

- feasible only: the site's CPU architecture and GPU model and memory meet the cell's `site_needs`; the cell's
  nodes are within the site's `max_nodes`; its wall time fits the site's `max_time` over its requeues
  (`max_time * (1 + max_requeues)`: a checkpointed cell resumes across them); a cell that needs the internet on its
  compute nodes only where they have it, and a cell whose Hub inputs are still to be staged only where staging
  reaches the Hub (`hub_reachable`); the node-hours the account has left, where the site reports them
  (`allocation_node_h`), cover it; the site answered (`reachable`);
- preferred: the earliest expected start. The scheduler's own estimate for the cell's training job on that site
  (`sbatch --test-only` with the job's own request, asked by `observe`, never here) plus the work this placement
  already put there, spread over the site's nodes; a site whose scheduler gave no estimate (it refused the request,
  or did not say) is unknown, ranked after every site with a known one, among its kind by that work alone; ties go
  to the site named first.

A cell no site can take now is not placed: its problem names every site's reason (the caller makes it wait; a cell
no site could ever take is refused before anything is written, `static_problems`). `place` is pure: the same cells,
facts and estimates give the same placement (tests/test_placement.py). A cell that was queued before keeps the site
its ledger names (its record); only a cell that is to be queued is placed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sft_grid.core.problems import GRID, Problem
from sft_grid.core.schema import ClusterConf
from sft_grid.core.timefmt import parse_minutes
from sft_grid.sites import call


@dataclass(frozen=True, kw_only=True)
class SiteFacts:
    """What `observe` knows of a site for a placement."""

    name: str
    cluster: ClusterConf
    reachable: bool = True
    # the site's nodes (sinfo), over which its queued work spreads; 1 when not known
    nodes: int = 1
    # (nodes, minutes) of a cell's training job -> seconds until the scheduler expects it to start (sbatch
    # --test-only with the job's request); a shape missing here has no estimate: unknown
    starts: Mapping[tuple[int, int], float] = field(default_factory=dict)
    error: str = ""  # why it did not answer


@dataclass(frozen=True, kw_only=True)
class Need:
    """What one cell asks of its site."""

    cell: str
    nodes: int
    minutes: int
    cpu_arch: str | None = None
    gpu_type: str | None = None
    gpu_mem_gb: int | None = None
    internet: bool = False
    hub: bool = False  # Hub inputs still to be staged

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nodes, self.minutes)

    @property
    def node_h(self) -> float:
        return self.nodes * self.minutes / 60


def _minutes(time: str) -> int:
    """A wall time in minutes; 0 for one that cannot be read (validation's time-format rule names it, with the fix,
    and no site is refused for it first)."""
    try:
        return math.ceil(parse_minutes(time))
    except ValueError:
        return 0


def need_of(cell: Any, hub: bool = False) -> Need:
    """A cell's needs, from its config (`cell.spec`); `hub`: its Hub inputs are still to be staged."""
    spec = cell.spec
    n = spec.site_needs
    return Need(
        cell=cell.name,
        # as the cell (or its cell.yaml) sets them, else the fewest that fit (planning/gpus.py)
        nodes=spec.nodes if spec.nodes is not None else cell.nodes,
        minutes=_minutes(spec.time),
        cpu_arch=n.cpu_arch,
        gpu_type=n.gpu_type,
        gpu_mem_gb=n.gpu_mem_gb,
        internet=n.internet,
        hub=hub,
    )


def refusal(need: Need, site: SiteFacts) -> tuple[str, object, str] | None:
    """Why this site cannot take this cell: (key, value, reason), or None when it can (allocation aside)."""
    c = site.cluster
    if not site.reachable:
        return ("sites", site.name, f"{site.name} did not answer")
    if need.cpu_arch and need.cpu_arch != c.cpu_arch:
        return ("site_needs.cpu_arch", need.cpu_arch, f"{site.name} is {c.cpu_arch}")
    if need.gpu_type and not (c.gpus_per_node and str(c.gpu_type or "").upper().startswith(need.gpu_type.upper())):
        return ("site_needs.gpu_type", need.gpu_type, f"{site.name} has {c.gpu_type or 'no GPU'}")
    if need.gpu_mem_gb and not (c.gpus_per_node and c.gpu_mem_gb and c.gpu_mem_gb >= need.gpu_mem_gb):
        return ("site_needs.gpu_mem_gb", need.gpu_mem_gb, f"{site.name}'s GPUs have {c.gpu_mem_gb or 'unknown'} GB")
    if c.max_nodes and need.nodes > c.max_nodes:
        return ("nodes", need.nodes, f"{site.name} allows {c.max_nodes} node(s) a job")
    try:
        longest = parse_minutes(c.max_time) * (1 + c.max_requeues)
    except ValueError:
        return ("sites", site.name, f"{site.name}'s profile has max_time {c.max_time!r}, which is not a wall time")
    if need.minutes > longest:
        return (
            "time",
            need.minutes,
            f"{site.name} runs a job at most {c.max_time} over {c.max_requeues} requeue(s) ({longest:.0f} min)",
        )
    if need.internet and not c.internet_on_compute:
        return ("site_needs.internet", True, f"{site.name}'s compute nodes have no internet")
    if need.hub and not c.hub_reachable:
        return ("sites", site.name, f"{site.name} cannot stage from the Hub and the cell's inputs are not staged")
    return None


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Cell name -> the site it goes to, and when it is expected to start there (seconds from now, the work placed
    before it included; None: the site's scheduler gave no estimate); the problems of cells no site can take."""

    sites: Mapping[str, str]
    problems: tuple[Problem, ...] = ()
    starts: Mapping[str, float | None] = field(default_factory=dict)


def place(needs: Sequence[Need], facts: Sequence[SiteFacts]) -> Placement:
    """Each cell on a feasible site, earliest expected start first (see the module's docstring). Pure."""
    backlog = {s.name: 0.0 for s in facts}  # seconds of node-time this placement put on each site
    spent = {s.name: 0.0 for s in facts}  # node-hours against each site's allocation
    order = {s.name: i for i, s in enumerate(facts)}
    placed: dict[str, str] = {}
    starts: dict[str, float | None] = {}
    problems: list[Problem] = []
    for need in needs:
        # (unknown, expected start, order, site): every known estimate before any unknown one
        feasible: list[tuple[bool, float, int, str]] = []
        reasons: list[tuple[str, object, str]] = []
        for site in facts:
            why = refusal(need, site)
            left = site.cluster.allocation_node_h
            if why is None and left is not None and spent[site.name] + need.node_h > left:
                why = ("sites", site.name, f"{site.name}'s allocation has {left - spent[site.name]:.1f} node-h left")
            if why is not None:
                reasons.append(why)
                continue
            known = site.starts.get(need.shape)
            start = (known or 0.0) + backlog[site.name] / max(1, site.nodes)
            feasible.append((known is None, start, order[site.name], site.name))
        if not feasible:
            key, value, _ = next((r for r in reasons if r[0] != "sites"), reasons[0]) if reasons else ("sites", (), "")
            problems.append(
                Problem(
                    cell=need.cell,
                    key=key,
                    value=value,
                    rule="site-feasible",
                    message="no site of the grid can run this cell: " + "; ".join(r[2] for r in reasons)
                    if reasons
                    else "the grid names no site",
                    fix=f"change {key} to what one of the sites offers, or add a site that offers it to sites=[...]",
                )
            )
            continue
        unknown, start, _, best = min(feasible)
        placed[need.cell] = best
        starts[need.cell] = None if unknown else start
        backlog[best] += need.minutes * 60 * need.nodes
        spent[best] += need.node_h
    return Placement(sites=placed, problems=tuple(problems), starts=starts)


def profiles(cells: Sequence[Any]) -> tuple[dict[str, ClusterConf], list[Problem]]:
    """The cluster profile of each site the grid's cells name (`sites=[...]`), read from conf/cluster/, and the
    problems of the list: one list for the whole grid, profiles that exist and are reached from here."""
    return named_profiles({tuple(c.spec.sites) for c in cells})


def named_profiles(lists: set[tuple[str, ...]]) -> tuple[dict[str, ClusterConf], list[Problem]]:
    """`profiles` of the cells' lists of sites as given (one list a cell; also read before the cells are planned)."""
    from omegaconf import OmegaConf

    from sft_grid.core import project
    from sft_grid.planning import resolvers
    from sft_grid.planning.hydra_errors import key_hint, plain_message
    from sft_grid.planning.schema_rules import section_values

    if lists <= {()}:  # no cell names sites (or no cell composed)
        return {}, []
    problems: list[Problem] = []
    if len(lists) > 1:
        problems.append(
            Problem(
                cell=GRID,
                key="sites",
                value=sorted(lists),
                rule="one-sites-list",
                message="the grid's cells name different lists of sites",
                fix="set sites=[...] once for the whole sweep",
            )
        )
        return {}, problems
    resolvers.register()
    found: dict[str, ClusterConf] = {}
    names = next(iter(lists))
    here = call.here()
    if here:  # a site's own invocation for a grid across remote sites: its cells are placed on it, by its own Slurm
        names = tuple(n for n in names if n == here)
    remote = []
    for name in names:
        path = project.find_option("cluster", name)
        if path is None:
            known = ", ".join(project.options("cluster"))
            problems.append(
                Problem(
                    cell=GRID,
                    key="sites",
                    value=name,
                    rule="site-known",
                    message=f"no conf/cluster/{name}.yaml",
                    fix=f"name one of {known}",
                )
            )
            continue
        try:
            cluster = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConf), OmegaConf.load(path)))
        except Exception as exc:  # YAML or OmegaConf refusing the profile: reported, not raised
            if not type(exc).__module__.startswith(("yaml", "omegaconf")):
                raise
            said = str(exc).strip()
            named = re.search(r"full_key: (\S+)", said)
            problems.append(
                Problem(
                    cell=GRID,
                    key=f"sites.{name}" + (f".{named.group(1)}" if named else ""),
                    value=_written(path, named.group(1)) if named else name,
                    rule="site-profile",
                    message=f"{path}: {plain_message(said) if said else type(exc).__name__}",
                    fix=key_hint(said) or f"fix {path} (sft-grid run cluster={name} dry_run=true names each problem)",
                )
            )
            continue
        assert isinstance(cluster, ClusterConf)
        # the schema's ranges and value sets, as `cluster=NAME` holds them (max_nodes: 0, site_answer_tries: 0)
        problems += [
            replace(p, fix=f"{p.fix} in {path}")
            for p in section_values(GRID, f"sites.{name}.", cluster)
            if p.rule != "required" or p.key != f"sites.{name}.name"
        ]
        cluster = replace(cluster, name=name)  # the site's name is the list's (each job's gate, the ledgers)
        if here:
            cluster = replace(cluster, remote=type(cluster.remote)())  # it runs here: nothing to reach over ssh
        elif cluster.remote.host and cluster.executor == "slurm":
            remote.append(name)  # sites reached over ssh: placed from here, launched there (sites/coordinate.py)
        if cluster.executor != "slurm":
            problems.append(
                Problem(
                    cell=GRID,
                    key="sites",
                    value=name,
                    rule="site-slurm-here",
                    message=f"a grid across sites places its cells on Slurm clusters; {name} has"
                    f" executor={cluster.executor}",
                    fix="name Slurm cluster profiles (executor: slurm)",
                )
            )
            continue
        found[name] = cluster
    if remote and len(remote) != len(found):
        problems.append(
            Problem(
                cell=GRID,
                key="sites",
                value=sorted(found),
                rule="site-slurm-here",
                message=f"a grid across sites reaches all of its sites over ssh, or none: {', '.join(remote)} "
                f"{'is' if len(remote) == 1 else 'are'} remote (remote.host), "
                f"{', '.join(sorted(set(found) - set(remote)))} not",
                fix="name only remote profiles (each with remote.host), or only Slurm clusters whose clients run here",
            )
        )
    return found, problems


def _written(path: Any, key: str) -> Any:
    """A profile's value of a dotted key as its file writes it (None where the file does not read)."""
    from sft_grid.planning.conf_files import option_data

    node = option_data(path)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def all_remote(sites: Mapping[str, ClusterConf]) -> bool:
    """Whether a grid's sites are reached over ssh (a grid across remote sites, sites/coordinate.py)."""
    return bool(sites) and all(c.remote.host for c in sites.values())


def static_problems(cells: Sequence[Any], sites: Mapping[str, ClusterConf]) -> list[Problem]:
    """The cells no site of the grid could ever take (before any site is asked anything)."""
    facts = [SiteFacts(name=n, cluster=c) for n, c in sites.items()]
    unlimited = [SiteFacts(name=f.name, cluster=_without_allocation(f.cluster)) for f in facts]
    return list(place([need_of(c) for c in cells if c.spec.sites], unlimited).problems)


def _without_allocation(cluster: ClusterConf) -> ClusterConf:
    return replace(cluster, allocation_node_h=None)
