"""Real training: the tiny models through the orchestrator, LLaMA-Factory on the CPU, submitit's local
executor. Reruns skip completed cells, report failed ones, resume from checkpoints, and force keeps the
old output."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sft_grid.job import hang

from .conftest import REPO_ROOT, run_sft

pytestmark = pytest.mark.backend


def cells(root: Path, sweep: str = "default") -> dict[str, Path]:
    return {
        p.name.split("_lr")[0].split("-")[0]: p for p in sorted((root / sweep).glob("*")) if (p / "cell.yaml").is_file()
    }


def events(cell: Path) -> list[dict]:
    """The cell's training events (the post-training chain's own are tested in test_post.py)."""
    return [
        e
        for e in map(json.loads, (cell / "events.jsonl").read_text().splitlines())
        if e["event"] not in ("stage", "post_job")
    ]


def trainer_state(output: Path) -> dict:
    return json.loads((output / "trainer_state.json").read_text())


def run_sft_piped(*args: str) -> tuple[subprocess.CompletedProcess[str], list[tuple[float, str]]]:
    """`python -m sft_grid <args>` with stdout and stderr into one pipe, as a log or CI sees it; each line with the
    time this test read it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-m", "sft_grid", *args]
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    read: list[tuple[float, str]] = [(time.monotonic(), "")]  # the start
    assert proc.stdout is not None
    read += [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    rc = proc.wait(timeout=600)
    read.append((time.monotonic(), ""))  # the end
    text = "\n".join(line for _, line in read)
    if rc != 0:
        raise AssertionError(f"sft_grid {' '.join(args)} failed ({rc}):\n{text}")
    return subprocess.CompletedProcess(argv, rc, text, ""), read


_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)")


def _stamp(line: str) -> float | None:
    """The wall time a log line is stamped with (the runner's and the backend's own, to the second)."""
    m = _STAMP.search(line)
    return time.mktime(time.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")) if m else None


def test_readme_grid_trains_both_models_then_does_nothing(tmp_path, tiny_assets):
    proc, read = run_sft_piped("-m", "model=tiny_llama,tiny_qwen3", "lr=2e-5", f"runs_root={tmp_path}")
    # a pipe hears a line at least every 3 s (the heartbeat says 2.5 s); twice that as headroom for a
    # busy machine, still far below the 11 s a backend's start was silent before
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(read)]
    assert max(gaps) <= 6.0, [(round(g, 1), line) for g, (_, line) in zip(gaps, read[1:], strict=True) if g > 3.0]
    found = cells(tmp_path)
    assert set(found) == {"tiny_llama", "tiny_qwen3"}
    for cell in found.values():
        out = cell / "output"
        state = trainer_state(out)
        assert state["global_step"] == 4 and state["max_steps"] == 4  # 60 rows / global batch 16, 1 epoch
        losses = [h["loss"] for h in state["log_history"] if "loss" in h]
        assert len(losses) == 4 and all(loss > 0 for loss in losses)
        assert (out / "model.safetensors").is_file()
        assert (out / "checkpoint-4" / "optimizer.pt").is_file()
        assert (out / "checkpoint-4" / "trainer_state.json").is_file()
        assert [e["event"] for e in events(cell)] == ["submitted", "job", "running", "completed"]
        # the job's log heard the backend's start: each of the runner's lines at most BEAT_S (+ a poll) after the last
        log = (cell / "logs" / "train.log").read_text().splitlines()
        said = [float(line.split(", ")[1].split(" s ")[0]) for line in log if "no output from the backend yet" in line]
        assert all(0 < b - a <= hang.BEAT_S + 1.0 for a, b in itertools.pairwise([0.0, *said])), said
        # and they went on until the backend's first line (both stamped to the second: 1 s of rounding, 2 s of load)
        stamps = [_stamp(line) for line in log]
        start = next(t for line, t in zip(log, stamps, strict=True) if t and "bash launch.sh" in line)
        first = next(
            t
            for line, t in zip(log, stamps, strict=True)
            if t and not line.startswith(("=== sft_grid", "--- sft_grid"))
        )
        assert first - start <= (said[-1] if said else 0.0) + hang.BEAT_S + 3.0, (first - start, said)
        assert f"completed {cell.name}" in " ".join(proc.stdout.split())
        cfg = (cell / "train_config.yaml").read_text()
        assert "learning_rate: 2.0e-05" in cfg and "gradient_accumulation_steps: 16" in cfg
    again = run_sft("-m", "model=tiny_llama,tiny_qwen3", "lr=2e-5", f"runs_root={tmp_path}", check=True)
    assert "2 cell(s): 0 to run, 2 completed - nothing to run." in again.stdout
    for cell in found.values():
        assert [e["event"] for e in events(cell)].count("submitted") == 1


