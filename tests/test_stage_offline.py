"""An offline site end to end, with real parts: the real huggingface_hub client (sft_grid's pin, and each backend
environment's own for the upload) against the hub server of tests/hubserver.py on 127.0.0.1, serving the tiny
assets; real training on the CPU; the local Slurm cluster, whose profile says `internet_on_compute: false`.

The grid's inputs are staged ahead of time (`sft-grid stage`), the server is stopped, and the grid is
run: it takes the inputs as staged, queues, and its cells train from the staged snapshots on both backends with
no hub to ask. The upload waits; once the server is back, `sft-grid post` uploads each cell's output.
No token reaches any file or log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sft_grid.core.hubcache import snapshot_path
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.paths import REPO_ROOT
from sft_grid.core.state import State
from sft_grid.stages.post_training import states
from tests.hubserver import spawn

from .conftest import run_sft
from .helpers import grid_states, ledger, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.backend]

TOKEN = "hf_test_token_never_written_7d1f"


def commit_tiny_assets(store, assets: Path) -> tuple[str, str]:
    model = {p.name: p.read_bytes() for p in (assets / "models" / "tiny-llama3").iterdir() if p.is_file()}
    rows = (assets / "data" / "tiny_messages.jsonl").read_bytes()
    return (
        store.commit("org/tiny-llama3", model),
        store.commit(
            "org/tiny-messages", {"data/train.jsonl": rows, "README.md": b"---\nlicense: mit\n---\n"}, kind="dataset"
        ),
    )


def test_offline_slurm_grid_trains_from_staged_copies_and_uploads_when_the_hub_is_back(
    runs_root, tiny_assets, tmp_path, monkeypatch
):
    hub_root, cache = tmp_path / "hub", tmp_path / "hf-cache"
    hub_root.mkdir()
    remote = spawn(hub_root)
    try:
        model_sha, data_sha = commit_tiny_assets(remote.store, tiny_assets)
        for var, value in {
            "HF_ENDPOINT": remote.url,
            "HF_TOKEN": TOKEN,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(tmp_path / "hf-home"),
        }.items():
            monkeypatch.setenv(var, value)
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        grid = [
            "-m",
            "cluster=slurm_local",
            "backend=llamafactory,axolotl",
            "model=tiny_llama",
            "model.path=null",
            "model.hub_id=org/tiny-llama3",
            "dataset=tiny_messages",
            "dataset.tiny_messages.source=org/tiny-messages",
            f"cluster.hf_cache={cache}",
            f"runs_root={runs_root}",
            "sweep_name=offline",
            "max_steps=2",
            "global_batch_size=2",
            "cutoff_len=256",
            "push_to_hub=true",
            "hub_model_id='org/out-{key}'",
        ]
        staged = subprocess.run(
            [sys.executable, "-m", "sft_grid", "stage", *grid],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        assert staged.returncode == 0, staged.stdout + staged.stderr
        assert "2 of 2 Hub repositories of 2 cell(s) staged" in staged.stdout
    finally:
        remote.stop()  # from here on the Hub is gone: nothing can be fetched

    proc = run_sft(*grid)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 2 Hub repositories for 2 cell(s) are taken as staged" in proc.stdout
    # every check read the staged copies before anything was queued; only the shared tokenization, which a job
    # before the cells builds, is checked by their first step
    deferred = [line for line in proc.stdout.splitlines() if "deferred to the job's first step" in line]
    assert all("tokenized dataset" in line for line in deferred), deferred
    cells = list(iter_cell_dirs(runs_root / "offline"))
    assert len(cells) == 2

    def upload_waiting() -> bool:
        done = all(s.state is State.COMPLETED for s in grid_states(runs_root, "offline").values())
        return done and all(
            states(c).get("upload", None) is not None and states(c)["upload"].state == "waiting" for c in cells
        )

    wait_for(upload_waiting, "both cells trained offline, their upload waiting for the Hub", 900, 2)
    model_dir = str(snapshot_path(cache, "org/tiny-llama3", "model", model_sha))
    data_dir = str(snapshot_path(cache, "org/tiny-messages", "dataset", data_sha))
    for cell in cells:
        config = yaml.safe_load(next(cell.glob("*_config.yaml")).read_text())
        loads = json.dumps(config) + (
            (cell / "dataset_info.json").read_text() if (cell / "dataset_info.json").exists() else ""
        )
        assert model_dir in (config.get("model_name_or_path"), config.get("base_model")) and data_dir in loads
        submitted = [e for e in ledger(cell) if e["event"] == "submitted"][-1]
        assert {(i["repo"], i["sha"]) for i in submitted["inputs"]} == {
            ("org/tiny-llama3", model_sha),
            ("org/tiny-messages", data_sha),
        }
        assert submitted["git"]["revision"] and submitted["sft_grid"]
        running = [e for e in ledger(cell) if e["event"] == "running"][-1]
        assert len(running["packages"]) == 16 and running["package_count"] > 20

    remote = spawn(hub_root, port=int(remote.url.rsplit(":", 1)[1]))  # the Hub is back, where jobs expect it
    try:
        post = subprocess.run(
            [sys.executable, "-m", "sft_grid", "post", str(runs_root / "offline"), "--stage", "upload"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        assert post.returncode == 0, post.stdout + post.stderr
        for cell in cells:
            repo = f"org/out-{cell.name.rsplit('-', 1)[1]}"
            rev = remote.store.revision(repo, "main")
            assert {"config.json", "tokenizer_config.json"} <= set(rev.files)
            assert any(p.endswith(".safetensors") for p in rev.files)
            assert not any(p.startswith("checkpoint-") for p in rev.files)
            weights = next(p for p in rev.files if p.endswith(".safetensors"))
            assert remote.store.read(repo, "main", weights) == (cell / "output" / weights).read_bytes()
    finally:
        remote.stop()
    leaked = [str(p) for p in runs_root.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert not leaked and TOKEN not in proc.stdout + proc.stderr + post.stdout + post.stderr
