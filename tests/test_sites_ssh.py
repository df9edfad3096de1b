"""The ssh side of remote sites against a real sshd on loopback (tests/sshd.py) and the ways real networks fail.

- A connection that goes silent once made (a laptop asleep, a VPN dropped, a site that drops packets): a TCP
  forwarder between ssh and the sshd (`Forwarder`, threads of this process) carries the bytes until the site's
  python starts the command, then reads and drops them without closing. A launch and a status over it end within
  the keepalive (ServerAliveInterval x ServerAliveCountMax, 1 s x 2 here) and name the site; nothing hangs.
- A site that never answers: the forwarder silent from the first byte (no banner), and a listening socket whose
  queue is full (no SYN-ACK): each is given up after ConnectTimeout.
- A command stuck on the site is stopped at its call's bound (`remote.timeout_s`).
- `results` and `report` of a grid across two sites pull only the files they read; a site whose pull outlives its
  bound is named, with what the output lacks, and the other site's cells are shown.
- The site's python: one older than sft_grid's `requires-python`, or a fresh virtualenv's without its dependencies,
  is refused in one line before anything is sent (the site's root stays empty); a good one passes, asked once.

Every wait is on an event (a connection made to the forwarder's trigger, a process's end) with a deadline; the
limits are a few seconds, the deadlines tens, for CI's two slow cores. The sshd is this module's; the tests share
the `sites_remote` worker with the other site tests (each checks that no control socket is left behind).
"""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sft_grid.cli import across
from sft_grid.core.paths import REPO_ROOT, cache_root
from sft_grid.sites import merged, remote
from sft_grid.sites.remote import Placed, Site, write_record
from sft_grid.sites.transport import SiteTimeout, SiteUnreachable, Ssh

from . import sshd
from .test_across import SWEEP, heavy, make_spread, pulled, site_cell

pytestmark = [pytest.mark.sites, pytest.mark.xdist_group("sites_remote")]

CLI = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"  # sft-grid, from this tree
ENV = {"SFT_GRID_CACHE": str(cache_root())}
# the keepalive of the silent connections' sites: a made connection silent for 2 s is dead
QUICK = {"connect_timeout_s": 3, "alive_interval_s": 1, "alive_count_max": 2}
DEADLINE_S = 60  # how long a test waits for what should take seconds


class Forwarder:
    """A TCP path to the sshd that can go silent: it carries the bytes both ways until `hole` is set, then reads and
    drops them, never closing (a half-open connection). `holed`: silent from the first byte (a site that accepts
    the connection and never speaks: it is not even connected upstream). A connection to `trigger_port` sets the
    hole (the site's python connects to it as a command starts: the connection goes silent mid-command)."""

    def __init__(self, target: int, holed: bool = False) -> None:
        self.target = target
        self.hole = threading.Event()
        self.holed_at = time.monotonic()
        if holed:
            self.hole.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.trigger = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.trigger_port = self.trigger.getsockname()[1]
        self.sockets: list[socket.socket] = []
        for run in (self._serve, self._arm):
            threading.Thread(target=run, daemon=True).start()

    def _arm(self) -> None:
        try:
            conn, _ = self.trigger.accept()
        except OSError:
            return
        self.holed_at = time.monotonic()
        self.hole.set()
        conn.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.sockets.append(client)
            threading.Thread(target=self._pipe, args=(client,), daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        peers: dict[socket.socket, socket.socket | None] = {client: None}
        if not self.hole.is_set():
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.sockets.append(upstream)
            peers = {client: upstream, upstream: client}
        while True:
            try:
                ready, _, _ = select.select(list(peers), [], [])
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other = peers[sock]
                    if other is not None and not self.hole.is_set():
                        other.sendall(data)
            except (OSError, ValueError):  # closed by `close`
                return

    def close(self) -> None:
        for sock in (self.listener, self.trigger, *self.sockets):
            sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sshd.Sshd]:
    base = tmp_path_factory.mktemp("ssh")
    running = sshd.start(base / "sshd", {"site_a": {}, "site_b": {}}, env=ENV)
    try:
        yield running
        # every connection of the module ended with its test (the forwarders closed theirs)
        deadline = time.monotonic() + DEADLINE_S
        while running.sessions():
            assert time.monotonic() < deadline, f"ssh sessions left on the site: {running.sessions()}"
            time.sleep(0.2)
    finally:
        running.stop()


