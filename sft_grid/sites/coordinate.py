"""A grid across remote sites: placed here, launched on each site.

`sites=[a, b]` naming cluster profiles that each have `remote.host` makes the machine the grid is launched from (a
laptop) the grid's coordinator; each site keeps its own cells, runs root, Hub cache and Slurm. One invocation:

1. here: every cell composed and validated, and the checkout's gate (sites/snapshot.py: a dirty checkout refused,
   naming the files), before any site is contacted;
2. each site, over its own control connection (sites/transport.py), all of them at once: the commit's snapshot put
   in place (once per commit), then the site's answer for the grid, `grid/site_answer.py` run there from the snapshot:
   its Slurm's facts (whether the controller answers, its nodes, `sbatch --test-only` for each shape of cell), each
   cell's state as its files there say, the moves off it that it confirmed (a cell queued there while its
   controller does not answer, or past `move_after`: its job's gate claimed there first, sites/moves.py), and the
   cells whose Hub inputs its cache lacks;
3. here, pure (`decide`): a cell that has a copy on a site stays there (completed or in flight: the same cell is
   never queued twice, wherever it is; failed or cancelled: that site's own rules decide whether it runs again, as
   on one site); a cell that the grid's record sent to a site that does not answer over ssh waits for that site
   (it may be queued there and nothing can confirm otherwise: it is never queued elsewhere on a guess); every other
   cell is placed (sites/placement.py) on a site that answered, earliest expected start first, never on a site it
   is moving away from; a cell no site can take now waits (each named, with every site's reason: its site stays
   silent, its only other site is the one it leaves), and the rest of the grid goes on;
4. the record here (`<runs root here>/<grid>/.site.json`) names each placed cell's site, written before anything
   is sent, then each site whose controller answers runs the grid command for its share of the cells, those it
   holds and those placed on it (its call's `only`, sites/call.py), from the snapshot (its refresh, as a run on one
   site is): its checks, its staging from its own login node, its model preps and tokenizations, its arrays, as a
   grid launched there. Its submissions record the site.

A site let go from here (`sft-grid release GRID --site NAME`, recorded in `<runs root here>/<grid>/sites.json` with
the cells the record had sent there): those cells no longer wait for it; they are placed on another site (never
that one), or, let go with --cancel, placed nowhere. Their copies on that site count only once completed there;
whenever it answers again, its own invocation gates their jobs there and records the let-go in their ledgers
(sites/moves.py; its call's `let_go`) before it answers.

Two launches of one grid (two people, two clones, two laptops: each with its own record here) take turns: before
it looks at any site, a launch holds the grid's launch lock on every site that answers (`hold_launch`: a lock file
in the grid's directory there, `LAUNCH_LOCK`: sft_grid's own lock, core/lock.py, taken by a process the launch
starts from its snapshot there and holds for as long as its connection lives), in the sites' name order, until
every site's share has been queued and recorded there. The second launch waits for it (at most `LAUNCH_WAIT_S`, then
it stops, naming the launch that holds it), then finds the first one's cells in flight in the sites' answers and
queues none of them again. A site that does not answer over ssh holds no lock, and nothing is placed on it. A dry
run takes no lock: it writes nothing on any site.

Killed at any point, the next invocation starts again from what the sites' files say: a cell sent to a site and
queued there is in flight there; one whose forward did not happen is placed again.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sft_grid.core.problems import GRID, GridError, Problem
from sft_grid.core.schema import ClusterConf
from sft_grid.core.state import State
from sft_grid.core.submission import CodeSnapshot
from sft_grid.sites import facts as site_facts
from sft_grid.sites import placement, remote, snapshot
from sft_grid.sites.call import SiteCall
from sft_grid.sites.placement import SiteFacts
from sft_grid.sites.transport import SiteUnreachable, Ssh, Transport

# the line of the site's output that carries its answer
ANSWER_MARK = "sft_grid-answer: "


@dataclass(frozen=True, kw_only=True)
class Answer:
    """A site's answer for the grid (what `grid/site_answer.py` found there), or why there is none."""

    site: str
    facts: SiteFacts | None = None  # None: the site did not answer over ssh
    states: Mapping[str, str] = field(default_factory=dict)  # cell name -> state there, for its cells there
    moving: frozenset[str] = frozenset()  # moves off the site confirmed there
    hub: frozenset[str] = frozenset()  # cells whose Hub inputs the site's cache lacks
    error: str = ""

    @property
    def answered(self) -> bool:
        return self.facts is not None


