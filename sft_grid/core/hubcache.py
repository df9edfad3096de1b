"""A Hub repository a cell needs, its pin, and where its files live in a Hugging Face cache (stdlib only).

Design: everything here is a pure function of a file listing or a read-only look at the cache, so the
planner, the dry run and ``is_complete`` agree without any network access.

Pins: a cell names its model and datasets by hub id and (implicitly) the branch ``main``. Staging resolves that
to a commit sha, once per grid invocation, and the sha is the pin (``Pin``): the cell's rendered configs point at
``<cache>/<models|datasets>--org--name/snapshots/<sha>``, its ledger records it when it is submitted, and a rerun
of the cell trains on the same sha (staged again from the cache, or from the Hub while it still has it) instead
of whatever ``main`` has become. The pin is never part of the cell's identity: the same cell rerun later is the
same cell, trained on the revision it was first trained on. A Hub id the client would refuse is refused with
the client's own rule (``repo_id_problem``) before anything is staged.

Cache layout (the one ``huggingface_hub`` writes and ``transformers``/``datasets`` read with
``HF_HUB_OFFLINE=1``):

    <cache>/<models|datasets>--<org>--<name>/
        blobs/<etag>                 file contents; <etag> is the sha256 for LFS files, the git blob oid otherwise
        blobs/<etag>.incomplete      a partial download the client may continue with a Range request (whether
                                     the server honours it is seen when it does: sft_grid/stages/staging/memory.py)
        snapshots/<sha>/<path>       relative symlinks into blobs/, one tree per commit
        refs/<branch>                the commit sha a branch resolved to (what offline loads of "main" read)
        .sft_grid/<sha>.json         our listing of the commit (all files, sizes, hashes)

The listing is kept because a commit sha is immutable: once listed, a pinned sha can be checked for
completeness, and staged again, with no network. huggingface_hub's cache scanner only reads ``refs``,
``snapshots`` and ``blobs``, and deleting a repo from the cache deletes the listing with it.

Selection rules (why a blacklist): a whitelist of config and tokenizer names would miss what some model needs
(remote code, sentencepiece variants, chat templates under new names) and the job would fail offline on a
compute node; what costs real space is duplicate weights and training state, which the rules drop.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

Kind = Literal["model", "dataset"]
MAIN = "main"
KINDS: tuple[str, ...] = ("model", "dataset")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# Weight formats a model repo may carry; training loads safetensors, or torch pickles when that is all there is.
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".bin",
    ".pth",
    ".pt",
    ".ckpt",
    ".h5",
    ".msgpack",
    ".onnx",
    ".onnx_data",
    ".gguf",
    ".tflite",
    ".ot",
    ".mlmodel",
    ".keras",
    ".pb",
    ".npz",
)
TORCH_SUFFIXES = (".bin", ".pth", ".pt")
TRAINING_STATE = (
    "optimizer.pt",
    "optimizer.bin",
    "scheduler.pt",
    "scaler.pt",
    "training_args.bin",
    "rng_state*.pth",
    "random_states_*.pkl",
)
CHECKPOINT_DIRS = ("checkpoint-*", "global_step*")
DATA_SUFFIXES = (".parquet", ".json", ".jsonl", ".arrow", ".csv", ".tsv")
COMPRESSED = ("", ".gz", ".zst", ".bz2", ".xz")
CARD_FILES = ("README.md", "LICENSE", "LICENSE.md", "LICENSE.txt")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a commit as the Hub lists it."""

    path: str
    size: int
    blob_id: str  # git blob oid (for LFS files: of the pointer)
    sha256: str | None = None  # LFS content hash; None for files stored in git

    @property
    def etag(self) -> str:
        """The cache blob name: the Hub sends the sha256 as X-Linked-Etag for LFS files, the git oid otherwise."""
        return self.sha256 or self.blob_id


@dataclass(frozen=True)
class Selection:
    keep: tuple[RemoteFile, ...]
    skipped: tuple[tuple[str, str], ...]  # (path, why), shown by the dry run

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.keep)


