"""The code a queued job runs is the commit the grid was launched from.

A Slurm job used to import the `sft_grid` of the live checkout it was submitted from, so a `git pull` or an edit
while its cells waited in the queue changed the code they ran. Now a launch that queues Slurm jobs:

- is refused before anything is written when the paths that decide cells (`DECIDING`: the package with its configs,
  the Hydra plugin, pyproject.toml) have uncommitted or untracked changes, naming the files; `ship_dirty=true` (or
  `SFT_GRID_SHIP_DIRTY=1`) ships them instead, and each cell's ledger records which files and a hash of them;
- extracts that commit (`git archive`, the changes shipped on top) once into the site's store,
  `<runs_root>/.code/<key>`, content-addressed by the commit (plus the shipped changes' hash): a second grid of the
  same commit reuses it, and a store entry is never changed once it is in place (written to a temporary directory,
  then renamed);
- runs every job from there: sbatch `--chdir` to the snapshot and `PYTHONPATH` with it first (the job's
  `python -m submitit.core._submit` puts its working directory first on sys.path, ahead of an editable install),
  and the rendered files (launch.sh, the in-venv scripts they name) point into the snapshot, not the checkout.

Only the code comes from the snapshot: the Python packages sft_grid depends on are those of the environment the
jobs run in (the same interpreter as before). Local-executor cells run in this process's lifetime, from the code
it imported, and get no snapshot. Outside a git checkout (sft_grid installed from a wheel) there is nothing to
snapshot: the installed package is what the jobs import.

The store sits under the runs root because a site's compute nodes read it, and the runs root is on the file system
they share. Extraction goes through a transport (sites/transport.py): a local process here, one ssh connection for a
remote site, so a site never needs the git remote or git at all (only tar).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shlex
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sft_grid.core.paths import PACKAGE_DIR, REPO_ROOT
from sft_grid.core.problems import GRID, GridError, Problem
from sft_grid.core.submission import CellFiles, CodeSnapshot, SlurmJob, SubmissionPlan
from sft_grid.sites.transport import LOCAL, Transport

log = logging.getLogger(__name__)

# the paths of a checkout that decide what a cell is and what its job runs
DECIDING = ("sft_grid", "hydra_plugins", "pyproject.toml")  # the shipped configs are in the package
STORE_DIR = ".code"  # under the runs root
MARKER = ".sft_grid_snapshot.json"  # written last into a snapshot: its commit and shipped files
SHIP_ENV = "SFT_GRID_SHIP_DIRTY"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=120, check=False)


def changed_paths(root: Path) -> list[str] | None:
    """The deciding paths with uncommitted or untracked changes (ignored files aside), relative to the checkout;
    None when `root` is not a git checkout."""
    if _git(root, "rev-parse", "--verify", "-q", "HEAD").returncode != 0:
        return None
    out = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--", *DECIDING)
    if out.returncode != 0:
        return None
    entries = out.stdout.decode(errors="surrogateescape").split("\0")
    paths: list[str] = []
    skip = False
    for entry in entries:
        if skip:  # the source path of a rename: the entry before named its destination
            skip = False
            continue
        if len(entry) < 4:
            continue
        paths.append(entry[3:])
        skip = entry[0] in "RC"
    return sorted(set(paths))


def _shipped_sha(root: Path, paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for rel in paths:
        path = root / rel
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes() if path.is_file() else b"<deleted>")
        h.update(b"\0")
    return h.hexdigest()


# SFT_GRID_SHIP_DIRTY's words: anything else is refused (before, any value but "" and "0" shipped: `false` too)
SHIP_WORDS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "": False,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def ship_dirty_asked(cells: Iterable[Any]) -> bool:
    """Whether the launch ships uncommitted changes: `ship_dirty=true` in a cell, or SFT_GRID_SHIP_DIRTY saying yes.
    Raises GridError for a value of the variable that says neither."""
    said = os.environ.get(SHIP_ENV, "")
    if said.strip().lower() not in SHIP_WORDS:
        raise GridError(
            [
                Problem(
                    cell=GRID,
                    key=SHIP_ENV,
                    value=said,
                    rule="ship-dirty",
                    message="is neither yes nor no: whether uncommitted changes are shipped to the jobs is not guessed",
                    fix=f"export {SHIP_ENV}=1 to ship them, or {SHIP_ENV}=0 (or unset it) not to",
                )
            ],
            "the environment",
        )
    return SHIP_WORDS[said.strip().lower()] or any(c.spec.ship_dirty for c in cells)


def needs_snapshot(cells: Iterable[Any]) -> bool:
    """Whether a grid's jobs go to a scheduler that may start them later (Slurm, a remote site, sites=[...])."""
    return any(c.spec.cluster.executor == "slurm" or c.spec.cluster.remote.host or c.spec.sites for c in cells)


def find(cells: Sequence[Any], dry_run: bool, root: Path = REPO_ROOT, store: Path | None = None) -> CodeSnapshot | None:
    """The snapshot the grid's Slurm jobs will run, found from the checkout now (git status; nothing written), to
    be kept in `store` (default: `<runs_root>/.code`). Run from a snapshot (a remote site's own invocation), that
    snapshot itself.

    Raises GridError, before anything is written, when deciding paths have uncommitted changes and the launch does
    not ship them (a dry run names the commit and never refuses: it queues nothing)."""
    if not needs_snapshot(cells):
        return None
    if (root / MARKER).is_file():
        mark = json.loads((root / MARKER).read_text())
        shipped = tuple(mark.get("shipped", ()))
        return CodeSnapshot(mark["commit"], mark["key"], root, root, shipped, mark.get("shipped_sha", ""))
    changed = changed_paths(root)
    if changed is None:
        log.info("%s is not a git checkout: the jobs run the installed sft_grid", root)
        return None
    commit = _git(root, "rev-parse", "HEAD").stdout.decode().strip()
    store = store or Path(cells[0].runs_root) / STORE_DIR
    if not changed:
        return CodeSnapshot(commit, commit, store / commit, root)
    if not ship_dirty_asked(cells):
        if dry_run:
            return CodeSnapshot(commit, commit, store / commit, root)
        raise GridError([refusal(root, changed)], "the checkout")
    sha = _shipped_sha(root, changed)
    key = f"{commit}-{sha[:12]}"
    return CodeSnapshot(commit, key, store / key, root, tuple(changed), sha)


