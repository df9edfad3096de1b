"""Staging through what sites put in front of the Hub: nginx (Debian's package) as a reverse proxy under a path prefix
with gzip and a file host for large files, and as a caching proxy; and the faulty answers such setups give.

The servers (``tests/nginx_proxy.py``) are real nginx processes on free loopback ports, in front of the project's
loopback hub (``tests/hubserver.py``). How each differs from the Hub, and what staging must make of it:

- ``prefix``: the API under ``/hf/``, JSON and file answers gzip-compressed and chunked (no Content-Length), GETs of
  large files redirected (302) to a second host: staged and verified as from the Hub;
- ``cache``: answers kept by nginx and served from its cache, a HEAD fetched as a GET: staged, and staged again from
  the cache alone once the hub behind it is gone;
- ``refused``: the file host refuses connections (a login node's firewall that allows the Hub API only): one line
  naming that host and URL and the firewall, not the endpoint and not an offline node;
- the prefix cut short: the site's portal page (HTML, 200) where the API should answer: one line with the URL and
  the prefix to fix, no traceback;
- ``wrong_size``: a HEAD whose size header is not the file's: one line with the URL, blaming the proxy, not the
  repository, before anything is fetched;
- ``no_query``: the query string dropped, so the recursive listing shows folders without their files: each folder is
  listed by path and the stage is complete (never exit 0 with files missing);
- ``flat``: folders stay without files even when listed by path: refused in one line, nothing staged;
- ``strip``: the Hub's ``X-Repo-Commit`` header stripped from file answers: one line naming the URL and the header;
- ``stall``: after 64 KiB, one byte per second: ``--time-limit`` still ends the run before the limit (exit 3, rerun).

Every case runs the real command (``sft-grid stage``) and checks its exit status and its one line.
"""

from __future__ import annotations

import gzip
import time
import urllib.request
from pathlib import Path

import pytest

from sft_grid.core.hubcache import is_complete, read_listing
from tests.hubtools import DATASET_NEEDED, MODEL_NEEDED, dataset_files, model_files, run_stage

pytest_plugins = ["tests.hub_fixtures", "tests.nginx_proxy"]  # fixtures: hf_env; nginx_front
pytestmark = pytest.mark.proxy


