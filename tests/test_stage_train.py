"""Revision pinning with real training: the real huggingface_hub client stages a tiny model and a tiny dataset from
the loopback hub of tests/hubserver.py, LLaMA-Factory trains on the CPU from the snapshots (offline), the
server's repository moves on, and the cell's rerun still trains the commit it trained on first, while a new
cell of the same grid trains the new one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.hubcache import snapshot_path
from sft_grid.core.layout import iter_cell_dirs

from .conftest import run_sft
from .helpers import grid_states, ledger
from .test_stage_offline import commit_tiny_assets

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hub (the loopback server, HF_ENDPOINT set), cache, hf_env
pytestmark = pytest.mark.backend


def cell(cache: Path, runs: Path, *extra: str) -> list[str]:
    return [
        "model=tiny_llama",
        "model.path=null",
        "model.hub_id=org/tiny-llama3",
        "dataset=tiny_messages",
        "dataset.tiny_messages.source=org/tiny-messages",
        f"cluster.hf_cache={cache}",
        f"runs_root={runs}",
        "max_steps=2",
        "global_batch_size=2",
        "cutoff_len=256",
        *extra,
    ]


def trained_on(cell_dir: Path) -> str:
    return [e for e in ledger(cell_dir) if e["event"] == "submitted"][-1]["inputs"][0]["sha"]


def test_a_rerun_trains_the_pinned_commit_after_main_moved(hub, cache, tmp_path, tiny_assets):
    first_sha, _ = commit_tiny_assets(hub.store, tiny_assets)
    runs = tmp_path / "runs"
    proc = run_sft(*cell(cache, runs))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cell_dir,) = iter_cell_dirs(runs / "default")
    assert trained_on(cell_dir) == first_sha
    # the cell's node died: its output is gone, its ledger says failed
    shutil.rmtree(cell_dir / "output")
    events.append(cell_dir, Event(Kind.FAILED, reason="node failure"))
    model = {p.name: p.read_bytes() for p in (tiny_assets / "models" / "tiny-llama3").iterdir() if p.is_file()}
    config = json.loads(model["config.json"])
    new_sha = hub.store.commit("org/tiny-llama3", {**model, "config.json": json.dumps({**config, "rev": 2}).encode()})

    proc = run_sft("-m", *cell(cache, runs, "lr=1e-5,2e-5", "rerun_failed=true"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    states = grid_states(runs)
    assert len(states) == 2 and all(s.state.value == "completed" for s in states.values()), states
    new_cell = next(d for d in iter_cell_dirs(runs / "default") if d != cell_dir)
    assert trained_on(cell_dir) == first_sha and trained_on(new_cell) == new_sha
    old_dir = snapshot_path(cache, "org/tiny-llama3", "model", first_sha)
    log = (cell_dir / "logs" / "train.log").read_text()
    assert f"{old_dir}/config.json" in log and new_sha not in log  # LLaMA-Factory loaded the pinned snapshot
    assert (
        f"{snapshot_path(cache, 'org/tiny-llama3', 'model', new_sha)}/config.json"
        in (new_cell / "logs" / "train.log").read_text()
    )


def test_a_staged_delphi_grid_checks_everything_before_queueing(hub, cache, tmp_path, tiny_assets):
    """A Delphi checkpoint staged from the Hub: the dry run checks its prepared tokenizer (made from the staged
    tokenizer files before any model prep), shows the first example of each source with the think tokens whole,
    and gives the loss-mask verdict; nothing is left for the cell's job to check (locally the model prep runs here
    first, and the cell tokenizes in its own job)."""
    model = {p.name: p.read_bytes() for p in (tiny_assets / "models" / "tiny-delphi").iterdir() if p.is_file()}
    hub.store.commit("org/tiny-delphi", model)
    commit_tiny_assets(hub.store, tiny_assets)
    runs = tmp_path / "runs"
    args = [
        "-m",
        "model=tiny_delphi",
        "model.path=null",
        "model.hub_id=org/tiny-delphi",
        "dataset=tiny_messages",
        "dataset.tiny_messages.source=org/tiny-messages",
        f"cluster.hf_cache={cache}",
        f"runs_root={runs}",
    ]
    staged = run_sft(*args, "stage_only=true")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    proc = run_sft(*args, "dry_run=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "--- dataset.tiny_messages of " in out and "[[<|start_think|>" in out
    assert "checked here before queueing, every one passed" in out
    assert "the loss mask trains the assistant turns and nothing else: 1" in out
    assert "template tokens are single tokens of the tokenizer: 1" in out
    deferred = [line for line in out.splitlines() if "deferred to the job's first step" in line]
    # nothing waits for the cell's job: locally, what a job before the cell builds (the model prep) runs here first,
    # and the cell, alone on its data, tokenizes in its own job
    assert not deferred, deferred
    assert "local: 1 prep, 1 train" in out, out
