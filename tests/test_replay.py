"""The `replay` backend (sft_grid/backends/replay.py): real, public fine-tuning curves replayed through the real
flow (planner, local executor, ledger, logs, the report's reading of a final loss), a run stopped at a rung and
resumed writing what an unbroken one writes, an unknown curve refused, and the `guard: extrapolate` of a pruned
grid accepted or refused before anything is queued; an adaptive grid over replayed models sized by their parameters,
a holdout naming a replayed model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sft_grid.analysis.table import final_loss, final_losses, read_table
from sft_grid.backends.replay import curves
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.in_venv import replay_train

from .conftest import run_sft

TRAINER = Path(replay_train.__file__)
CURVE = {"dataset": "flan", "model": "gpt2"}


def _measured(examples: int) -> float:
    return dict(curves()[("flan", "gpt2")]["points"])[examples]


def test_a_replayed_run_logs_the_measured_curve_and_resumes_as_an_unbroken_run(tmp_path):
    points = curves()[("flan", "gpt2")]["points"]
    cfg = {"examples": 51200, "points": [p for p in points if p[0] <= 51200], "max_steps": 40, "logging_steps": 2}
    whole, legs = tmp_path / "whole", tmp_path / "legs"
    for d in (whole, legs):
        d.mkdir()
        (d / "r.json").write_text(json.dumps({**cfg, "output_dir": str(d / "output")}))
    subprocess.run(["python3", str(TRAINER), str(whole / "r.json")], check=True, capture_output=True)
    subprocess.run(["python3", str(TRAINER), str(legs / "r.json"), "stop_at_step=10"], check=True, capture_output=True)
    assert (legs / "output" / "checkpoint-10").is_dir() and not (legs / "output" / "trainer_state.json").exists()
    subprocess.run(
        ["python3", str(TRAINER), str(legs / "r.json"), f"resume_from_checkpoint={legs / 'output' / 'checkpoint-10'}"],
        check=True,
        capture_output=True,
    )
    log = (whole / "output" / "trainer_log.jsonl").read_text()
    assert (legs / "output" / "trainer_log.jsonl").read_text() == log
    # the report's final loss (the mean of the last tenth of the steps) is the measured number
    assert final_loss(final_losses(whole / "output")) == pytest.approx(_measured(51200), abs=1e-6)
    # before the last tenth: the curve at the examples seen so far (here half of them: 25600, a measured size)
    assert replay_train.logged_loss(cfg, 20) == pytest.approx(_measured(25600))


def test_a_replay_grid_trains_through_the_real_flow_with_the_local_executor(tmp_path):
    sizes = (200, 12800, 819200)
    run_sft(
        "-m",
        "backend=replay",
        "cluster=local",
        "max_steps=20",
        "+extra.replay={dataset: flan, model: gpt2}",
        "+extra.replay.examples=" + ",".join(map(str, sizes)),
        f"runs_root={tmp_path}",
        check=True,
    )
    found = {}
    for cell in iter_cell_dirs(tmp_path / "default"):
        cfg = json.loads((cell / "replay.json").read_text())
        assert cfg["replayed"] and cfg["params"] == 124439808
        events = [json.loads(x)["event"] for x in (cell / "events.jsonl").read_text().splitlines()]
        assert "completed" in events, events
        found[cfg["examples"]] = final_loss(final_losses(cell / "output"))
    assert found == pytest.approx({n: _measured(n) for n in sizes}, abs=1e-6)
    # the results and the report name the replayed model and its size, not the config's stand-in model
    assert {(r.model, r.params) for r in read_table(tmp_path / "default").rows} == {("gpt2", 124439808.0)}


def test_an_unknown_curve_is_refused_naming_its_key_and_the_values_it_can_take(tmp_path):
    proc = run_sft(
        "backend=replay", "+extra.replay={dataset: flan, model: nope}", "dry_run=true", f"runs_root={tmp_path}"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "extra.replay.model" in out and "gpt2" in out


PRUNE = ["-m", "backend=replay", "max_steps=90", "save_steps=1000", "lr=1e-4,2e-4,4e-4", "dry_run=true"]


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["logging_steps=1", "+prune={rungs: [10, 30], keep: 0.5, guard: extrapolate}"], None),
        (["logging_steps=5", "+prune={rungs: [10, 30], keep: 0.5, guard: extrapolate}"], "logged point(s)"),
        (["logging_steps=4", "+prune={rungs: [30, 60], keep: 0.5, guard: extrapolate}"], "multiple of logging_steps"),
        (["logging_steps=1", "+prune={rungs: [10, 30], keep: 0.5, guard: cooldown}"], "no cooldown probe"),
    ],
)
def test_the_extrapolate_guard_is_accepted_or_refused_before_anything_is_queued(tmp_path, args, refused):
    proc = run_sft(*PRUNE, "+extra.replay={dataset: flan, model: gpt2}", *args, f"runs_root={tmp_path}")
    out = proc.stdout + proc.stderr
    if refused is None:
        assert proc.returncode == 0, out
        assert "guard extrapolate" in out and out.count("trains to step 10") == 3
    else:
        assert proc.returncode != 0 and refused in out, out


GAP = (
    "-m",
    "backend=replay",
    "cluster=local",
    "max_steps=20",
    "+extra.replay={dataset: flan}",
    "+extra.replay.model=gpt2,t5-small",
    "+extra.replay.examples=200,800,3200,12800,51200,204800,819200,1638400",
    "+adaptive.question=gap",
    "+adaptive.at=1638400",
    "+adaptive.recipes=[gpt2,t5-small]",
    "+adaptive.recipe_key=extra.replay.model",
    "+adaptive.size_key=extra.replay.examples",
    "+adaptive.holdout=[1638400]",
    "+adaptive.budget_cells=11",
    "+adaptive.batch=8",
)


def test_a_gap_decision_over_examples_steers_a_replay_grid_through_the_real_flow(tmp_path):
    """The adaptive loop on real curves as a user runs it: each `sft-grid run` of the same sweep is one round, the
    cells' sizes read from `size_key` (examples, not the stand-in model's parameters), the 1.6M-example cells held out
    by size and run once so that the forecast is checked against the measured loss, and the loop stops by itself."""
    from sft_grid.adaptive.steer import SUMMARY_FILE, read_rounds

    sweep = tmp_path / "default"
    for _ in range(8):
        out = run_sft(*GAP, f"runs_root={tmp_path}", check=True).stdout
        if "  stop: " in out:
            break
    assert "  stop: " in out, out
    rounds = read_rounds(sweep)
    examples = {c.name: json.loads((c / "replay.json").read_text())["examples"] for c in iter_cell_dirs(sweep)}
    # the ladder (the default design), its budget in cells: each model's top at its largest size (819,200), its
    # rung the largest size at least 8 times below (51,200: the grid steps by 4) and its foot the same below that
    # (3,200); feet and rungs first, in one batch
    assert sorted(examples[c] for c in rounds[0]["chosen"]) == [3200, 3200, 51200, 51200]
    # what they cost: the replayed model's parameters (not the config's stand-in's, the same for both) x examples
    # over the smallest, the cells having no GPU-hour estimate
    params = {m: curves()[("flan", m)]["params"] for m in ("gpt2", "t5-small")}
    seed_units = (3200 + 51200) / 200
    assert rounds[0]["spent"] == pytest.approx(sum(params.values()) / 1e9 * seed_units), rounds[0]
    assert rounds[-1]["stop"] and rounds[-1]["decision"] in ("gpt2", "t5-small")
    assert rounds[-1]["p_wrong"] is not None and 0 <= rounds[-1]["p_wrong"] <= 1
    fitted = rounds[-1]["observed"]
    assert 4 < len(fitted) <= 6 and all(examples[c] < 1638400 for c in fitted), fitted
    assert {examples[c] for c in fitted} - {3200, 51200} == {819200}, fitted  # a top for each model still in
    summary = json.loads((sweep / SUMMARY_FILE).read_text())
    held = {h["recipe"]: h for h in summary["holdouts"]}
    assert set(held) == {"gpt2", "t5-small"} and all(
        h["size"] == 1638400 and h["at_question_size"] for h in held.values()
    )
    for model, h in held.items():
        assert h["realised"] == pytest.approx(dict(curves()[("flan", model)]["points"])[1638400], abs=1e-6)
        assert h["lo"] < h["forecast"] < h["hi"]
    # nothing ran that the loop did not choose: the fitted cells and the two holdouts
    assert len(examples) == len(fitted) + 2, (examples, fitted)


def test_a_size_key_that_names_no_number_is_refused_before_anything_is_queued(tmp_path):
    args = [a.replace("size_key=extra.replay.examples", "size_key=extra.replay.model") for a in GAP]
    proc = run_sft(*args, f"runs_root={tmp_path}")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "adaptive.size_key" in text and "'gpt2'" in text, text
    assert "a cell's size must be a number above 0" in text and "nothing was submitted" in text, text
    assert not (tmp_path / "default").exists() or not list(iter_cell_dirs(tmp_path / "default"))


SIZES = (
    "-m",
    "backend=replay",
    "cluster=local",
    "max_steps=20",
    "+extra.replay={dataset: flan, examples: 51200}",
    "+extra.replay.model=gpt2,gpt2-medium,gpt2-large,gpt2-xl",
    "+adaptive.question=loss",
    "+adaptive.at=1557611200",
    "+adaptive.recipe_key=extra.replay.dataset",
    "+adaptive.budget_cells=4",
    "dry_run=true",
)


def test_a_replay_grid_over_model_sizes_holds_out_a_replayed_model_by_its_name(tmp_path):
    """Sized by parameters (no size_key), a replayed cell is the model whose curve it replays, not the config's
    stand-in (the same for every cell): a holdout names that model, and its cells run as the holdout while the seed
    design takes the smallest of the others. Before, every cell was the stand-in: the holdout named no model, and the
    four models were one size."""
    proc = run_sft(*SIZES, "+adaptive.holdout=[gpt2-xl]", f"runs_root={tmp_path}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    model = {c.name: json.loads((c / "replay.json").read_text())["model"] for c in iter_cell_dirs(tmp_path / "default")}
    chosen = {model[n] for n in model if f"next: {n}: seed design" in out}
    # the seed design's batch (2): the two smallest models; the holdout rendered to run beside them, never chosen
    assert chosen == {"gpt2", "gpt2-medium"} and set(model.values()) == {"gpt2", "gpt2-medium", "gpt2-xl"}, out


def test_a_holdout_that_names_no_replayed_model_is_refused_with_the_names_it_can_take(tmp_path):
    proc = run_sft(*SIZES, "+adaptive.holdout=[gpt2-xxl]", f"runs_root={tmp_path}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "adaptive.holdout" in out and "gpt2-xxl names no model of the grid" in out, out
    assert "fix: one of gpt2, gpt2-large, gpt2-medium, gpt2-xl" in out and "nothing was submitted" in out, out


def test_an_adaptive_block_naming_no_form_is_refused_before_anything_is_queued(tmp_path):
    """`forms:` is read through the real flow (Hydra's override, the sweep's block): `[tail]` is accepted and a dry
    run renders the grid; a name that is no form is refused naming the key, the value and the forms there are, and
    nothing is written."""
    ok = run_sft(*SIZES, "+adaptive.holdout=[gpt2-xl]", "+adaptive.forms=[tail]", f"runs_root={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run_sft(*SIZES, "+adaptive.forms=[tail,cubic]", f"runs_root={tmp_path / 'bad'}")
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "adaptive.forms" in out and "cubic" in out and "rectified" in out, out
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("*.yaml"))