def _weights_of(path: str) -> str | None:
    """The weight suffix of a weight file or of its shard index (``*.safetensors.index.json``)."""
    name = path.removesuffix(".index.json")
    return next((s for s in WEIGHT_SUFFIXES if name.endswith(s)), None)


def _model_skip(path: str, has_safetensors: bool) -> str | None:
    p = PurePosixPath(path)
    if any(fnmatch.fnmatch(part, pat) for part in p.parts[:-1] for pat in CHECKPOINT_DIRS):
        return "training checkpoint folder"
    if any(fnmatch.fnmatch(p.name, pat) for pat in TRAINING_STATE):
        return "optimizer/scheduler/rng state"
    if p.name == ".gitattributes":
        return "git metadata"
    fmt = _weights_of(path)
    if fmt is None or fmt == ".safetensors":
        return None
    if has_safetensors:
        return f"duplicate weights ({fmt} beside safetensors)"
    return None if fmt in TORCH_SUFFIXES else f"weights in a format training does not load ({fmt})"


def _dataset_skip(path: str) -> str | None:
    name = PurePosixPath(path).name
    if path in CARD_FILES:
        return None
    if any(name.endswith(s + c) for s in DATA_SUFFIXES for c in COMPRESSED):
        return None
    return "not a data file or the dataset card"


def select_files(files: Iterable[RemoteFile], kind: Kind, allow: Iterable[str] | None = None) -> Selection:
    """The files training needs (see the module docstring); ``allow`` (fnmatch patterns) narrows further,
    e.g. to one subset of a dataset, but never drops the top-level card (it maps subsets to files)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    files = sorted(files, key=lambda f: f.path)
    patterns = tuple(allow or ())
    has_st = False
    if kind == "model":
        state = {
            f.path
            for f in files
            if _model_skip(f.path, False) in ("training checkpoint folder", "optimizer/scheduler/rng state")
        }
        has_st = any(f.path.endswith(".safetensors") and f.path not in state for f in files)
    keep: list[RemoteFile] = []
    skipped: list[tuple[str, str]] = []
    for f in files:
        why = _model_skip(f.path, has_st) if kind == "model" else _dataset_skip(f.path)
        if (
            why is None
            and patterns
            and f.path not in CARD_FILES
            and not any(fnmatch.fnmatch(f.path, pat) for pat in patterns)
        ):
            why = "not matched by the allow patterns"
        if why is None:
            keep.append(f)
        else:
            skipped.append((f.path, why))
    return Selection(tuple(keep), tuple(skipped))


# -- cache layout ---------------------------------------------------------------------------------------------
def repo_folder(repo_id: str, kind: Kind) -> str:
    """``models--org--name``: huggingface_hub's folder name for a repo."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    return f"{kind}s--" + repo_id.replace("/", "--")


def snapshot_path(cache: Path | str, repo_id: str, kind: Kind, sha: str) -> Path:
    """The directory a backend loads offline: ``<cache>/<repo folder>/snapshots/<sha>``."""
    return Path(cache) / repo_folder(repo_id, kind) / "snapshots" / sha


def blob_path(cache: Path | str, repo_id: str, kind: Kind, f: RemoteFile) -> Path:
    return Path(cache) / repo_folder(repo_id, kind) / "blobs" / f.etag


def partial_bytes(cache: Path | str, repo_id: str, kind: Kind, f: RemoteFile) -> int:
    """Bytes of a partial download of ``f`` under the name a client continues (``blobs/<etag>.incomplete``), or 0."""
    p = blob_path(cache, repo_id, kind, f).with_name(f.etag + ".incomplete")
    try:
        return min(p.stat().st_size, f.size)
    except FileNotFoundError:
        return 0


