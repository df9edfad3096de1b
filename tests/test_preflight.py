"""Checks that read tokenizers and data: real tiny tokenizers and datasets, deduplicated, deferred when
the input cannot be read here (hub ids: no hub from this machine)."""

from __future__ import annotations

import json

import pytest

from sft_grid.checks.preflight import assistant_turns, preflight, run, run_deferred
from sft_grid.core.cellfiles import Check


def test_tiny_cells_pass(make_cells, tiny_assets):
    cells = make_cells(["model=tiny_llama"], ["model=tiny_qwen3"], ["model=tiny_llama", "dataset=tiny_sharegpt"])
    result = preflight(cells)
    assert result.problems == [] and result.deferred == {}


def test_chatml_template_on_the_tiny_llama3_tokenizer_is_caught_by_its_tokenizer(make_cells, tiny_assets):
    # the static family rule is bypassed here on purpose: the tokenizer itself must reject the template
    (cell,) = make_cells(["model=tiny_llama", "model.template=qwen3", "model.tokenizer_family=qwen3"])
    (problem,) = preflight([cell]).problems
    assert problem.rule == "preflight-template_tokens" and problem.key == "model.template"
    assert "<|im_start|> ->" in problem.message and "not single tokens" in problem.message


def test_wrong_role_tags_give_zero_assistant_turns(make_cells, tiny_assets):
    (cell,) = make_cells(
        [
            "dataset=tiny_sharegpt",
            "dataset.tiny_sharegpt.tags.role_tag=role",
            "dataset.tiny_sharegpt.tags.assistant_tag=assistant",
        ]
    )
    (problem,) = preflight([cell]).problems
    assert problem.key == "dataset.tiny_sharegpt" and problem.rule == "preflight-assistant_turns"
    assert "0 assistant turns in 40 sampled rows" in problem.message
    assert "message keys seen: from, value" in problem.message
    assert problem.fix.startswith(
        "the rows' roles: tags role_tag=from content_tag=value user_tag=human assistant_tag=gpt"
    )


def test_a_local_parquet_source_is_checked_here_by_the_backends_environment(make_cells, tiny_assets, tmp_path):
    """This process has no pyarrow (sft_grid does not depend on it); the backend's environment does (its datasets
    needs it), and reads the sample rows: the assistant turns and the loss mask are judged here, not deferred, and a
    wrong tag is refused before anything is queued."""
    import subprocess

    from sft_grid.planning.environments import bin_dir

    (cell,) = make_cells(["model=tiny_llama"])
    source = tiny_assets / "data" / "tiny_messages.jsonl"
    data = tmp_path / "tiny_messages.parquet"
    subprocess.run(  # written by the real pyarrow of the backend's environment
        [
            str(bin_dir(cell.spec) / "python"),
            "-c",
            "import json, sys, pyarrow as pa, pyarrow.parquet as pq;"
            "rows = [json.loads(line) for line in open(sys.argv[1])];"
            "pq.write_table(pa.Table.from_pylist(rows), sys.argv[2])",
            str(source),
            str(data),
        ],
        check=True,
        timeout=300,
    )
    on = ["model=tiny_llama", "dataset=tiny_messages", f"dataset.tiny_messages.source={data}"]
    good, bad = make_cells(on, [*on, "dataset.tiny_messages.tags.assistant_tag=bot"])
    result = preflight([good, bad])
    assert result.deferred == {}, result.deferred
    assert result.passed["assistant_turns"] == 1 and result.passed["loss_mask"] == 1, result.passed
    assert [(p.cell, p.rule) for p in result.problems] == [(bad.name, "preflight-assistant_turns")], result.problems
    assert "0 assistant turns in" in result.problems[0].message


def test_wrong_column(make_cells, tiny_assets):
    (cell,) = make_cells(["dataset=tiny_sharegpt", "dataset.tiny_sharegpt.messages=messages"])
    (problem,) = preflight([cell]).problems
    assert "no column 'messages'" in problem.message and "conversations" in problem.message


