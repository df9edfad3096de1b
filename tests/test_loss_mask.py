"""The loss-mask preflight (sft_grid/checks/mask.py) and `sft-grid show`.

Tests marked `backend` run each backend's own preprocessing in its real environment (LLaMA-Factory,
axolotl) on the tiny local models and datasets. The others are unit tests of the pure pass/fail logic on
hand-written token data, shaped like the probe's output (no backend runs in them).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from sft_grid.checks import mask, venv_facts
from sft_grid.checks.mask import judge, judge_row
from sft_grid.checks.preflight import preflight
from sft_grid.cli.present import DIM, GREEN, RESET
from sft_grid.core.paths import REPO_ROOT

TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "system_tag": "system",
}
SHAREGPT = ["dataset=tiny_sharegpt"]


# -- pure logic, on hand-written token data ----------------------------------------------------------------


def _row(messages, segments, **extra):
    roles = [{"assistant": "assistant", "user": "user", "system": "system"}.get(k, "gpt") for k, _ in messages]
    trained = sum(len(t) for t, tr, _ in segments if tr)  # a stand-in count: non-zero when anything is trained
    return {
        "messages": [list(m) for m in messages],
        "roles": roles,
        "warnings": [],
        "dropped": False,
        "segments": [list(s) for s in segments],
        "n_tokens": 10,
        "n_trained": trained,
        **extra,
    }


LLAMA_OK = _row(
    [("system", "Be brief."), ("user", "What is 2+2?"), ("assistant", "<|start_think|>add<|end_think|>4.")],
    [
        ("<|begin_of_text|><|start_header_id|>", False, True),
        ("system", False, False),
        ("<|end_header_id|>", False, True),
        ("\n\nBe brief.", False, False),
        ("<|eot_id|><|start_header_id|>", False, True),
        ("user", False, False),
        ("<|end_header_id|>", False, True),
        ("\n\nWhat is 2+2?", False, False),
        ("<|eot_id|><|start_header_id|>", False, True),
        ("assistant", False, False),
        ("<|end_header_id|>", False, True),
        ("\n\n", False, False),
        ("<|start_think|>", True, True),
        ("add", True, False),
        ("<|end_think|>", True, True),
        ("4.", True, False),
        ("<|eot_id|>", True, True),
    ],
)


def test_a_right_mask_passes_think_block_and_end_of_turn_included():
    assert judge_row(LLAMA_OK) == []
    assert judge([LLAMA_OK] * 8, TAGS).ok


def test_an_empty_think_block_added_by_the_template_is_markup_not_a_leak():
    row = _row(
        [("user", "hi"), ("assistant", "hello")],
        [
            ("<|im_start|>", False, True),
            ("user\nhi", False, False),
            ("<|im_end|>", False, True),
            ("\n", False, False),
            ("<|im_start|>", False, True),
            ("assistant\n", False, False),
            ("<think>", True, True),
            ("\n\n", True, False),
            ("</think>", True, True),
            ("\n\nhello", True, False),
            ("<|im_end|>", True, True),
            ("\n", True, False),
        ],
    )
    assert judge_row(row) == []


def test_an_untrained_end_of_turn_is_caught():
    """The answer trained without the token that ends it: the model would never learn to stop."""
    segments = [(t, tr and t != "<|eot_id|>", m) for t, tr, m in LLAMA_OK["segments"]]
    (problem,) = judge_row({**LLAMA_OK, "segments": segments})
    assert problem == "the end of assistant turn 1 is not trained (the model never learns to stop)"


def test_the_turns_own_end_token_must_be_trained_not_just_something_after_the_answer():
    """A pad equal to the turn's end (what LLaMA-Factory picks for a tokenizer without a pad: pad = eos =
    <|eot_id|>) masked by a collator: the answer is trained and so is a token after it, but not <|eot_id|>. Only the
    template's end-of-turn token teaches the model to stop."""
    segments = [
        s if s[0] != "<|eot_id|>" or not s[1] else ("<|end_of_text|>", True, True) for s in LLAMA_OK["segments"]
    ]
    row = {**LLAMA_OK, "segments": segments}
    assert judge_row(row) == []  # something is trained after the answer: the generic check is satisfied
    (problem,) = judge_row(row, end_of_turn="<|eot_id|>")
    assert problem.startswith("the end-of-turn token <|eot_id|> of assistant turn 1 is not trained")
    assert judge_row(LLAMA_OK, end_of_turn="<|eot_id|>") == []
    verdict = judge([row] * 4, TAGS, end_of_turn="<|eot_id|>")
    assert not verdict.ok and "4/4 sampled rows are trained wrongly" in verdict.message


