"""What olah (a real, independently written Hub mirror) answers, offline, from plain git repos, to raw HTTP and to
the installed ``huggingface_hub`` client: a probe that pins olah's behaviour as observed, not as the Hub's.

olah runs from its own virtual environment (``tests/olah_mirror.py``; built on first use, about 10 s, or by
``python -m tests.olah_mirror build``); the tests skip only when that environment cannot be built. Raw facts use
``httpx`` with a new connection per request: olah closes the connection after each 500 without saying
``Connection: close``, so a reused connection would blur one request's answer into the next. Client facts use
the real client with ``HF_ENDPOINT`` at olah, Xet off, a tmp cache and HF_HOME, and no token.

Where olah differs from the Hub (and from ``tests/hubserver.py``), the assertion says so in its comment.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.hubstore import git_blob_oid

if TYPE_CHECKING:  # imported by pytest_plugins below, as a plugin (importing it here first would skip its rewrite)
    from tests.olah_mirror import OlahServer

pytest_plugins = ["tests.hub_fixtures", "tests.olah_mirror"]  # fixtures: hf_env; olah
pytestmark = pytest.mark.mirror

UNKNOWN_SHA = "0123456789abcdef0123456789abcdef01234567"
REPO_NOT_FOUND = "Repository not found"


def _http(method: str, url: str, **headers: str) -> httpx.Response:
    """One request on a connection of its own (see the module's docstring)."""
    return httpx.request(method, url, headers=headers, timeout=30)


def _first_line(e: BaseException) -> str:
    return str(e).split("\n")[0]


@pytest.fixture
def client(
    olah: OlahServer, hf_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimpleNamespace]:
    """The installed client pointed at olah, with every request and answer it exchanges logged.

    The client reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_DISABLE_XET once, at import: the calls pass the endpoint
    and the cache, and the Xet constant is patched. (Patching ``constants.ENDPOINT`` would send requests towards the
    real Hub: the URL template was built from it at import.) A fresh HTTP session per test.
    """
    import huggingface_hub.constants as c
    from huggingface_hub import HfApi, close_session, set_client_factory
    from huggingface_hub.utils import _http as hf_http

    monkeypatch.setenv("HF_ENDPOINT", olah.url)
    monkeypatch.setattr(c, "HF_HUB_CACHE", hf_env["HF_HUB_CACHE"])
    monkeypatch.setattr(c, "HF_HUB_DISABLE_XET", True)
    log: list[dict[str, Any]] = []

    def factory() -> httpx.Client:
        http = hf_http.default_client_factory()
        http.event_hooks["request"].append(
            lambda r: log.append(
                {
                    "method": r.method,
                    "path": r.url.path,
                    "range": r.headers.get("range"),
                    "auth": r.headers.get("authorization"),
                    "status": None,
                }
            )
        )
        http.event_hooks["response"].append(lambda r: log[-1].update(status=r.status_code))
        return http

    previous = hf_http._GLOBAL_CLIENT_FACTORY
    set_client_factory(factory)  # closes the current session
    cache = Path(hf_env["HF_HUB_CACHE"])
    try:
        yield SimpleNamespace(api=HfApi(endpoint=olah.url), cache=cache, log=log, url=olah.url)
    finally:
        set_client_factory(previous)
        close_session()
    assert all(r["auth"] is None for r in log), "the client sent a token to olah"


def _download(client: SimpleNamespace, repo: str, name: str, revision: str | None = None, **kw: Any) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, name, revision=revision, cache_dir=client.cache, endpoint=client.url, **kw))