def one_line(text: str) -> str:
    """The one line the command printed besides its progress lines ("staging org/x: 0 B / ...")."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("staging org/")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def stage(endpoint: str, cache: Path, repo: str, *args: str, monkeypatch: pytest.MonkeyPatch, timeout: float = 300):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    return run_stage("--repo", repo, "--cache", str(cache), *args, timeout=timeout)


@pytest.fixture
def repos(nginx_front):
    hub, ng = nginx_front
    model = hub.store.commit("org/tiny", model_files(weights_mib=1), "model")
    data = hub.store.commit("org/chat", dataset_files(), "dataset")
    return hub, ng, model, data


def test_prefix_gzip_and_a_file_host_stage_as_from_the_hub(repos, tmp_path, monkeypatch):
    _, ng, model, data = repos
    # the setup really differs from the Hub: the API answers gzip-compressed and chunked under the prefix
    req = urllib.request.Request(f"{ng.url('prefix')}/api/models/org/tiny", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Encoding"] == "gzip" and r.headers["Content-Length"] is None
        assert b'"sha"' in gzip.decompress(r.read())
    cache = tmp_path / "c"
    for repo, kind, sha, needed in (("org/tiny", "model", model, MODEL_NEEDED), ("org/chat", "dataset", data, None)):
        r = stage(ng.url("prefix"), cache, repo, *(["--dataset"] if kind == "dataset" else []), monkeypatch=monkeypatch)
        assert r.returncode == 0, r.stderr
        assert is_complete(cache, repo, kind, sha)
        listed = {f.path for f in read_listing(cache, repo, kind, sha) or ()}
        assert (needed or DATASET_NEEDED) <= listed
    # the weights came from the second host, through a redirect, as the Hub sends them to its CDN
    log = ng.log()
    assert f'"GET /hf/org/tiny/resolve/{model}/model.safetensors HTTP/1.1" 302' in log
    assert f'"GET /org/tiny/resolve/{model}/model.safetensors HTTP/1.1" 200' in log


def test_a_caching_proxy_stages_and_serves_from_its_cache_alone(repos, tmp_path, monkeypatch):
    hub, ng, model, _ = repos
    r = stage(ng.url("cache"), tmp_path / "a", "org/tiny", monkeypatch=monkeypatch)
    assert r.returncode == 0, r.stderr
    hub.stop()  # the hub behind the proxy is gone: a second cache is filled from nginx's cache alone
    r = stage(ng.url("cache"), tmp_path / "b", "org/tiny", monkeypatch=monkeypatch)
    assert r.returncode == 0, r.stderr
    assert is_complete(tmp_path / "b", "org/tiny", "model", model)


def test_a_refused_file_host_is_named_not_the_endpoint(repos, tmp_path, monkeypatch):
    _, ng, _, _ = repos
    r = stage(ng.url("refused"), tmp_path / "c", "org/tiny", monkeypatch=monkeypatch)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    host = f"127.0.0.1:{ng.closed}"
    assert f"the file host it sends downloads to, {host}, refused the connection (http://{host}/org/tiny/" in line
    assert "firewall" in line and f"allow {host}" in line
    assert "cannot reach" not in line and "compute node" not in line and "HF_HUB_OFFLINE" not in line


def test_a_prefix_cut_short_answers_html_and_says_so(repos, tmp_path, monkeypatch):
    _, ng, _, _ = repos
    r = stage(ng.portal(), tmp_path / "c", "org/tiny", monkeypatch=monkeypatch)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert f"{ng.portal()}/api/models/org/tiny/revision/main answered 200 with an HTML page" in line
    assert "Research Computing Portal" in line and "path prefix" in line and "Fix: set HF_ENDPOINT" in line


def test_a_wrong_size_from_a_proxy_is_not_blamed_on_the_repository(repos, tmp_path, monkeypatch):
    _, ng, model, _ = repos
    r = stage(ng.url("wrong_size"), tmp_path / "c", "org/tiny", monkeypatch=monkeypatch)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert f"{ng.url('wrong_size')}/org/tiny/resolve/{model}/" in line and "X-Linked-Size: 123" in line
    assert "the repository is not at fault" in line and "repo owner" not in line
    assert not list((tmp_path / "c").glob("models--org--tiny/blobs/*"))  # nothing fetched on a wrong size


def test_a_listing_without_its_query_string_is_listed_by_folder(repos, tmp_path, monkeypatch):
    _, ng, _, data = repos
    r = stage(ng.url("no_query"), tmp_path / "c", "org/chat", "--dataset", monkeypatch=monkeypatch)
    assert r.returncode == 0, r.stderr
    assert is_complete(tmp_path / "c", "org/chat", "dataset", data)
    snapshot = tmp_path / "c" / "datasets--org--chat" / "snapshots" / data
    assert all((snapshot / p).is_file() for p in DATASET_NEEDED)  # the folder's files too, not the README alone
    assert "ignores recursive=true" in r.stderr  # the server's fault is said, with the URL
    assert f"{ng.url('no_query')}/api/datasets/org/chat/tree/" in r.stderr


def test_a_listing_that_stays_without_files_is_refused(repos, tmp_path, monkeypatch):
    _, ng, _, data = repos
    r = stage(ng.url("flat"), tmp_path / "c", "org/chat", "--dataset", monkeypatch=monkeypatch)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert f"from {ng.url('flat')}/api/datasets/org/chat/tree/{data}" in line and "is incomplete" in line
    assert "data" in line and "recursive=true" in line
    assert not list((tmp_path / "c").glob("datasets--org--chat/snapshots/*/README.md"))  # nothing staged


def test_a_proxy_stripping_the_hub_headers_is_named(repos, tmp_path, monkeypatch):
    _, ng, model, _ = repos
    r = stage(ng.url("strip"), tmp_path / "c", "org/tiny", monkeypatch=monkeypatch)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert f"{ng.url('strip')}/org/tiny/resolve/{model}/" in line and "answered HEAD 200" in line
    assert "without X-Repo-Commit" in line and "Fix: ask the proxy's operator" in line


def test_a_stalled_download_ends_before_the_time_limit(repos, tmp_path, monkeypatch):
    _, ng, model, _ = repos
    limit = 20  # staging stops 5 s before it (its margin): the headroom for the process to exit
    t0 = time.monotonic()
    r = stage(ng.url("stall"), tmp_path / "c", "org/tiny", "--time-limit", str(limit), monkeypatch=monkeypatch)
    elapsed = time.monotonic() - t0
    line = one_line(r.stderr)
    assert r.returncode == 3, r.stderr
    assert line.startswith("staging stopped:") and "Rerun to continue" in line
    assert f"{ng.url('stall')}/org/tiny/resolve/{model}/model.safetensors" in line
    assert elapsed < limit, f"ran {elapsed:.1f}s with --time-limit {limit}"
