"""Successive halving with a real backend: tiny LLaMA-Factory (and axolotl) cells on the local Slurm
cluster end their first leg at the rung (in_venv/leg_stop.py: checkpoint saved, no final model, the schedule the
full run's), the rung is decided from their trainer logs (guard: position), the losers are `pruned` with their
checkpoint kept, the survivor resumes from its checkpoint and ends with the trainer log an unbroken run of the same
cell writes (the same steps, none twice, the same learning rates and losses), and a further `sft-grid run` does
nothing. The refusals (a cooldown probe a real backend cannot run, a rung between logging points) are checked before
anything is written."""

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
    "logging_steps=1",
    "save_steps=1000",
]
# per backend: its cell, and the learning rates of the bracket; the last one survives (at 4 steps of a tiny Llama,
# the highest rate has the lowest loss), and its unbroken run trains beside the first legs. axolotl's bracket is two
# cells, the fewest a bracket compares (each axolotl process costs about 27 s of imports on 2 cores; the pruning
# itself is the same code for every backend, checked on LLaMA-Factory's three): its legs, its resume and its log are
# axolotl's own
BACKENDS = {
    "llamafactory": ([*CELL, "cutoff_len=256"], "1e-5,1e-4,1e-3"),
    "axolotl": ([*CELL, "backend=axolotl", "cutoff_len=128"], "1e-5,1e-3"),
}
RUNG = "+prune={rungs: [4], keep: 0.3, guard: position}"


def _log(cell_dir: Path) -> list[tuple[int, float, float]]:
    """(step, loss, learning rate) of every logged training loss, in the order the trainer logged them."""
    out = []
    for line in (cell_dir / "output" / "trainer_log.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if isinstance(rec.get("loss"), (int, float)):
            # LLaMA-Factory's log names the learning rate `lr`, the axolotl plugin's (the trainer's) `learning_rate`
            out.append((rec["current_steps"], rec["loss"], rec.get("lr", rec.get("learning_rate"))))
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
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_cells_are_pruned_at_a_rung_and_the_survivor_resumes_as_an_unbroken_run(tmp_path, request, backend):
    request.getfixturevalue("axolotl_env" if backend == "axolotl" else "tiny_assets")
    cell, lrs = BACKENDS[backend]
    n = len(lrs.split(","))
    prune = [*cell, f"lr={lrs}", RUNG]
    pruned_root, whole_root = tmp_path / "pruned", tmp_path / "whole"
    try:
        first = run_sft("-m", *prune, f"runs_root={pruned_root}", check=True)
        assert f"{n} cell(s) train a leg now" in first.stdout, first.stdout
        best = lrs.split(",")[-1]
        run_sft("-m", *cell, f"lr={best}", f"runs_root={whole_root}", check=True)  # the unbroken run
        _settle(pruned_root)
        states = grid_states(pruned_root)
        assert {s.state.value for s in states.values()} == {"planned"}, states  # each waits at its rung
        for name in states:
            out = pruned_root / "default" / name / "output"
            assert (out / "checkpoint-4").is_dir() and not (out / "trainer_state.json").exists()
            assert max(step for step, _ in _losses(out.parent)) == 4  # nothing trained past the rung

        second = run_sft("-m", *prune, f"runs_root={pruned_root}", check=True)
        assert "1 cell(s) train a leg now" in second.stdout, second.stdout
        (record,) = (pruned_root / "default" / ".sft_grid_prune.jsonl").read_text().splitlines()
        decision = json.loads(record)
        (survivor,) = decision["kept"]
        assert len(decision["pruned"]) == n - 1 and decision["step"] == 4
        # the evidence: each cell's logged loss at step 4, smoothed over its last three logging points (2, 3, 4)
        for name, value in decision["evidence"].items():
            logged = dict(_losses(pruned_root / "default" / name))
            assert math.isclose(value, (logged[2] + logged[3] + logged[4]) / 3, rel_tol=1e-9)
        assert decision["evidence"][survivor] == min(decision["evidence"].values())
        assert yaml.safe_load((pruned_root / "default" / survivor / "cell.yaml").read_text())["lr"] == float(best)
        _settle(pruned_root)
        _settle(whole_root)

        states = grid_states(pruned_root)
        for name in decision["pruned"]:
            loser = pruned_root / "default" / name
            assert states[name].state.value == "pruned" and states[name].reason.startswith("pruned at rung 1 (step 4)")
            assert (loser / "output" / "checkpoint-4").is_dir()  # kept: resumable by hand
            assert max(step for step, _ in _losses(loser)) == 4
        assert states[survivor].state.value == "completed", states[survivor]
        resumed = [e for e in ledger(pruned_root / "default" / survivor) if e["event"] == "resumed"]
        assert [e["checkpoint"] for e in resumed] == ["checkpoint-4"]
        (whole_dir,) = (d for d in (whole_root / "default").iterdir() if (d / LEDGER_FILE).is_file())
        legs, whole = _log(pruned_root / "default" / survivor), _log(whole_dir)
        assert [s for s, _, _ in legs] == [s for s, _, _ in whole] == list(range(1, 9))  # every step once, none twice
        for (step, loss, lr_at), (_, loss_whole, lr_whole) in zip(legs, whole, strict=True):
            # the schedule is the full run's in both legs (the rung changed no learning rate); both backends on CPU
            # with a fixed seed are deterministic, and the resume restores every state: measured bit-identical
            assert math.isclose(lr_at, lr_whole, rel_tol=1e-9), (step, lr_at, lr_whole)
            assert math.isclose(loss, loss_whole, rel_tol=1e-6), (step, loss, loss_whole)
        assert legs[-1][2] < legs[3][2] < legs[0][2]  # a decaying schedule, carried across the rung

        again = run_sft("-m", *prune, f"runs_root={pruned_root}", check=True)
        assert "0 cell(s) train a leg now" in again.stdout and "nothing to run" in again.stdout, again.stdout
        assert (pruned_root / "default" / ".sft_grid_prune.jsonl").read_text().splitlines() == [record]
    finally:
        cancel_jobs_of(pruned_root)
        cancel_jobs_of(whole_root)


@pytest.mark.parametrize(
    ("args", "key", "fix"),
    [
        (["backend=axolotl", "+prune={rungs: [4]}"], "prune.guard", "the axolotl backend runs no cooldown probe"),
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