def answer_line(answer: Answer) -> str:
    """The line a site prints for its answer (the site side of the protocol; `parse` reads it here)."""
    facts = answer.facts
    data = {
        "facts": None
        if facts is None
        else {
            "reachable": facts.reachable,
            "nodes": facts.nodes,
            "starts": [[n, m, s] for (n, m), s in sorted(facts.starts.items())],
            "error": facts.error,
        },
        "states": dict(answer.states),
        "moving": sorted(answer.moving),
        "hub": sorted(answer.hub),
    }
    return ANSWER_MARK + json.dumps(data, separators=(",", ":"))


def parse(site: str, cluster: ClusterConf, output: str) -> Answer:
    """The site's answer from its output (its last answer line)."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith(ANSWER_MARK)), None)
    if line is None:
        return Answer(site=site, error="no answer in its output: " + output.strip()[-300:])
    data = json.loads(line[len(ANSWER_MARK) :])
    f = data["facts"] or {"reachable": False, "nodes": 1, "starts": []}
    facts = SiteFacts(
        name=site,
        cluster=cluster,
        reachable=bool(f["reachable"]),
        nodes=int(f["nodes"]),
        starts={(int(n), int(m)): float(s) for n, m, s in f["starts"]},
        error=str(f.get("error") or ""),
    )
    return Answer(
        site=site,
        facts=facts,
        states=dict(data["states"]),
        moving=frozenset(data["moving"]),
        hub=frozenset(data["hub"]),
    )


@dataclass(frozen=True, kw_only=True)
class Decided:
    """Where each cell of the grid is, or goes, after this invocation's look at every site."""

    placed: Mapping[str, str]  # cell -> the site it is sent to now (it has no copy on any site that answered)
    kept: Mapping[str, str]  # cell -> the site that holds it (completed, in flight, or ended there): its refresh
    waiting: Mapping[str, str]  # cell -> the site, not answering, that the record sent it to
    states: Mapping[str, str] = field(default_factory=dict)  # cell -> its state where it is kept
    # cell -> why no site can take it now (every site's reason): it waits, the rest of the grid goes on
    unplaced: Mapping[str, str] = field(default_factory=dict)
    # cell -> the site it was let go from with --cancel: placed nowhere
    cancelled: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LetGo:
    """A cell the grid let go from a site (`sft-grid release`, recorded here): the site, and whether cancelled."""

    site: str
    cancel: bool = False


def let_go_of(record: Mapping[str, Mapping[str, Any]]) -> dict[str, LetGo]:
    """Cell name -> its let-go, from the grid's record of its sites here (sites/facts.py `read_record`)."""
    out: dict[str, LetGo] = {}
    for site, entry in sorted(record.items()):
        let = entry.get("let_go") or {}
        for name in let.get("cells") or () if isinstance(let, dict) else ():
            out[str(name)] = LetGo(site=site, cancel=bool(let.get("cancel")))
    return out


