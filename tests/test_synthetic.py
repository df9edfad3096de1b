"""The `synthetic` backend, a simulator (sft_grid/backends/synthetic.py): its law (in_venv/synthetic_train.py), its
files, a simulated run stopped and resumed from its checkpoint, and a grid of the Delphi grid's shape through the
real local Slurm cluster (job arrays, the ledger, the post-training chain, a requeue that resumes, a rerun that
runs nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sft_grid.core.layout import checkpoints, iter_cell_dirs
from sft_grid.in_venv import synthetic_train as law

from .conftest import REPO_ROOT, run_sft
from .helpers import cancel_jobs_of, grid_states, ledger, wait_for

TRAINER = Path(law.__file__)


def _cfg(tmp_path: Path, **kw) -> dict:
    return {
        "identity": "abc",
        "seed": 1,
        "params": 5e8,
        "learning_rate": 3e-4,
        "max_steps": 60,
        "save_steps": 20,
        "logging_steps": 5,
        "warmup_steps": 5,
        "output_dir": str(tmp_path / "output"),
        **kw,
    }


def test_the_law_is_seeded_and_its_rankings_flip_during_decay():
    cfg = {"identity": "x", "seed": 3, "params": 1e9, "max_steps": 100, "warmup_steps": 5, "tokens_per_step": 1e6}
    assert law.observed_loss({**cfg, "learning_rate": 3e-4}, 40) == law.observed_loss(
        {**cfg, "learning_rate": 3e-4}, 40
    )
    assert law.observed_loss({**cfg, "learning_rate": 3e-4}, 40) != law.observed_loss(
        {**cfg, "seed": 4, "learning_rate": 3e-4}, 40
    )
    noiseless = {**cfg, "law": {"run_noise": 0.0, "step_noise": 0.0}}
    best, low = {**noiseless, "learning_rate": 3e-4}, {**noiseless, "learning_rate": 1e-4}
    # before the decay the lower learning rate looks better; at the end of the schedule the best one wins
    assert law.observed_loss(low, 30) < law.observed_loss(best, 30)
    assert law.observed_loss(best, 100) < law.observed_loss(low, 100)
    # larger models reach a lower loss at their own best learning rate
    big = {**noiseless, "params": 1e10, "learning_rate": law.lr_opt(law.LAW_DEFAULTS, 1e10)}
    assert law.observed_loss(big, 100) < law.observed_loss(best, 100)


def test_a_stopped_run_resumes_from_its_checkpoint_and_writes_what_an_unbroken_run_writes(tmp_path):
    whole, legs = tmp_path / "whole", tmp_path / "legs"
    for d in (whole, legs):
        d.mkdir()
    (whole / "s.json").write_text(json.dumps(_cfg(whole)))
    (legs / "s.json").write_text(json.dumps(_cfg(legs)))
    subprocess.run(["python3", str(TRAINER), str(whole / "s.json")], check=True, capture_output=True)
    first = subprocess.run(
        ["python3", str(TRAINER), str(legs / "s.json"), "stop_at_step=30"], check=True, capture_output=True, text=True
    )
    assert "leg ends at step 30" in first.stdout
    out = legs / "output"
    assert [p.name for p in checkpoints(out)] == ["checkpoint-20", "checkpoint-30"]
    assert not (out / "trainer_state.json").exists()  # not complete: the leg ended at a rung
    subprocess.run(
        ["python3", str(TRAINER), str(legs / "s.json"), f"resume_from_checkpoint={out / 'checkpoint-30'}"],
        check=True,
        capture_output=True,
    )
    assert (out / "trainer_log.jsonl").read_text() == (whole / "output" / "trainer_log.jsonl").read_text()
    state = json.loads((out / "trainer_state.json").read_text())
    assert state == json.loads((whole / "output" / "trainer_state.json").read_text())
    assert state["global_step"] == 60 and (out / "model.safetensors").stat().st_size > 8
    bad = subprocess.run(["python3", str(TRAINER), str(legs / "s.json"), "lr=1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument 'lr=1'" in bad.stderr


def test_the_synthetic_sweep_renders_its_law_and_refuses_what_it_derives(tmp_path):
    dry = run_sft("-m", "+sweep=synthetic_delphi", "dry_run=true", f"runs_root={tmp_path}", check=True)
    assert "18 cell(s)" in dry.stdout
    cells = list(iter_cell_dirs(tmp_path / "synthetic_delphi"))
    cfg = json.loads(
        next(c for c in cells if c.name.startswith("delphi-1e22_wildchat")).joinpath("synthetic.json").read_text()
    )
    assert cfg["params"] == 9714698752 and cfg["law"]["E"] == 1.74 and cfg["simulated"] is True
    bad = run_sft("backend=synthetic", "+extra.learning_rate=1", f"runs_root={tmp_path}", "dry_run=true")
    assert (
        bad.returncode != 0
        and "extra.learning_rate" in bad.stdout + bad.stderr
        and "set lr instead" in bad.stdout + bad.stderr
        and "[synthetic-knob]" not in bad.stdout + bad.stderr  # told once, by the rule that names lr
    )


@pytest.mark.parametrize(
    "knob, told",
    [
        ("+extra.law=5", "extra.law=5: the law is a mapping of its constants"),
        ("+extra.law.Q=1", "extra.law.Q=1: not a constant of the simulator's law"),
        ("+extra.law.E=abc", "extra.law.E='abc': not a finite number"),
        ("+extra.step_seconds=-1", "extra.step_seconds=-1: not a finite number >= 0"),
        ("+extra.tokens_per_step=0", "extra.tokens_per_step=0: not a finite number above 0"),
    ],
)
def test_a_simulator_knob_its_trainer_would_fail_on_or_ignore_is_refused_before_anything_is_written(
    make_cells, knob, told
):
    from sft_grid import backends

    (cell,) = make_cells(["backend=synthetic", knob])
    (problem,) = backends.get("synthetic").problems(cell)
    assert problem.render().splitlines()[0].strip().startswith(told), problem.render()
    (fine,) = make_cells(["backend=synthetic", "+extra.law.E=1.8", "+extra.step_seconds=0.01"])
    assert not list(backends.get("synthetic").problems(fine))


@pytest.mark.slurm
def test_a_synthetic_grid_runs_on_slurm_resumes_after_a_requeue_and_runs_nothing_twice(tmp_path, tiny_assets):
    roots = [tmp_path / "grid", tmp_path / "one"]
    try:
        run_sft("-m", "+sweep=synthetic_delphi", "cluster=slurm_local", f"runs_root={roots[0]}", check=True)
        # one slow cell (0.05 s a simulated step), requeued once it has its first checkpoint
        slow = [
            "backend=synthetic",
            "cluster=slurm_local",
            "max_steps=200",
            "save_steps=20",
            "+extra.step_seconds=0.05",
        ]
        run_sft(*slow, f"runs_root={roots[1]}", check=True)
        (cell,) = iter_cell_dirs(roots[1] / "default")
        wait_for(lambda: checkpoints(cell / "output"), "a first checkpoint", deadline_s=300)
        job = grid_states(roots[1])[cell.name].job_id
        subprocess.run(["scontrol", "requeue", job], check=True)
        for root, sweep, n in ((roots[0], "synthetic_delphi", 18), (roots[1], "default", 1)):
            done = wait_for(
                lambda r=root, s=sweep: (
                    (st := grid_states(r, s))
                    and all(x.state.value in ("completed", "failed") for x in st.values())
                    and st
                ),
                "every cell ended",
                deadline_s=600,
            )
            assert len(done) == n and {s.state.value for s in done.values()} == {"completed"}, done
        kinds = [e["event"] for e in ledger(cell)]
        assert "resumed" in kinds, kinds
        assert "resuming from" in (cell / "logs" / "train.log").read_text()
        steps = [
            json.loads(line)["current_steps"]
            for line in (cell / "output" / "trainer_log.jsonl").read_text().splitlines()
        ]
        assert steps[-1] == 200
        again = run_sft("-m", "+sweep=synthetic_delphi", "cluster=slurm_local", f"runs_root={roots[0]}", check=True)
        assert "18 cell(s): 0 to run, 18 completed - nothing to run." in again.stdout
        report = subprocess.run(
            [
                sys.executable,
                "-m",
                "sft_grid",
                "results",
                "synthetic_delphi",
                "--runs-root",
                str(roots[0]),
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert report.stdout.count('"completed"') >= 18
    finally:
        for root in roots:
            cancel_jobs_of(root)


ADAPTIVE = [
    "+sweep=synthetic_delphi",
    "cluster=slurm_local",
    "+adaptive.at=9714698752",
    "+adaptive.budget_cells=8",
    "+adaptive.holdout=[delphi-1e22]",
]


@pytest.mark.slurm
def test_the_adaptive_loop_on_slurm_seeds_fits_chooses_and_stops_and_replays_a_recorded_round(tmp_path, tiny_assets):
    """`sft-grid run` again and again continues the loop: the holdouts and the seed design first, then the cells the
    fit chooses, until the budget. A round recorded but not queued (sbatch refused it here; a kill would do the same)
    is replayed by the next invocation, never chosen again."""
    from sft_grid.adaptive.steer import RECORD_FILE, SUMMARY_FILE, read_rounds

    sweep = tmp_path / "synthetic_delphi"
    try:
        refused = run_sft("-m", *ADAPTIVE, "cluster.partition=nope", f"runs_root={tmp_path}")
        assert refused.returncode == 1 and "sbatch refused" in refused.stderr
        assert len(read_rounds(sweep)) == 1
        outputs = []
        for _ in range(8):
            proc = run_sft("-m", *ADAPTIVE, f"runs_root={tmp_path}", check=True)
            outputs.append(proc.stdout)
            if "stop: the budget is spent" in proc.stdout:
                break
            wait_for(
                lambda: (
                    (st := grid_states(tmp_path, "synthetic_delphi"))
                    and all(s.state.value in ("completed", "failed") for s in st.values())
                ),
                "the round's cells",
                deadline_s=600,
            )
        assert "round 1 already recorded" in outputs[0] and "queued 4 cell(s)" in outputs[0], outputs[0]
        rounds = read_rounds(sweep)
        assert "stop: the budget is spent" in outputs[-1]
        # 3 seed rounds of 2 (the three cheapest sizes of each recipe), then the fit's choice, then the stop
        assert [len(r["chosen"]) for r in rounds] == [2, 2, 2, 2, 0], rounds
        assert all("seed design" in w for r in rounds[:3] for w in r["why"])
        assert all("minimises the forecast's variance" in w for w in rounds[3]["why"])
        states = grid_states(tmp_path, "synthetic_delphi")
        ran = {name.split("_")[0] for name in states}
        assert len(states) == 10 and "delphi-1e22" in ran  # 8 chosen + the 2 holdouts, never fitted
        assert not any("delphi-1e22" in n for r in rounds for n in r["observed"] + r["chosen"])
        summary = json.loads((sweep / SUMMARY_FILE).read_text())
        for h in summary["holdouts"]:
            assert h["realised"] and h["forecast"] and h["lo"] <= h["forecast"] <= h["hi"]
        assert (sweep / RECORD_FILE).is_file()
    finally:
        cancel_jobs_of(tmp_path)


PRUNE = [
    "backend=synthetic",
    "cluster=slurm_local",
    "max_steps=90",
    "save_steps=1000",
    "lr=1e-4,2e-4,4e-4,8e-4,1.6e-3,3.2e-3",
    "+prune={rungs: [10, 30], keep: 0.5}",
]


def _prune_until_done(root: Path, kill_after_decision: bool = False) -> list[str]:
    """`sft-grid run` until every cell is completed or pruned, waiting for each round's jobs; with
    `kill_after_decision`, the first invocation that records a decision is killed (SIGKILL) right after it does."""
    from sft_grid.adaptive.halving import RECORD_FILE

    record = root / "default" / RECORD_FILE
    outputs = []
    killed = not kill_after_decision
    for _ in range(10):
        before = len(record.read_text().splitlines()) if record.is_file() else 0
        if not killed and before >= 1:
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
            proc = subprocess.Popen(
                [sys.executable, "-m", "sft_grid", "-m", *PRUNE, f"runs_root={root}"],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

            def recorded(p: subprocess.Popen = proc, n: int = before) -> bool:
                return p.poll() is not None or len(record.read_text().splitlines()) > n

            wait_for(
                recorded,
                "the next decision recorded",
                deadline_s=300,
                interval=0.01,
            )
            proc.kill()
            proc.wait()
            killed = True
        else:
            outputs.append(run_sft("-m", *PRUNE, f"runs_root={root}", check=True).stdout)
        wait_for(
            lambda: all(not s.state.in_flight for s in grid_states(root).values()),
            "the round's legs",
            deadline_s=600,
        )
        states = grid_states(root)
        if all(s.state.value in ("completed", "pruned") for s in states.values()):
            return outputs
    raise AssertionError(f"not done after 10 invocations: {outputs}")


@pytest.mark.slurm
def test_successive_halving_on_slurm_prunes_from_files_and_a_kill_changes_no_decision(tmp_path, tiny_assets):
    from sft_grid.adaptive.halving import read_record

    roots = [tmp_path / "ref", tmp_path / "killed"]
    try:
        _prune_until_done(roots[0])
        _prune_until_done(roots[1], kill_after_decision=True)
        want, got = (read_record(r / "default") for r in roots)
        assert len(want) == 2 and got == want  # the same rungs, evidence, kept and pruned cells
        states = grid_states(roots[0])
        pruned = {n for n, s in states.items() if s.state.value == "pruned"}
        done = {n for n, s in states.items() if s.state.value == "completed"}
        assert len(pruned) == 4 and len(done) == 2 and done == set(want[("all", 1)].kept)
        for name in pruned:
            cell = roots[0] / "default" / name
            st = states[name]
            assert st.reason.startswith("pruned at rung") and "kept of" in st.reason
            # pruned at its rung: its checkpoint kept (resumable by hand), nothing trained past it
            step = int(st.reason.split("(step ")[1].split(")")[0])
            assert (cell / "output" / f"checkpoint-{step}").is_dir()
            logged = [
                json.loads(x)["current_steps"] for x in (cell / "output" / "trainer_log.jsonl").read_text().splitlines()
            ]
            assert max(logged) == step
        for name in done:  # survivors resumed from their rungs' checkpoints: every step logged once, none twice
            logged = [
                json.loads(x)["current_steps"]
                for x in (roots[0] / "default" / name / "output" / "trainer_log.jsonl").read_text().splitlines()
            ]
            assert logged == sorted(set(logged)) and logged[-1] == 90
        again = run_sft("-m", *PRUNE, f"runs_root={roots[0]}", check=True)
        assert "0 cell(s) train a leg now" in again.stdout and "nothing to run" in again.stdout
        assert read_record(roots[0] / "default") == want
    finally:
        for root in roots:
            cancel_jobs_of(root)


@pytest.mark.slurm
def test_the_adaptive_loop_trains_real_cells_with_llamafactory_on_slurm(tmp_path, tiny_assets):
    """The loop end to end with a real backend: three tiny Llama sizes trained by LLaMA-Factory on the local Slurm
    cluster, chosen two then one by the fit's seed design, fitted on their real losses, then the stop."""
    from sft_grid.adaptive.steer import read_rounds

    args = [
        "-m",
        "model=tiny_llama,tiny_llama_m,tiny_llama_l",
        "cluster=slurm_local",
        "max_steps=4",
        "global_batch_size=4",
        "micro_batch_size=2",
        "cutoff_len=256",
        "+adaptive.at=0.01e9",
        "+adaptive.budget_cells=3",
        "+adaptive.recipe_key=dataset",
        f"runs_root={tmp_path}",
    ]
    try:
        outputs = []
        for _ in range(4):
            outputs.append(run_sft(*args, check=True).stdout)
            if "stop:" in outputs[-1]:
                break
            wait_for(
                lambda: all(not s.state.in_flight for s in grid_states(tmp_path).values()),
                "the round's cells",
                deadline_s=900,
            )
        rounds = read_rounds(tmp_path / "default")
        assert [len(r["chosen"]) for r in rounds] == [2, 1, 0], outputs
        states = grid_states(tmp_path)
        assert len(states) == 3 and {s.state.value for s in states.values()} == {"completed"}, states
        (fit,) = rounds[-1]["forecasts"]
        assert fit["points"] == 3 and fit["value"] > 0  # fitted on the three real final losses
        assert "the budget is spent" in outputs[-1]
    finally:
        cancel_jobs_of(tmp_path)


