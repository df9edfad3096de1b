"""A grid on a remote site, driven from the machine it is launched from.

A cluster with `remote.host` (a Host of the user's ssh config) and `remote.root` is reached over OpenSSH
(sites/transport.py: one control connection for the whole command, closed at its end). Launching a grid there:

1. here: compose, validate (every rule over every cell, raised before anything is written or sent) and the
   checkout's gate (sites/snapshot.py: a checkout with uncommitted changes is refused, naming the files);
2. over ssh: the site's python is checked (`check_python`: its version and sft_grid's dependencies within
   pyproject.toml's ranges, refused in one line before anything is sent); the launch's commit is extracted once into
   `<remote.root>/code/<key>` (a `git archive` stream: the site needs neither the git remote nor git);
3. over the same connection: the site runs the grid command with the same arguments, from that snapshot, with the
   site's python: the checks that need the site's files, environments and Hub cache, the staging, the rendering
   into the site's runs root and the sbatch calls happen there, and its output streams back here. Its jobs run the
   snapshot (the site's invocation finds it by its marker file and pins every job to it).

The grid's record here, `<runs root here>/<sweep_name>/.site.json`, names the site, so `sft-grid status`, `logs`,
`cancel`, `results` and `report` given that grid run there too: one ssh command each, one round trip a refresh
(`status --watch` streams its redraws over that one command). `report` copies its page and data back here.

What a site needs: an sshd that the user's keys reach (jump hosts as their ssh config says), `sh` and `tar`, Slurm's
client commands, and a python with sft_grid's dependencies (`remote.python`); the backends' environments are built or
found there as on any site. What it does not need: git, a checkout, the git remote, a daemon (nothing of sft_grid
runs there between commands), an open port besides sshd's, or sft_grid installed (each command runs from its
snapshot).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sft_grid.core.paths import REPO_ROOT
from sft_grid.core.problems import GRID, GridError, Problem
from sft_grid.core.submission import CodeSnapshot
from sft_grid.sites import call, snapshot
from sft_grid.sites.call import SiteCall
from sft_grid.sites.transport import TIMEOUT_S, SiteUnreachable, Ssh, Transport, one_line

if TYPE_CHECKING:
    from sft_grid.core.schema import RemoteConf

RECORD = ".site.json"
# commands that read or act on a launched grid: run on its site when the grid is remote
FORWARDED = ("status", "logs", "cancel", "results", "report")
CODE_DIR = "code"
LAUNCH_TIMEOUT_S = 43200  # a launch's run on the site, streamed here (RemoteConf.launch_timeout_s's default)


@dataclass(frozen=True)
class Site:
    """A remote site as a grid's cells name it: where it is, and how long its connections and commands may take
    (the profile's `remote:` section; None: the ssh config's own, else sites/transport.py's defaults)."""

    name: str  # the cluster config's name
    host: str
    root: str
    python: str
    ssh_config: str | None
    runs_root: str  # the cells' runs root, on the site
    connect_timeout_s: int | None = None
    alive_interval_s: int | None = None
    alive_count_max: int | None = None
    timeout_s: int = TIMEOUT_S
    launch_timeout_s: int = LAUNCH_TIMEOUT_S

    @classmethod
    def of(cls, name: str, remote: RemoteConf, runs_root: str) -> Site:
        """The site of cluster profile `name` (its `remote:` section, a RemoteConf, and its runs root there)."""
        return cls(
            name,
            remote.host or "",
            remote.root or "",
            remote.python,
            remote.ssh_config,
            runs_root,
            connect_timeout_s=remote.connect_timeout_s,
            alive_interval_s=remote.alive_interval_s,
            alive_count_max=remote.alive_count_max,
            timeout_s=remote.timeout_s,
            launch_timeout_s=remote.launch_timeout_s,
        )

    def transport(self, check: bool = True) -> Ssh:
        """Its ssh transport. `check`: before the first command, the site's python is checked (`check_python`):
        what launches a grid there sends nothing to a python that cannot run it. The commands that read a launched
        grid run the snapshot it was launched with, whose dependencies may differ from this checkout's: they pass
        False."""
        return Ssh(
            self.host,
            Path(self.ssh_config) if self.ssh_config else None,
            name=self.name,
            connect_timeout_s=self.connect_timeout_s,
            alive_interval_s=self.alive_interval_s,
            alive_count_max=self.alive_count_max,
            timeout_s=self.timeout_s,
            before=functools.partial(check_python, self) if check else None,
        )

    @property
    def store(self) -> Path:
        return Path(self.root) / CODE_DIR


def own_configs_problem(key: str, value: object) -> Problem | None:
    """A grid composed with the team's own config folders (sft_grid/core/project.py) cannot go to a remote site yet:
    the site composes its cells again from a snapshot of sft_grid's checkout, which does not carry those folders, so
    it would compose other cells. Refused in one line rather than run as something else. `key` and `value` name the
    site as the grid names it (cluster.remote.host and the host, or sites and the profiles); the message names the
    folders."""
    from sft_grid.core import project

    dirs = project.user_dirs()
    if not dirs:
        return None
    return Problem(
        cell=GRID,
        key=key,
        value=value,
        rule="remote-configs",
        message="a remote site composes the cells from sft_grid's shipped configs only, and this grid is composed"
        f" with your config folders too ({', '.join(map(str, dirs))}): they would not be there, so the site would"
        " train other cells",
        fix="launch the grid on the site itself (its own checkout of this repository, sft_grid installed there), or put"
        " the options it needs into a checkout of sft_grid that the site runs",
    )


def _runs_root_given(config: Mapping[str, Any]) -> str:
    """The runs root as the cell's config writes it (the grid's own, else its profile's), before it is made absolute
    here: the site reads the command's words, not this machine's resolution of them."""
    return str(config.get("runs_root") or (config.get("cluster") or {}).get("runs_root") or "")


def relative_paths(cell: str, cluster: str, root: str, runs_root: str) -> list[Problem]:
    """A remote site's folders must be absolute paths on the site: its commands run from a code snapshot's folder,
    so a relative remote.root or runs_root would name a folder inside the snapshot, and this machine would record
    its own resolution of it. Refused before anything connects. A runs root read from an unset per-user variable is
    a dry run's placeholder (site_rules.py refuses a real run with it)."""
    from sft_grid.planning import resolvers

    out = []
    if root and not root.startswith("/"):
        out.append(
            Problem(
                cell=cell,
                key="cluster.remote.root",
                value=root,
                rule="remote-root",
                message=f"cluster {cluster}'s remote.root is relative: the site's folder for sft_grid's code snapshots"
                " must be an absolute path there",
                fix=f"cluster.remote.root=/<absolute path on the site>/{root.lstrip('./') or 'sft_grid'} (or set it"
                " so in its profile)",
            )
        )
    if runs_root and not resolvers.is_placeholder(runs_root) and not runs_root.startswith("/"):
        out.append(
            Problem(
                cell=cell,
                key="runs_root",
                value=runs_root,
                rule="remote-runs-root",
                message=f"the runs root of cluster {cluster}'s cells is relative: on the site it would be relative to"
                " a code snapshot",
                fix=f"runs_root=/<absolute path on the site>/{runs_root.lstrip('./~') or 'runs'} (or set runs_root in"
                " its profile to an absolute path on the site)",
            )
        )
    return out


def site_of(cells: Sequence[Any]) -> Site | None:
    """The remote site of a grid's cells; None when they run where the command runs (or this is the site's own
    invocation). Raises GridError when they name several sites or a site without a root."""
    if call.current() is not None:
        return None
    sites: dict[Site, list[str]] = {}
    problems = []
    for cell in cells:
        remote = cell.spec.cluster.remote
        if not remote.host:
            continue
        if not remote.root:
            problems.append(
                Problem(
                    cell=cell.name,
                    key="cluster.remote.root",
                    value=None,
                    rule="remote-root",
                    message=f"cluster {cell.spec.cluster.name} names remote.host {remote.host} but no remote.root",
                    fix="set cluster.remote.root to a directory on the site for sft_grid's code snapshots",
                )
            )
            continue
        problems += relative_paths(cell.name, cell.spec.cluster.name, remote.root, _runs_root_given(cell.config))
        site = Site.of(cell.spec.cluster.name, remote, str(cell.runs_root))
        sites.setdefault(site, []).append(cell.name)
    if not sites and not problems:
        return None
    if sites and (own := own_configs_problem("cluster.remote.host", ", ".join(sorted({s.host for s in sites})))):
        problems.append(own)
    local = [c.name for c in cells if not c.spec.cluster.remote.host]
    if len(sites) > 1 or (sites and local):
        first = sorted(sites, key=lambda s: s.name)[0]
        problems.append(
            Problem(
                cell=GRID,
                key="cluster",
                value=", ".join(sorted({s.name for s in sites} | ({"here"} if local else set()))),
                rule="one-site",
                message="a grid runs on one site: its cells name several",
                fix=f"name the sites in sites=[...] to spread one grid over them (each cell placed on one), or launch "
                f"the cells of each site as a grid of its own (e.g. cluster={first.name})",
            )
        )
    if problems:
        raise GridError(problems, "the sites")
    return next(iter(sites))


def there(site: Site, code_dir: Path, argv: Sequence[str], asked: SiteCall | None = None) -> list[str]:
    """python's arguments `argv` run on the site from the snapshot, its directory first on the path. When they run
    sft_grid (`-m sft_grid`, or `command_there`'s), the program is told it is the site's own invocation and what it is
    asked (`asked`; by default only which site it is: sites/call.py)."""
    if list(argv[:2]) in (["-m", "sft_grid"], ["-c", _MAIN]):
        argv = [*argv[:2], *(asked or SiteCall(site=site.name)).argv(), *argv[2:]]
    return [
        "sh",
        "-c",
        'cd "$1" && shift && exec "$@"',
        "sh",
        str(code_dir),
        "env",
        f"PYTHONPATH={code_dir}",
        site.python,
        *argv,
    ]


# -- the site's python ------------------------------------------------------------------------------------------

# what the site's python says of itself: its version, and each distribution's installed version and whether its
# module is found (importlib.metadata and find_spec: nothing is imported). Python 2.7 and 3.x alike run it, so an old
# python is named by its version, not by a syntax error; argv: [[distribution, module], ...] as JSON.
PYTHON_CHECK = r"""
import json, sys
found = {"version": ".".join(str(v) for v in sys.version_info[:3]), "executable": sys.executable, "packages": None}
if sys.version_info >= (3, 8):
    from importlib import metadata, util
    found["packages"] = {}
    for dist, module in json.loads(sys.argv[1]):
        try:
            version = metadata.version(dist)
        except Exception:
            version = None
        try:
            there = util.find_spec(module) is not None
        except Exception:
            there = False
        found["packages"][dist] = [version, there]
sys.stdout.write("sft_grid-python: " + json.dumps(found) + "\n")
"""
PYTHON_MARK = "sft_grid-python: "
# a distribution whose module is not its name (the others: the name, - as _)
MODULES = {"hydra-core": "hydra", "pyyaml": "yaml"}


class SitePythonError(GridError):
    """A site's python that cannot run sft_grid, refused before anything is sent there: one line a site (its name,
    the python, what is wrong, the fix)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__(
            [
                Problem(cell=GRID, key="cluster.remote.python", value=None, rule="site-python", message=line, fix="")
                for line in self.lines
            ],
            "the sites' pythons",
        )

    def __str__(self) -> str:
        return "\n".join(self.lines)


@functools.cache
def requirements() -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """sft_grid's python (`requires-python`) and its dependencies (each its requirement as written, its distribution's
    name and its module), as the commit a launch ships has them: this checkout's pyproject.toml (a deciding path:
    shipped as it is), else the installed package's metadata."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement  # hydra-core's own dependency, so wherever sft_grid is

    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text())["project"]
        python, deps = str(project.get("requires-python") or ""), [str(d) for d in project.get("dependencies", [])]
    else:
        python = str(metadata.metadata("sft_grid")["Requires-Python"] or "")
        deps = [d for d in metadata.requires("sft_grid") or [] if "extra ==" not in d]
    out = []
    for dep in deps:
        name = Requirement(dep).name
        out.append((dep, name, MODULES.get(name.lower(), name.lower().replace("-", "_"))))
    return python, tuple(out)


