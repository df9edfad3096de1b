"""Staging against servers that are not the Hub: olah (a real mirror server from PyPI, in its own environment) and
the loopback hub switched to answer as mirrors and caching proxies do where they differ from the Hub.

What differs, and what staging must make of it:

- ``Range`` ignored (200, the whole file, chunked without Content-Length): a partial file restarts from zero. The
  restart is seen, remembered for the endpoint, resume is no longer promised nor a partial file counted as fetched,
  and a file that cannot finish within one run is sent to a staging job instead of being restarted forever;
- a revision the server lacks answered as a missing repository (olah: 401 RepoNotFound; proxies: 404): the
  repository is asked for at its default revision, and the message says the revision is missing, not the token;
- a server error (olah: 500 for a commit it lacks): retried, then one line naming the repository, the revision and
  the fix, from every entry point that stages (no traceback);
- unquoted ETags and chunked answers: staged and checked as any other.

Each behaviour runs on olah and on the loopback hub switched to it (``hub-as-mirror``: 401 for an unknown revision;
``hub-as-proxy``: 404), and, where the Hub's own behaviour is the control, on the plain loopback hub. The module
starts servers (marker ``mirror``); every test stops by itself within seconds (waits are events, retries are short).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.hubcache import blob_path, is_complete, read_listing
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.stages.staging import (
    Budget,
    BudgetExceeded,
    HubServerError,
    RepoNotFound,
    RevisionNotFound,
    TokenRequired,
    download,
    memory,
    plan,
    resolve,
)
from sft_grid.stages.staging.client import client_version
from tests.hubserver import HubServer
from tests.hubtools import MiB, cell_args, dataset_files, model_files, run_stage

from .conftest import run_sft

pytest_plugins = ["tests.hub_fixtures", "tests.olah_mirror"]  # fixtures: hf_env, cache; olah
pytestmark = pytest.mark.mirror

UNKNOWN_SHA = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Server:
    """A server staging is pointed at, and how it differs from the Hub."""

    name: str
    url: str
    commit: Callable[[str, dict[str, bytes], str], str]  # (repo, files, kind) -> the commit sha of main
    ignores_range: bool
    hub: HubServer | None = None  # the loopback hub: its request log and faults

    def fail_unknown_sha(self) -> None:
        """A commit the server lacks answered with a bare 500, as mirrors do (olah by itself; the Hub: 404)."""
        if self.hub is not None and self.name != "hub":
            self.hub.fail(500, contains=UNKNOWN_SHA)


@pytest.fixture(params=["hub", "hub-as-mirror", "hub-as-proxy", "olah"])
def server(
    request: pytest.FixtureRequest, hf_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    # retries of a failing server: short here (the entry points in subprocesses keep the real waits)
    monkeypatch.setattr("sft_grid.stages.staging.client.RETRY_WAITS_S", (0.05, 0.05, 0.05))
    monkeypatch.setattr("sft_grid.stages.staging.transfer.RETRY_BASE_S", 0.05)
    if request.param == "olah":
        olah = request.getfixturevalue("olah")
        monkeypatch.setenv("HF_ENDPOINT", olah.url)
        yield Server("olah", olah.url, lambda repo, files, kind: olah.commit(repo, files, kind, lfs=True), True)
        return
    with HubServer(tmp_path / "hub") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        if request.param != "hub":
            hub.ignore_range()
            hub.unquoted_etags()
            hub.unknown_revision(401 if request.param == "hub-as-mirror" else 404)
        yield Server(
            request.param,
            hub.url,
            lambda repo, files, kind: hub.store.commit(repo, files, kind),
            request.param != "hub",
            hub,
        )


def repo_name() -> str:
    """A repository of its own per test: the olah server is shared by the module's tests."""
    return f"org/m-{uuid.uuid4().hex[:10]}"


def weights_repo(server: Server, size: int = 300_000) -> tuple[str, str, dict[str, bytes]]:
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(size)}
    repo = repo_name()
    return repo, server.commit(repo, files, "model"), files