@pytest.fixture
def forwarders() -> Iterator[list[Forwarder]]:
    made: list[Forwarder] = []
    yield made
    for f in made:
        f.close()


def silencing_python(where: Path, trigger_port: int, when: str) -> Path:
    """The site's python, which makes the forwarder go silent as it starts a command whose first two arguments
    hold `when`, then runs as this python: the connection works until the site is mid-command."""
    script = where / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, socket, sys\n"
        f"if {when!r} in ' '.join(sys.argv[1:3]):\n"
        f"    socket.create_connection(('127.0.0.1', {trigger_port})).close()\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    return script


def launch(server: sshd.Sshd, where: Path, host: str, python: str | Path, *more: str) -> subprocess.Popen[str]:
    """A dry run of one synthetic cell launched on `host` (the local executor there: no Slurm, no training), its
    site's root `where/site`, the laptop's runs root `where/laptop`."""
    root = where / "site"
    args = [
        "-m",
        "+sweep=synthetic_delphi",
        "vars.model=delphi-3e18",
        "vars.recipe=magpie",
        "dry_run=true",
        "cluster=local",
        "sweep_name=far",
        f"runs_root={root / 'runs'}",
        f"cluster.remote.host={host}",
        f"cluster.remote.root={root}",
        f"cluster.remote.ssh_config={server.config}",
        f"cluster.remote.python={python}",
        *more,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SFT_GRID_RUNS": str(where / "laptop")}
    return subprocess.Popen(
        [sys.executable, "-m", "sft_grid", *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def quick(*keys: str) -> list[str]:
    return [f"cluster.remote.{k}={v}" for k, v in QUICK.items() if not keys or k in keys]


# -- connections that go silent, or are never made -------------------------------------------------------------


def test_a_launch_whose_connection_goes_silent_ends_within_the_keepalive(server, forwarders, tmp_path: Path):
    """The python check passes and the snapshot goes over; the connection then goes silent as the site's run
    starts: the launch ends once the keepalive gives up (2 s), names the site, and records nothing."""
    path = Forwarder(server.port)
    forwarders.append(path)
    server.add_host("silent_launch", path.port, ENV)
    python = silencing_python(tmp_path, path.trigger_port, "-m sft_grid")
    started = time.monotonic()
    proc = launch(server, tmp_path, "silent_launch", python, *quick())
    assert path.hole.wait(timeout=300), "the site's run never started"
    out, err = proc.communicate(timeout=DEADLINE_S)
    ended = time.monotonic()
    assert proc.returncode == 1, out + err
    assert "cannot reach site local: ssh silent_launch: the connection failed (exit status 255" in err, err
    assert "ServerAliveInterval 1 s x ServerAliveCountMax 2" in err and "Traceback" not in err, err
    assert ended - path.holed_at < 20, (ended - path.holed_at, ended - started)
    # the site's python passed its check: the snapshot was sent, and the site's run began
    assert [p.name for p in (tmp_path / "site" / "code").iterdir() if not p.name.startswith(".")]
    assert not (tmp_path / "laptop" / "far").exists()  # no record: the launch did not end


def test_status_over_a_connection_that_goes_silent_names_the_site(server, forwarders, tmp_path: Path):
    path = Forwarder(server.port)
    forwarders.append(path)
    server.add_host("silent_status", path.port, ENV)
    python = silencing_python(tmp_path, path.trigger_port, "sft_grid.cli.main")
    laptop, runs = tmp_path / "laptop", tmp_path / "site" / "runs"
    (runs / "g").mkdir(parents=True)
    site = Site("far", "silent_status", str(tmp_path / "site"), str(python), str(server.config), str(runs), **QUICK)
    write_record(laptop / "g", [Placed(site=site, code_dir=REPO_ROOT)])
    env = {**os.environ, "SFT_GRID_RUNS": str(laptop)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "status", "g"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert path.hole.wait(timeout=DEADLINE_S), "the site's status never started"
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert time.monotonic() - path.holed_at < 20
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert "site far did not answer: ssh silent_status: the connection failed (exit status 255" in err, err


@pytest.mark.parametrize("kind", ["no banner", "no SYN-ACK"])
def test_a_site_that_never_answers_is_given_up_after_the_connect_timeout(server, forwarders, kind: str):
    """A site that accepts the connection and never speaks, and one whose SYN is never answered (a listening
    socket whose queue is full): each given up after ConnectTimeout (2 s), in one line that says so."""
    if kind == "no banner":
        mute = Forwarder(server.port, holed=True)
        forwarders.append(mute)
        port = mute.port
    else:
        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        filler = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)  # the queue's one place
    host = f"mute_{kind.rsplit(maxsplit=1)[-1].replace('-', '_').lower()}"
    server.add_host(host, port)
    transport = Ssh(host, server.config, connect_timeout_s=2, alive_interval_s=1, alive_count_max=2)
    started = time.monotonic()
    try:
        with pytest.raises(SiteUnreachable) as raised:
            transport.run(["true"])
    finally:
        transport.close()
        if kind != "no banner":
            filler.close()
            full.close()
    took = time.monotonic() - started
    said = str(raised.value)
    assert 1.5 < took < 20, took
    assert "timed out" in said and "ConnectTimeout 2 s" in said and "\n" not in said, said


def test_a_stuck_command_is_stopped_at_its_bound_and_ends_on_the_site(server, tmp_path: Path):
    """A command that never answers is stopped after the call's bound (2 s): SiteTimeout, one line; the site's
    process ends with the channel (it waits for its output's reader to go)."""
    ended = tmp_path / "ended"
    waits = (
        f"import select; p = select.poll(); p.register(1, select.POLLERR); p.poll(); open({str(ended)!r}, 'w').close()"
    )
    transport = Ssh("site_a", server.config, timeout_s=2)
    started = time.monotonic()
    try:
        with pytest.raises(SiteTimeout) as raised:
            transport.run([sys.executable, "-c", waits])
    finally:
        transport.close()
    assert 1.5 < time.monotonic() - started < 20
    assert str(raised.value).startswith("ssh site_a: no answer within 2 s (") and "\n" not in str(raised.value)
    deadline = time.monotonic() + DEADLINE_S
    while not ended.exists():
        assert time.monotonic() < deadline, "the stuck command is still running on the site"
        time.sleep(0.1)


def test_the_limits_are_the_profiles_else_the_ssh_configs_else_sft_grids(server):
    """ssh's own config for the host wins over sft_grid's defaults (site_down's entry says ConnectTimeout 10); a
    profile's value wins over both."""
    assert Ssh("site_a", server.config).limits() == (30, 15, 4)
    mine = Ssh("site_down", server.config)
    assert mine.limits()[0] == 10 and "ConnectTimeout=30" not in " ".join(mine.base())
    profile = Ssh("site_down", server.config, connect_timeout_s=7, alive_interval_s=2, alive_count_max=3)
    assert profile.limits() == (7, 2, 3) and "ConnectTimeout=7" in profile.base()


# -- results and report across two sites --------------------------------------------------------------------------


def stuck_python(where: Path) -> Path:
    """The site's python, whose pull (merged.PULL) never answers: it waits until its output's reader goes."""
    script = where / "stuck_python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, select, sys\n"
        f"if sys.argv[1:2] == ['-c'] and {merged.PULL[:60]!r} in sys.argv[2]:\n"
        "    p = select.poll(); p.register(1, select.POLLERR); p.poll(); sys.exit(1)\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    return script


def test_results_and_report_over_ssh_pull_what_they_read_and_name_a_stuck_site(
    server, make_cells, tmp_path: Path, capsys
):
    def site(tmp: Path, name: str) -> Site:
        return Site(name, f"site_{name}", str(tmp / name), sys.executable, str(server.config), str(tmp / name / "runs"))

    spread = make_spread(make_cells, tmp_path, site)
    heavy(site_cell(spread, 1, 1))
    argv = [SWEEP, "--runs-root", str(spread.here)]

    def forward(*args: str) -> int:
        return across.forward(args[0], [*argv, *args[1:]], SWEEP, spread.grid_here, spread.placed)

    before = server.accepted()
    assert forward("results", "--format", "json") == 0
    assert server.accepted() - before == 2  # one connection a site
    got = pulled(spread.grid_here, "b")
    name = spread.cells[1]
    assert f"{name}/output/trainer_log.jsonl" in got and got[f"{name}/output/model.safetensors"] == 0
    assert not [k for k in got if "/logs/" in k or "checkpoint-" in k or k.endswith("tokenizer.json")], got
    assert forward("report", "--resamples", "0") == 0
    assert (spread.grid_here / "report.html").is_file()
    capsys.readouterr()

    # site b's pull never answers: stopped after its bound, named with what the output lacks; a's cells shown
    b = spread.placed[1]
    spread.placed[1] = dataclasses.replace(
        b, site=dataclasses.replace(b.site, python=str(stuck_python(tmp_path)), timeout_s=3)
    )
    started = time.monotonic()
    assert forward("results", "--format", "csv") == 1
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert took < 3 + 20, took
    (line,) = [ln for ln in err.splitlines() if ln.startswith("site b")]
    assert line.startswith("site b did not answer: ssh site_b: no answer within 3 s ("), line
    assert "2 are shown as pulled at " in line and spread.cells[2] in line, line
    rows = {r.split(",")[0]: r for r in out.splitlines()[1:]}
    assert ",completed,a," in rows[spread.cells[0]], out
    assert forward("report", "--resamples", "0") == 1  # written from what is here, and said so
    assert "site b did not answer" in capsys.readouterr().err


# -- the site's python --------------------------------------------------------------------------------------------


def older_python() -> str | None:
    """A python on this machine older than sft_grid's requires-python (RHEL's 3.6 and 3.9 stand-ins), or None."""
    import glob
    import shutil

    found = [
        *glob.glob("/usr/bin/python3.[0-9]*"),
        *glob.glob("/usr/local/bin/python3.[0-9]*"),
        *glob.glob(str(Path.home() / ".pyenv" / "versions" / "*" / "bin" / "python")),
        *(w for v in range(6, 11) if (w := shutil.which(f"python3.{v}"))),
    ]
    for path in sorted(set(found)):
        if path.endswith("-config") or not os.access(path, os.X_OK):
            continue
        said = subprocess.run([path, "-c", "import sys; print(sys.version_info >= (3, 11))"], capture_output=True)
        if said.returncode == 0 and said.stdout.strip() == b"False":
            return path
    return None


@pytest.mark.parametrize("which", ["a virtualenv without sft_grid's dependencies", "an older python"])
def test_a_site_python_that_cannot_run_sft_grid_is_refused_before_anything_is_sent(server, tmp_path: Path, which):
    if which.startswith("a virtualenv"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        python: str | None = str(tmp_path / "venv" / "bin" / "python")
        wrong = "without sft_grid's dependencies (not installed: hydra-core, omegaconf, submitit"
    else:
        python = older_python()
        if python is None:
            pytest.skip("no python older than 3.11 on this machine")
        wrong = "; sft_grid needs Python >=3.11; fix: set remote.python=/path/to/python3.11"
    before = server.accepted()
    proc = launch(server, tmp_path, "site_a", str(python))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("site local:")]
    assert line.startswith(f"site local: remote.python {python} is Python ") and wrong in line, line
    assert "fix: " in line and "Traceback" not in err
    assert server.accepted() - before == 1  # the check's one connection
    assert not (tmp_path / "site").exists()  # nothing was sent: the site's root stays empty
    assert not (tmp_path / "laptop" / "far").exists()


def test_a_good_python_passes_and_is_asked_once_per_site_and_python(server):
    site = Site("far", "site_a", "/nowhere", sys.executable, str(server.config), "/nowhere/runs")
    transport = Ssh("site_a", server.config)
    asked: list[list[str]] = []
    run = transport.run

    def counted(argv, *args, **kwargs):
        asked.append(list(argv))
        return run(argv, *args, **kwargs)

    transport.run = counted
    remote._CHECKED.clear()
    try:
        remote.check_python(site, transport)
        remote.check_python(site, transport)
        remote.check_pythons({site: transport, dataclasses.replace(site, name="other"): transport})
    finally:
        transport.close()
    assert [a[0] for a in asked] == [sys.executable, sys.executable]  # far once, other once
