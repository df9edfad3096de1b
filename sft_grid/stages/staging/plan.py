"""What staging will do, before it does anything: each repository resolved and weighed, and a grid's inputs as one
plan (no transfers, no writes).

Compute nodes of several sites (Leonardo, Jupiter, JURECA, JUWELS) have no internet, so the grid stages each
repository its cells name into the cluster's Hugging Face cache (`cluster.hf_cache`) before anything is queued,
and the cells' configs point at the staged snapshots (planning/inputs.py).

- `resolve` pins a revision to its commit sha and lists the commit (sizes, LFS sha256); `resolve_pinned` answers
  a sha listed in the cache with no request at all. `plan` selects the files training needs, subtracts what the
  cache holds (complete snapshot entries, blobs shared with another commit, and partial files where the server is
  taken to continue them) and compares with the filesystem's free space.
- `plan_staging`: each cell's Hub inputs at the revision it asks for: `main` for a new cell, or the sha its earlier
  submission recorded (a rerun trains on what it trained on before; `force=true` starts over on the current
  `main`). Each unique (repository, revision, cache) is resolved once, and what must move is weighed against the
  free space of each filesystem. A missing or gated repository or revision, a missing token, a failing server, too
  little space: each is a problem naming the cell, before anything is queued. A dry run stops here and prints it.
  Each evaluated cell's tasks' `datasets` are inputs too (keyed `eval.tasks.<label>.datasets`): the evaluation job
  runs offline and reads them from their snapshots. A cell whose training is complete needs no training input, and
  one whose evaluation is complete (every score there, its base model's too) no eval dataset: they are pinned to
  what they recorded when it is still in the cache.

The transfers are `download.stage_here` (on the machine running the grid, `cluster.staging.where: login`) or a
Slurm job on the transfer partition (`in_job`, `where: job`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sft_grid.core import events, human
from sft_grid.core.events import Kind
from sft_grid.core.hubcache import (
    KINDS,
    MAIN,
    SHA_RE,
    Pin,
    RemoteFile,
    cached_elsewhere,
    file_ok,
    is_complete,
    partial_bytes,
    read_listing,
    read_ref,
    recorded_pins,
    select_files,
)
from sft_grid.core.hubcache import Kind as HubKind
from sft_grid.core.layout import OUTPUT_DIR, output_complete
from sft_grid.core.problems import GRID, Problem
from sft_grid.planning.cells import Cell
from sft_grid.planning.evaluation import base_complete, base_targets, eval_complete, suites_of
from sft_grid.planning.inputs import eval_repos, hf_cache, train_repos
from sft_grid.stages.staging import memory, watch
from sft_grid.stages.staging.client import client_version, endpoint_of, hf_client, translate, with_retries
from sft_grid.stages.staging.values import (
    Budget,
    HubError,
    HubUnreachable,
    IncompleteListing,
    NotEnoughSpace,
    Plan,
    Resolved,
    RevisionNotFound,
    UnconfirmedId,
)

log = logging.getLogger(__name__)

DEFAULT_RESERVE = 256 << 20  # leave the filesystem some room: other users and the training job write there too


# -- one repository ---------------------------------------------------------------------------------------------
def resolve(
    repo_id: str,
    kind: HubKind = "model",
    revision: str = MAIN,
    token: str | None = None,
    *,
    endpoint: str | None = None,
    cache: Path | None = None,
    budget: Budget | None = None,
) -> Resolved:
    """The commit ``revision`` names, and every file of it. Raises a ``HubError`` naming the repo and fix (a
    transient failure is tried again first; see ``client``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    hf = hf_client()

    api = hf.HfApi(endpoint=endpoint)
    token = token or hf.get_token()

    def ask() -> tuple[str, tuple[RemoteFile, ...]]:
        # the revision always named: a mirror may answer a repository without one only from its upstream (olah)
        info = api.repo_info(repo_id, repo_type=kind, revision=revision, token=token)
        files = _listing(api, repo_id, kind, info, token)
        if getattr(info, "gated", False) and files:  # listing is public on a gated repo; the files are not
            url = hf.hf_hub_url(repo_id, files[0].path, repo_type=kind, revision=info.sha, endpoint=api.endpoint)
            hf.get_hf_file_metadata(url, token=token)
        return info.sha, files

    try:
        sha, files = with_retries(ask, f"resolving {kind} {repo_id}@{revision}", budget)
    except HubError:
        raise
    except Exception as e:
        if budget is not None and watch.time_up(e):
            raise watch.TimeUp(
                f"stopped before this process's time limit (the time budget ran out while resolving {kind}"
                f" '{repo_id}'@{revision} on {api.endpoint.rstrip('/')}; the last request:"
                f" {_last_request()}). Rerun to continue, or stage where processes may run longer"
                " (a staging job on the transfer partition: cluster.staging.where=job)."
            ) from e
        err = translate(e, repo_id, kind, revision, token, api.endpoint.rstrip("/"), cache)
        if err is None:
            raise
        raise err from e
    return Resolved(repo_id, kind, revision, sha, files)


MAX_LISTINGS = 10_000  # folders listed one by one, at most: a bound on a server whose listing never converges


def _listing(api: Any, repo_id: str, kind: HubKind, info: Any, token: str | None) -> tuple[RemoteFile, ...]:
    """Every file of the commit: the recursive tree listing, checked against itself and the repository's file list.

    A server that ignores ``recursive=true`` (a proxy that drops the query string) lists a folder without its files:
    each such folder is listed by its path, and so on down. A folder that stays without files, or a file the
    repository's own list names that no listing shows, makes staging refuse: a stage that exits 0 with files missing
    is found only when the grid fails later."""
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    files: dict[str, RemoteFile] = {}
    folders: set[str] = set()
    listed: set[str | None] = set()
    queue: list[str | None] = [None]  # None: the whole commit, recursively
    root = None
    while queue and len(listed) < MAX_LISTINGS:
        where = queue.pop()
        listed.add(where)
        for e in api.list_repo_tree(
            repo_id, path_in_repo=where, repo_type=kind, revision=info.sha, recursive=True, token=token
        ):  # the listing is paged: read within the caller's retries
            if isinstance(e, RepoFile):
                files[e.path] = RemoteFile(e.path, e.size, e.blob_id, e.lfs.sha256 if e.lfs else None)
            elif isinstance(e, RepoFolder):
                folders.add(e.path)
        if where is None:
            root = watch.last("GET", "/tree/")  # the listing to name: the one that came without its files
        queue += sorted(d for d in folders - listed if d not in queue and not _has_files(d, files))
    missing = sorted(d for d in folders if not _has_files(d, files))
    named = [s.rfilename for s in (getattr(info, "siblings", None) or []) if getattr(s, "rfilename", None)]
    missing += sorted(p for p in named if p not in files and not any(p.startswith(d + "/") for d in missing))
    url = root.url if root else api.endpoint
    if missing:
        raise IncompleteListing(
            f"the file listing of {kind} '{repo_id}'@{info.sha[:12]} from {url} is incomplete: {len(missing)}"
            f" folder(s) or file(s) the repository has are not in it, even listed by path ({', '.join(missing[:3])}):"
            " staging it would leave files the cells load out. Fix: ask the operator of the proxy or mirror to pass"
            " the query string (recursive=true) of /api/.../tree/ requests through, or stage from another endpoint"
            " (HF_ENDPOINT)."
        )
    if len(listed) > 1:
        log.warning(
            "the tree listing of %s %s (%s) showed folders without their files: the server ignores recursive=true"
            " (a proxy dropping the query string?); each folder was listed by its path (%d listings)",
            kind,
            repo_id,
            url,
            len(listed),
        )
    return tuple(files.values())


def _has_files(folder: str, files: dict[str, RemoteFile]) -> bool:
    return any(p.startswith(folder + "/") for p in files)


def _last_request() -> str:
    a = watch.last()
    return f"{a.method} {a.url}" if a else "none answered"


def resolve_pinned(
    repo_id: str,
    kind: HubKind,
    revision: str,
    token: str | None,
    endpoint: str | None,
    cache: Path,
    budget: Budget | None = None,
) -> Resolved:
    """``resolve``, except that a sha listed in the cache needs no request (its listing cannot change)."""
    if SHA_RE.match(revision):
        files = read_listing(cache, repo_id, kind, revision)
        if files is not None:
            return Resolved(repo_id, kind, revision, revision, files)
    return resolve(repo_id, kind, revision, token, endpoint=endpoint, cache=cache, budget=budget)


def _free_bytes(path: Path) -> int:
    while not path.exists():  # the cache may not exist yet: ask the filesystem it will be created on
        path = path.parent
    return shutil.disk_usage(path).free


def plan(
    resolved: Resolved,
    cache: Path | str,
    *,
    allow: Iterable[str] | None = None,
    reserve_bytes: int = DEFAULT_RESERVE,
    resumable: bool | None = None,
    endpoint: str | None = None,
) -> Plan:
    """What staging ``resolved`` into ``cache`` will transfer, and whether it fits (see ``check_space``).

    ``resumable``: whether a partial file counts as partly fetched; None: as last seen for the endpoint (``memory``:
    yes until the server was seen to start a partial file again from zero)."""
    cache = Path(cache)
    r = resolved
    if resumable is None:
        resumable = memory.resumes(cache, endpoint_of(endpoint), client_version())
    selection = select_files(r.files, r.kind, allow)
    cached, link, fetch = [], [], []
    for f in selection.keep:
        if file_ok(cache, r.repo_id, r.kind, r.sha, f):
            cached.append(f)
        elif cached_elsewhere(cache, r.repo_id, r.kind, f):
            link.append(f)
        else:
            fetch.append(f)
    partial = sum(partial_bytes(cache, r.repo_id, r.kind, f) for f in fetch) if resumable else 0
    return Plan(
        resolved=r,
        cache=cache,
        selection=selection,
        cached=tuple(cached),
        to_link=tuple(link),
        to_fetch=tuple(fetch),
        bytes_to_fetch=sum(f.size for f in fetch) - partial,
        free_bytes=_free_bytes(cache),
        reserve_bytes=reserve_bytes,
    )


def check_space(p: Plan) -> None:
    if not p.fits:
        r = p.resolved
        raise NotEnoughSpace(
            f"staging {r.kind} '{r.repo_id}'@{r.sha[:12]} needs {human.size(p.bytes_to_fetch)} more in {p.cache}, but "
            f"its filesystem has {human.size(p.free_bytes)} free"
            f" (and {human.size(p.reserve_bytes)} is kept in reserve). "
            "Fix: free space there, or point the cluster profile's HF cache (HF_HUB_CACHE) at a filesystem with "
            "room (a project or scratch area, not $HOME)."
        )


# -- a grid's inputs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wanted:
    """One repository at one revision, into one cache: what a group of cells share."""

    kind: str
    repo_id: str
    revision: str
    cache: Path


@dataclass(kw_only=True)
class Item:
    wanted: Wanted
    users: list[tuple[str, str]] = field(default_factory=list)  # (cell name, key naming it)
    pin: Pin | None = None
    plan: Plan | None = None  # what moves; None: staged already (no request made), or not resolved
    error: HubError | None = None
    here: bool = False  # a cell's cluster stages on the machine running the grid (else in a staging job)
    offline: bool = False  # a cell's cluster has no internet on compute nodes: its jobs cannot fetch it themselves
    # a cell's model table marks the id unconfirmed: it is queued only once resolved on the site's Hub
    unconfirmed: bool = False

    @property
    def complete(self) -> bool:
        return self.pin is not None and (self.plan is None or not (self.plan.to_fetch or self.plan.to_link))

    @property
    def bytes_needed(self) -> int:
        return self.plan.bytes_needed if self.plan else 0

    @property
    def bytes_to_fetch(self) -> int:
        return self.plan.bytes_to_fetch if self.plan else 0

    def text(self) -> str:
        w = self.wanted
        sha = f"@{self.pin.sha[:12]}" if self.pin else f"@{w.revision}"
        if self.plan is None:
            return f"{w.kind} {w.repo_id}{sha}: " + ("staged" if self.pin else "not resolved")
        p = self.plan
        return (
            f"{w.kind} {w.repo_id}{sha}: {len(p.selection.keep)} files, {human.size(p.bytes_needed)}"
            + (f", {human.size(p.bytes_to_fetch)} to fetch" if not self.complete else ", staged")
            + (f" ({len(p.selection.skipped)} files not needed for training left out)" if p.selection.skipped else "")
        )


@dataclass(frozen=True)
class Space:
    """One filesystem the grid stages into: bytes to fetch there, against what is free."""

    cache: Path
    to_fetch: int
    free: int
    reserve: int = DEFAULT_RESERVE

    @property
    def fits(self) -> bool:
        return self.to_fetch + self.reserve <= self.free


@dataclass
class StagingPlan:
    items: list[Item] = field(default_factory=list)
    # cell name -> its pins (completed cells: only those still staged)
    pins: dict[str, tuple[Pin, ...]] = field(default_factory=dict)
    space: list[Space] = field(default_factory=list)
    # a dry run where the Hub could not be reached: inputs are known by name only
    unreachable: str = ""
    # `sft-grid check`: (kind, repo id) -> the commit its `main` names now, or why it could not be read
    heads: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def pending(self) -> list[Item]:
        """Pinned and not all staged (an input not resolved, with the Hub out of reach, is left to the jobs)."""
        return [i for i in self.items if i.pin is not None and not i.complete]

    @property
    def to_fetch(self) -> int:
        return sum(i.bytes_to_fetch for i in self.pending)

    def problems(self) -> list[Problem]:
        out = []
        for item in self.items:
            if item.error is None:
                continue
            message, _, fix = str(item.error).partition(" Fix: ")
            for cell, key in item.users:
                out.append(
                    Problem(
                        cell=cell,
                        key=key,
                        value=item.wanted.repo_id,
                        rule=f"staging-{_rule(item.error)}",
                        message=message,
                        fix=fix or "see the message",
                    )
                )
        out.extend(
            Problem(
                cell=GRID,
                key="cluster.hf_cache",
                value=str(s.cache),
                rule="staging-space",
                message=f"staging needs {human.size(s.to_fetch)} more in {s.cache}, but its filesystem has"
                f" {human.size(s.free)} free (and {human.size(s.reserve)} is kept in reserve)",
                fix="free space there, or point the cluster's hf_cache at a filesystem with room"
                " (a project or scratch area, not $HOME)",
            )
            for s in self.space
            if not s.fits
        )
        return out


def _rule(e: HubError) -> str:
    return "".join("-" + c.lower() if c.isupper() else c for c in type(e).__name__).lstrip("-")


def recorded(cell_dir: Path) -> dict[tuple[str, str], str]:
    """The pins a cell's latest submission recorded in its ledger."""
    last = events.last(events.read(cell_dir), Kind.SUBMITTED) if cell_dir.is_dir() else None
    return recorded_pins(last.details) if last is not None else {}


def plan_staging(cells: Sequence[Cell], dirs: Sequence[Path], dry_run: bool) -> StagingPlan:
    """What the grid must stage and whether it can (no transfers, no writes)."""
    out = StagingPlan()
    items: dict[Wanted, Item] = {}
    bases = _bases_to_evaluate(cells)
    for cell, cell_dir in zip(cells, dirs, strict=True):
        repos = train_repos(cell)
        evals = eval_repos(cell)
        if not repos and not evals:
            continue
        cache = hf_cache(cell.spec)
        pins = {} if cell.spec.force else recorded(cell_dir)
        trains = cell.spec.force or not output_complete(cell_dir / OUTPUT_DIR)
        # its evaluation reads its tasks' datasets until every score is there (its own, or its base model's)
        scores = bool(evals) and (trains or cell.name in bases or not eval_complete(cell, cell_dir))
        mine: list[Pin] = []
        for key, repo, need in [*((k, r, trains) for k, r in repos), *((k, r, scores) for k, r in evals)]:
            sha = pins.get((repo.kind, repo.repo_id))
            if not need:  # done with it: render with what it read while that is staged, fetch nothing
                if sha and is_complete(cache, repo.repo_id, repo.kind, sha):  # type: ignore[arg-type]
                    mine.append(Pin(repo.kind, repo.repo_id, sha, sha, cache))
                continue
            wanted = Wanted(repo.kind, repo.repo_id, sha or repo.revision, cache)
            item = items.setdefault(wanted, Item(wanted=wanted))
            item.users.append((cell.name, key))
            item.here |= cell.spec.cluster.staging.where == "login"
            item.offline |= not cell.spec.cluster.internet_on_compute
            item.unconfirmed |= repo.kind == "model" and not cell.spec.model.confirmed
        out.pins[cell.name] = tuple(mine)
    _resolve(list(items.values()), dry_run, out)
    out.items = list(items.values())
    for item in out.items:
        if item.pin is not None:
            for name, _ in item.users:
                out.pins[name] += (item.pin,)
    # a repository two keys of a cell name (a dataset it trains on and evaluates on): pinned once
    out.pins = {name: _once(pins) for name, pins in out.pins.items()}
    out.space = _space(out.items)
    return out


def _once(pins: Sequence[Pin]) -> tuple[Pin, ...]:
    first: dict[tuple[str, str], Pin] = {}
    for pin in pins:
        first.setdefault((pin.kind, pin.repo_id), pin)
    return tuple(first.values())


def _bases_to_evaluate(cells: Sequence[Cell]) -> set[str]:
    """The cells whose base model's evaluation (run with that cell's pins) misses a score."""
    if not any(s.base_models for c in cells for s in suites_of(c)):
        return set()
    return {t.cell.name for t in base_targets(cells) if not base_complete(t)}


def _resolve(items: list[Item], dry_run: bool, into: StagingPlan) -> None:
    """Each item's commit and what must move. One unreachable Hub stops the asking (each try costs a timeout)."""
    down: HubError | None = None
    for item in items:
        w = item.wanted
        if SHA_RE.match(w.revision) and is_complete(w.cache, w.repo_id, w.kind, w.revision):  # type: ignore[arg-type]
            item.pin = Pin(w.kind, w.repo_id, w.revision, w.revision, w.cache)
            continue
        if down is not None:
            _staged_before(item, down, dry_run)
            continue
        try:
            resolved = resolve_pinned(w.repo_id, w.kind, w.revision, None, None, w.cache)  # type: ignore[arg-type]
        except HubUnreachable as e:
            down = e
            into.unreachable = _summary(e)
            _staged_before(item, down, dry_run)
            continue
        except HubError as e:
            item.error = _rerun_note(e, w)
            continue
        item.pin = Pin(w.kind, w.repo_id, w.revision, resolved.sha, w.cache)
        item.plan = plan(resolved, w.cache)


def _staged_before(item: Item, down: HubError, dry_run: bool) -> None:
    """The Hub cannot be reached from here (an offline login node, staged ahead of time): a branch is taken as it
    was staged (`refs/<branch>` in the cache, all its training files there). Otherwise it is an error where the
    cells' compute nodes have no internet either; where they have, the jobs fetch it themselves, as they did
    before staging (its checks wait for them). A dry run only notes it."""
    w = item.wanted
    sha = read_ref(w.cache, w.repo_id, w.kind, w.revision)  # type: ignore[arg-type]
    if sha and is_complete(w.cache, w.repo_id, w.kind, sha):  # type: ignore[arg-type]
        item.pin = Pin(w.kind, w.repo_id, w.revision, sha, w.cache)
    elif not dry_run and item.offline:
        item.error = down
    elif not dry_run and item.unconfirmed:
        item.error = UnconfirmedId(
            f"{w.kind} {w.repo_id}: its id is not confirmed by its publisher's records (confirmed: false in the"
            f" model table), and the Hub cannot be reached from here to resolve it ({_summary(down)}), so no job may"
            " find out instead. Fix: run `sft-grid check` with the same overrides where the site's Hub or mirror"
            " answers (or stage it there: `sft-grid stage`); once resolved, its commit is pinned and the cells queue"
        )


def _summary(e: HubError) -> str:
    return str(e).partition(" Fix: ")[0].rstrip(".")


def _rerun_note(e: HubError, w: Wanted) -> HubError:
    """A recorded sha the Hub no longer has: the cell trained on it before and cannot resume on another."""
    if not (SHA_RE.match(w.revision) and isinstance(e, RevisionNotFound)):
        return e
    return type(e)(
        f"{e}".partition(" Fix: ")[0].rstrip(".") + ": the cell's earlier run trained on this commit, so"
        " it is resumed from it. Fix: stage it from where it is still kept, or rerun the cell with"
        " force=true to train it from the start on the current revision (its old output is moved aside)."
    )


def _space(items: Iterable[Item]) -> list[Space]:
    by_fs: dict[int, list[Item]] = {}
    for item in items:
        if item.plan is not None:
            by_fs.setdefault(_device(item.wanted.cache), []).append(item)
    return [
        Space(group[0].wanted.cache, sum(i.bytes_to_fetch for i in group), group[0].plan.free_bytes)  # type: ignore[union-attr]
        for group in by_fs.values()
    ]


def _device(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return os.stat(path).st_dev


def provenance(pins: Sequence[Pin], checkout: dict[str, Any]) -> dict[str, Any]:
    """What a cell's submission records beside its state: its pinned inputs, the sft_grid version and the git
    revision of the checkout its config came from (the packages of its environment are recorded by its job)."""
    return {"inputs": [p.to_json() for p in pins], **checkout}


def budget_for(cells: Iterable[Cell]) -> Budget | None:
    """The time a process may run where the grid stages (the shortest `staging.time_limit_s` of its clusters that
    stage there), counted from this process's start, as the site's process killer counts it."""
    limits = [
        c.spec.cluster.staging.time_limit_s
        for c in cells
        if c.spec.cluster.staging.where == "login" and c.spec.cluster.staging.time_limit_s
    ]
    return Budget.since_process_start(float(min(limits))) if limits else None


def check_inputs(cells: Sequence[Cell], dirs: Sequence[Path]) -> StagingPlan:
    """`sft-grid check`: every Hub input resolved as a real run resolves it (the same verdicts), and for each one
    that is found, what its `main` points at now (a pinned commit the branch has since moved past shows there)."""
    plan = plan_staging(cells, dirs, dry_run=True)
    for item in plan.items:
        w = item.wanted
        if item.pin is None or w.revision == MAIN:
            if item.pin is not None:
                plan.heads[(w.kind, w.repo_id)] = item.pin.sha
            continue
        try:
            head = resolve(w.repo_id, w.kind, MAIN, None, cache=w.cache)  # type: ignore[arg-type]
        except HubError as e:
            plan.heads[(w.kind, w.repo_id)] = f"? ({_summary(e)})"
        else:
            plan.heads[(w.kind, w.repo_id)] = head.sha
    return plan