def one_line(text: str) -> str:
    """The one line an entry point printed (progress lines aside: "  staging org/x: 0 B / ...")."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("  staging ")]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- staged as from the Hub, whatever the ETags and the framing ------------------------------------------------
def test_a_model_and_a_dataset_stage_and_verify(server, cache):
    model, data = repo_name(), repo_name()
    files = model_files(weights_mib=0.25)
    model_sha = server.commit(model, files, "model")
    data_sha = server.commit(data, {"README.md": b"# d\n", "data/train.jsonl": b'{"a": 1}\n' * 500}, "dataset")

    staged = download(model, "model", "main", cache, endpoint=server.url)
    assert staged.complete and staged.sha == model_sha and is_complete(cache, model, "model", model_sha, checksums=True)
    assert download(data, "dataset", "main", cache, endpoint=server.url).sha == data_sha
    assert is_complete(cache, data, "dataset", data_sha, checksums=True)
    assert download(model, "model", model_sha, cache, endpoint=server.url).offline  # the pin needs no request


# -- 6: resume is what the server does --------------------------------------------------------------------------
def test_a_restart_is_seen_remembered_and_a_file_too_big_for_a_run_goes_to_a_job(server, cache):
    repo, sha, files = weights_repo(server)
    weights = next(f for f in resolve(repo, endpoint=server.url).files if f.path == "model.safetensors")
    partial = blob_path(cache, repo, "model", weights).with_name(f"{weights.etag}.incomplete")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(files["model.safetensors"][:100_000])  # what a killed run leaves: the file's first bytes
    memory.keep_rate(cache, 20_000)  # the last run measured 20 kB/s: 15 s for the weights, more than a run here
    budget = Budget.from_now(10.0, margin_s=1.0)

    if not server.ignores_range:  # the Hub continues the file: seen, and nothing refused
        try:
            staged = download(repo, "model", "main", cache, endpoint=server.url, budget=budget)
        except BudgetExceeded as e:  # unless the client never continues a file (huggingface_hub 2.x): seen as such
            assert "this client" in str(e) and not memory.seen(cache, server.url, client_version()).resumes
            return
        assert staged.complete and is_complete(cache, repo, "model", sha, checksums=True)
        assert memory.seen(cache, server.url, client_version()).resumes is True
        return
    with pytest.raises(BudgetExceeded) as raised:
        download(repo, "model", "main", cache, endpoint=server.url, budget=budget)
    msg = str(raised.value)
    assert "model.safetensors" in msg and "restarts from zero" in msg
    # who restarted it, as seen: the server (a client that asks for the rest: huggingface_hub 1.17), or a client that
    # never asks (2.x)
    assert f"{server.url} ignores Range requests" in msg or "starts a file cut in an earlier run anew" in msg
    assert "cluster.staging.where=job" in msg and "\n" not in msg
    assert budget.left() > 0  # decided as the file started, not at the limit
    seen = memory.seen(cache, server.url, client_version())
    assert seen is not None and not seen.resumes and seen.why in msg
    assert not (cache / f"models--{repo.replace('/', '--')}" / "snapshots" / sha / "model.safetensors").exists()

    # nothing is counted as fetched any more: a partial file of the weights is the whole file to fetch
    partial.write_bytes(files["model.safetensors"][:100_000])
    p = plan(resolve(repo, endpoint=server.url), cache, endpoint=server.url)
    assert p.bytes_to_fetch == len(files["model.safetensors"])
    if server.hub is not None:
        server.hub.clear_log()
    with pytest.raises(BudgetExceeded):  # the next run knows: it does not even start the file
        download(repo, "model", "main", cache, endpoint=server.url, budget=Budget.from_now(10.0, margin_s=1.0))
    if server.hub is not None:
        assert server.hub.downloads(repo, "model.safetensors") == []
    assert download(repo, "model", "main", cache, endpoint=server.url).complete  # without a limit it stages


def test_time_limited_runs_behind_a_server_that_ignores_range_end_instead_of_looping(server, cache):
    """The issue's loop, as a user meets it: repeated time-limited runs of `sft-grid stage`."""
    if server.name == "hub":
        pytest.skip("the Hub honours Range: test_hub_stage covers runs that continue each other")
    repo, _, files = weights_repo(server, size=6 * MiB if server.hub else 300_000)
    if server.hub is not None:  # 1 MiB/s: the first run moves part of the file and stops before its limit
        server.hub.throttle(1 * MiB, path="model.safetensors")
        first = run_stage("--repo", repo, "--cache", str(cache), "--time-limit", "9")
        assert first.returncode == 3, first.stdout + first.stderr
        out = first.stdout + first.stderr
        assert out.count("stopped before this process's time limit") == 1  # printed once
        assert f"if {server.url} honours Range requests, which the next run will show" in out  # no blind promise
    else:  # olah cannot be slowed down: a killed run's partial file and its measured rate, as the first run leaves
        f = next(f for f in resolve(repo, endpoint=server.url).files if f.path == "model.safetensors")
        partial = blob_path(cache, repo, "model", f).with_name(f"{f.etag}.incomplete")
        partial.parent.mkdir(parents=True)
        partial.write_bytes(files["model.safetensors"][:100_000])
        memory.keep_rate(cache, 20_000)
    second = run_stage("--repo", repo, "--cache", str(cache), "--time-limit", "9")
    assert second.returncode == 1, second.stdout + second.stderr
    line = one_line(second.stderr)
    assert "restarts from zero" in line and "cluster.staging.where=job" in line and "partial files resume" not in line
    third = run_stage("--repo", repo, "--cache", str(cache), "--time-limit", "9")
    assert third.returncode == 1 and "cluster.staging.where=job" in one_line(third.stderr)