def test_trained_prompt_is_caught_and_named():
    segments = [(t, True, m) for t, _, m in LLAMA_OK["segments"]]
    problems = judge_row({**LLAMA_OK, "segments": segments})
    assert len(problems) == 1 and problems[0].startswith("system/user text trained")
    outcome = judge([{**LLAMA_OK, "segments": segments}], TAGS)
    assert not outcome.ok and "train_on_prompt" in outcome.fix


def test_a_trained_role_header_is_template_text():
    segments = [(t, t == "assistant" or tr, m) for t, tr, m in LLAMA_OK["segments"]]
    (problem,) = judge_row({**LLAMA_OK, "segments": segments})
    assert problem == "template text trained: 'assistant'"


def test_a_masked_think_block_is_caught():
    segments = [
        (t, tr and t not in ("<|start_think|>", "add", "<|end_think|>"), m) for t, tr, m in LLAMA_OK["segments"]
    ]
    assert judge_row({**LLAMA_OK, "segments": segments}) == ["the think block of assistant turn 1 is not trained"]


def test_a_masked_earlier_turn_fails_unless_only_the_last_turn_is_trained_on_purpose():
    row = _row(
        [("user", "a"), ("assistant", "first answer"), ("user", "b"), ("assistant", "second answer")],
        [
            ("a", False, False),
            ("first answer", False, False),
            ("<|eot_id|>", False, True),
            ("b", False, False),
            ("second answer", True, False),
            ("<|eot_id|>", True, True),
        ],
    )
    assert judge_row(row) == ["assistant turn 1 is masked (not trained): 'first answer'"]
    assert judge_row(row, last_turn_only=True) == []


def test_dropped_rows_and_unmatched_roles_give_a_fix_naming_the_tag():
    row = {
        **_row([("user", "a"), ("other", "b")], []),
        "roles": ["human", "gpt"],
        "dropped": True,
        "warnings": ["Invalid role tag in [...]"],
        "n_trained": 0,
    }
    outcome = judge([row] * 8, TAGS)
    assert not outcome.ok and outcome.message.startswith("8/8 sampled rows train 0 tokens")
    assert "Invalid role tag" in outcome.message
    assert "'human', 'gpt'" in outcome.fix and "assistant_tag 'assistant'" in outcome.fix


def test_a_role_no_tag_matches_fails_even_when_the_mask_looks_right():
    # axolotl renders an unmapped role (here 'human' with user_tag=user) as it is: masked, but a wrong prompt
    row = {
        **LLAMA_OK,
        "messages": [["system", "Be brief."], ["other", "What is 2+2?"], LLAMA_OK["messages"][2]],
        "roles": ["system", "human", "assistant"],
    }
    (problem,) = judge_row(row)
    assert problem.startswith("role(s) 'human' match no tag")
    assert "'human' match no tag (user_tag='user'" in judge([row], TAGS).fix


def test_zero_trained_tokens_and_last_turn_skips_fail():
    row = _row([("user", "a"), ("assistant", "b")], [("a", False, False), ("b", False, False)])
    assert judge_row(row)[0].startswith("0 trained tokens")
    skipped = {**LLAMA_OK, "warnings": ["Last turn is not trainable, skipping having to find the turn indices."]}
    assert judge_row(skipped)[0].startswith("the backend skipped the last turn as not trainable")
    # one bad row of eight fails the check
    assert not judge([LLAMA_OK] * 7 + [row], TAGS).ok


# -- the real backends -------------------------------------------------------------------------------------


