"""Staging as a stage of the grid, through the grid command and `sft-grid stage`, with the real
huggingface_hub client (the pinned 1.17) against the loopback hub server of tests/hubserver.py (HF_ENDPOINT;
no other network).

What a user relies on: a dry run says what must be staged, how big and whether it fits, and stages nothing; a
real run stages only training files into the cluster's cache and the rendered configs point at the pinned
snapshots; a missing repository, a private or gated one without a token, or too little space is an error naming
the cell before anything is written; a rerun of a cell keeps the commit it trained on while `main` moves on;
short runs under the site's process time limit continue each other, each saying so once; a limit too short to
transfer anything is refused in one line with the smallest that works; a kill -9 loses no finished file; two grids
staging one repository fetch each file once. (Servers that differ from the Hub: tests/test_stage_mirror.py.)
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
import yaml

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.hubcache import is_complete, snapshot_path
from sft_grid.core.layout import iter_cell_dirs
from tests.hubtools import (
    DATASET_NEEDED,
    MODEL_NEEDED,
    MiB,
    cell_args,
    dataset_files,
    model_files,
    popen_stage,
    run_stage,
    wait_for,
)

from .conftest import run_sft

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hub (the loopback server, HF_ENDPOINT set), cache, hf_env


def fetched(hub, repo: str) -> list[str]:
    return [r["path"].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests(f"/{repo}/resolve/", "GET")]


def commit_inputs(hub, weights_mib: float = 0.25) -> tuple[str, str]:
    return (
        hub.store.commit("org/tiny", model_files(weights_mib=weights_mib)),
        hub.store.commit("org/chat", dataset_files(), kind="dataset"),
    )


def test_dry_run_says_what_must_be_staged_and_stages_nothing(hub, cache, tmp_path):
    model_sha, data_sha = commit_inputs(hub)
    runs = tmp_path / "runs"
    proc = run_sft(*cell_args(cache, runs), "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "staging: 2 Hub repositories for 1 cell(s)" in out
    assert f"model org/tiny@{model_sha[:12]}: 7 files" in out and "7 files not needed for training left out" in out
    assert f"dataset org/chat@{data_sha[:12]}: 3 files" in out
    assert f"to fetch into {cache}:" in out and "free there (fits)" in out
    assert "a real run stages them here first" in out
    # nothing staged, nothing recorded: only the cell's own rendered files
    assert not cache.exists() and hub.requests("/resolve/", "GET") == []
    (cell,) = iter_cell_dirs(runs / "default")
    assert not (cell / "events.jsonl").exists()
    config = yaml.safe_load((cell / "train_config.yaml").read_text())
    assert config["model_name_or_path"] == str(snapshot_path(cache, "org/tiny", "model", model_sha))
    info = json.loads((cell / "dataset_info.json").read_text())
    assert info["tiny_messages"]["hf_hub_url"] == str(snapshot_path(cache, "org/chat", "dataset", data_sha))
    launch = (cell / "launch.sh").read_text()
    assert f"export HF_HUB_CACHE={cache}" in launch and "HF_DATASETS_OFFLINE=1" in launch


def test_stage_command_fetches_only_training_files_once(hub, cache, tmp_path):
    model_sha, data_sha = commit_inputs(hub)
    runs = tmp_path / "runs"
    proc = run_stage(*cell_args(cache, runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 of 2 Hub repositories of 1 cell(s) staged; nothing rendered or queued" in proc.stdout
    assert not runs.exists()
    model = snapshot_path(cache, "org/tiny", "model", model_sha)
    data = snapshot_path(cache, "org/chat", "dataset", data_sha)
    assert {str(p.relative_to(model)) for p in model.rglob("*") if p.is_file()} == MODEL_NEEDED
    assert {str(p.relative_to(data)) for p in data.rglob("*") if p.is_file()} == DATASET_NEEDED
    assert sorted(fetched(hub, "org/tiny")) == sorted(MODEL_NEEDED)  # duplicate weights, optimizer state: never
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == model_sha
    hub.clear_log()
    again = run_stage(*cell_args(cache, runs))
    assert again.returncode == 0 and "2 of 2" in again.stdout
    assert hub.requests("/resolve/", "GET") == []  # staged: no file is fetched again


def test_access_problems_are_named_before_anything_is_written(hub, cache, tmp_path):
    commit_inputs(hub)
    hub.store.create_repo("org/closed", token="s3cret")
    hub.store.commit("org/closed", model_files())
    hub.store.create_repo("org/gated-chat", kind="dataset", gated=True, granted=("granted",))
    hub.store.commit("org/gated-chat", dataset_files(), kind="dataset")
    runs = tmp_path / "runs"
    base = [a for a in cell_args(cache, runs) if not a.startswith(("model.hub_id", "dataset.tiny_messages.source"))]
    proc = run_sft("-m", *base, "model.hub_id=org/nope,org/closed", "dataset.tiny_messages.source=org/gated-chat")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert "found by staging; nothing was submitted" in err
    assert "model.hub_id='org/nope': model repo 'org/nope' was not found" in err and "check the id" in err
    assert "model.hub_id='org/closed'" in err and "HF_TOKEN" in err and "[staging-token-required]" in err
    assert "dataset.tiny_messages.source='org/gated-chat'" in err and "request access" in err
    assert err.count("  cell ") == 2  # each problem under the cell that has it
    assert not runs.exists() and not any(cache.glob("*/blobs/*"))
    assert "s3cret" not in err + proc.stdout


@pytest.mark.filterwarnings("ignore:Not enough free disk space")
def test_not_enough_space_is_refused_before_any_transfer(hub, small_fs, tmp_path):
    commit_inputs(hub, weights_mib=6)
    runs = tmp_path / "runs"
    proc = run_sft(*cell_args(small_fs / "cache", runs))
    assert proc.returncode == 1
    assert "cluster.hf_cache=" in proc.stderr and "[staging-space]" in proc.stderr
    assert "6.29 MB more" in proc.stderr and "free" in proc.stderr
    assert hub.requests("/resolve/", "GET") == [] and not runs.exists()


def _earlier_run(cell_dir: Path, model_sha: str, data_sha: str) -> None:
    """The ledger of a cell whose first run trained on these commits and failed."""
    inputs = [
        {"kind": "model", "repo": "org/tiny", "revision": "main", "sha": model_sha},
        {"kind": "dataset", "repo": "org/chat", "revision": "main", "sha": data_sha},
    ]
    events.append(cell_dir, Event(Kind.SUBMITTED, executor="local", details={"inputs": inputs}))
    events.append(cell_dir, Event(Kind.FAILED, reason="node failure"))


def test_a_rerun_keeps_the_commit_it_trained_on_while_main_moves(hub, cache, tmp_path):
    old_model, old_data = commit_inputs(hub)
    runs = tmp_path / "runs"
    assert run_stage(*cell_args(cache, runs)).returncode == 0
    assert run_sft(*cell_args(cache, runs), "dry_run=true").returncode == 0
    (cell,) = iter_cell_dirs(runs / "default")
    _earlier_run(cell, old_model, old_data)
    new_model = hub.store.commit("org/tiny", model_files(seed=7))  # main moves on
    hub.clear_log()

    def trained_on(*extra: str) -> str:
        proc = run_sft(*cell_args(cache, runs), "dry_run=true", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # a dry run over a cell with a record renders beside it, as the real run would write it
        return yaml.safe_load((cell.parent / ".dry_run" / cell.name / "train_config.yaml").read_text())[
            "model_name_or_path"
        ]

    assert trained_on("rerun_failed=true") == str(snapshot_path(cache, "org/tiny", "model", old_model))
    assert hub.requests("/api/models/org/tiny") == []  # staged and pinned: not even a question to the Hub
    # force=true trains from the start, on what main is now
    assert trained_on("force=true") == str(snapshot_path(cache, "org/tiny", "model", new_model))

    # the pinned commit gone from the Hub and from this cache: the rerun says why it cannot
    other = tmp_path / "other-cache"
    hub.store.delete_revision("org/tiny", old_model)
    proc = run_sft(*cell_args(other, runs), "rerun_failed=true")
    assert proc.returncode == 1
    assert f"revision '{old_model}'" in proc.stderr and "earlier run trained on this commit" in proc.stderr
    assert "force=true" in proc.stderr and cell.name in proc.stderr


def test_time_limited_runs_continue_each_other(hub, cache, tmp_path):
    """A login node that kills processes: the run stops cleanly before the limit (exit 3, what is left), and the
    next run continues the partial file with a Range request; finished files are never fetched again."""
    model_sha, _ = commit_inputs(hub, weights_mib=16)
    hub.throttle(MiB // 4, path="model.safetensors")  # 64 s for the file: longer than any limit below leaves
    runs = tmp_path / "runs"
    first = run_stage(*cell_args(cache, runs), "cluster.staging.time_limit_s=15")
    if first.returncode == 1 and "the smallest limit that works here is " in first.stderr:
        # a busy machine needs longer before its first transfer than 15 s leaves: the refusal names the smallest
        # limit that transfers something here; twice that still stops well before the file is done
        smallest = int(first.stderr.split("the smallest limit that works here is ", 1)[1].split("s", 1)[0])
        first = run_stage(*cell_args(cache, runs), f"cluster.staging.time_limit_s={2 * smallest}")
    assert first.returncode == 3, first.stdout + first.stderr
    assert "staging stopped" in first.stderr and "Run the same command again to continue" in first.stderr
    assert (first.stdout + first.stderr).count("stopped before this process's time limit") == 1  # said once
    partial = sum(p.stat().st_size for p in (cache / "models--org--tiny" / "blobs").glob("*.incomplete"))
    hub.clear_faults()
    second = run_stage(*cell_args(cache, runs))
    assert second.returncode == 0, second.stderr[-3000:]
    names = fetched(hub, "org/tiny")
    assert all(names.count(p) == 1 for p in MODEL_NEEDED - {"model.safetensors"})
    last = hub.downloads("org/tiny", "model.safetensors")[-1]
    assert last["range"] == (f"bytes={partial}-" if partial else None)
    assert is_complete(cache, "org/tiny", "model", model_sha, checksums=True)


def test_a_time_limit_too_short_to_transfer_anything_is_refused_in_one_line(hub, cache, tmp_path):
    commit_inputs(hub)
    proc = run_stage("--repo", "org/tiny", "--cache", str(cache), "--time-limit", "5")  # all of it is safety margin
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    smallest = int(line.split("the smallest limit that works here is ", 1)[1].split("s", 1)[0])
    assert line.startswith("staging refused: a process time limit of 5s leaves no time to transfer") and smallest > 5
    assert "Rerun" not in line and hub.requests("/resolve/", "GET") == []

    # the grid: 10 s passes validation, but this process spends its 5 s after the margin before its first transfer
    # (each repository's revision answers 503 three times: 3.5 s of retries per repository)
    for api in ("/api/models/org/tiny/revision/", "/api/datasets/org/chat/revision/"):
        hub.fail(503, contains=api, method="GET", times=3)
    proc = run_sft(*cell_args(cache, tmp_path / "runs"), "cluster.staging.time_limit_s=10")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # stderr: the progress line that says what the command is about to do, then the refusal in one line; between
    # them, while the retries run, the heartbeat every 2.5 s (what the command does and for how long)
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    beat = re.compile(r"  checking and planning the grid \(\d+\.\d s\)")
    progress, line = [line for line in said if not beat.fullmatch(line)]
    assert progress.startswith("grid of 1 cell(s)"), proc.stdout + proc.stderr
    assert line.startswith("staging refused: a process time limit of 10s") and "smallest limit that works" in line
    assert hub.requests("/resolve/", "GET") == [] and not (tmp_path / "runs").exists()


def test_the_unreachable_hub_line_reads_cleanly(hub, cache, tmp_path, monkeypatch):
    commit_inputs(hub)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: the connection is refused at once
    proc = run_sft(*cell_args(cache, tmp_path / "runs"), "dry_run=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("staging:")]
    assert line == (
        "staging: the Hub cannot be reached from here: cannot reach http://127.0.0.1:9 to stage model repo"
        " 'org/tiny' (http://127.0.0.1:9/api/models/org/tiny/revision/main: [Errno 111] Connection refused);"
        " 2 of 2 Hub repositories for 1 cell(s) are not staged, sizes unknown"
    )


def test_killed_stage_command_loses_no_finished_file(hub, cache, tmp_path):
    model_sha, _ = commit_inputs(hub, weights_mib=6)
    hub.throttle(2 * MiB, path="model.safetensors")
    runs = tmp_path / "runs"
    child = popen_stage(*cell_args(cache, runs))
    blobs = cache / "models--org--tiny" / "blobs"

    def partly_written() -> bool:
        # the client's own partial file, not the server's count of what it sent: on a busy machine the client may
        # not have written a byte of what the server already counts when the kill lands
        for p in blobs.glob("*.incomplete") if blobs.is_dir() else ():
            try:
                if p.stat().st_size >= MiB:
                    return True
            except FileNotFoundError:  # renamed into place meanwhile
                pass
        return False

    try:
        wait_for(partly_written, "the weights to be partly written", 600, 0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    hub.clear_faults()
    proc = run_stage(*cell_args(cache, runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = fetched(hub, "org/tiny")
    assert all(names.count(p) == 1 for p in MODEL_NEEDED - {"model.safetensors"})
    assert names.count("model.safetensors") == 2 and hub.downloads("org/tiny", "model.safetensors")[-1]["status"] == 206
    assert is_complete(cache, "org/tiny", "model", model_sha, checksums=True)


def test_two_grids_staging_one_repository_fetch_each_file_once(hub, cache, tmp_path):
    model_sha, data_sha = commit_inputs(hub, weights_mib=4)
    hub.throttle(4 * MiB, path="model.safetensors")  # the first holds the repository's lock for about a second
    one = popen_stage(*cell_args(cache, tmp_path / "grid-a"), "sweep_name=a")
    two = popen_stage(*cell_args(cache, tmp_path / "grid-b"), "sweep_name=b", "lr=2e-5")
    outs = [p.communicate(timeout=300) for p in (one, two)]
    assert one.returncode == 0 and two.returncode == 0, outs
    assert sorted(fetched(hub, "org/tiny")) == sorted(MODEL_NEEDED)
    assert sorted(fetched(hub, "org/chat")) == sorted(DATASET_NEEDED)
    assert is_complete(cache, "org/tiny", "model", model_sha, checksums=True)
    assert is_complete(cache, "org/chat", "dataset", data_sha, checksums=True)


@pytest.fixture(autouse=True)
def _no_backend(no_backend_here: None) -> None:
    """Every test here: no backend environment on this machine (tests/conftest.py)."""