# -- 8: server errors --------------------------------------------------------------------------------------------
def test_an_unknown_commit_answered_with_a_server_error_names_the_revision(server, cache):
    repo, _, _ = weights_repo(server)
    server.fail_unknown_sha()
    with pytest.raises((RevisionNotFound, HubServerError)) as e:
        download(repo, "model", UNKNOWN_SHA, cache, endpoint=server.url)
    msg = str(e.value)
    assert UNKNOWN_SHA in msg and repo in msg and " Fix: " in msg and "\n" not in msg
    if server.name == "hub":  # the Hub says so itself
        # not a server error (the repository's random name, or the cache's path, can hold the digits 500)
        assert isinstance(e.value, RevisionNotFound) and "answered 500" not in msg
    else:  # a 500 each try, while the repository answers at main: the revision is what is missing
        assert isinstance(e.value, RevisionNotFound) and "500 Internal Server Error" in msg and "'main'" in msg
        if server.hub is not None:
            tries = [r for r in server.hub.requests(UNKNOWN_SHA) if r["status"] == 500]
            assert len(tries) == 4  # tried again after each wait


@pytest.mark.parametrize(
    "where, status", [("the repository", 503), ("the repository", 429), ("a file", 520), ("a file", 500)]
)
def test_a_transient_server_error_is_retried(hf_env, cache, tmp_path, monkeypatch, where, status):
    """Any 5xx (a proxy's own ones too: 520) and 429, on the repository's revision or on a file's bytes."""
    monkeypatch.setattr("sft_grid.stages.staging.client.RETRY_WAITS_S", (0.05, 0.05, 0.05))
    monkeypatch.setattr("sft_grid.stages.staging.transfer.RETRY_BASE_S", 0.05)
    with HubServer(tmp_path / "hub") as hub:
        sha = hub.store.commit("org/m", model_files())
        hub.fail(
            status,
            contains="/api/models/org/m/revision/main" if where == "the repository" else "/resolve/",
            method="GET",
            times=2,
        )
        staged = download("org/m", "model", "main", cache, endpoint=hub.url)
        assert staged.complete and staged.sha == sha and is_complete(cache, "org/m", "model", sha, checksums=True)
        assert [r["status"] for r in hub.requests("", "GET") if r["status"] == status] == [status, status]


@pytest.mark.parametrize("where", ["the repository", "a file"])
def test_a_failing_server_is_one_line_with_the_fix(hf_env, cache, tmp_path, monkeypatch, where):
    monkeypatch.setattr("sft_grid.stages.staging.client.RETRY_WAITS_S", (0.05, 0.05, 0.05))
    monkeypatch.setattr("sft_grid.stages.staging.transfer.RETRY_BASE_S", 0.05)
    with HubServer(tmp_path / "hub") as hub:
        hub.store.commit("org/m", model_files())
        hub.fail(502, contains="/org/m" if where == "the repository" else "model.safetensors", method="GET")
        with pytest.raises(HubServerError) as e:
            download("org/m", "model", "main", cache, endpoint=hub.url)
    msg = str(e.value)
    assert "502 Bad Gateway to each of" in msg and "model repo 'org/m' at revision '" in msg
    assert " Fix: " in msg and "again later" in msg and "\n" not in msg
    if where == "a file":
        assert "model.safetensors" in msg and "finished files are kept" in msg