# -- the server -----------------------------------------------------------------------------------------------
def test_olah_is_the_pinned_release(olah):
    from tests.olah_mirror import OLAH_VERSION, olah_cli

    cli = olah_cli()
    assert cli is not None and olah.url.startswith("http://127.0.0.1:")
    probe = "import importlib.metadata as m; print(m.version('olah'))"
    version = subprocess.run(
        [str(cli.parent / "python"), "-c", probe], check=False, capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert version == OLAH_VERSION


# -- the client: resolve, list, download ----------------------------------------------------------------------
def test_client_resolves_lists_and_downloads(olah, client):
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    old_files = {"config.json": b'{"v": 1}', "w.dat": os.urandom(5000), "sub/dir/t.txt": b"t"}
    old = olah.add_repo("org/client", old_files)
    new = olah.commit("org/client", {"config.json": b'{"v": 2}', "w.dat": old_files["w.dat"]})  # main moves
    api = client.api

    assert api.repo_info("org/client", revision="main").sha == new  # at once: olah reads git on every request
    info = api.model_info("org/client", revision="main")
    assert info.sha == new and sorted(s.rfilename for s in info.siblings) == ["config.json", "w.dat"]
    assert api.repo_info("org/client", revision=old).sha == old  # an old sha still resolves
    assert olah.tag("org/client", "v1", old) == old and api.repo_info("org/client", revision="v1").sha == old
    # olah ignores ?blobs=true: no sizes in siblings (the Hub gives them); the tree has them
    assert {s.size for s in api.repo_info("org/client", revision=old, files_metadata=True).siblings} == {None}

    tree = {e.path: e for e in api.list_repo_tree("org/client", revision=old, recursive=True)}
    assert set(tree) == {"config.json", "w.dat", "sub", "sub/dir", "sub/dir/t.txt"}
    assert isinstance(tree["sub/dir"], RepoFolder) and isinstance(tree["w.dat"], RepoFile)
    assert {p: (tree[p].size, tree[p].blob_id) for p in old_files} == {
        p: (len(d), git_blob_oid(d)) for p, d in old_files.items()
    }
    assert [e.path for e in api.list_repo_tree("org/client", revision="main")] == ["config.json", "w.dat"]

    assert _download(client, "org/client", "config.json", revision=old).read_bytes() == b'{"v": 1}'
    assert _download(client, "org/client", "config.json", revision="main").read_bytes() == b'{"v": 2}'
    blob = _download(client, "org/client", "w.dat", revision=old).resolve()
    assert blob.name == git_blob_oid(old_files["w.dat"])  # the cache blob is named by olah's ETag

    ds = olah.add_repo("org/client-data", {"data/train.jsonl": b'{"text": "a"}\n'}, kind="dataset")
    assert api.dataset_info("org/client-data", revision="main").sha == ds
    assert (
        _download(client, "org/client-data", "data/train.jsonl", revision=ds, repo_type="dataset").read_bytes()
        == b'{"text": "a"}\n'
    )

    # Surprise: offline, olah answers the repo-info route without a revision only from its proxy cache, never
    # from a local mirror: `repo_info(repo)` fails, `repo_info(repo, revision="main")` works.
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("org/client")


def test_lfs_files_are_served_and_named_by_sha256(olah, client):
    big = os.urandom(100_000)
    sha = olah.add_repo("org/lfs", {"config.json": b"{}", "model.safetensors": big}, lfs=True)
    entry = next(e for e in client.api.list_repo_tree("org/lfs", revision=sha) if e.path == "model.safetensors")
    assert (entry.size, entry.lfs.sha256, entry.lfs.size) == (len(big), hashlib.sha256(big).hexdigest(), len(big))
    path = _download(client, "org/lfs", "model.safetensors", revision=sha)
    assert path.read_bytes() == big and path.resolve().name == hashlib.sha256(big).hexdigest()


# -- raw HTTP: headers, Range -----------------------------------------------------------------------------------
def test_resolve_headers(olah):
    data, big = os.urandom(5000), os.urandom(100_000)
    sha = olah.add_repo("org/headers", {"w.dat": data, "model.safetensors": big}, lfs=["model.safetensors"])
    url = f"{olah.url}/org/headers/resolve/main"

    head = _http("HEAD", f"{url}/w.dat")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == "5000" and "Transfer-Encoding" not in head.headers
    assert head.headers["X-Repo-Commit"] == sha
    # ETag: the git blob oid, unquoted (the Hub quotes it); no X-Linked-*, no Accept-Ranges
    assert head.headers["ETag"] == git_blob_oid(data)
    assert not {"X-Linked-Etag", "X-Linked-Size", "Accept-Ranges", "Content-Range"} & set(head.headers)

    get = _http("GET", f"{url}/w.dat")
    assert get.status_code == 200 and get.content == data
    # GET is chunked, and carries none of HEAD's metadata
    assert get.headers["Transfer-Encoding"] == "chunked"
    assert not {"Content-Length", "ETag", "X-Repo-Commit", "Accept-Ranges"} & set(get.headers)

    lfs = _http("HEAD", f"{url}/model.safetensors")
    assert lfs.status_code == 200 and lfs.headers["Content-Length"] == "100000"  # the object's size, not the pointer's
    assert lfs.headers["ETag"] == hashlib.sha256(big).hexdigest()  # unquoted sha256, in ETag itself
    assert not {"X-Linked-Etag", "X-Linked-Size"} & set(lfs.headers)
    assert _http("GET", f"{url}/model.safetensors").content == big


def test_range_is_ignored(olah):
    data = os.urandom(5000)
    olah.add_repo("org/range", {"w.dat": data})
    url = f"{olah.url}/org/range/resolve/main/w.dat"
    for rng in ("bytes=1000-", "bytes=10-19", "bytes=-5", "bytes=5000-", "bytes=99999-"):
        r = _http("GET", url, Range=rng)
        # always 200 with the whole file, chunked: no 206, no Content-Range, and no 416 past the end
        assert (r.status_code, r.content, r.headers.get("Transfer-Encoding")) == (200, data, "chunked"), rng
        assert "Content-Range" not in r.headers and "Content-Length" not in r.headers


# -- errors -----------------------------------------------------------------------------------------------------
def test_unknown_branch(olah, client):
    from huggingface_hub.errors import RepositoryNotFoundError

    olah.add_repo("org/branch", {"config.json": b"{}"})
    for method, path in [
        ("HEAD", "/org/branch/resolve/nope/config.json"),
        ("GET", "/org/branch/resolve/nope/config.json"),
        ("GET", "/api/models/org/branch/revision/nope"),
    ]:
        r = _http(method, olah.url + path)
        # 401 RepoNotFound (the Hub: 404 RevisionNotFound): offline, olah looks a branch up in its proxy cache only
        assert (r.status_code, r.headers.get("X-Error-Code"), r.headers.get("X-Error-Message")) == (
            401,
            "RepoNotFound",
            REPO_NOT_FOUND,
        ), (method, path)

    # so the client raises RepositoryNotFoundError, not RevisionNotFoundError
    with pytest.raises(RepositoryNotFoundError) as e:
        _download(client, "org/branch", "config.json", revision="nope")
    assert type(e.value) is RepositoryNotFoundError and e.value.response.status_code == 401
    assert str(e.value).startswith(
        f"401 Client Error.\n\nRepository Not Found for url: {olah.url}/org/branch/resolve/nope/config.json.\n"
    )
    with pytest.raises(RepositoryNotFoundError) as e:
        client.api.repo_info("org/branch", revision="nope")
    assert str(e.value).startswith(
        f"401 Client Error.\n\nRepository Not Found for url: {olah.url}/api/models/org/branch/revision/nope.\n"
    )


def test_unknown_sha(olah, client, monkeypatch):
    from huggingface_hub import close_session
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RemoteEntryNotFoundError

    olah.add_repo("org/sha", {"config.json": b"{}"})
    # GitPython raises on a sha the repo lacks, and olah answers a bare 500 (no X-Error-Code) to file and API
    for method, path in [
        ("HEAD", f"/org/sha/resolve/{UNKNOWN_SHA}/config.json"),
        ("GET", f"/org/sha/resolve/{UNKNOWN_SHA}/config.json"),
        ("GET", f"/api/models/org/sha/revision/{UNKNOWN_SHA}"),
    ]:
        r = _http(method, olah.url + path)
        assert r.status_code == 500 and "X-Error-Code" not in r.headers, (method, path)
        assert r.content == (b"" if method == "HEAD" else b"Internal Server Error")
    tree = _http("GET", f"{olah.url}/api/models/org/sha/tree/{UNKNOWN_SHA}/")
    assert (tree.status_code, tree.headers.get("X-Error-Code")) == (404, "EntryNotFound")

    # After a 500 olah closes the connection, with no "Connection: close" in the answer
    with socket.create_connection(("127.0.0.1", olah.port), timeout=10) as s:
        s.sendall(f"HEAD /org/sha/resolve/{UNKNOWN_SHA}/config.json HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 500 ") and b"connection: close" not in answer.lower()
        assert s.recv(4096) == b""  # then EOF

    with pytest.raises(HfHubHTTPError) as e:
        client.api.repo_info("org/sha", revision=UNKNOWN_SHA)
    assert type(e.value) is HfHubHTTPError and e.value.response.status_code == 500
    assert _first_line(e.value) == (
        f"Server error '500 Internal Server Error' for url '{olah.url}/api/models/org/sha/revision/{UNKNOWN_SHA}'"
    )
    # The client's next request on that kept-alive connection would mostly fail with httpx.ReadError
    # ("[Errno 104] Connection reset by peer"; a race, not asserted): start a new session after each 500.
    close_session()
    with pytest.raises(RemoteEntryNotFoundError):
        list(client.api.list_repo_tree("org/sha", revision=UNKNOWN_SHA))

    # hf_hub_download: one HEAD without retries (500), then at once a second round with retries: that round's
    # first HEAD goes out on the connection olah just closed and mostly dies with ECONNRESET (status None
    # here); then five retries after backoff waits of 1, 2, 4, 8, 8 s (shortened to 0.2 s here, long enough for
    # the client to see the connection closed: each retry gets a new one and a 500). Then it gives up as if
    # offline. On the real clock: about 23 s before a LocalEntryNotFoundError.
    waits: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (waits.append(s), real_sleep(min(s, 0.2)))[1])
    close_session()
    client.log.clear()
    with pytest.raises(LocalEntryNotFoundError) as e:
        _download(client, "org/sha", "config.json", revision=UNKNOWN_SHA)
    assert waits == [1, 2, 4, 8, 8]
    statuses = [r["status"] for r in client.log]
    assert {r["method"] for r in client.log} == {"HEAD"} and len(statuses) == 7
    assert statuses[0] == 500 and statuses[1] in (500, None) and statuses[2:] == [500] * 5
    assert str(e.value).startswith(
        "An error happened while trying to locate the file on the Hub and we cannot "
        "find the requested files in the local cache."
    )