@pytest.mark.parametrize(
    ("steering", "refused"),
    [
        (["lr=1e-4,2e-4,4e-4,8e-4", "+prune={rungs: [10, 30], keep: 0.5}"], "time=99:00:00"),
        (["lr=1e-4,2e-4,4e-4,8e-4", "+prune={rungs: [10, 30], keep: 0.5}"], "micro_batch_size=0"),
        (["+sweep=synthetic_delphi", "+adaptive.at=9714698752", "+adaptive.budget_cells=8"], "time=99:00:00"),
        (["+sweep=synthetic_delphi", "+adaptive.at=9714698752", "+adaptive.budget_cells=8"], "micro_batch_size=0"),
    ],
)
def test_a_steered_grid_that_validation_refuses_leaves_no_file_of_its_decision(tmp_path, steering, refused):
    """The decision (a rung's record, leg files, an adaptive round) is written by the flow after every rule has
    passed: a refused grid leaves nothing, not even the sweep's directory."""
    base = [] if "+sweep=synthetic_delphi" in steering else ["backend=synthetic", "max_steps=90", "save_steps=1000"]
    proc = run_sft("-m", *base, *steering, "cluster.max_time=24:00:00", refused, f"runs_root={tmp_path}")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert refused.split("=")[0] in proc.stdout + proc.stderr
    assert not any(tmp_path.iterdir()), sorted(str(p) for p in tmp_path.rglob("*"))


def test_a_dry_run_prints_the_steering_decision_and_writes_no_record_of_it(tmp_path):
    from sft_grid.adaptive.halving import RECORD_FILE

    proc = run_sft(
        "-m",
        "backend=synthetic",
        "max_steps=90",
        "save_steps=1000",
        "lr=1e-4,2e-4,4e-4,8e-4",
        "+prune={rungs: [10, 30], keep: 0.5}",
        "dry_run=true",
        f"runs_root={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "prune: 1 bracket(s), rungs at steps [10, 30]" in proc.stdout
    assert proc.stdout.count("trains to step 10") == 4
    assert not (tmp_path / "default" / RECORD_FILE).exists()
    assert not list(tmp_path.rglob("leg.json"))