# -- 9: which thing is missing -------------------------------------------------------------------------------------
def test_an_unknown_branch_is_named_as_the_revision_not_the_token(server, cache):
    repo, _, _ = weights_repo(server)
    with pytest.raises(RevisionNotFound) as e:
        download(repo, "model", "nope", cache, endpoint=server.url)
    msg = str(e.value)
    assert "revision 'nope'" in msg and repo in msg and "does not exist" in msg and "\n" not in msg
    assert "token" not in msg.lower()
    with pytest.raises((RepoNotFound, TokenRequired)) as missing:  # the repository itself: missing, or private
        download(repo + "-none", "model", "nope", cache, endpoint=server.url)
    assert f"'{repo}-none'" in str(missing.value) and "check the id" in str(missing.value)
    assert read_listing(cache, repo, "model", "nope") is None


def test_the_stage_command_says_which_thing_is_missing_in_one_line(server, cache):
    if server.name not in ("olah", "hub-as-mirror"):
        pytest.skip("the entry point is the same for every server: run it where the answers differ most")
    repo, _, _ = weights_repo(server)
    server.fail_unknown_sha()
    branch = run_stage("--repo", repo, "--revision", "nope", "--cache", str(cache))
    assert branch.returncode == 1
    assert f"revision 'nope' of model repo '{repo}' does not exist" in one_line(branch.stderr)
    sha = run_stage("--repo", repo, "--revision", UNKNOWN_SHA, "--cache", str(cache))
    assert sha.returncode == 1
    line = one_line(sha.stderr)
    assert f"revision '{UNKNOWN_SHA}' of model repo '{repo}'" in line and "500" in line and " Fix: " in line


def test_the_grid_and_its_dry_run_name_a_recorded_commit_the_server_lacks(server, cache, tmp_path):
    """A failed cell's rerun trains on the commit it recorded; a mirror that lacks it answers 500 (olah) or as if the
    repository were missing (401/404): the grid and its dry run say the revision is missing, for that cell, without
    a traceback."""
    if server.name == "hub":
        pytest.skip(
            "the Hub's own answer: test_stage_grid.py::test_a_rerun_keeps_the_commit_it_trained_on_while_main_moves"
        )
    model, data = repo_name(), repo_name()
    model_sha = server.commit(model, model_files(), "model")
    data_sha = server.commit(data, dataset_files(), "dataset")
    runs = tmp_path / "runs"
    argv = cell_args(cache, runs, model, data)
    assert run_sft(*argv, "dry_run=true").returncode == 0  # renders the cell
    (cell,) = iter_cell_dirs(runs / "default")
    inputs = [
        {"kind": "model", "repo": model, "revision": "main", "sha": UNKNOWN_SHA},
        {"kind": "dataset", "repo": data, "revision": "main", "sha": data_sha},
    ]
    events.append(cell, Event(Kind.SUBMITTED, executor="local", details={"inputs": inputs}))
    events.append(cell, Event(Kind.FAILED, reason="node failure"))
    if server.name == "hub-as-mirror":  # a 500, as olah; the proxy keeps its 404 RepoNotFound
        server.fail_unknown_sha()

    for extra in (["dry_run=true"], []):
        proc = run_sft(*argv, "rerun_failed=true", *extra)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        err = proc.stderr
        assert "Traceback" not in err + proc.stdout and "found by staging; nothing was submitted" in err
        assert f"cell {cell.name}" in err and f"model.hub_id='{model}': revision '{UNKNOWN_SHA}'" in err
        assert "'main'): the cell's earlier run trained on this commit" in err and "force=true" in err
        assert "token" not in err.lower()
        assert (
            "answered 404 as if the repository were missing"
            if server.name == "hub-as-proxy"
            else "500 Internal Server Error to each of 4 tries"
        ) in err
    assert not (cache / f"models--{model.replace('/', '--')}" / "snapshots" / model_sha).exists()


@pytest.fixture(autouse=True)
def _no_backend(no_backend_here: None) -> None:
    """Every test here: no backend environment on this machine (tests/conftest.py)."""