@pytest.fixture
def backend_env(request, backend):
    """The backend's managed environment (built on first use); the tiny assets come with it."""
    return request.getfixturevalue("axolotl_env" if backend == "axolotl" else "tiny_assets")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty probe cache and zeroed counters."""
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight-cache"))
    monkeypatch.setattr(mask, "STATS", mask.Stats())
    return tmp_path / "preflight-cache"


# every cell the wrong-setting tests below probe, for both backends: probed in one batch by `batched`, one backend
# process per environment for all of them (a process costs a backend's imports: seconds; axolotl's, ~27 s)
WRONG = {
    "assistant_tag": [*SHAREGPT, "dataset.tiny_sharegpt.tags.assistant_tag=assistant"],
    "template": ["model.template=qwen3"],
    "user_tag": [*SHAREGPT, "dataset.tiny_sharegpt.tags.user_tag=user"],
    "prompt": {"llamafactory": ["+extra.train_on_prompt=true"], "axolotl": ["+extra.train_on_inputs=true"]},
    # a cutoff that cuts the answers away, each backend truncating its own way: LLaMA-Factory shares the cutoff
    # between prompt and answer (2 tokens leave the answer none), axolotl drops a row longer than it (all are)
    "cutoff": {"llamafactory": ["cutoff_len=2"], "axolotl": ["cutoff_len=16"]},
}


def wrong(name: str, backend: str) -> list[str]:
    extra = WRONG[name]
    return [f"backend={backend}", "model=tiny_llama", *(extra[backend] if isinstance(extra, dict) else extra)]


@pytest.fixture(scope="module")
def batch_cache(tmp_path_factory, tiny_assets, axolotl_env):
    """A probe cache holding the verdicts of every WRONG cell, probed together; asserts it took one process per
    backend environment."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sft_grid.core.paths import PACKAGE_CONF
    from sft_grid.planning.cells import plan_cell
    from sft_grid.planning.compose import GridComposer

    cache = tmp_path_factory.mktemp("probe-batch")
    variants = [[*wrong(name, b), f"runs_root={cache / 'runs'}"] for name in WRONG for b in ("llamafactory", "axolotl")]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base=None):
        composed, errors = GridComposer(GlobalHydra.instance().config_loader(), "config").compose_all(variants)
    GlobalHydra.instance().clear()
    assert not errors, errors
    cells = [plan_cell(c.overrides, c.config) for c in composed]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SFT_GRID_PREFLIGHT_CACHE", str(cache / "preflight"))
        mp.setattr(mask, "STATS", mask.Stats())
        mask.run_checks([check for cell in cells for check in mask.checks_for(cell)])
        assert (mask.STATS.probed, mask.STATS.subprocesses) == (2 * len(WRONG), 2)
    return cache / "preflight"


@pytest.fixture
def batched(batch_cache, monkeypatch):
    """The batch's probe cache: a test's checks are answered from it, and none of them starts a backend process."""
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(batch_cache))
    monkeypatch.setattr(mask, "STATS", mask.Stats())
    yield batch_cache
    assert mask.STATS.subprocesses == 0, "a check was not in the batch"


def _mask_problems(problems):
    return [p for p in problems if p.rule == "preflight-loss_mask"]