def test_missing_local_path(make_cells, tmp_path):
    (cell,) = make_cells([f"model.path={tmp_path}/nope", "dataset=magpie"])
    problems = preflight([cell]).problems
    assert [(p.key, p.rule) for p in problems] == [("model.path", "preflight-path")]
    assert "no such file" in problems[0].message and "sft-grid assets build" in problems[0].fix


def test_hub_inputs_are_deferred_to_the_job_not_skipped(make_cells, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cells = make_cells(
        ["model=qwen3_8b", "dataset=[magpie,delphi_warmup]", "mix.strategy=interleave_under", "mix.probs=[0.9,0.1]"],
        ["model=qwen3_8b", "dataset=magpie", "lr=3e-5"],
    )
    result = preflight(cells)
    assert result.problems == []
    kinds = {(c.kind, c.target) for c in result.deferred[cells[0].name]}
    assert kinds == {
        ("template_tokens", "Qwen/Qwen3-8B"),
        ("assistant_turns", "Magpie-Align/Magpie-Llama-3.3-Pro-500K-Filtered"),
        ("assistant_turns", "laion/llama-nemotron-science-reasoning-on-le3000tok-100k-canonical-think"),
        ("loss_mask", "Magpie-Align/Magpie-Llama-3.3-Pro-500K-Filtered"),
        ("loss_mask", "laion/llama-nemotron-science-reasoning-on-le3000tok-100k-canonical-think"),
    }
    # deduplicated: the second cell shares the tokenizer, magpie and magpie loss-mask checks
    assert result.unique_checks == 5
    # at job time the same check runs again and an input still unreadable fails the job
    (_, outcome), *_ = run_deferred(result.deferred[cells[1].name][:1])
    assert not outcome.ok and "not readable from this machine" in outcome.message


def test_hub_inputs_found_in_the_hf_cache_are_checked_here(make_cells, tmp_path, monkeypatch, tiny_assets):
    snap = (
        tmp_path / "hub" / "datasets--Magpie-Align--Magpie-Llama-3.3-Pro-500K-Filtered" / "snapshots" / "abc" / "data"
    )
    snap.mkdir(parents=True)
    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
    (snap / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    ok = run(
        Check(
            "assistant_turns",
            "dataset.magpie",
            "Magpie-Align/Magpie-Llama-3.3-Pro-500K-Filtered",
            column="conversations",
            tags=(("role_tag", "from"), ("assistant_tag", "gpt"), ("content_tag", "value")),
        )
    )
    assert ok.ok
    bad = run(
        Check(
            "assistant_turns",
            "dataset.magpie",
            "Magpie-Align/Magpie-Llama-3.3-Pro-500K-Filtered",
            column="conversations",
            tags=(("role_tag", "role"), ("assistant_tag", "assistant"), ("content_tag", "content")),
        )
    )
    assert not bad.ok and not bad.unreachable


@pytest.mark.parametrize(
    "rows, ok",
    [
        ([{"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}], True),
        ([{"m": [{"role": "user", "content": "a"}]}], False),
        ([], False),
    ],
)
def test_assistant_turn_counting(rows, ok):
    assert assistant_turns(rows, "m", {"role_tag": "role", "assistant_tag": "assistant"}).ok is ok


def test_check_round_trips_through_preflight_json():
    check = Check(
        "template_tokens", "model.template", "Qwen/Qwen3-8B", tokens=("<|im_start|>",), tags=(("role_tag", "role"),)
    )
    assert Check.from_json(json.loads(json.dumps(check.to_json()))) == check


@pytest.mark.backend
def test_job_side_fetch_uses_the_backends_loaders(tiny_assets, tmp_path):
    """At job start an input not on disk is read with the backend's own loaders (here: local inputs given
    as if they were hub ids, since no hub is reachable from this machine)."""
    from sft_grid.checks.preflight import fetch_and_run
    from sft_grid.planning.environments import VenvSpec

    python = str(VenvSpec.load("llamafactory").path / "bin" / "python")
    data = tmp_path / "repo"
    data.mkdir()
    (data / "train.jsonl").write_text((tiny_assets / "data" / "tiny_sharegpt.jsonl").read_text())
    good = Check(
        "assistant_turns",
        "dataset.x",
        str(data),
        column="conversations",
        tags=(("role_tag", "from"), ("assistant_tag", "gpt"), ("content_tag", "value")),
    )
    assert fetch_and_run(good, python, tmp_path / "work").ok
    assert len((tmp_path / "work" / "dataset_x.jsonl").read_text().splitlines()) == 40
    wrong = Check(
        "assistant_turns",
        "dataset.x",
        str(data),
        column="conversations",
        tags=(("role_tag", "role"), ("assistant_tag", "assistant"), ("content_tag", "content")),
    )
    assert "0 assistant turns" in fetch_and_run(wrong, python, tmp_path / "work").message
    chatml = Check(
        "template_tokens",
        "model.template",
        str(tiny_assets / "models" / "tiny-llama3"),
        tokens=("<|im_start|>", "<|im_end|>"),
    )
    outcome = fetch_and_run(chatml, python, tmp_path / "work")
    assert not outcome.ok and "not single tokens" in outcome.message
    missing = Check("template_tokens", "model.template", "no-such-org/no-such-model", tokens=("<|im_start|>",))
    outcome = fetch_and_run(missing, python, tmp_path / "work", {"HF_HUB_OFFLINE": "1"})
    assert not outcome.ok and "from this node either" in outcome.message


# -- a model directory and report_to, asked of the backends' own environments --------------------------


def _tiny_copy(tiny_assets, tmp_path, **config):
    """The tiny Llama-3 model, copied, with its config.json changed."""
    import shutil

    d = tmp_path / "model"
    shutil.copytree(tiny_assets / "models" / "tiny-llama3", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **config}))
    return d


def _python(make_cells, backend):
    from sft_grid.planning.environments import bin_dir

    (cell,) = make_cells([f"backend={backend}", "model=qwen3_8b"])
    return str(bin_dir(cell.spec) / "python")


@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_an_architecture_the_backends_transformers_does_not_know_is_refused(
    make_cells, tiny_assets, axolotl_env, tmp_path, monkeypatch, backend
):
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    python = _python(make_cells, backend)
    good = run(Check("model", "model.path", str(tiny_assets / "models" / "tiny-llama3"), python=python))
    assert good.ok, good.message
    unknown_type = _tiny_copy(tiny_assets, tmp_path / "a", model_type="llama_nope")
    verdict = run(Check("model", "model.path", str(unknown_type), python=python))
    assert not verdict.ok and "model_type 'llama_nope' is not one transformers 5." in verdict.message
    assert "of the backend's environment" in verdict.message and "cluster.backend_venvs" in verdict.fix
    unknown_arch = _tiny_copy(tiny_assets, tmp_path / "b", architectures=["LlamaNopeForCausalLM"])
    verdict = run(Check("model", "model.path", str(unknown_arch), python=python))
    assert not verdict.ok and "architectures ['LlamaNopeForCausalLM'] are not classes" in verdict.message


def test_report_to_is_checked_against_the_backends_own_environment(
    make_cells, tiny_assets, axolotl_env, tmp_path, monkeypatch
):
    """The managed LLaMA-Factory environment has no wandb (refused, with the install line); axolotl's has it."""
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    lf = run(Check("integration", "report_to", "wandb", python=_python(make_cells, "llamafactory")))
    assert not lf.ok and "needs the wandb package" in lf.message and "bin/pip install wandb" in lf.fix
    assert run(Check("integration", "report_to", "wandb", python=_python(make_cells, "axolotl"))).ok


def test_a_config_that_is_not_json_is_the_models_problem_not_the_datasets(
    make_cells, tiny_assets, tmp_path, monkeypatch
):
    """The backend's own preprocessing fails on such a model too (the loss-mask probe): reported once, as the
    model's config, never as the dataset failing to preprocess."""
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    d = _tiny_copy(tiny_assets, tmp_path)
    (d / "config.json").write_text('{"model_type": "llama",,}')
    (cell,) = make_cells(["model=tiny_llama", f"model.path={d}"])
    problems = preflight([cell]).problems
    assert [p.rule for p in problems if p.key.startswith("dataset")] == [], [p.render() for p in problems]
    (p,) = [p for p in problems if p.rule == "preflight-model"]
    assert p.key == "model.path" and "config.json is not JSON" in p.message and "line 1, column 24" in p.message
