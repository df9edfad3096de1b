"""A grid across remote sites, decided here (sft_grid/sites/coordinate.py): which cell stays where it is, which waits
for a site that does not answer (or for a site that can take it), which is placed, from the sites' answers. Pure and
fast; the answers are parsed from the line a site prints (`answer_line`, the site's side of the protocol); the cells
carry what placement reads of a composed cell. tests/test_sites_across.py runs the whole of it over sshd and two Slurm
clusters."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from sft_grid.core.problems import GridError
from sft_grid.core.schema import ClusterConf, RemoteConf
from sft_grid.sites.coordinate import Answer, answer_line, decide, parse, site_argv, sites_of
from sft_grid.sites.placement import SiteFacts

A = ClusterConf(name="a", executor="slurm", max_nodes=1, max_time="24:00:00")
B = ClusterConf(name="b", executor="slurm", max_nodes=4, max_time="24:00:00", hub_reachable=False)
PROFILES = {"a": A, "b": B}


def cell(name: str, nodes: int = 1) -> SimpleNamespace:
    spec = SimpleNamespace(
        nodes=nodes,
        time="01:00:00",
        site_needs=SimpleNamespace(cpu_arch=None, gpu_type=None, gpu_mem_gb=None, internet=False),
        dry_run=False,
    )
    return SimpleNamespace(name=name, spec=spec)


def answer(site: str, states: dict[str, str] | None = None, reachable: bool = True, **kw: object) -> Answer:
    """A site's answer as the site prints it and this side parses it."""
    cluster = PROFILES[site]
    facts = SiteFacts(name=site, cluster=cluster, reachable=reachable, nodes=2, starts={(1, 60): 10.0})
    said = Answer(site=site, facts=facts, states=states or {}, **kw)  # type: ignore[arg-type]
    line = answer_line(said)
    return parse(site, cluster, "some of the site's own output\n" + line + "\n")


def test_the_answer_line_round_trips_and_a_missing_one_is_no_answer() -> None:
    got = answer("b", {"x": "running"}, moving=["y"], hub=["z"])
    assert got.answered and got.facts is not None and got.facts.starts == {(1, 60): 10.0} and got.facts.nodes == 2
    assert got.states == {"x": "running"} and got.moving == {"y"} and got.hub == {"z"}
    none = parse("b", B, "Traceback: the site's python failed\n")
    assert not none.answered and "Traceback" in none.error
    unreached = parse("b", B, answer_line(Answer(site="b")))  # the site's python ran, its Slurm was not asked
    assert unreached.answered and unreached.facts is not None and not unreached.facts.reachable


def test_a_cell_with_a_copy_on_a_site_stays_there_and_only_a_new_one_is_placed() -> None:
    """Completed or in flight: never queued twice, wherever it is. Failed: its site's own rules decide whether it
    runs again (rerun_failed, its failure's policy), as on one site; it is not sent to another site on its own."""
    cells = [cell("done"), cell("live"), cell("new"), cell("failed"), cell("twice")]
    answers = [
        answer("a", {"done": "completed", "failed": "failed", "twice": "failed"}),
        answer("b", {"live": "submitted", "twice": "completed"}),
    ]
    d = decide(cells, answers, {})
    assert d.kept == {"done": "a", "live": "b", "failed": "a", "twice": "b"}
    assert d.states == {"done": "completed", "live": "submitted", "failed": "failed", "twice": "completed"}
    assert set(d.placed) == {"new"} and not d.unplaced


def test_a_cell_sent_to_a_silent_site_waits_for_it() -> None:
    """A site that does not answer over ssh may hold the cell queued: it is never queued elsewhere on a guess."""
    silent = Answer(site="b", error="ssh: connect to host: Connection refused")
    d = decide([cell("x"), cell("y")], [answer("a"), silent], {"x": "b"})
    assert d.waiting == {"x": "b"} and d.placed == {"y": "a"}


def test_a_confirmed_move_goes_elsewhere_never_back() -> None:
    """site b's controller is down: it confirmed the move of `m` (its gate claimed there); `m` is placed on a."""
    answers = [answer("a"), answer("b", {"m": "submitted"}, reachable=False, moving=["m"])]
    d = decide([cell("m")], answers, {"m": "b"})
    assert d.placed == {"m": "a"} and not d.kept
    only_b = decide([cell("m")], answers[1:], {"m": "b"})
    # nowhere else to go: it waits, with the reason (the rest of the grid is not refused for it)
    assert not only_b.placed and set(only_b.unplaced) == {"m"} and "leaves b" in only_b.unplaced["m"]