@pytest.mark.backend
def test_good_tiny_cells_pass_one_probe_process_per_env_then_the_disk_cache(
    make_cells, axolotl_env, fresh, monkeypatch
):
    # the probe's process answers its environment's facts too (the model check's transformers), so the
    # checks start one backend process per environment, not two
    facts_processes: list[list[str]] = []
    real_run = subprocess.run
    monkeypatch.setattr(
        venv_facts,
        "subprocess",
        SimpleNamespace(run=lambda argv, **kw: facts_processes.append(argv) or real_run(argv, **kw)),
    )
    cells = make_cells(
        *[["model=tiny_llama", f"lr={lr}"] for lr in (1e-3, 2e-3, 3e-3)],
        ["model=tiny_qwen3"],
        ["model=tiny_llama", *SHAREGPT],
        ["backend=axolotl", "model=tiny_llama", *SHAREGPT],
        ["backend=axolotl", "model=tiny_qwen3"],
    )
    started = time.perf_counter()
    result = preflight(cells)
    first = time.perf_counter() - started
    assert result.problems == [] and result.deferred == {}
    # 7 cells, 5 unique (backend, tokenizer, template, dataset): one process per backend environment
    assert (mask.STATS.checks, mask.STATS.probed, mask.STATS.subprocesses) == (5, 5, 2)
    assert facts_processes == []
    # and what it answered is what env_facts.py answers in a process of its own
    python = next(c.python for c in mask.checks_for(cells[0]))
    shared = venv_facts.facts(python, transformers=True)
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(fresh.parent / "facts-alone"))
    assert venv_facts.facts(python, transformers=True) == shared and shared and shared["model_types"]
    assert len(facts_processes) == 1
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(fresh))
    mask.STATS = mask.Stats()
    started = time.perf_counter()
    assert preflight(cells).problems == []
    second = time.perf_counter() - started
    assert (mask.STATS.cached, mask.STATS.subprocesses) == (5, 0)
    assert len(list(fresh.glob("*.json"))) == 5
    # the counters above say the second preflight ran no probe and no process; its speed-up is a figure to read,
    # not to assert (a busy machine stretches either run)
    print(f"mask preflight of 7 cells: first {first:.1f} s, second (cached) {second:.2f} s")


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_wrong_assistant_tag_trains_nothing(make_cells, batched, backend):
    (cell,) = make_cells(wrong("assistant_tag", backend))
    (check,) = mask.checks_for(cell)
    outcome = mask.run_checks([check])[check]
    assert not outcome.ok and not outcome.unreachable
    assert outcome.message.startswith(f"{backend}'s own preprocessing of 8 rows: 8/8 sampled rows train 0 tokens")
    assert "'gpt'" in outcome.fix and "assistant_tag 'assistant'" in outcome.fix
    # in the grid the static tag check names the same cause first: one problem, one fix
    (problem,) = preflight([cell]).problems
    assert problem.rule == "preflight-assistant_turns" and problem.key == "dataset.tiny_sharegpt"


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_a_wrong_template_is_caught_by_the_mask_itself(make_cells, batched, backend):
    """ChatML (qwen3) on the Llama-3 tokenizer: the backend's own preprocessing trains template text in
    pieces. The static family rule and the token check stop it first in a grid; here the mask check alone is
    run, to show it does not depend on them."""
    (cell,) = make_cells(wrong("template", backend))
    (check,) = mask.checks_for(cell)
    outcome = mask.run_checks([check])[check]
    assert not outcome.ok and not outcome.unreachable
    assert outcome.message.startswith(f"{backend}'s own preprocessing of 8 rows")
    # LLaMA-Factory trains ChatML's end marker as text pieces; axolotl trains the answers but not their end
    caught = "template text trained" if backend == "llamafactory" else "is not trained (the model never learns to stop)"
    assert caught in outcome.message, outcome.message


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_wrong_user_tag_is_caught_only_by_the_mask(make_cells, batched, backend):
    """The static tag check sees assistant turns; only the backend's preprocessing shows the damage."""
    (cell,) = make_cells(wrong("user_tag", backend))
    problems = preflight([cell]).problems
    assert [p.rule for p in problems] == ["preflight-loss_mask"], [p.render() for p in problems]
    assert "'human' match no tag (user_tag='user'" in problems[0].fix


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_a_config_that_trains_the_prompt_is_caught_only_by_the_mask(make_cells, batched, backend):
    (cell,) = make_cells(wrong("prompt", backend))
    problems = preflight([cell]).problems
    assert [p.rule for p in problems] == ["preflight-loss_mask"], [p.render() for p in problems]
    assert "user text trained" in problems[0].message and "train_on_prompt" in problems[0].fix


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_a_cutoff_that_cuts_the_answers_away_is_refused(make_cells, batched, backend):
    """The probe truncates each row as the job will, at the cell's cutoff_len: most rows training nothing is refused,
    saying how many; the default cutoff (4096) keeps every answer of the same rows."""
    (cell,) = make_cells(wrong("cutoff", backend))
    problems = preflight([cell]).problems
    assert [p.rule for p in problems] == ["preflight-loss_mask"], [p.render() for p in problems]
    cutoff = cell.spec.cutoff_len
    assert f"cutoff_len={cutoff} leaves 8 of 8 sampled rows with no trained token" in problems[0].message
    assert "raise cutoff_len" in problems[0].fix


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SFT_GRID_PREFLIGHT_CACHE": str(cache)}


@pytest.mark.backend
@pytest.mark.xdist_group("loss_mask_batch")
def test_a_failing_cell_is_reported_before_anything_is_written(batched, tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sft_grid",
            "model=tiny_llama",
            *SHAREGPT,
            "dataset.tiny_sharegpt.tags.user_tag=user",
            f"runs_root={runs}",
        ],
        cwd=REPO_ROOT,
        env=_env(batched),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nothing was submitted" in proc.stderr and "cell tiny_llama_tiny_sharegpt_user_taguser-" in proc.stderr
    assert "dataset.tiny_sharegpt=" in proc.stderr and "[preflight-loss_mask]" in proc.stderr
    assert "fix: role value(s) 'human'" in proc.stderr
    assert not any(p.name != ".sft_grid.lock" for p in runs.rglob("*") if p.is_file())