def decide(
    cells: Sequence[Any],
    answers: Sequence[Answer],
    recorded: Mapping[str, str],
    let_go: Mapping[str, LetGo] = {},
) -> Decided:
    """Each cell kept where it is, waiting for its site, or placed (see the module's docstring). Pure."""
    by_site = {a.site: a for a in answers}
    kept: dict[str, str] = {}
    waiting: dict[str, str] = {}
    avoid: dict[str, str] = {}
    cancelled: dict[str, str] = {}
    to_place = []
    states: dict[str, str] = {}
    for cell in cells:
        gone = let_go.get(cell.name)
        here = [
            (a.states[cell.name], a.site)
            for a in answers
            if a.answered
            and cell.name in a.states
            and cell.name not in a.moving
            # its copy on a site it was let go from counts only once completed there
            and not (gone and gone.site == a.site and a.states[cell.name] != State.COMPLETED.value)
        ]
        silent = recorded.get(cell.name)
        # its copy: a completed one first, then one in flight, then any (it failed or was cancelled there: that
        # site's own rules decide whether it runs again, as on one site: rerun_failed, its failure's policy)
        ranked = sorted(here, key=lambda h: (h[0] != State.COMPLETED.value, not State(h[0]).in_flight))
        if ranked:
            states[cell.name], kept[cell.name] = ranked[0]
        elif gone and gone.cancel and silent == gone.site:
            cancelled[cell.name] = gone.site
        elif silent and silent in by_site and not by_site[silent].answered and not (gone and gone.site == silent):
            waiting[cell.name] = silent
        else:
            moved = [a.site for a in answers if cell.name in a.moving]
            away = moved[0] if moved else gone.site if gone else ""
            if away:
                avoid[cell.name] = away
            to_place.append(cell)
    facts = [a.facts for a in answers if a.facts is not None]
    offline = [f.name for f in facts if not f.cluster.hub_reachable]
    placed: dict[str, str] = {}
    unplaced: dict[str, str] = {}
    for away in sorted({avoid.get(c.name, "") for c in to_place}):
        group = [c for c in to_place if avoid.get(c.name, "") == away]
        # a cell whose Hub inputs some site without a route to the Hub lacks goes where staging reaches the Hub
        needs = [placement.need_of(c, any(c.name in by_site[s].hub for s in offline)) for c in group]
        result = placement.place(needs, [f for f in facts if f.name != away])
        placed.update(result.sites)
        left = f" (it leaves {away})" if away else ""
        unplaced.update({p.cell: left + ": " + p.message.split(": ", 1)[-1] for p in result.problems})
    return Decided(placed=placed, kept=kept, waiting=waiting, states=states, unplaced=unplaced, cancelled=cancelled)


def sites_of(profiles: Mapping[str, ClusterConf]) -> list[remote.Site]:
    """Each profile as a remote site; raises GridError for one that lacks what a remote site needs."""
    problems = []
    found = []
    for name, c in profiles.items():
        if not c.remote.host or not c.remote.root:
            problems.append(
                Problem(
                    cell=GRID,
                    key=f"sites.{name}",
                    value=None,
                    rule="remote-root",
                    message=f"cluster {name} names no remote.root",
                    fix="set remote.root in its profile: a directory on the site for sft_grid's code snapshots",
                )
            )
        if not Path(c.runs_root).is_absolute():
            problems.append(
                Problem(
                    cell=GRID,
                    key=f"sites.{name}",
                    value=c.runs_root,
                    rule="remote-runs-root",
                    message=f"cluster {name}'s runs_root is relative: on the site it would be relative to a code"
                    " snapshot",
                    fix="set runs_root in its profile to an absolute path on the site",
                )
            )
        if c.remote.root and not Path(c.remote.root).is_absolute():
            problems.append(
                Problem(
                    cell=GRID,
                    key=f"sites.{name}",
                    value=c.remote.root,
                    rule="remote-root",
                    message=f"cluster {name}'s remote.root is relative: the site's folder for sft_grid's code"
                    " snapshots must be an absolute path there",
                    fix="set remote.root in its profile to an absolute path on the site",
                )
            )
        found.append(remote.Site.of(name, c.remote, c.runs_root))  # its ssh timeouts and bounds with it
    if found and (own := remote.own_configs_problem("sites", ", ".join(sorted(profiles)))) is not None:
        problems.append(own)
    if problems:
        raise GridError(problems, "the sites")
    return found


def site_argv(argv: Sequence[str], site: str) -> list[str]:
    """The grid command's arguments as a site runs them: its own cluster profile; its runs root the profile's."""
    kept = [a for a in argv if not a.startswith(("runs_root=", "cluster="))]
    return [*kept, f"cluster={site}"]


def _ask(
    site: remote.Site,
    cluster: ClusterConf,
    code: CodeSnapshot,
    argv: Sequence[str],
    t: Ssh,
    let_go: Mapping[str, LetGo] = {},
) -> Answer:
    """The site's answer for the grid: its own invocation, asked for its answer (sites/call.py), from the snapshot."""
    # cells let go from this site: gated there before it answers (sites/moves.py)
    gone = tuple(sorted(n for n, g in let_go.items() if g.site == site.name))
    asked = SiteCall(site=site.name, answer=True, let_go=gone, cancel=tuple(n for n in gone if let_go[n].cancel))
    try:
        snapshot.materialize(code, t)
        there = remote.there(site, code.dir, ["-m", "sft_grid", *site_argv(argv, site.name)], asked)
        done = t.run(there, check=False, timeout=900)
    except SiteUnreachable as exc:
        return Answer(site=site.name, error=str(exc))
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()
        return Answer(site=site.name, error=f"its answer failed (exit status {done.returncode}): {err[-500:]}")
    return parse(site.name, cluster, done.stdout.decode(errors="replace"))


