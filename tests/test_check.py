"""`sft-grid check`: every Hub model and dataset of a grid resolved on the site's Hub, in one table, from a login
node; and a real run reaching the same verdicts before it queues anything.

The Hub here is the project's loopback server (tests/hubserver.py, HF_ENDPOINT) answered through the real
huggingface_hub client: the real Hub cannot be reached from this machine. The grid is one cell on the synthetic
repositories of tests/hubtools.py; nothing in these tests may write a cell, stage a file or queue a job.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid.core.paths import REPO_ROOT
from tests.hubtools import cell_args, dataset_files, model_files

from .conftest import run_sft

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hub (the loopback server, HF_ENDPOINT set), cache, hf_env


def check(*args: str) -> subprocess.CompletedProcess[str]:
    """`sft-grid check <args>` as a user types it (the console script's module)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "sft_grid.cli.main", "check", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def row(out: str, repo: str) -> str:
    found = [line for line in out.splitlines() if f" {repo} " in line]
    assert len(found) == 1, out
    return found[0]


def cols(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def nothing_written(runs: Path, cache: Path) -> None:
    assert not runs.exists(), sorted(runs.rglob("*"))
    assert not any(cache.glob("*/snapshots/*")) if cache.exists() else True


def test_check_resolves_the_pinned_commit_and_says_where_main_is_now(hub, cache, tmp_path):
    pinned = hub.store.commit("org/tiny", model_files(weights_mib=0.25))
    moved = hub.store.commit("org/tiny", model_files(weights_mib=0.25, seed=1))
    data = hub.store.commit("org/chat", dataset_files(), kind="dataset")
    runs = tmp_path / "runs"
    proc = check(*cell_args(cache, runs), f"model.revision={pinned}")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    # kind, repository, asked, resolves to, main now (moved past the pin), files, their size, cells, verdict
    model = cols(row(proc.stdout, "org/tiny"))
    assert model[:5] == ["model", "org/tiny", pinned[:12], pinned[:12], f"{moved[:12]} (moved on)"], model
    assert int(model[5]) >= 3 and model[6].endswith("kB") and model[7:] == ["1", "found"], model
    dataset = cols(row(proc.stdout, "org/chat"))
    assert dataset[:4] == ["dataset", "org/chat", "main", data[:12]] and dataset[-1] == "found", dataset
    assert "2 Hub repositories of 1 cell(s): every one found; nothing written, staged or queued" in proc.stdout
    nothing_written(runs, cache)
    # it asked the Hub about the files, and fetched none of them
    assert not hub.requests("/org/tiny/resolve/", "GET")


def test_check_names_a_wrong_id_and_a_wrong_revision_and_exits_1(hub, cache, tmp_path):
    hub.store.commit("org/tiny", model_files(weights_mib=0.25))
    hub.store.commit("org/chat", dataset_files(), kind="dataset")
    runs = tmp_path / "runs"
    wrong_id = check(*cell_args(cache, runs, model="org/tiny-2.7Btokens"))
    assert wrong_id.returncode == 1
    assert "org/tiny-2.7Btokens" in row(wrong_id.stdout, "org/tiny-2.7Btokens")
    assert "NOT all found" in wrong_id.stdout and "Traceback" not in wrong_id.stderr
    bad_sha = "0" * 40
    wrong_rev = check(*cell_args(cache, runs), f"model.revision={bad_sha}")
    assert wrong_rev.returncode == 1
    line = cols(row(wrong_rev.stdout, "org/tiny"))
    assert line[2:4] == [bad_sha[:12], "-"] and "revision" in line[-1].lower(), line
    assert "found" in row(wrong_rev.stdout, "org/chat")
    nothing_written(runs, cache)


def test_a_real_run_refuses_a_wrong_id_with_the_checks_verdict_before_anything_is_written(hub, cache, tmp_path):
    hub.store.commit("org/chat", dataset_files(), kind="dataset")
    runs = tmp_path / "runs"
    verdict = row(check(*cell_args(cache, runs, model="org/missing")).stdout, "org/missing")
    proc = run_sft(*cell_args(cache, runs, model="org/missing"))
    assert proc.returncode != 0
    reason = cols(verdict)[-1]
    assert reason and reason in " ".join(proc.stderr.split()), (reason, proc.stderr[-2000:])
    nothing_written(runs, cache)


def test_an_unconfirmed_id_is_queued_only_once_resolved(hub, cache, tmp_path, monkeypatch):
    hub.store.commit("org/tiny", model_files(weights_mib=0.25))
    hub.store.commit("org/chat", dataset_files(), kind="dataset")
    runs = tmp_path / "runs"
    args = [*cell_args(cache, runs), "model.confirmed=false", "cluster.internet_on_compute=true"]
    found = check(*args)
    assert found.returncode == 0 and "(an unconfirmed id: now resolved)" in row(found.stdout, "org/tiny")
    # the Hub out of reach: a compute node could fetch it, but an unconfirmed id must not cost a queued job
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    proc = run_sft(*args)
    assert proc.returncode != 0
    err = " ".join(proc.stderr.split())
    assert "model.hub_id" in err and "org/tiny" in err and "not confirmed" in err and "sft-grid check" in err, err
    nothing_written(runs, cache)
    # a dry run only says so (and writes its rendered files, as every dry run does)
    dry = run_sft(*args, "dry_run=true")
    assert dry.returncode == 0 and "id unconfirmed: queued only once resolved on the site's Hub" in dry.stdout


@pytest.fixture(autouse=True)
def _no_backend(no_backend_here: None) -> None:
    """Every test here: no backend environment on this machine (tests/conftest.py)."""
