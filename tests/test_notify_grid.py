"""Notifications of a real grid: two tiny cells trained locally, one completing and one stopped by the loss
watchdog; a command and a webhook (a receiver on loopback whose URL carries a token, so the grid names the
variable that holds it). Each cell's end is sent once, with its class when it failed, and the grid's end once;
running the grid command and `status` again sends nothing more. The token is in no file the grid wrote."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import run_sft

TOKEN = "T0kenInThePath9f3a"


def test_a_grid_notifies_each_cell_and_its_end_once(tmp_path, tiny_assets, receiver, monkeypatch):
    monkeypatch.setenv("SFT_GRID_TEST_HOOK", receiver.url(f"/hooks/{TOKEN}"))
    sink = tmp_path / "notified.jsonl"
    script = tmp_path / "notify.py"
    script.write_text("import sys\nopen(sys.argv[1], 'a').write(sys.stdin.read().strip() + '\\n')\n")
    root = tmp_path / "runs"
    grid = [
        "-m",
        "model=tiny_llama",
        "lr=2e-5,1",
        "max_steps=12",
        "save_steps=4",
        "global_batch_size=2",
        "micro_batch_size=2",
        "scheduler=constant",
        f"runs_root={root}",
        "notify.webhook_env=SFT_GRID_TEST_HOOK",
        f"notify.command=[{sys.executable},{script},{sink}]",
    ]
    first = run_sft(*grid)
    assert first.returncode == 1, first.stdout + first.stderr  # the lr 1 cell failed (diverged)

    def sent() -> list[dict]:
        return [json.loads(r["body"]) for r in receiver.requests]

    by_kind = sorted((e["kind"], e["outcome"], e["class"]) for e in sent())
    assert by_kind == [("cell", "completed", ""), ("cell", "failed", "diverged"), ("grid", "done", "")], by_kind
    assert all(r["path"] == f"/hooks/{TOKEN}" for r in receiver.requests)
    commands = [json.loads(line) for line in sink.read_text().splitlines()]
    assert sorted(c["key"] for c in commands) == sorted(e["key"] for e in sent())
    (done,) = [e for e in sent() if e["kind"] == "grid"]
    assert done["details"]["counts"] == {"completed": 1, "failed": 1}

    again = run_sft(*grid)
    assert "0 to run" in again.stdout, again.stdout
    status = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr
    assert len(receiver.requests) == 3 and len(sink.read_text().splitlines()) == 3  # nothing sent twice

    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
