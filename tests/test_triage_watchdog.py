"""The loss watchdog's rules and callback (sft_grid/in_venv/loss_watchdog.py), driven with a fake trainer state
(no transformers here). Runs it stops for real, through the orchestrator on both backends, are in
tests/test_triage_faults.py."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from types import SimpleNamespace

import pytest

from sft_grid.core.failures import FailureClass, classify
from sft_grid.in_venv import loss_watchdog as wd

LN_1000 = math.log(1000)


def rules(**kw) -> wd.LossRules:
    return wd.LossRules(wd.WatchdogSettings(**kw))


def feed(r: wd.LossRules, losses: list[float]) -> wd.Verdict | None:
    for step, loss in enumerate(losses, 1):
        verdict = r.observe(step, loss)
        if verdict:
            return verdict
    return None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_loss_stops_at_once(bad):
    v = feed(rules(), [2.0, bad, 2.0])
    assert v is not None and (v.klass, v.rule, v.step) == ("nan_loss", "non_finite", 2)


def test_divergence_needs_p_logged_steps_in_a_row_above_k_times_the_start():
    assert feed(rules(k=4, p=3), [2.0, 9.0, 9.0, 1.0, 9.0, 9.0]) is None  # the streak was broken
    v = feed(rules(k=4, p=3), [2.0, 9.0, 9.0, 1.0, 9.0, 9.0, 9.0])
    assert v is not None and (v.klass, v.rule, v.step, v.loss) == ("diverged", "above_k", 7, 9.0)
    assert feed(rules(k=4, p=3), [2.0, 7.9, 7.9, 7.9, 7.9]) is None  # below 4 x 2.0


def test_a_collapse_to_the_uniform_guess_is_caught():
    v = feed(rules(vocab_size=1000, p=3), [6.9173, LN_1000, LN_1000 + 1e-7, LN_1000])
    assert v is not None and (v.klass, v.rule, v.step) == ("diverged", "uniform", 4)
    assert "ln(V)=6.908" in v.detail


def test_the_uniform_rule_spares_runs_that_start_there_or_only_pass_through():
    # a model that starts inside the band cannot be told from a collapse
    assert feed(rules(vocab_size=1000), [LN_1000 + 1e-5] + [LN_1000] * 5) is None
    # a healthy run passing through ln(V) on its way down
    assert feed(rules(vocab_size=1000), [7.2, 7.0, LN_1000, 6.8, 6.5]) is None
    # no vocabulary size known: the rule is off
    assert feed(rules(), [7.2] + [LN_1000] * 5) is None


def test_settings_from_the_environment_and_their_bounds():
    s = wd.WatchdogSettings.from_env(
        {
            "SFT_GRID_WATCHDOG_K": "8",
            "SFT_GRID_WATCHDOG_P": "5",
            "SFT_GRID_WATCHDOG_TOL": "0.01",
            "SFT_GRID_WATCHDOG_VOCAB": "32000",
        }
    )
    assert s == wd.WatchdogSettings(k=8.0, p=5, tol=0.01, vocab_size=32000)
    assert wd.WatchdogSettings.from_env({"SFT_GRID_WATCHDOG_K": "8"}, k=2.5).k == 2.5
    assert wd.WatchdogSettings.from_env({}) == wd.WatchdogSettings()
    for bad in ({"SFT_GRID_WATCHDOG_K": "1"}, {"SFT_GRID_WATCHDOG_P": "0"}, {"SFT_GRID_WATCHDOG_TOL": "-1"}):
        with pytest.raises(ValueError):
            wd.WatchdogSettings.from_env(bad)


def fake_state(step: int, rank0: bool = True, history: list[dict] | None = None) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, is_world_process_zero=rank0, log_history=history or [])


def test_the_callback_writes_the_verdict_prints_one_line_and_exits_non_zero(tmp_path, capsys):
    cb = wd.WatchdogCallback(wd.WatchdogSettings(p=2))
    args = SimpleNamespace(output_dir=str(tmp_path / "output"))
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=1000))
    cb.on_train_begin(args, fake_state(0), None, model=model)
    cb.on_log(args, fake_state(1), None, logs={"loss": 2.5, "grad_norm": 1.0})
    cb.on_log(args, fake_state(1), None, logs={"train_runtime": 3.0, "train_loss": 99.0})  # no "loss": ignored
    with pytest.raises(SystemExit) as stop:
        cb.on_log(args, fake_state(2), None, logs={"loss": float("nan")})
    assert stop.value.code == wd.EXIT_STATUS != 0
    verdict = json.loads((tmp_path / "output" / wd.VERDICT_FILE).read_text())
    assert verdict == {
        "class": "nan_loss",
        "step": 2,
        "loss": "nan",
        "rule": "non_finite",
        "detail": "loss is nan at step 2",
    }
    assert [p.name for p in (tmp_path / "output").iterdir()] == [wd.VERDICT_FILE]  # no temp file left
    lines = [x for x in capsys.readouterr().err.splitlines() if "sft_grid watchdog" in x]
    assert len(lines) == 1 and lines[0].startswith("sft_grid watchdog: nan_loss at step 2")
    # the orchestrator's triage reads that line as the same class
    assert classify([], lines[0]).klass is FailureClass.NAN_LOSS


def test_other_ranks_stop_too_but_write_nothing(tmp_path):
    cb = wd.WatchdogCallback(wd.WatchdogSettings())
    with pytest.raises(SystemExit):
        cb.on_log(SimpleNamespace(output_dir=str(tmp_path)), fake_state(3, rank0=False), None, logs={"loss": "inf"})
    assert not (tmp_path / wd.VERDICT_FILE).exists() and cb.verdict.klass == "nan_loss"


def test_a_resumed_run_keeps_its_first_legs_starting_loss(tmp_path):
    cb = wd.WatchdogCallback(wd.WatchdogSettings(k=4, p=2))
    args = SimpleNamespace(output_dir=str(tmp_path))
    cb.on_train_begin(args, fake_state(100, history=[{"learning_rate": 1e-5}, {"loss": 1.5, "step": 10}]), None)
    cb.on_log(args, fake_state(101), None, logs={"loss": 6.5})
    with pytest.raises(SystemExit):
        cb.on_log(args, fake_state(102), None, logs={"loss": 6.6})
    verdict = json.loads((tmp_path / wd.VERDICT_FILE).read_text())
    assert verdict["class"] == "diverged" and verdict["rule"] == "above_k" and "1.5" in verdict["detail"]
    line = wd.Verdict("diverged", 102, 6.6, "above_k", verdict["detail"]).line()
    assert classify([], line).klass is FailureClass.DIVERGED


def test_the_axolotl_plugin_is_built_only_when_asked_for():
    # importing the module never imports axolotl (it also loads in LLaMA-Factory's environment)
    assert "axolotl" not in sys.modules
    if importlib.util.find_spec("axolotl") is None:
        with pytest.raises(ImportError):
            _ = wd.LossWatchdogPlugin
    with pytest.raises(AttributeError):
        _ = wd.NoSuchThing
    assert len(wd.llamafactory_callbacks(k=6)) == 1 and wd.llamafactory_callbacks(k=6)[0].rules.settings.k == 6