# the lock file of a grid's launches, in the grid's directory on each site, and how long a launch waits for another
LAUNCH_LOCK = ".sft_grid.launch.lock"
LAUNCH_WAIT_S = 900
# the site's side of the lock, run from the launch's snapshot there: sft_grid's own lock (core/lock.py: no flock, which
# a cluster filesystem may grant to everyone; a holder killed on the site is seen dead at once there, and from another
# login node once its heartbeat stops). argv: the lock file, the wait (s). Prints "held" once it holds the lock, then
# holds it until its stdin ends (this launch closes it, or its ssh session ends); "busy <who holds it>" and exit 3
# when the wait runs out first.
_HOLD = """
import signal, sys
from pathlib import Path
from sft_grid.core.lock import Lock, LockTimeout
def end(*_):
    raise SystemExit(1)
signal.signal(signal.SIGHUP, end)
signal.signal(signal.SIGTERM, end)
path = Path(sys.argv[1])
path.parent.mkdir(parents=True, exist_ok=True)
lock = Lock(path, timeout_s=float(sys.argv[2]))
try:
    lock.acquire()
except LockTimeout as exc:
    print("busy " + " ".join(str(exc).split()), flush=True)
    sys.exit(3)
try:
    print("held", flush=True)
    sys.stdin.buffer.read()
finally:
    lock.release()
"""


class LaunchBusy(RuntimeError):
    """Another launch of the grid held its lock on a site for longer than this one waits."""


