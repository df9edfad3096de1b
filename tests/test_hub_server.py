"""The loopback hub answers as the Hub does, for raw HTTP and for the installed huggingface_hub client.

The staging tests trust this server; these tests pin the protocol details they rely on (headers, Range,
error codes, revisions, uploads, fault injection, the standalone process), and the switches that make it answer as
mirrors and proxies do (as olah does: tests/test_olah_mirror.py pins olah's answers).
"""

from __future__ import annotations

import http.client
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.hubserver import spawn
from tests.hubtools import MiB, wait_for

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hub, cache, hf_env


def _http(url: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_resolve_headers_and_ranges(hub):
    big = os.urandom(100_000)  # over the LFS threshold
    sha = hub.store.commit("org/m", {"config.json": b'{"a": 1}', "w.bin": big})
    url = f"{hub.url}/org/m/resolve/main"

    status, h, body = _http(f"{url}/w.bin", "HEAD")
    assert status == 200 and body == b"" and h["Content-Length"] == "100000" and h["Accept-Ranges"] == "bytes"
    assert h["X-Repo-Commit"] == sha and h["ETag"].startswith('"') and h["X-Linked-Size"] == "100000"
    assert h["X-Linked-Etag"].strip('"') == hub.store.revision("org/m", sha).files["w.bin"].sha256
    status, h, body = _http(f"{url}/config.json", "HEAD")
    assert "X-Linked-Etag" not in h
    assert h["ETag"].strip('"') == hub.store.revision("org/m", sha).files["config.json"].oid  # the git blob oid

    assert _http(f"{url}/w.bin", Range="bytes=10-19")[::2] == (206, big[10:20])
    status, h, body = _http(f"{url}/w.bin", Range="bytes=99990-")
    assert (status, body, h["Content-Range"]) == (206, big[99990:], "bytes 99990-99999/100000")
    assert _http(f"{url}/w.bin", Range="bytes=-5")[::2] == (206, big[-5:])
    status, h, _ = _http(f"{url}/w.bin", Range="bytes=100000-")
    assert status == 416 and h["Content-Range"] == "bytes */100000"
    assert _http(f"{url}/w.bin")[::2] == (200, big)


def test_error_codes(hub):
    sha = hub.store.commit("org/m", {"config.json": b"{}"})
    hub.store.create_repo("org/private", token="tok")
    hub.store.commit("org/private", {"a": b"x"})
    hub.store.create_repo("org/gated", gated=True, granted=("ok",))
    hub.store.commit("org/gated", {"a": b"x"})

    def code(path: str, **headers: str) -> tuple[int, str | None]:
        status, h, _ = _http(hub.url + path, **headers)
        return status, h.get("X-Error-Code")

    assert code("/org/none/resolve/main/a") == (404, "RepoNotFound")
    assert code("/api/models/org/none") == (404, "RepoNotFound")
    assert code("/org/m/resolve/v2/config.json") == (404, "RevisionNotFound")
    assert code("/api/models/org/m/revision/v2") == (404, "RevisionNotFound")
    status, h, _ = _http(f"{hub.url}/org/m/resolve/main/nope.json")
    assert (status, h["X-Error-Code"], h["X-Repo-Commit"]) == (404, "EntryNotFound", sha)
    assert code("/org/private/resolve/main/a") == (401, "RepoNotFound")  # anonymous: hidden
    assert code("/org/private/resolve/main/a", Authorization="Bearer other") == (404, "RepoNotFound")
    assert code("/org/private/resolve/main/a", Authorization="Bearer tok") == (200, None)
    assert code("/api/models/org/gated") == (200, None)  # metadata of a gated repo is public
    assert code("/org/gated/resolve/main/a") == (401, "GatedRepo")
    assert code("/org/gated/resolve/main/a", Authorization="Bearer other") == (403, "GatedRepo")
    assert code("/org/gated/resolve/main/a", Authorization="Bearer ok") == (200, None)


def test_client_sees_revisions_listing_and_typed_errors(hub, cache):
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    old = hub.store.commit("org/m", {"config.json": b"1", "sub/dir/w.safetensors": b"w" * 10})
    new = hub.store.commit("org/m", {"config.json": b"2"})
    api = HfApi(endpoint=hub.url)
    assert api.repo_info("org/m").sha == new
    info = api.repo_info("org/m", revision=old, files_metadata=True)
    assert {s.rfilename: s.size for s in info.siblings} == {"config.json": 1, "sub/dir/w.safetensors": 10}
    tree = {e.path: e for e in api.list_repo_tree("org/m", revision=old, recursive=True)}
    assert set(tree) == {"config.json", "sub", "sub/dir", "sub/dir/w.safetensors"}
    assert tree["sub/dir/w.safetensors"].lfs.sha256 and tree["config.json"].lfs is None
    assert [e.path for e in api.list_repo_tree("org/m", revision=old)] == ["config.json", "sub"]

    def read(rev: str) -> str:
        return Path(
            hf_hub_download("org/m", "config.json", revision=rev, cache_dir=cache, endpoint=hub.url)
        ).read_text()

    assert (read(old), read(new), read("main")) == ("1", "2", "2")

    hub.store.create_repo("org/gated", gated=True)
    hub.store.commit("org/gated", {"a": b"x"})
    for exc, repo, name, rev in [
        (RepositoryNotFoundError, "org/none", "a", None),
        (RevisionNotFoundError, "org/m", "a", "v9"),
        (EntryNotFoundError, "org/m", "nope", None),
        (GatedRepoError, "org/gated", "a", None),
    ]:
        with pytest.raises(exc):
            hf_hub_download(repo, name, revision=rev, cache_dir=cache, endpoint=hub.url)
    hub.store.set_ref("org/m", "main", old)  # main moved back (a revert)
    assert api.repo_info("org/m").sha == old and read("main") == "1"
    hub.store.delete_revision("org/m", old)
    with pytest.raises(RevisionNotFoundError):
        api.repo_info("org/m", revision=old)


def test_upload_folder_with_this_client(hub, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    folder = tmp_path / "out"
    (folder / "sub").mkdir(parents=True)
    files = {"README.md": b"---\nlicense: mit\n---\n", "model.safetensors": os.urandom(200_000), "sub/c.json": b"{}"}
    for p, data in files.items():
        (folder / p).write_bytes(data)
    api = HfApi(endpoint=hub.url, token="dummy")
    for kind in ("model", "dataset"):
        url = api.create_repo("org/up", repo_type=kind, exist_ok=True)
        assert url.repo_id == "org/up"
        assert api.create_repo("org/up", repo_type=kind, exist_ok=True).repo_id == "org/up"  # 409 is fine
        commit = api.upload_folder(repo_id="org/up", folder_path=folder, repo_type=kind)
        rev = hub.store.revision("org/up", "main", kind)
        assert commit.oid == rev.sha and set(rev.files) == set(files)
        assert all(hub.store.read("org/up", rev.sha, p, kind) == data for p, data in files.items())
    api.upload_file(path_or_fileobj=b"new", path_in_repo="sub/c.json", repo_id="org/up")  # a commit on top
    assert hub.store.read("org/up", "main", "sub/c.json") == b"new"
    assert set(hub.store.revision("org/up", "main").files) == set(files)


def test_throttle_drop_and_request_log(hub):
    data = os.urandom(MiB)
    hub.store.commit("org/m", {"w.bin": data, "x.bin": data})
    url = f"{hub.url}/org/m/resolve/main"
    hub.throttle(2 * MiB, path="w.bin")
    t0 = time.monotonic()
    assert _http(f"{url}/w.bin")[2] == data
    assert time.monotonic() - t0 >= 0.45  # 1 MiB at 2 MiB/s, paced over the whole response
    assert _http(f"{url}/x.bin")[2] == data
    # other files unthrottled: the server's own record, not a duration (a busy machine is slow either way)
    assert [r["rate"] for r in hub.requests("/org/m/resolve/main/", "GET")] == [2 * MiB, 0]

    hub.drop_after(1000, path="x.bin")
    with pytest.raises(http.client.IncompleteRead):  # the body ends short of its Content-Length
        _http(f"{url}/x.bin")
    assert _http(f"{url}/x.bin")[2] == data  # once only
    log = hub.requests("/x.bin", "GET")
    assert [(r["status"], r["bytes_sent"], r["aborted"]) for r in log] == [
        (200, MiB, False),
        (200, 1000, True),
        (200, MiB, False),
    ]
    assert hub.requests("/w.bin", "GET")[0]["bytes_sent"] == MiB


def test_switches_answer_as_mirrors_and_proxies_do(hub):
    import httpx

    data = os.urandom(5000)
    hub.store.commit("org/m", {"w.dat": data})
    url = f"{hub.url}/org/m/resolve/main/w.dat"

    hub.ignore_range()  # 200, the whole file, chunked without Content-Length; HEAD keeps Content-Length
    for rng in ("bytes=1000-", "bytes=10-19", "bytes=-5", "bytes=99999-"):
        r = httpx.get(url, headers={"Range": rng})
        assert (r.status_code, r.content, r.headers.get("Transfer-Encoding")) == (200, data, "chunked"), rng
        assert not {"Content-Length", "Content-Range", "Accept-Ranges"} & set(r.headers)
    assert httpx.head(url).headers["Content-Length"] == "5000"

    hub.unquoted_etags()
    etag = httpx.head(url).headers["ETag"]
    assert etag == hub.store.revision("org/m", "main").files["w.dat"].oid  # no quotes

    for status in (401, 404):  # a revision it lacks, answered as a missing repository (olah: 401)
        hub.unknown_revision(status)
        for method, path in [("HEAD", "/org/m/resolve/nope/w.dat"), ("GET", "/api/models/org/m/revision/nope")]:
            r = httpx.request(method, hub.url + path)
            assert (r.status_code, r.headers.get("X-Error-Code")) == (status, "RepoNotFound"), (method, path)

    hub.fail(500, contains="/revision/", method="GET", times=2)  # a bare 500, then the connection closed unsaid
    with socket.create_connection(("127.0.0.1", int(hub.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(b"GET /api/models/org/m/revision/main HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"Internal Server Error"):
            chunk = s.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 500 ") and b"x-error-code" not in answer.lower()
        assert b"connection: close" not in answer.lower() and s.recv(4096) == b""  # then EOF
    assert httpx.get(hub.url + "/api/models/org/m/revision/main").status_code == 500
    assert httpx.get(hub.url + "/api/models/org/m/revision/main").status_code == 200  # two only

    hub.clear_faults()  # every mode back to the Hub's
    r = httpx.get(url, headers={"Range": "bytes=10-19"})
    assert (r.status_code, r.content) == (206, data[10:20]) and r.headers["ETag"].startswith('"')
    assert httpx.get(hub.url + "/api/models/org/m/revision/nope").headers["X-Error-Code"] == "RevisionNotFound"


def test_standalone_process(tmp_path, hf_env):
    from huggingface_hub import hf_hub_download

    remote = spawn(tmp_path / "hub")
    try:
        remote.store.commit("org/m", {"config.json": b"{}", "w.bin": os.urandom(300_000)})  # shared through disk
        remote.throttle(1_000_000, path="w.bin")  # faults reach the other process over HTTP
        t0 = time.monotonic()
        path = hf_hub_download("org/m", "w.bin", cache_dir=tmp_path / "cache", endpoint=remote.url)
        assert time.monotonic() - t0 >= 0.25 and Path(path).stat().st_size == 300_000
        assert [r["status"] for r in remote.requests("/org/m/resolve/", "GET")] == [200]
    finally:
        remote.stop()
    assert remote.proc is not None and remote.proc.returncode == 0
    wait_for(lambda: remote.proc.poll() is not None, "the server process to exit", 30, 0.01)
