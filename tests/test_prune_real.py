"""Successive halving with a real backend (issue 26): tiny LLaMA-Factory cells on the local Slurm cluster end their
first leg at the rung (in_venv/leg_stop.py: checkpoint saved, no final model, the schedule the full run's), the rung
is decided from their trainer logs (guard: position), the losers are `pruned` with their checkpoint kept, the
survivor resumes from its checkpoint and ends with the trainer log an unbroken run of the same cell writes (the
same steps, none twice, the same losses), and a further `sft-grid run` does nothing. The refusals (a backend that
cannot end a leg, a cooldown probe a real backend cannot run, a rung between logging points) are checked before
anything is queued."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from sft_grid.core.layout import LEDGER_FILE

from .conftest import run_sft
from .helpers import cancel_jobs_of, grid_states, ledger, wait_for

CELL = [
    "model=tiny_llama",
    "cluster=slurm_local",
    "max_steps=8",
    "global_batch_size=4",
    "micro_batch_size=2",
    "cutoff_len=256",
    "logging_steps=1",
    "save_steps=1000",
]
PRUNE = [*CELL, "lr=1e-5,1e-4,1e-3", "+prune={rungs: [4], keep: 0.3, guard: position}"]


def _log(cell_dir: Path) -> list[tuple[int, float, float]]:
    """(step, loss, learning rate) of every logged training loss, in the order the trainer logged them."""
    out = []
    for line in (cell_dir / "output" / "trainer_log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("loss"), (int, float)):
            out.append((rec["current_steps"], rec["loss"], rec["lr"]))
    return out


def _losses(cell_dir: Path) -> list[tuple[int, float]]:
    return [(step, loss) for step, loss, _ in _log(cell_dir)]


def _settle(root: Path) -> None:
    wait_for(
        lambda: all(not s.state.in_flight for s in grid_states(root).values()),
        f"the jobs of {root.name}",
        deadline_s=900,
    )


@pytest.mark.backend
@pytest.mark.slurm
def test_llamafactory_cells_are_pruned_at_a_rung_and_the_survivor_resumes_as_an_unbroken_run(tmp_path, tiny_assets):
    pruned_root, whole_root = tmp_path / "pruned", tmp_path / "whole"
    try:
        first = run_sft("-m", *PRUNE, f"runs_root={pruned_root}", check=True)
        assert "3 cell(s) train a leg now" in first.stdout, first.stdout
        _settle(pruned_root)
        states = grid_states(pruned_root)
        assert {s.state.value for s in states.values()} == {"planned"}, states  # each waits at its rung
        for name in states:
            out = pruned_root / "default" / name / "output"
            assert (out / "checkpoint-4").is_dir() and not (out / "trainer_state.json").exists()
            assert max(step for step, _ in _losses(out.parent)) == 4  # nothing trained past the rung

        second = run_sft("-m", *PRUNE, f"runs_root={pruned_root}", check=True)
        assert "1 cell(s) train a leg now" in second.stdout, second.stdout
        (record,) = (pruned_root / "default" / ".sft_grid_prune.jsonl").read_text().splitlines()
        decision = json.loads(record)
        (survivor,) = decision["kept"]
        assert len(decision["pruned"]) == 2 and decision["step"] == 4
        # the evidence: each cell's logged loss at step 4, smoothed over its last three logging points (2, 3, 4)
        for name, value in decision["evidence"].items():
            logged = dict(_losses(pruned_root / "default" / name))
            assert math.isclose(value, (logged[2] + logged[3] + logged[4]) / 3, rel_tol=1e-9)
        assert decision["evidence"][survivor] == min(decision["evidence"].values())
        # the unbroken run of the survivor's cell, beside its second leg
        lr = yaml.safe_load((pruned_root / "default" / survivor / "cell.yaml").read_text())["lr"]
        run_sft("-m", *CELL, f"lr={lr}", f"runs_root={whole_root}", check=True)
        _settle(pruned_root)
        _settle(whole_root)

        states = grid_states(pruned_root)
        for name in decision["pruned"]:
            cell = pruned_root / "default" / name
            assert states[name].state.value == "pruned" and states[name].reason.startswith("pruned at rung 1 (step 4)")
            assert (cell / "output" / "checkpoint-4").is_dir()  # kept: resumable by hand
            assert max(step for step, _ in _losses(cell)) == 4
        assert states[survivor].state.value == "completed", states[survivor]
        resumed = [e for e in ledger(pruned_root / "default" / survivor) if e["event"] == "resumed"]
        assert [e["checkpoint"] for e in resumed] == ["checkpoint-4"]
        (whole_dir,) = (d for d in (whole_root / "default").iterdir() if (d / LEDGER_FILE).is_file())
        legs, whole = _log(pruned_root / "default" / survivor), _log(whole_dir)
        assert [s for s, _, _ in legs] == [s for s, _, _ in whole] == list(range(1, 9))  # every step once, none twice
        for (step, loss, lr_at), (_, loss_whole, lr_whole) in zip(legs, whole, strict=True):
            # the schedule is the full run's in both legs (the rung changed no learning rate); LLaMA-Factory on CPU
            # with a fixed seed is deterministic, and the resume restores every state: measured bit-identical
            assert math.isclose(lr_at, lr_whole, rel_tol=1e-9), (step, lr_at, lr_whole)
            assert math.isclose(loss, loss_whole, rel_tol=1e-6), (step, loss, loss_whole)
        assert legs[-1][2] < legs[3][2] < legs[0][2]  # a decaying schedule, carried across the rung

        again = run_sft("-m", *PRUNE, f"runs_root={pruned_root}", check=True)
        assert "0 cell(s) train a leg now" in again.stdout and "nothing to run" in again.stdout, again.stdout
        assert (pruned_root / "default" / ".sft_grid_prune.jsonl").read_text().splitlines() == [record]
    finally:
        cancel_jobs_of(pruned_root)
        cancel_jobs_of(whole_root)


@pytest.mark.parametrize(
    ("args", "key", "fix"),
    [
        (["backend=axolotl", "+prune={rungs: [4], guard: position}"], "backend.name", "backend=llamafactory"),
        (["+prune={rungs: [4]}"], "prune.guard", "guard: position"),
        (["logging_steps=3", "+prune={rungs: [4], guard: position}"], "prune.rungs", "multiples of 3"),
    ],
)
def test_a_prune_block_a_real_backend_cannot_run_is_refused_before_anything_is_written(tmp_path, args, key, fix):
    """Refused with the cell, key, value and fix, in the invocation that would have queued the legs: no cell
    directory, no leg file, no record written (composition only: nothing trains)."""
    bad = run_sft(
        "-m", "model=tiny_llama", "max_steps=8", "lr=1e-4,1e-3", *args, "cluster=local", f"runs_root={tmp_path}"
    )
    text = bad.stdout + bad.stderr
    assert bad.returncode != 0 and key in text and fix in text, text
    assert not list(tmp_path.rglob("leg.json")) and not list(tmp_path.rglob(".sft_grid_prune.jsonl"))
    assert not list(tmp_path.rglob("cell.yaml"))
