"""Bad input, eighth round: a model's declared shape (it feeds the GPU memory model and the layout) that disagrees with
its checkpoint's config.json or does not hold together, an evaluation's generation settings that lm-eval would read
only after training, a dataset option copied by hand that kept the original's key (two options, one source trained),
and a Hub web address given as an id. Each is refused naming the key, the value and the fix, with no traceback and
nothing written."""

from __future__ import annotations

import json

import pytest

from sft_grid.planning.evaluation import eval_suite
from sft_grid.planning.hub_rules import hub_ids, model_facts
from sft_grid.planning.validate import inputs_named

from .conftest import run_sft

# a checkpoint's config.json as transformers writes it (the tiny Llama's shape)
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "head_dim": 16,
}


def _refused(tmp_path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run the grid command in an empty folder and return what it said, asserting that it failed, without a
    traceback, and wrote nothing."""
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft("run", *args, "dry_run=true", f"runs_root={here / 'runs'}", cwd=here, env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "Traceback" not in said, said
    assert list(here.iterdir()) == [], said
    return said


def _checkpoint(tmp_path, **config: object) -> str:
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CONFIG, **config}))
    return str(folder)


@pytest.fixture
def no_hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache with nothing in it: a Hub model's config.json is not readable here."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


# -- 1. a model's shape ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "declared", "real"),
    [
        ("num_layers", 32, 2),
        ("hidden_size", 4096, 64),
        ("num_heads", 5, 4),
        ("num_kv_heads", 3, 2),
        ("num_kv_heads", 8, 2),
        ("intermediate_size", 512, 128),
        ("vocab_size", 100, 1000),
    ],
)
def test_a_declared_shape_that_disagrees_with_the_checkpoints_config_is_refused(
    make_cells, tmp_path, key, declared, real
):
    (cell,) = make_cells(["model=tiny_llama", f"model.path={_checkpoint(tmp_path)}", f"model.{key}={declared}"])
    (problem,) = [p for p in model_facts(cell) if p.rule == "model-shape"]
    assert problem.key == f"model.{key}" and problem.value == declared, problem
    theirs = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}.get(key, key)
    theirs = "num_key_value_heads" if key == "num_kv_heads" else theirs
    assert f"disagrees with the checkpoint's config.json ({theirs}: {real} in " in problem.message, problem
    assert f"model.{key}={real}" in problem.fix and f"{key}: {real} in conf/model/tiny_llama.yaml" in problem.fix
    # the checkpoint's own value, or none declared, passes
    agrees, unstated = make_cells(
        ["model=tiny_llama", f"model.path={_checkpoint(tmp_path)}", f"model.{key}={real}"],
        ["model=tiny_llama", f"model.path={_checkpoint(tmp_path)}"],
    )
    assert [p for c in (agrees, unstated) for p in model_facts(c) if p.rule == "model-shape"] == []


def test_a_multimodal_checkpoints_text_config_is_the_shape_compared(make_cells, tmp_path):
    folder = tmp_path / "vl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "x", "text_config": {**CONFIG, "vocab_size": 500}}))
    (cell,) = make_cells(["model=tiny_llama", f"model.path={folder}", "model.vocab_size=1000"])
    (problem,) = [p for p in model_facts(cell) if p.rule == "model-shape"]
    assert "(vocab_size: 500 in " in problem.message and "model.vocab_size=500" in problem.fix, problem


@pytest.mark.parametrize(
    ("kv", "why", "fix"),
    [(7, "does not divide", "model.num_kv_heads=4"), (64, "is more than", "model.num_kv_heads=32")],
)
def test_key_value_heads_that_do_not_divide_the_heads_are_refused_where_no_config_is_readable(
    make_cells, no_hub_cache, kv, why, fix
):
    (cell,) = make_cells(["model=qwen3_8b", f"model.num_kv_heads={kv}"])  # 32 heads, its config not cached here
    (problem,) = [p for p in model_facts(cell) if p.rule == "model-shape"]
    assert problem.key == "model.num_kv_heads" and problem.value == kv, problem
    assert f"{why} model.num_heads=32" in problem.message and fix in problem.fix, problem
    # the shipped models pass: Qwen3.5-27B's 24 heads do not divide its hidden size 5120 (a head is head_dim=256
    # wide), and no rule asks that they do
    shipped = make_cells(*[[f"model={m}"] for m in ("qwen3_5_27b", "qwen3_5_9b", "qwen3_8b", "qwen3_32b", "delphi")])
    assert [p for c in shipped for p in model_facts(c) if p.rule == "model-shape"] == []


def test_the_cli_refuses_a_shape_the_checkpoint_contradicts(tmp_path):
    said = _refused(tmp_path, "model=tiny_llama", f"model.path={_checkpoint(tmp_path)}", "model.num_layers=32")
    assert "model.num_layers=32: disagrees with the checkpoint's config.json (num_hidden_layers: 2 in" in said, said
    assert "[model-shape]" in said and "model.num_layers=2" in said, said


# -- 2. evaluation generation settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "must", "fix"),
    [
        ("max_gen_toks", "abc", "a whole number >= 1", "max_gen_toks=16"),
        ("max_gen_toks", 0, "a whole number >= 1", "max_gen_toks=16"),
        ("max_new_tokens", 1.5, "a whole number >= 1", "max_new_tokens=16"),
        ("temperature", -1, "a number >= 0", "temperature=0"),
        ("top_p", 0, "a number in (0, 1]", "top_p=0.9"),
        ("top_p", 1.5, "a number in (0, 1]", "top_p=0.9"),
        ("top_k", -1, "a whole number >= 0", "top_k=50"),
        ("do_sample", "maybe", "true or false", "do_sample=false"),
        ("until", 5, "a string or a list of strings", "until=[END]"),
    ],
)
def test_a_generation_setting_of_the_wrong_kind_is_refused(make_cells, key, value, must, fix):
    (cell,) = make_cells(["model=tiny_llama", "eval=tiny", f"+eval.tasks.tiny_gen.gen_kwargs.{key}={value}"])
    (problem,) = [p for p in eval_suite(cell) if p.rule == "eval-gen-kwargs"]
    assert problem.key == f"eval.tasks.tiny_gen.gen_kwargs.{key}", problem
    assert f"must be {must}" in problem.message and f"eval.tasks.tiny_gen.gen_kwargs.{fix}" in problem.fix, problem


def test_a_misspelt_generation_setting_is_refused_with_the_one_meant(make_cells):
    (cell,) = make_cells(["model=tiny_llama", "eval=tiny", "+eval.tasks.tiny_gen.gen_kwargs.max_new_tokenz=16"])
    (problem,) = [p for p in eval_suite(cell) if p.rule == "eval-gen-kwargs"]
    assert "(did you mean 'max_new_tokens'?)" in problem.message, problem
    assert "'+eval.tasks.tiny_gen.gen_kwargs.max_new_tokens=16'" in problem.fix, problem
    # settings of their kind, and any attribute of transformers' GenerationConfig, pass; with vllm another key goes to
    # vLLM's SamplingParams, which names its settings otherwise (presence_penalty, min_tokens): only kinds are checked
    right, vllm = make_cells(
        [
            "model=tiny_llama",
            "eval=tiny",
            "+eval.tasks.tiny_gen.gen_kwargs={max_gen_toks:8,temperature:0.5,top_p:1,top_k:0,do_sample:true,"
            "until:[a,b],num_beams:2,repetition_penalty:1.1}",
        ],
        ["model=tiny_llama", "eval=tiny", "eval.engine=vllm", "+eval.tasks.tiny_gen.gen_kwargs.presence_penalty=1"],
    )
    assert [p for c in (right, vllm) for p in eval_suite(c) if p.rule == "eval-gen-kwargs"] == []


def test_the_cli_refuses_a_misspelt_generation_setting(tmp_path):
    said = _refused(tmp_path, "model=tiny_llama", "eval=tiny", "+eval.tasks.tiny_gen.gen_kwargs.max_new_tokenz=16")
    assert "eval.tasks.tiny_gen.gen_kwargs.max_new_tokenz=16: (suite tiny)" in said and "[eval-gen-kwargs]" in said


# -- 3. a dataset option copied by hand that kept its key ------------------------------------------------------------


def _team_conf(tmp_path) -> dict[str, str]:
    conf, data = tmp_path / "conf" / "dataset", tmp_path / "data"
    conf.mkdir(parents=True)
    data.mkdir()
    for name in ("good", "other"):
        (data / f"{name}.jsonl").write_text(
            json.dumps({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})
            + "\n"
        )
    option = "{key}:\n  source: {source}\n  formatting: sharegpt\n  messages: messages\n"
    (conf / "d_good.yaml").write_text(option.format(key="d_good", source=data / "good.jsonl"))
    (conf / "d_copy.yaml").write_text(
        "# copied from d_good\n" + option.format(key="d_good", source=data / "other.jsonl")
    )
    return {"SFT_GRID_CONF": str(tmp_path / "conf")}


def test_a_dataset_option_keyed_by_another_name_is_refused_in_a_mix(tmp_path):
    said = _refused(tmp_path, "model=tiny_llama", "dataset=[d_good,d_copy]", env=_team_conf(tmp_path))
    assert "dataset='d_copy': " in said and "d_copy.yaml is keyed d_good: a dataset option is keyed by its" in said
    assert "replaces the settings of dataset d_good (the cell would train one source, not both)" in said, said
    assert "[dataset-option-key]" in said and "fix: rename its key d_copy: write d_copy: instead of d_good:" in said


def test_a_dataset_option_keyed_by_another_name_is_refused_alone(tmp_path, make_cells):
    said = _refused(tmp_path, "model=tiny_llama", "dataset=d_copy", env=_team_conf(tmp_path))
    assert "would be trained and reported as dataset d_good, not d_copy [dataset-option-key]" in said, said
    # options under their own names pass
    (cell,) = make_cells(["model=tiny_llama", "dataset=[tiny_messages,tiny_sharegpt]"])
    assert [p for p in inputs_named(cell) if p.rule == "dataset-option-key"] == []


# -- 4. a Hub web address given as an id -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "fix"),
    [
        ("model.hub_id=https://huggingface.co/Qwen/Qwen3-8B", "model.hub_id", "model.hub_id=Qwen/Qwen3-8B"),
        ("model.hub_id=https://huggingface.co/Qwen/Qwen3-8B/tree/main", "model.hub_id", "model.hub_id=Qwen/Qwen3-8B"),
        (
            "dataset.tiny_messages.source=https://huggingface.co/datasets/HuggingFaceH4/ultrachat_200k",
            "dataset.tiny_messages.source",
            "dataset.tiny_messages.source=HuggingFaceH4/ultrachat_200k",
        ),
    ],
)
def test_a_hub_web_address_is_refused_with_its_id(make_cells, override, key, fix):
    (cell,) = make_cells(["model=qwen3_8b", override])
    (problem,) = [p for p in hub_ids(cell) if p.key == key]
    url = override.split("=", 1)[1]
    assert problem.rule == "hub-url" and problem.value == url and problem.fix == fix, problem
    assert "is the web address of the Hub repository" in problem.message, problem


def test_a_hub_web_address_with_a_credential_is_shown_masked_and_its_id_given(make_cells):
    (cell,) = make_cells(["model=qwen3_8b", "model.hub_id=https://me:hf_abcdefgh12345678@huggingface.co/Qwen/Qwen3-8B"])
    (problem,) = [p for p in hub_ids(cell) if p.key == "model.hub_id"]
    assert "hf_abcdefgh12345678" not in repr(problem), problem
    assert problem.value == "https://***@huggingface.co/Qwen/***" and problem.fix == "model.hub_id=Qwen/Qwen3-8B"


def test_a_datasets_page_given_as_a_model_says_so(make_cells):
    (cell,) = make_cells(["model=qwen3_8b", "model.hub_id=https://huggingface.co/datasets/org/data"])
    (problem,) = [p for p in hub_ids(cell) if p.key == "model.hub_id"]
    assert "it is a dataset's page, not a model's" in problem.message and "(org/data is a dataset)" in problem.fix