def partial_files(cache: Path | str, repo_id: str, kind: Kind, f: RemoteFile) -> dict[Path, int]:
    """Every partial download of ``f`` in the cache, with its size: ``<etag>.incomplete`` (the name a client may
    continue) and ``<etag>.<8 hex>.incomplete`` (one file per attempt, by clients that start each attempt anew)."""
    folder = blob_path(cache, repo_id, kind, f).parent
    out = {}
    for p in folder.glob(f"{f.etag}*.incomplete") if folder.is_dir() else ():
        try:
            out[p] = p.stat().st_size
        except FileNotFoundError:
            continue
    return out


def git_blob_oid(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    _feed(h, path)
    return h.hexdigest()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    _feed(h, path)
    return h.hexdigest()


def _feed(h: hashlib._Hash, path: Path) -> None:
    with open(path, "rb") as fh:
        while chunk := fh.read(4 << 20):
            h.update(chunk)


def checksum_ok(path: Path, f: RemoteFile) -> bool:
    """The sha256 for LFS files; for git-stored files the git blob oid (both are what the Hub lists)."""
    if f.sha256:
        return sha256_of(path) == f.sha256
    return git_blob_oid(path) == f.blob_id if SHA_RE.match(f.blob_id) else True


def file_ok(cache: Path | str, repo_id: str, kind: Kind, sha: str, f: RemoteFile, checksums: bool = False) -> bool:
    """The snapshot entry exists (the symlink resolves) with the listed size, and the right checksum if asked."""
    p = snapshot_path(cache, repo_id, kind, sha) / f.path
    try:
        if p.stat().st_size != f.size:
            return False
    except OSError:
        return False
    return checksum_ok(p, f) if checksums else True


def cached_elsewhere(cache: Path | str, repo_id: str, kind: Kind, f: RemoteFile) -> bool:
    """The blob is already in the cache (from another commit): staging links it, no bytes move."""
    try:
        return blob_path(cache, repo_id, kind, f).stat().st_size == f.size
    except OSError:
        return False


# -- the listing of a commit ----------------------------------------------------------------------------------
def listing_path(cache: Path | str, repo_id: str, kind: Kind, sha: str) -> Path:
    return Path(cache) / repo_folder(repo_id, kind) / ".sft_grid" / f"{sha}.json"


def write_listing(cache: Path | str, repo_id: str, kind: Kind, sha: str, files: Iterable[RemoteFile]) -> None:
    path = listing_path(cache, repo_id, kind, sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"repo_id": repo_id, "kind": kind, "sha": sha, "files": [asdict(f) for f in files]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, path)


def read_listing(cache: Path | str, repo_id: str, kind: Kind, sha: str) -> tuple[RemoteFile, ...] | None:
    try:
        body = json.loads(listing_path(cache, repo_id, kind, sha).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return tuple(RemoteFile(**f) for f in body["files"])


def is_complete(
    cache: Path | str,
    repo_id: str,
    kind: Kind,
    sha: str,
    *,
    allow: Iterable[str] | None = None,
    checksums: bool = False,
) -> bool:
    """Every file training needs from commit ``sha`` is in the cache with its size (and checksum if asked).

    False when the commit was never listed here: completeness cannot be known without the listing.
    """
    files = read_listing(cache, repo_id, kind, sha)
    if files is None:
        return False
    needed = select_files(files, kind, allow).keep
    return all(file_ok(cache, repo_id, kind, sha, f, checksums) for f in needed)


def write_ref(cache: Path | str, repo_id: str, kind: Kind, revision: str, sha: str) -> None:
    """``refs/<revision>``: what an offline ``from_pretrained(repo_id)`` resolves "main" through."""
    path = Path(cache) / repo_folder(repo_id, kind) / "refs" / revision
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(sha)  # no newline: huggingface_hub reads the file verbatim
    os.replace(tmp, path)


def parse_snapshot(path: Path | str) -> tuple[Path, str, Kind, str] | None:
    """(cache, repo id, kind, sha) of a snapshot directory ``<cache>/<kind>s--org--name/snapshots/<sha>``."""
    p = Path(path)
    if p.parent.name != "snapshots" or not SHA_RE.match(p.name):
        return None
    folder = p.parent.parent.name
    kind, _, rest = folder.partition("s--")
    if kind not in KINDS or "--" not in rest:
        return None
    return p.parent.parent.parent, rest.replace("--", "/", 1), kind, p.name  # type: ignore[return-value]


def failure_path(cache: Path | str, repo_id: str, kind: Kind, sha: str) -> Path:
    return Path(cache) / repo_folder(repo_id, kind) / ".sft_grid" / f"{sha}.failed"


def staging_failure(cache: Path | str, repo_id: str, kind: Kind, sha: str) -> str:
    """Why the last staging of this commit failed ("" when it did not, or a later one succeeded): a staging job's
    cells read it at their first step."""
    try:
        return failure_path(cache, repo_id, kind, sha).read_text().strip()
    except OSError:
        return ""


def record_failure(cache: Path | str, repo_id: str, kind: Kind, sha: str, reason: str | None) -> None:
    """Record why staging this commit failed, or (reason None) clear it."""
    path = failure_path(cache, repo_id, kind, sha)
    if reason is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(reason + "\n")
    os.replace(tmp, path)


def read_ref(cache: Path | str, repo_id: str, kind: Kind, revision: str) -> str | None:
    """The commit ``refs/<revision>`` points at in the cache (what staging last resolved the branch to), if any."""
    try:
        sha = (Path(cache) / repo_folder(repo_id, kind) / "refs" / revision).read_text().strip()
    except (OSError, ValueError):
        return None
    return sha if SHA_RE.match(sha) else None


# -- repository ids and pins ----------------------------------------------------------------------------------
# the Hub client's own rule for a repository id (huggingface_hub's validate_repo_id, which tests/test_hub_ids.py holds
# this to): an id it refuses is refused with its cell and key before anything is staged or queued
_REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$")


def repo_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` is not a Hub repository id, or None."""
    if repo_id.count("/") > 1:
        return "more than one '/': a repository id is <name> or <org>/<name>"
    if not _REPO_ID.match(repo_id):
        return (
            "letters, digits, '-', '_' and '.' only, neither starting nor ending with '-' or '.', and a name of at"
            " most 96 characters"
        )
    if "--" in repo_id or ".." in repo_id:
        return "'--' and '..' are not allowed in it"
    if repo_id.endswith(".git"):
        return "it cannot end with '.git'"
    return None


# a revision as the Hub takes it: a branch or tag name, or a commit sha
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")


def revision_problem(revision: str) -> str | None:
    """Why `revision` is not a branch, tag or commit sha the Hub would take, or None."""
    return None if _REVISION.fullmatch(str(revision)) else "not a branch, tag or commit sha"


@dataclass(frozen=True)
class HubRepo:
    """A model or dataset repository at a revision as asked (a branch, tag or sha)."""

    kind: str  # "model" | "dataset"
    repo_id: str
    revision: str = MAIN

    def text(self) -> str:
        return f"{self.kind} {self.repo_id}" + (f"@{self.revision[:12]}" if self.revision != MAIN else "")


@dataclass(frozen=True)
class Pin:
    """A repository pinned to a commit, staged (or to be staged) into `cache`."""

    kind: str
    repo_id: str
    revision: str  # what was asked: a branch name, or the sha itself on a rerun
    sha: str
    cache: Path

    @property
    def path(self) -> Path:
        """The snapshot directory a backend loads, offline."""
        return snapshot_path(self.cache, self.repo_id, self.kind, self.sha)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "repo": self.repo_id, "revision": self.revision, "sha": self.sha}


def recorded_pins(details: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(kind, repo id) -> sha, from the `inputs` a cell's submission recorded in its ledger."""
    out: dict[tuple[str, str], str] = {}
    for item in details.get("inputs") or ():
        if isinstance(item, Mapping) and SHA_RE.match(str(item.get("sha", ""))):
            out[(str(item.get("kind")), str(item.get("repo")))] = str(item["sha"])
    return out


def default_cache() -> Path:
    """The Hugging Face hub cache of this environment: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"