def _trained_spans(text: str) -> list[str]:
    return re.findall(r"\[\[(.*?)\]\]", text, re.DOTALL)


@pytest.mark.backend
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_show_marks_exactly_the_assistant_turns(tiny_assets, backend_env, fresh, backend):
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "show", f"backend={backend}", "model=tiny_llama", *SHAREGPT],
        cwd=REPO_ROOT,
        env=_env(fresh),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads((tiny_assets / "data" / "tiny_sharegpt.jsonl").read_text().splitlines()[0])
    answers = [m["value"] for m in first["conversations"] if m["from"] == "gpt"]
    example = proc.stdout.split("example 0:", 1)[1].split("\n--- ", 1)[0]
    assert _trained_spans(example) == [a + "<|eot_id|>" for a in answers]
    assert "\x1b[" not in proc.stdout  # not a terminal: plain marks, no colour codes
    counts = re.search(r"example 0: (\d+) tokens, (\d+) trained", proc.stdout)
    assert counts and 0 < int(counts[2]) < int(counts[1])
    assert "loss mask ok" in proc.stdout


@pytest.mark.backend
def test_show_a_rendered_cell_dir_in_colour_from_the_cache(tiny_assets, fresh, tmp_path):
    runs = tmp_path / "runs"
    subprocess.run(
        [sys.executable, "-m", "sft_grid", "model=tiny_qwen3", "dry_run=true", f"runs_root={runs}"],
        cwd=REPO_ROOT,
        env=_env(fresh),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (cell_dir,) = [p for p in (runs / "default").iterdir() if p.is_dir()]
    cached = set(fresh.glob("*.json"))
    assert len(cached) == 1
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "show", str(cell_dir), "--color", "always"],
        cwd=REPO_ROOT,
        env=_env(fresh),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    green = re.findall(re.escape(GREEN) + r"(.*?)" + re.escape(RESET), proc.stdout, re.DOTALL)
    assert "<|start_think|>I add 25 and 49.<|end_think|>The answer is 74.<|im_end|>" in green[0]
    assert DIM + "<|im_start|>system" in proc.stdout
    assert set(fresh.glob("*.json")) == cached  # the grid's probe result served the show command


@pytest.mark.backend
def test_inputs_not_readable_here_are_deferred_and_run_by_the_job(
    make_cells, tiny_assets, fresh, tmp_path, monkeypatch
):
    """A hub model is deferred to the job's first step, where the same probe runs on what the backend's
    own loaders fetch (here: local copies named as if they were hub ids, since no hub is reachable)."""
    from dataclasses import replace

    from sft_grid.checks.preflight import run_deferred

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    (cell,) = make_cells(["model=qwen3_8b", "dataset=magpie"])
    deferred = preflight([cell]).deferred[cell.name]
    (check,) = [c for c in deferred if c.kind == "loss_mask"]
    assert check.model == "Qwen/Qwen3-8B" and check.backend == "llamafactory"
    # the job side, with the tiny tokenizer and data standing in for the hub's
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "data").mkdir(parents=True)
    (tmp_path / "org" / "data" / "train.jsonl").write_text((tiny_assets / "data" / "tiny_sharegpt.jsonl").read_text())
    (tmp_path / "org" / "tok").symlink_to(tiny_assets / "models" / "tiny-qwen3")
    stand_in = replace(check, model="org/tok", target="org/data")
    good = replace(
        stand_in,
        tags=(
            ("role_tag", "from"),
            ("content_tag", "value"),
            ("user_tag", "human"),
            ("assistant_tag", "gpt"),
            ("system_tag", "system"),
        ),
    )
    ((_, outcome),) = run_deferred([good], check.python, tmp_path / "work")
    assert outcome.ok, outcome.message
    wrong = replace(
        good,
        tags=(
            ("role_tag", "from"),
            ("content_tag", "value"),
            ("user_tag", "user"),
            ("assistant_tag", "gpt"),
            ("system_tag", "system"),
        ),
    )
    ((_, outcome),) = run_deferred([wrong], check.python, tmp_path / "work")
    assert not outcome.ok and "role(s) 'human' match no tag" in outcome.message