@contextlib.contextmanager
def hold_launch(
    sites: Sequence[remote.Site],
    transports: Mapping[str, Transport],
    codes: Mapping[str, CodeSnapshot],
    sweeps: Sequence[str],
    wait_s: float,
) -> Iterator[list[str]]:
    """Hold each grid's launch lock on every site that answers, in the sites' name order (two launches never wait
    for each other in a circle), for the body; yields the sites that answered none (no lock there). Raises
    LaunchBusy when another launch holds one for longer than `wait_s`."""
    held: list[subprocess.Popen[bytes]] = []
    silent: list[str] = []
    try:
        for site in sorted(sites, key=lambda s: s.name):
            t = transports[site.name]
            for sweep in sweeps:
                path = str(PurePosixPath(site.runs_root) / sweep / LAUNCH_LOCK)
                try:
                    snapshot.materialize(codes[site.name], t)  # the lock's code, as the site runs it
                    proc = t.start(remote.there(site, codes[site.name].dir, ["-c", _HOLD, path, f"{wait_s:g}"]))
                except SiteUnreachable:
                    silent.append(site.name)
                    break
                held.append(proc)
                assert proc.stdout is not None
                said = proc.stdout.readline().decode(errors="replace").strip()
                if said == "held":
                    continue
                if said.startswith("busy"):
                    raise LaunchBusy(
                        f"another launch of grid {sweep} holds it on site {site.name} ({said[5:]}); run the same"
                        " command again once it has ended"
                    )
                silent.append(site.name)  # the connection failed, or the site's python: nothing is placed there
                break
        yield silent
    finally:
        for proc in held:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
        for proc in held:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def launch(cells: Sequence[Any], profiles: Mapping[str, ClusterConf], argv: Sequence[str], records: Path) -> int:
    """Look at every site, place the cells, record, and run each site's share there (see the module's docstring).
    Returns the exit status: 0 when every site that was sent cells queued them."""
    sites = sites_of(profiles)
    dry_run = any(c.spec.dry_run for c in cells)
    codes = dict(zip((s.name for s in sites), remote.code_for(cells, dry_run, [s.store for s in sites]), strict=True))
    transports = {s.name: s.transport() for s in sites}
    # every site's python and sft_grid's dependencies there, before anything is sent to any of them
    remote.check_pythons({s: transports[s.name] for s in sites})
    sweeps = sorted({c.spec.sweep_name for c in cells})
    let_go: dict[str, LetGo] = {}
    for sweep in sweeps:
        let_go.update(let_go_of(site_facts.read_record(records / sweep)))
    try:  # (a dry run writes nothing on any site: it holds no lock)
        with hold_launch(() if dry_run else sites, transports, codes, sweeps, LAUNCH_WAIT_S) as silent:
            with ThreadPoolExecutor(max_workers=len(sites)) as pool:
                futures = [
                    pool.submit(_ask, s, profiles[s.name], codes[s.name], argv, transports[s.name], let_go)
                    for s in sites
                    if s.name not in silent
                ]
                answers = [f.result() for f in futures]
            answers += [Answer(site=s, error="it did not answer for the grid's launch lock") for s in silent]
            recorded: dict[str, str] = {}
            for sweep in sweeps:
                recorded.update(remote.recorded_cells(records / sweep))
            decided = decide(cells, answers, recorded, let_go)
            for a in answers:
                if not a.answered:
                    print(f"site {a.site} did not answer: {a.error}", file=sys.stderr, flush=True)
                elif a.facts is not None and not a.facts.reachable:
                    why = f": {a.facts.error}" if a.facts.error else ""
                    print(f"site {a.site}: its Slurm controller did not answer{why}", file=sys.stderr, flush=True)
            for name, site in sorted(decided.waiting.items()):
                print(f"  {name}: waits for site {site} (sent there, which does not answer)", flush=True)
            for name, why in sorted(decided.unplaced.items()):
                print(f"  {name}: waiting{why}; the next run places it once a site can take it", flush=True)
            for name, site in sorted(decided.cancelled.items()):
                print(f"  {name}: cancelled (its site {site} was let go with --cancel)", flush=True)
            for name, site in sorted(decided.placed.items()):
                if name in let_go:
                    print(f"  {name}: placed on {site} (its site {let_go[name].site} was let go)", flush=True)
            counts: dict[str, int] = {}
            for state in decided.states.values():
                counts[state] = counts.get(state, 0) + 1
            held = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            print(
                f"grid of {len(cells)} cell(s) across {len(sites)} site(s): {len(decided.kept)} on a site"
                + (f" ({held})" if held else "")
                + f", {len(decided.waiting)} waiting for their site, {len(decided.placed)} to place"
                + (f", {len(decided.unplaced)} waiting for a site that can take them" if decided.unplaced else ""),
                flush=True,
            )
            if not dry_run:
                placed = [
                    remote.Placed(
                        site=s, code_dir=codes[s.name].dir, code=codes[s.name].key, commit=codes[s.name].commit
                    )
                    for s in sites
                ]
                for sweep in sweeps:
                    names = {c.name for c in cells if c.spec.sweep_name == sweep}
                    remote.write_record(
                        records / sweep, placed, {n: s for n, s in decided.placed.items() if n in names}
                    )
            status = 0
            controller = {a.site: a.facts is not None and a.facts.reachable for a in answers}
            for s in sites:
                new = sorted(n for n, site in decided.placed.items() if site == s.name)
                share = sorted([*new, *(n for n, site in decided.kept.items() if site == s.name)])
                if not share:
                    continue
                if not controller.get(s.name):  # nothing is placed there; its cells are refreshed once it answers
                    print(f"site {s.name}: {len(share)} cell(s) there wait for its Slurm controller", flush=True)
                    continue
                # every site that holds cells runs the grid command for them: its refresh, as a run on one site is
                # (completed cells skipped, failures triaged, post-training and scores caught up)
                print(f"{len(share)} cell(s) on site {s.name} ({len(new)} new; {s.host}:{s.runs_root})", flush=True)
                asked = SiteCall(site=s.name, only=tuple(share))
                there = remote.there(s, codes[s.name].dir, ["-m", "sft_grid", *site_argv(argv, s.name)], asked)
                try:
                    status = transports[s.name].stream(there, timeout=s.launch_timeout_s) or status
                except SiteUnreachable as exc:
                    print(f"site {s.name} stopped answering: {exc}. Run the same command again", file=sys.stderr)
                    status = 1
            return status
    except LaunchBusy as exc:
        print(f"grid not launched: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for t in transports.values():
            t.close()
