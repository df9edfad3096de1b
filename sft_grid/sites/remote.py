"""A grid on a remote site, driven from the machine it is launched from (issue 25, item 1).

A cluster with `remote.host` (a Host of the user's ssh config) and `remote.root` is reached over OpenSSH
(sites/transport.py: one control connection for the whole command, closed at its end). Launching a grid there:

1. here: compose, validate (every rule over every cell, raised before anything is written or sent) and the
   checkout's gate (sites/snapshot.py: a checkout with uncommitted changes is refused, naming the files);
2. over ssh: the launch's commit is extracted once into `<remote.root>/code/<key>` (a `git archive` stream: the site
   needs neither the git remote nor git);
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

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sft_grid.core.paths import REPO_ROOT
from sft_grid.core.problems import GridError, Problem
from sft_grid.core.submission import CodeSnapshot
from sft_grid.sites import snapshot
from sft_grid.sites.placement import ON_SITE_ENV
from sft_grid.sites.transport import Ssh

RECORD = ".site.json"
# commands that read or act on a launched grid: run on its site when the grid is remote
FORWARDED = ("status", "logs", "cancel", "results", "report")
CODE_DIR = "code"


@dataclass(frozen=True)
class Site:
    """A remote site as a grid's cells name it."""

    name: str  # the cluster config's name
    host: str
    root: str
    python: str
    ssh_config: str | None
    runs_root: str  # the cells' runs root, on the site

    def transport(self) -> Ssh:
        return Ssh(self.host, Path(self.ssh_config) if self.ssh_config else None, name=self.name)

    @property
    def store(self) -> Path:
        return Path(self.root) / CODE_DIR


def own_configs_problem(key: str) -> Problem | None:
    """A grid composed with the team's own config folders (sft_grid/core/project.py) cannot go to a remote site yet:
    the site composes its cells again from a snapshot of sft_grid's checkout, which does not carry those folders, so
    it would compose other cells. Refused in one line rather than run as something else."""
    from sft_grid.core import project

    dirs = project.user_dirs()
    if not dirs:
        return None
    return Problem(
        "(grid)",
        key,
        ", ".join(map(str, dirs)),
        "remote-configs",
        "a remote site composes the cells from sft_grid's shipped configs only: these config folders would not be"
        " there, so it would train other cells",
        "launch the grid on the site itself (its own checkout of this repository, sft_grid installed there), or put"
        " the options it needs into a checkout of sft_grid that the site runs",
    )


def site_of(cells: Sequence[Any]) -> Site | None:
    """The remote site of a grid's cells; None when they run where the command runs (or this is the site's own
    invocation). Raises GridError when they name several sites or a site without a root."""
    if os.environ.get(ON_SITE_ENV):
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
                    cell.name,
                    "cluster.remote.root",
                    None,
                    "remote-root",
                    f"cluster {cell.spec.cluster.name} names remote.host {remote.host} but no remote.root",
                    "set cluster.remote.root to a directory on the site for sft_grid's code snapshots",
                )
            )
            continue
        site = Site(
            cell.spec.cluster.name,
            remote.host,
            remote.root,
            remote.python,
            remote.ssh_config,
            str(cell.runs_root),
        )
        sites.setdefault(site, []).append(cell.name)
    if not sites and not problems:
        return None
    if sites and (own := own_configs_problem("cluster.remote.host")) is not None:
        problems.append(own)
    local = [c.name for c in cells if not c.spec.cluster.remote.host]
    if len(sites) > 1 or (sites and local):
        first = sorted(sites, key=lambda s: s.name)[0]
        problems.append(
            Problem(
                "(grid)",
                "cluster",
                ", ".join(sorted({s.name for s in sites} | ({"here"} if local else set()))),
                "one-site",
                "a grid runs on one site: its cells name several",
                f"name the sites in sites=[...] to spread one grid over them (each cell placed on one), or launch "
                f"the cells of each site as a grid of its own (e.g. cluster={first.name})",
            )
        )
    if problems:
        raise GridError(problems, "the sites")
    return next(iter(sites))


def there(site: Site, code_dir: Path, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """argv run on the site from the snapshot: its directory first on the path, marked as the site's own (`env`:
    more of its environment)."""
    return [
        "sh",
        "-c",
        'cd "$1" && shift && exec "$@"',
        "sh",
        str(code_dir),
        "env",
        f"{ON_SITE_ENV}={site.name}",
        f"PYTHONPATH={code_dir}",
        *(f"{k}={v}" for k, v in (env or {}).items()),
        site.python,
        *argv,
    ]


def code_for(cells: Sequence[Any], dry_run: bool, stores: Sequence[Path]) -> list[CodeSnapshot]:
    """The launch's snapshot (sites/snapshot.py: a dirty checkout refused, naming the files) as each remote site
    keeps it, in `stores[i]/<key>`: the checkout read once for all of them. Raises GridError outside a git checkout:
    a remote site runs a snapshot of a commit."""
    code = snapshot.find(cells, dry_run, store=stores[0]) if stores else None
    if code is None:
        raise GridError(
            [
                Problem(
                    "(grid)",
                    "checkout",
                    str(REPO_ROOT),
                    "git-checkout",
                    "a remote site runs a snapshot of a commit: sft_grid here is not a git checkout",
                    "launch from a git clone of the project",
                )
            ],
            "the checkout",
        )
    return [replace(code, dir=store / code.key) for store in stores]


def launch(cells: Sequence[Any], site: Site, argv: Sequence[str], dry_run: bool, records: Path) -> int:
    """Ship the launch's commit to the site once, then run the grid command (`argv`, Hydra's arguments) there from
    it, its output streamed here; record the site for the grid's later commands. Returns its exit status."""
    (code,) = code_for(cells, dry_run, [site.store])
    transport = site.transport()
    try:
        snapshot.materialize(code, transport)
        status = transport.stream(there(site, code.dir, ["-m", "sft_grid", *argv]))
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


def read_record(grid_here: Path, anywhere: bool = False) -> list[Placed] | None:
    """The grid's sites, as its record here names them; None when it has none (or this is a site's own
    invocation, unless `anywhere`)."""
    data = None if (os.environ.get(ON_SITE_ENV) and not anywhere) else _load(grid_here)
    if data is None:
        return None
    return [
        Placed(
            site=Site(**entry["site"]),
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


def command_there(command: str, args: Sequence[str]) -> list[str]:
    """python's arguments that run `sft-grid <command> <args>` on a site (from its snapshot, `there`)."""
    main = "import sys; from sft_grid.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return ["-c", main, command, *args]


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
    transport = site.transport()
    try:
        if command != "report":
            return transport.stream(there(site, code_dir, command_there(command, args_there)))
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
    finally:
        transport.close()
