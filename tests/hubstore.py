"""On-disk repositories for the loopback hub (tests only, stdlib only).

Design: everything lives under one root directory so that a hub server running in another process (started
with ``python tests/hubserver.py --root DIR``) and the test process that creates repos and commits see the
same state without any channel between them:

    <root>/<kind>s/<org>/<name>/
        access.json              who may read: {"token": str | None, "gated": bool, "granted": [tokens]}
        refs.json                {"main": "<sha>", ...}: branches and tags
        revisions/<sha>.json     {path: {"size", "sha256", "oid", "lfs"}} plus the commit message
        objects/<sha256>         file contents, content-addressed

Invariants: a revision file is never changed once written (shas are immutable, as on the Hub); every write
goes to a temporary name and is renamed into place, so a reader in another process sees a whole file or none.
Old revisions stay resolvable after ``main`` moves until ``delete_revision`` removes them.

Identifiers follow the Hub: a file's ``oid`` is its git blob sha1 (for "LFS" files, the sha1 of the LFS
pointer text, as git stores the pointer), and an LFS file is also named by the sha256 of its content, which is
what clients use as the cache blob name (``X-Linked-Etag``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# Extensions the Hub's default .gitattributes sends to LFS whatever their size.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".parquet", ".arrow", ".gguf", ".h5", ".msgpack")
KINDS = ("model", "dataset")


class HubStoreError(Exception):
    """A repo, revision or file the caller named does not exist; ``code`` is the Hub's X-Error-Code."""

    def __init__(self, code: str, message: str, sha: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.sha = sha


@dataclass(frozen=True)
class StoredFile:
    path: str
    size: int
    sha256: str
    oid: str
    lfs: bool

    def lfs_pointer(self) -> bytes:
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def etag(self) -> str:
        """Stable per content: clients name the cache blob after it, so it must never change for a file."""
        return self.sha256 if self.lfs else self.oid


@dataclass(frozen=True)
class Revision:
    repo_id: str
    kind: str
    sha: str
    files: dict[str, StoredFile]
    message: str
    created: float


@dataclass(frozen=True)
class Access:
    token: str | None = None
    gated: bool = False
    granted: tuple[str, ...] = ()


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class HubStore:
    """Repos, revisions and files under ``root``; safe to use from several threads and processes."""

    def __init__(self, root: Path | str, lfs_threshold: int = 64 * 1024) -> None:
        self.root = Path(root)
        self.lfs_threshold = lfs_threshold
        self._lock = threading.Lock()  # serialises ref updates made through this object (HTTP commits)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- layout -------------------------------------------------------------------------------------------------
    def repo_dir(self, repo_id: str, kind: str = "model") -> Path:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        return self.root / f"{kind}s" / repo_id

    def exists(self, repo_id: str, kind: str = "model") -> bool:
        return (self.repo_dir(repo_id, kind) / "refs.json").is_file()

    def object_path(self, repo_id: str, kind: str, sha256: str) -> Path:
        return self.repo_dir(repo_id, kind) / "objects" / sha256

    # -- repos and access ---------------------------------------------------------------------------------------
    def create_repo(
        self,
        repo_id: str,
        kind: str = "model",
        *,
        token: str | None = None,
        gated: bool = False,
        granted: tuple[str, ...] = (),
        exist_ok: bool = False,
    ) -> bool:
        """Create an empty repo (no commit yet, ``main`` unset); False when it existed and ``exist_ok``."""
        d = self.repo_dir(repo_id, kind)
        with self._lock:
            if self.exists(repo_id, kind):
                if exist_ok:
                    return False
                raise HubStoreError("RepoExists", f"{kind} repo {repo_id} already exists")
            self.set_access(repo_id, kind, token=token, gated=gated, granted=granted)
            _write_atomic(d / "refs.json", b"{}")
        return True

    def set_access(
        self,
        repo_id: str,
        kind: str = "model",
        *,
        token: str | None = None,
        gated: bool = False,
        granted: tuple[str, ...] = (),
    ) -> None:
        """``token``: the repo is private and only this token reads it. ``gated``: only ``granted`` tokens."""
        body = {"token": token, "gated": gated, "granted": list(granted)}
        _write_atomic(self.repo_dir(repo_id, kind) / "access.json", json.dumps(body).encode())

    def access(self, repo_id: str, kind: str = "model") -> Access:
        path = self.repo_dir(repo_id, kind) / "access.json"
        if not path.is_file():
            return Access()
        raw = json.loads(path.read_text())
        return Access(raw.get("token"), bool(raw.get("gated")), tuple(raw.get("granted") or ()))

    # -- refs and revisions -------------------------------------------------------------------------------------
    def refs(self, repo_id: str, kind: str = "model") -> dict[str, str]:
        if not self.exists(repo_id, kind):
            raise HubStoreError("RepoNotFound", f"Repository {repo_id} not found")
        return json.loads((self.repo_dir(repo_id, kind) / "refs.json").read_text())

    def set_ref(self, repo_id: str, name: str, sha: str, kind: str = "model") -> None:
        """Point a branch or tag at an existing revision (moving ``main`` back or forth)."""
        self.revision(repo_id, sha, kind)  # must exist
        refs = self.refs(repo_id, kind)
        refs[name] = sha
        _write_atomic(self.repo_dir(repo_id, kind) / "refs.json", json.dumps(refs).encode())

    def revision(self, repo_id: str, rev: str, kind: str = "model") -> Revision:
        """A branch, tag or full sha, as the Hub resolves it."""
        refs = self.refs(repo_id, kind)
        sha = refs.get(rev) or (rev if SHA_RE.match(rev) else None)
        path = self.repo_dir(repo_id, kind) / "revisions" / f"{sha}.json"
        if sha is None or not path.is_file():
            raise HubStoreError("RevisionNotFound", f"Invalid rev id: {rev}")
        raw = json.loads(path.read_text())
        files = {p: StoredFile(p, f["size"], f["sha256"], f["oid"], f["lfs"]) for p, f in raw["files"].items()}
        return Revision(repo_id, kind, sha, files, raw.get("message", ""), raw.get("created", 0.0))

    def delete_revision(self, repo_id: str, sha: str, kind: str = "model") -> None:
        """Forget a sha (as a force-push does); refs still naming it are dropped too."""
        (self.repo_dir(repo_id, kind) / "revisions" / f"{sha}.json").unlink(missing_ok=True)
        refs = {k: v for k, v in self.refs(repo_id, kind).items() if v != sha}
        _write_atomic(self.repo_dir(repo_id, kind) / "refs.json", json.dumps(refs).encode())

    def commit(
        self,
        repo_id: str,
        files: dict[str, bytes],
        kind: str = "model",
        *,
        branch: str = "main",
        replace: bool = True,
        delete: tuple[str, ...] = (),
        message: str = "commit",
    ) -> str:
        """Write a new revision and move ``branch`` to it; returns its sha.

        ``replace=True``: ``files`` is the whole tree (what tests want: "the repo now holds exactly this").
        ``replace=False``: files are added on top of the branch's tree and ``delete`` paths (or folders,
        given with a trailing "/") are removed, as an HTTP commit does.
        """
        if not self.exists(repo_id, kind):
            self.create_repo(repo_id, kind, exist_ok=True)
        with self._lock:
            refs = self.refs(repo_id, kind)
            base: dict[str, StoredFile] = {}
            if not replace and branch in refs:
                base = dict(self.revision(repo_id, refs[branch], kind).files)
            for gone in delete:
                for p in [p for p in base if p == gone or (gone.endswith("/") and p.startswith(gone))]:
                    del base[p]
            for path, data in files.items():
                base[path] = self._put_object(repo_id, kind, path, data)
            tree = {p: {"size": f.size, "sha256": f.sha256, "oid": f.oid, "lfs": f.lfs} for p, f in base.items()}
            parent = refs.get(branch, "")
            # Unique even for identical trees: the Hub gives every commit its own sha.
            seed = json.dumps([parent, tree, message, time.time_ns(), os.getpid()], sort_keys=True)
            sha = hashlib.sha1(seed.encode()).hexdigest()
            body = {"files": tree, "message": message, "parent": parent, "created": time.time()}
            _write_atomic(self.repo_dir(repo_id, kind) / "revisions" / f"{sha}.json", json.dumps(body).encode())
            refs[branch] = sha
            _write_atomic(self.repo_dir(repo_id, kind) / "refs.json", json.dumps(refs).encode())
        return sha

    def _put_object(self, repo_id: str, kind: str, path: str, data: bytes) -> StoredFile:
        sha256 = hashlib.sha256(data).hexdigest()
        obj = self.object_path(repo_id, kind, sha256)
        if not obj.is_file():
            _write_atomic(obj, data)
        lfs = len(data) >= self.lfs_threshold or path.endswith(LFS_SUFFIXES)
        stored = StoredFile(path, len(data), sha256, "", lfs)
        oid = git_blob_oid(stored.lfs_pointer() if lfs else data)
        return StoredFile(path, len(data), sha256, oid, lfs)

    def read(self, repo_id: str, rev: str, path: str, kind: str = "model") -> bytes:
        """A file's bytes at a revision (for tests checking what an upload stored)."""
        f = self.revision(repo_id, rev, kind).files.get(path)
        if f is None:
            raise HubStoreError("EntryNotFound", f"{path} does not exist at {rev}")
        return self.object_path(repo_id, kind, f.sha256).read_bytes()