def python_problem(site: Site, said: str, stderr: str, returncode: int) -> str:
    """The refusal of a site's python, one line, from what it said of itself ("" when it can run sft_grid)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    needs_python, deps = requirements()
    head = f"site {site.name}: remote.python {site.python}"
    fix = (
        f"set remote.python=/path/to/python3.11 in the {site.name} profile (or cluster.remote.python=... when"
        " launching)"
    )
    line = next((ln for ln in said.splitlines() if ln.startswith(PYTHON_MARK)), None)
    if line is None:
        why = one_line(stderr, 200) or f"exit status {returncode}, no answer"
        return f"{head} does not run there ({why}); fix: {fix}, a python {needs_python} with sft_grid's dependencies"
    try:
        found = json.loads(line[len(PYTHON_MARK) :])
        version = str(found.get("version") or "")
        old = bool(needs_python) and Version(version) not in SpecifierSet(needs_python)
    except (ValueError, AttributeError):
        return f"{head} does not run there (it said {one_line(line, 200)}); fix: {fix}"
    executable = str(found.get("executable") or "")
    named = f"{head} is Python {version}" + (f" ({executable})" if executable not in ("", site.python) else "")
    if old:
        return f"{named}; sft_grid needs Python {needs_python}; fix: {fix}"
    packages = found.get("packages") or {}
    missing: list[str] = []
    outside: list[str] = []
    install: list[str] = []
    for dep, dist, _module in deps:
        req = Requirement(dep)
        if req.marker is not None and not req.marker.evaluate(
            {"python_version": ".".join(version.split(".")[:2]), "python_full_version": version, "extra": ""}
        ):
            continue
        installed, importable = packages.get(dist, [None, False])
        try:
            ok = importable and installed is not None and req.specifier.contains(Version(installed), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            wanted = dep.split(";")[0].strip()  # as pyproject.toml writes it
            if installed is None or not importable:
                missing.append(dist)
            else:
                outside.append(f"{dist} {installed}, needs {wanted}")
            install.append(shlex.quote(wanted))
    if not install:
        return ""
    said = "; ".join(
        ([f"not installed: {', '.join(missing)}"] if missing else [])
        + ([f"outside sft_grid's ranges: {', '.join(outside)}"] if outside else [])
    )
    return (
        f"{named}, without sft_grid's dependencies ({said}); fix: {site.python} -m pip install {' '.join(install)}"
        " on the site, or set remote.python to a python that has them"
    )


_CHECKED: dict[tuple[str, str, str | None, str], str] = {}  # (site, host, ssh config, python) -> its refusal, or ""
_CHECKING = threading.Lock()


def python_refusal(site: Site, transport: Transport) -> str:
    """Whether the site's python can run sft_grid: "" when it can, else the one-line refusal. Asked once an
    invocation for each (site, python): one command on the site, which sends nothing else. Raises SiteUnreachable
    when the site does not answer (not remembered: the next command asks again)."""
    key = (site.name, site.host, site.ssh_config, site.python)
    with _CHECKING:
        if key in _CHECKED:
            return _CHECKED[key]
    _, deps = requirements()
    payload = json.dumps([[dist, module] for _, dist, module in deps])
    done = transport.run([site.python, "-c", PYTHON_CHECK, payload], check=False)
    refusal = python_problem(
        site, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"), done.returncode
    )
    with _CHECKING:
        _CHECKED[key] = refusal
    return refusal


def check_python(site: Site, transport: Transport) -> None:
    """Refuse a site whose python cannot run sft_grid (SitePythonError), before anything is sent there: a python
    older than sft_grid's `requires-python`, or without its dependencies at versions within pyproject.toml's ranges
    (RHEL 8's and 9's python3 are 3.6 and 3.9)."""
    refusal = python_refusal(site, transport)
    if refusal:
        raise SitePythonError([refusal])


def check_pythons(sites: Mapping[Site, Transport]) -> None:
    """`check_python` of several sites at once (a grid across sites: each site's python asked before anything is
    sent to any of them), every refusal in one SitePythonError; a site that does not answer is left to the caller's
    first command there (SiteUnreachable, as any)."""
    items = list(sites.items())

    def one(item: tuple[Site, Transport]) -> str:
        try:
            return python_refusal(*item)
        except SiteUnreachable:
            return ""

    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        refusals = [r for r in pool.map(one, items) if r]
    if refusals:
        raise SitePythonError(refusals)


def code_for(cells: Sequence[Any], dry_run: bool, stores: Sequence[Path]) -> list[CodeSnapshot]:
    """The launch's snapshot (sites/snapshot.py: a dirty checkout refused, naming the files) as each remote site
    keeps it, in `stores[i]/<key>`: the checkout read once for all of them. Raises GridError outside a git checkout:
    a remote site runs a snapshot of a commit."""
    code = snapshot.find(cells, dry_run, store=stores[0]) if stores else None
    if code is None:
        raise GridError(
            [
                Problem(
                    cell=GRID,
                    key="checkout",
                    value=str(REPO_ROOT),
                    rule="git-checkout",
                    message="a remote site runs a snapshot of a commit: sft_grid here is not a git checkout",
                    fix="launch from a git clone of the project",
                )
            ],
            "the checkout",
        )
    return [replace(code, dir=store / code.key) for store in stores]


def launch(cells: Sequence[Any], site: Site, argv: Sequence[str], dry_run: bool, records: Path) -> int:
    """Check the site's python, ship the launch's commit to the site once, then run the grid command (`argv`,
    Hydra's arguments) there from it, its output streamed here (within `launch_timeout_s`); record the site for the
    grid's later commands. Returns its exit status. Raises SitePythonError (nothing sent) and SiteUnreachable."""
    (code,) = code_for(cells, dry_run, [site.store])
    transport = site.transport()  # its first command checks the site's python: nothing is sent to one that fails
    try:
        snapshot.materialize(code, transport)
        status = transport.stream(there(site, code.dir, ["-m", "sft_grid", *argv]), timeout=site.launch_timeout_s)
    finally:
        transport.close()
    sweeps = sorted({c.spec.sweep_name for c in cells})
    for sweep in sweeps if not dry_run else ():
        write_record(records / sweep, [Placed(site=site, code_dir=code.dir, code=code.key, commit=code.commit)])
    return status


@dataclass(frozen=True, kw_only=True)
class Placed:
    """One site of a launched grid, as its record here names it: the site and the snapshot its jobs run."""

    site: Site
    code_dir: Path
    code: str = ""
    commit: str = ""


def write_record(grid_here: Path, placed: Sequence[Placed], cells: Mapping[str, str] | None = None) -> None:
    """The grid's record here: its sites (each with its snapshot) and, for a grid across remote sites, each cell's
    site (cell name -> site name; written before the cell is sent there, so a site that stops answering keeps its
    cells: they are neither lost nor sent twice). Merged with what the record held: sites and cells are added."""
    grid_here.mkdir(parents=True, exist_ok=True)
    known = {p.site.name: p for p in read_record(grid_here, anywhere=True) or []}
    known.update({p.site.name: p for p in placed})
    record = {
        "sites": [
            {"site": asdict(p.site), "code": p.code, "code_dir": str(p.code_dir), "commit": p.commit}
            for p in known.values()
        ],
        "cells": {**recorded_cells(grid_here), **dict(cells or {})},
    }
    tmp = grid_here / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(grid_here / RECORD)


def _load(grid_here: Path) -> dict[str, Any] | None:
    path = grid_here / RECORD
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    if "site" in data:  # a one-site record of an earlier version
        data = {"sites": [data], "cells": {}}
    return data


_SITE_FIELDS = frozenset(f.name for f in fields(Site))  # a record's keys that are a Site's (a later version adds)


def read_record(grid_here: Path, anywhere: bool = False) -> list[Placed] | None:
    """The grid's sites, as its record here names them; None when it has none (or this is a site's own
    invocation, unless `anywhere`)."""
    data = None if (call.current() is not None and not anywhere) else _load(grid_here)
    if data is None:
        return None
    return [
        Placed(
            site=Site(**{k: v for k, v in entry["site"].items() if k in _SITE_FIELDS}),
            code_dir=Path(entry["code_dir"]),
            code=entry.get("code", ""),
            commit=entry.get("commit", ""),
        )
        for entry in data["sites"]
    ]


def recorded_cells(grid_here: Path) -> dict[str, str]:
    """Cell name -> the site the grid's record says it was sent to (a grid across remote sites)."""
    data = _load(grid_here)
    return dict(data.get("cells", {})) if data else {}


def site_args(args: Sequence[str], grid: str, grid_here: Path, site: Site) -> list[str]:
    """A command's arguments (after its name) as the site runs them: GRID (`grid`, as given) becomes the grid's
    directory there, first, and --runs-root is dropped."""
    args_there: list[str] = [str(Path(site.runs_root) / grid_here.name)]
    skip, replaced = False, False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--runs-root":
            skip = True
        elif not arg.startswith("--runs-root="):
            if arg == grid and not replaced:
                replaced = True
                continue
            args_there.append(arg)
    return args_there


_MAIN = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"


def command_there(command: str, args: Sequence[str]) -> list[str]:
    """python's arguments that run `sft-grid <command> <args>` on a site (from its snapshot, `there`)."""
    return ["-c", _MAIN, command, *args]


def forward(command: str, args: Sequence[str], grid: str, grid_here: Path) -> int | None:
    """Run `sft-grid <command> <args>` on the grid's site when its record here names one: GRID (`grid`, as given)
    becomes the grid's directory there, and --runs-root is dropped; None when the grid is not remote."""
    found = read_record(grid_here) if command in FORWARDED else None
    if not found:
        return None
    if len(found) > 1:  # a grid across remote sites: each site asked, the answers merged (cli/across.py)
        return None
    site, code_dir = found[0].site, found[0].code_dir
    args_there = site_args(args, grid, grid_here, site)
    # which site answers, on stderr: stdout stays the command's own (a table, csv, json)
    print(f"grid {grid_here.name} on site {site.name} ({site.host}:{site.runs_root})", file=sys.stderr, flush=True)
    transport = site.transport(check=False)
    try:
        if command != "report":
            bound = None if until_stopped(command, args) else site.timeout_s
            return transport.stream(there(site, code_dir, command_there(command, args_there)), timeout=bound)
        done = transport.run(there(site, code_dir, command_there(command, args_there)), check=False)
        sys.stderr.write(done.stderr.decode(errors="replace"))
        if done.returncode != 0:
            sys.stdout.write(done.stdout.decode(errors="replace"))
            return done.returncode
        for remote_path in done.stdout.decode().split():  # the page and its data, written on the site: copied here
            local = grid_here / Path(remote_path).name
            local.write_bytes(transport.run(["cat", remote_path]).stdout)
            print(local)
        return 0
    except SiteUnreachable as exc:
        print(f"site {site.name} did not answer: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        transport.close()


def until_stopped(command: str, args: Sequence[str]) -> bool:
    """Whether the command runs until its user stops it or its grid ends (`status --watch`, `logs --follow`): no
    bound on its time, the connection's keepalive its only limit."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(add_help=False)
    importlib.import_module(f"sft_grid.cli.cmd_{command}").add_arguments(parser)
    try:
        parsed, _ = parser.parse_known_args(list(args))
    except SystemExit:  # the site's own parser says what is wrong
        return False
    return bool(getattr(parsed, "watch", False) or getattr(parsed, "follow", False))