def test_unknown_repo(olah, client):
    from huggingface_hub.errors import RepositoryNotFoundError

    for method, path in [
        ("HEAD", "/org/none/resolve/main/config.json"),
        ("GET", "/org/none/resolve/main/config.json"),
        ("GET", "/api/models/org/none/revision/main"),
        ("GET", "/api/models/org/none"),
        ("GET", "/api/datasets/org/none/revision/main"),
    ]:
        r = _http(method, olah.url + path)
        assert (r.status_code, r.headers.get("X-Error-Code")) == (401, "RepoNotFound"), (method, path)  # Hub: 401 too
    with pytest.raises(RepositoryNotFoundError) as e:
        _download(client, "org/none", "config.json")
    assert str(e.value).startswith(
        f"401 Client Error.\n\nRepository Not Found for url: {olah.url}/org/none/resolve/main/config.json.\n"
    )
    with pytest.raises(RepositoryNotFoundError):
        client.api.repo_info("org/none", revision="main")


def test_unknown_file(olah, client):
    from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError

    sha = olah.add_repo("org/file", {"config.json": b"{}"})
    at_sha, at_main = f"{olah.url}/org/file/resolve/{sha}/nope.json", f"{olah.url}/org/file/resolve/main/nope.json"
    # at a sha: HEAD 404 EntryNotFound (no X-Repo-Commit), but GET 500; at a branch: 401 RepoNotFound
    r = _http("HEAD", at_sha)
    assert (r.status_code, r.headers.get("X-Error-Code"), "X-Repo-Commit" in r.headers) == (404, "EntryNotFound", False)
    assert _http("GET", at_sha).status_code == 500
    r = _http("HEAD", at_main)
    assert (r.status_code, r.headers.get("X-Error-Code")) == (401, "RepoNotFound")

    from huggingface_hub import close_session

    close_session()  # the GET above left nothing behind (a new connection), but be explicit: no reuse after a 500
    with pytest.raises(RemoteEntryNotFoundError):
        _download(client, "org/file", "nope.json", revision=sha)
    with pytest.raises(RepositoryNotFoundError):
        _download(client, "org/file", "nope.json", revision="main")


# -- a partial file in the cache ----------------------------------------------------------------------------------
def test_partial_incomplete_file_restarts_from_zero(olah, client):
    import huggingface_hub
    from packaging.version import Version

    data = os.urandom(300_000)
    sha = olah.add_repo("org/partial", {"w.dat": data})
    etag = git_blob_oid(data)  # olah's ETag for a plain file: the cache blob's name
    blobs = client.cache / "models--org--partial" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{etag}.incomplete").write_bytes(b"\0" * 1000)  # not the file's first bytes: a resume would corrupt
    client.log.clear()

    path = _download(client, "org/partial", "w.dat", revision=sha)

    assert path.read_bytes() == data
    gets = [r for r in client.log if r["method"] == "GET"]
    if Version(huggingface_hub.__version__) < Version("1.18"):
        # this client appends to blobs/<etag>.incomplete and asks for the rest; olah answers 200 with the whole
        # file, and the client empties the partial file and starts again from byte 0
        assert [(r["range"], r["status"]) for r in gets] == [("bytes=1000-", 200)]
        assert sorted(p.name for p in blobs.iterdir()) == [etag]
    else:  # later clients write each download to a file of its own and never resume across runs
        assert [r["range"] for r in gets] == [None]