def test_constraints_and_the_hub_decide_the_site() -> None:
    """Two nodes fit only b; a cell whose Hub inputs b lacks (b has no route to the Hub) goes to a."""
    d = decide([cell("big", nodes=2), cell("hub")], [answer("a"), answer("b", hub=["hub"])], {})
    assert d.placed == {"big": "b", "hub": "a"}
    d = decide([cell("big", nodes=2)], [answer("a"), answer("b", hub=["big"])], {})
    assert not d.placed and set(d.unplaced) == {"big"} and "cannot stage from the Hub" in d.unplaced["big"]


def test_a_site_runs_its_own_profile_and_runs_root() -> None:
    argv = ["-m", "+sweep=s", "cluster=local", "runs_root=/here", "lr=1e-5"]
    assert site_argv(argv, "b") == ["-m", "+sweep=s", "lr=1e-5", "cluster=b"]


def test_a_remote_profile_without_its_roots_is_refused_naming_the_key() -> None:
    ok = replace(A, runs_root="/scratch/runs", remote=RemoteConf(host="a", root="/work/sft"))
    bad = replace(B, runs_root="runs", remote=RemoteConf(host="b"))
    with pytest.raises(GridError) as err:
        sites_of({"a": ok, "b": bad})
    text = str(err.value)
    assert "sites.b" in text and "remote.root" in text and "runs_root" in text and "sites.a" not in text
    (site,) = sites_of({"a": ok})
    assert (site.host, site.root, site.runs_root) == ("a", "/work/sft", "/scratch/runs")


def test_a_site_let_go_no_longer_holds_its_cells() -> None:
    """`sft-grid release GRID --site b` (recorded here): the cells the record sent to b are placed on another site
    instead of waiting for it, or, let go with --cancel, nowhere; b's copies count again only once completed."""
    from sft_grid.sites.coordinate import LetGo, let_go_of

    record: dict[str, dict[str, object]] = {
        "b": {"let_go": {"cells": ["x", "y"], "cancel": False}},
        "a": {"silent_since": 1.0},
    }
    assert let_go_of(record) == {"x": LetGo(site="b"), "y": LetGo(site="b")}
    silent = Answer(site="b", error="ssh: connect to host: Connection refused")
    d = decide([cell("x"), cell("y")], [answer("a"), silent], {"x": "b", "y": "b"}, let_go_of(record))
    assert d.placed == {"x": "a", "y": "a"} and not d.waiting
    cancelled = {"x": LetGo(site="b", cancel=True)}
    d = decide([cell("x")], [answer("a"), silent], {"x": "b"}, cancelled)
    assert d.cancelled == {"x": "b"} and not d.placed and not d.waiting
    # b answers again: its old copy in flight does not hold the cell (its invocation gates it there); a completed
    # one does
    back = answer("b", {"x": "submitted", "y": "completed"})
    d = decide([cell("x"), cell("y")], [answer("a"), back], {"x": "b", "y": "b"}, let_go_of(record))
    assert d.placed == {"x": "a"} and d.kept == {"y": "b"}


def test_a_launch_that_finds_the_grid_held_on_a_site_waits_then_names_its_holder(tmp_path) -> None:
    """The launch lock's site side, run as a site runs it (the snapshot's python, here over the local transport, a
    process that holds the lock until its stdin ends): a second launch waits its bound and is refused naming the
    holder; once the first ends, the next takes it."""
    import os
    import sys

    from sft_grid.core.paths import REPO_ROOT
    from sft_grid.core.submission import CodeSnapshot
    from sft_grid.sites.coordinate import LAUNCH_LOCK, LaunchBusy, hold_launch
    from sft_grid.sites.remote import Site
    from sft_grid.sites.snapshot import MARKER
    from sft_grid.sites.transport import Local

    code = tmp_path / "code"
    code.mkdir()
    os.symlink(REPO_ROOT / "sft_grid", code / "sft_grid")  # the snapshot's package, as extracted there
    (code / MARKER).write_text("{}")  # in place: nothing to extract
    site = Site("a", "host-a", str(tmp_path), sys.executable, None, str(tmp_path / "runs"))
    codes = {"a": CodeSnapshot(commit="c", key="c", dir=code, checkout=REPO_ROOT)}
    transports = {"a": Local(name="a")}
    lock = tmp_path / "runs" / "grid" / LAUNCH_LOCK
    with hold_launch([site], transports, codes, ["grid"], wait_s=5) as silent:
        assert silent == [] and lock.is_file() and "pid" in lock.read_text()
        busy = hold_launch([site], transports, codes, ["grid"], wait_s=0.5)
        with pytest.raises(LaunchBusy, match=r"another launch of grid grid holds it on site a \(.*pid"), busy:
            pass
    assert not lock.exists()  # let go when the first launch ended
    with hold_launch([site], transports, codes, ["grid"], wait_s=5) as silent:
        assert silent == [] and lock.is_file()
    assert not lock.exists()