def refusal(root: Path, changed: Sequence[str]) -> Problem:
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    return Problem(
        cell=GRID,
        key="checkout",
        value=shown,
        rule="committed-code",
        message=f"{root} has uncommitted or untracked changes under the paths that decide cells"
        f" ({', '.join(DECIDING)}):"
        " queued jobs run a snapshot of a commit, so these changes would not be what the cells run",
        fix="commit them (or stash or remove them) and launch again; or ship them as they are with ship_dirty=true"
        " (recorded in each cell's ledger)",
    )


# -- the plan, pinned to the snapshot (pure) -------------------------------------------------------------------


def pin(submission: SubmissionPlan, code: CodeSnapshot | None) -> SubmissionPlan:
    """The plan with its Slurm jobs running the snapshot: each sbatch changes into it and puts it first on
    PYTHONPATH, the files of their targets name its package instead of the checkout's, and each cell's `submitted`
    event records it."""
    if code is None or not submission.slurm:
        return submission
    targets = {t for job in submission.slurm for t in job.targets}
    return replace(
        submission,
        slurm=tuple(_pin_job(job, code) for job in submission.slurm),
        writes=tuple(_pin_files(f, code) if f.dir in targets else f for f in submission.writes),
        scripts=tuple(_pin_files(f, code) if _under(f.dir, targets) else f for f in submission.scripts),
        provenance={d: ({**p, "code": code.record()} if d in targets else p) for d, p in submission.provenance.items()},
        code=code,
    )


def _under(path: Path, targets: set[Path]) -> bool:
    return path in targets or path.parent in targets


def _pin_job(job: SlurmJob, code: CodeSnapshot) -> SlurmJob:
    params = dict(job.request.params)
    extra = dict(params.get("additional_parameters", ()))
    extra["chdir"] = str(code.dir)
    setup = (
        f"export PYTHONPATH={shlex.quote(str(code.dir))}${{PYTHONPATH:+:$PYTHONPATH}}",
        f"export SFT_GRID_CODE={shlex.quote(code.key)}",
        *params.get("setup", ()),
    )
    request = job.request.replace(additional_parameters=tuple(sorted(extra.items())), setup=setup)
    return replace(job, request=request)


def _pin_files(files: CellFiles, code: CodeSnapshot) -> CellFiles:
    here, there = str(PACKAGE_DIR) + "/", str(code.dir / PACKAGE_DIR.name) + "/"
    return replace(
        files,
        files={rel: t.replace(here, there) if isinstance(t, str) else t for rel, t in files.files.items()},
    )


# -- the snapshot, put in place on the site (effects) --------------------------------------------------------------


def archive(code: CodeSnapshot) -> bytes:
    """The snapshot as one tar stream: the commit's deciding paths, the shipped files in place of theirs (a shipped
    deletion leaves its file out), and the marker last."""
    out = _git(code.checkout, "archive", "--format=tar", code.commit, "--", *_present(code))
    if out.returncode != 0:
        raise RuntimeError(f"git archive {code.commit} failed: {out.stderr.decode(errors='replace').strip()}")
    shipped = set(code.shipped)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as source, tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in source.getmembers():
            if member.name.rstrip("/") in shipped:
                continue
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        for rel in code.shipped:
            path = code.checkout / rel
            if path.is_file():
                tar.add(path, arcname=rel, recursive=False)
        marker = json.dumps({"key": code.key, **code.record()}, indent=1).encode()
        info = tarfile.TarInfo(MARKER)
        info.size, info.mode = len(marker), 0o644
        tar.addfile(info, io.BytesIO(marker))
    return buffer.getvalue()


def _present(code: CodeSnapshot) -> list[str]:
    """The deciding paths the commit has (git archive refuses a path it lacks)."""
    listed = _git(code.checkout, "ls-tree", "--name-only", code.commit, "--", *DECIDING)
    return listed.stdout.decode().split() or list(DECIDING)


def materialize(code: CodeSnapshot, transport: Transport = LOCAL) -> bool:
    """Put the snapshot in place on the site, once: a store entry that is there is left as it is. Returns whether
    it was extracted now. The tar stream goes to a temporary directory beside it, renamed into place whole."""
    marker = code.dir / MARKER
    if transport.run(["test", "-e", str(marker)], check=False).returncode == 0:
        return False
    store, final = shlex.quote(str(code.dir.parent)), shlex.quote(str(code.dir))
    script = (
        f"set -e; mkdir -p {store}; tmp=$(mktemp -d {store}/.incoming.XXXXXX); trap 'rm -rf \"$tmp\"' EXIT;"
        f' tar -x -C "$tmp" -f -; chmod 755 "$tmp";'
        f' mv -T "$tmp" {final} 2>/dev/null || test -e {shlex.quote(str(marker))}'
    )
    transport.run(["sh", "-c", script], stdin=archive(code))
    log.info("code snapshot %s extracted into %s", code.key, code.dir)
    return True