def test_failed_cell_is_reported_skipped_then_rerun_on_request(tmp_path, tiny_assets):
    common = ["model=tiny_llama", "max_steps=2", "global_batch_size=4", "micro_batch_size=2", f"runs_root={tmp_path}"]
    # the site's setup is wrong (a module that is not there): not part of the cell's identity, so fixing it reruns
    # the same cell (an environment that does not exist is refused before anything is queued: test_envs_existing.py)
    setup = "cluster.setup=['echo module cuda/99.9 not found >&2; exit 7']"
    broken = run_sft("-m", *common, setup, "seed=1,2")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "2 cell(s) failed" in broken.stderr
    (cell, *_) = cells(tmp_path).values()
    last = events(cell)[-1]
    assert last["event"] == "failed", last

    before = events(cell)
    skipped = run_sft("-m", *common, "seed=1,2", check=True)
    assert "2 failed" in skipped.stdout and "rerun_failed=true reruns them" in skipped.stdout
    assert events(cell) == before  # skipped: nothing submitted or recorded again

    fixed = run_sft("-m", *common, "seed=1,2", "rerun_failed=true", check=True)
    assert "2 to run" in fixed.stdout
    for cell in cells(tmp_path).values():
        assert trainer_state(cell / "output")["global_step"] == 2


def test_single_cell_rerun_resumes_from_its_checkpoint_and_force_keeps_old_output(tmp_path, tiny_assets):
    args = [
        "model=tiny_qwen3",
        "max_steps=4",
        "save_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        f"runs_root={tmp_path}",
    ]
    run_sft(*args, check=True)
    (cell,) = cells(tmp_path).values()
    out = cell / "output"
    assert (out / "checkpoint-2").is_dir() and (out / "checkpoint-4").is_dir()
    # the job "died" after its step-2 checkpoint: no final weights, no step-4 checkpoint
    shutil.rmtree(out / "checkpoint-4")
    for name in ("model.safetensors", "trainer_state.json", "trainer_log.jsonl"):
        (out / name).unlink()

    listed = run_sft(*args, check=True)
    assert "the ledger says completed but the output has no final weights" in listed.stdout

    run_sft(*args, "rerun_failed=true", check=True)
    resumed = [e for e in events(cell) if e["event"] == "resumed"]
    assert resumed and resumed[-1]["checkpoint"] == "checkpoint-2"
    steps = [json.loads(x)["current_steps"] for x in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert steps[0] == 3 and trainer_state(out)["global_step"] == 4  # continued, not restarted

    run_sft(*args, "force=true", check=True)
    archived = list((cell / "attempts").glob("*/output"))
    assert len(archived) == 1 and (archived[0] / "checkpoint-2").is_dir()
    assert trainer_state(out)["global_step"] == 4
    assert json.loads((out / "trainer_log.jsonl").read_text().splitlines()[0])["current_steps"] == 1


def test_a_check_deferred_to_the_job_fails_it_before_training(tmp_path, tiny_assets, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    # a site whose compute nodes reach the Hub (nothing must be staged first) and each cell tokenizing in its own
    # job: the data's checks, unreadable here, are the job's first step, and fail it before training
    proc = run_sft(
        "model=tiny_llama",
        "dataset=magpie",
        "cluster.internet_on_compute=true",
        "tokenize_once=false",
        f"runs_root={tmp_path}",
    )
    assert "deferred to the job's first step" in proc.stdout
    assert proc.returncode == 1
    (cell,) = cells(tmp_path).values()
    last = events(cell)[-1]
    assert last["event"] == "failed"
    assert last["reason"].startswith("preflight: the schema tags find assistant turns in a sample of the data")
    assert "from this node either" in last["reason"]
    assert not (cell / "output").exists() and not (cell / "logs" / "train.log").exists()


def test_mixed_schema_interleave_trains_on_both_sources(tmp_path, tiny_assets):
    proc = run_sft(
        "model=tiny_llama",
        "dataset=[tiny_messages,tiny_sharegpt]",
        "mix.strategy=interleave_under",
        "mix.probs=[0.7,0.3]",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        f"runs_root={tmp_path}",
        check=True,
    )
    (cell,) = cells(tmp_path).values()
    assert trainer_state(cell / "output")["global_step"] == 2
    log = (cell / "logs" / "train.log").read_text()
    # LLaMA-Factory converts each source with its own tags (in the cell's own job: locally, a cell that alone needs
    # its tokenization tokenizes itself, no tokenize job before it): both load, and the mix holds more examples than
    # the 60-row role/content source alone could give, so the ShareGPT rows contributed
    assert not (tmp_path / "_tokenized").exists()
    assert "tiny_messages.jsonl..." in log and "tiny_sharegpt.jsonl..." in log
    examples = int(re.search(r"Num examples = (\d+)", log).group(1))
    assert examples > 60, proc.stdout


def test_a_second_invocation_while_the_grid_runs_queues_nothing_twice(tmp_path, tiny_assets):
    import subprocess
    import sys
    import time

    args = [
        "-m",
        "model=tiny_llama,tiny_qwen3",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        f"runs_root={tmp_path}",
    ]
    first = subprocess.Popen(
        [sys.executable, "-m", "sft_grid", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 600
    while True:  # both cells queued by the first invocation (local: one at a time)
        found = cells(tmp_path)
        if len(found) == 2 and all((c / "events.jsonl").exists() for c in found.values()):
            break
        assert time.time() < deadline and first.poll() is None, "the first invocation never queued both cells"
        time.sleep(0.2)
    second = run_sft(*args, check=True)
    first_out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, first_out
    assert "0 to run" in second.stdout, second.stdout
    for cell in cells(tmp_path).values():
        kinds = [e["event"] for e in events(cell)]
        assert kinds.count("submitted") == 1 and kinds.count("running") == 1 and kinds[-1] == "completed"
