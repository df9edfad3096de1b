"""Delphi: the tokenizer prep as a grid stage, the delphi chat template (one jinja for both backends) and its
guards. The model is tiny-delphi, built locally by project code like a real Delphi checkpoint: a Qwen3ForCausalLM
(QK-norm, untied, float32, sharded) carrying Llama-3.1's tokenizer layout (128000 BPE ids, then its 256 specials
with the reserved slots the prep renames; no pad token, no chat template).

Train == serve: for sample conversations, the text each backend trains on (LLaMA-Factory through the
template sft_grid registers in its process, axolotl through its chat_template strategy with the jinja) is
the jinja's own render, and the trained tokens are exactly the assistant parts.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest

from sft_grid.checks import mask
from sft_grid.checks.preflight import preflight
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.state import CellState, State
from sft_grid.core.templates import DELPHI_TOKENS, TEMPLATES
from sft_grid.planning import inputs
from sft_grid.planning.environments import VenvSpec
from sft_grid.stages import prep
from sft_grid.stages.venv_build import build

from .conftest import run_sft
from .helpers import ledger as ledger_of
from .helpers import states_of

JINJA = TEMPLATES["delphi"].jinja_path
TINY = ["model=tiny_delphi", "max_steps=3", "cutoff_len=256", "global_batch_size=2", "save_steps=3"]


def _plan(*overrides: str):
    """One composed and planned cell, with these overrides as given (runs_root included)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from sft_grid.core.paths import PACKAGE_CONF
    from sft_grid.planning.cells import plan_cell

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base=None):
        config = cast(
            dict[str, Any],
            OmegaConf.to_container(compose("config", overrides=["model=tiny_delphi", *overrides]), resolve=True),
        )
    GlobalHydra.instance().clear()
    config.pop("hydra", None)
    return plan_cell(["model=tiny_delphi", *overrides], config)


def _cell(make_cells, *overrides: str):
    (cell,) = make_cells(["model=tiny_delphi", *overrides])
    return cell


@pytest.fixture(scope="module")
def prepared(tiny_assets, tmp_path_factory) -> Path:
    """tiny-delphi prepared by the grid's own prep stage (run here, as for a local grid)."""
    cell = _plan(f"runs_root={tmp_path_factory.mktemp('prep')}")
    planned = inputs.prep_for(cell)
    assert planned is not None
    assert prep.prepare(planned, cell) is None
    return planned.model_dir


def _root(prepared: Path) -> str:
    return f"runs_root={prepared.parent.parent.parent}"


def _py(code: str, *args: str, backend: str = "llamafactory") -> str:
    python = VenvSpec.load(backend).path / "bin" / "python"
    proc = subprocess.run(
        [str(python), "-c", code, *args],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# -- the prep ------------------------------------------------------------------------------------------------

_INSPECT = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, out = sys.argv[1], sys.argv[2]
ids = [128002, 128003, 128005, 128011, 128012, 128013]
tok, before = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(src)
m, m0 = AutoModelForCausalLM.from_pretrained(out), AutoModelForCausalLM.from_pretrained(src)
res = {"vocab": len(tok), "vocab_before": len(before), "tied": m.config.tie_word_embeddings,
       "names_before": before.convert_ids_to_tokens(ids), "names": tok.convert_ids_to_tokens(ids),
       "encoded": {t: tok.encode(t, add_special_tokens=False) for t in tok.convert_ids_to_tokens(ids)},
       "chat_template": tok.chat_template, "pad": tok.pad_token, "pad_id": tok.pad_token_id,
       "pad_before": before.pad_token, "eos_id": tok.eos_token_id, "eot_id": tok.convert_tokens_to_ids("<|eot_id|>"),
       "config_pad": m.config.pad_token_id, "dtype": str(m.dtype), "dtype_before": str(m0.dtype)}
for key, w, w0 in (("in", m.get_input_embeddings().weight, m0.get_input_embeddings().weight),
                   ("out", m.get_output_embeddings().weight, m0.get_output_embeddings().weight)):
    mean = w0[:128000].mean(0)
    res[key + "_rows_are_mean"] = all(torch.allclose(w[i], mean, atol=1e-6) for i in ids)
    res[key + "_rows_were_mean"] = any(torch.allclose(w0[i], mean, atol=1e-6) for i in ids)
    others = [i for i in range(w.shape[0]) if i not in ids]
    res[key + "_others_same"] = bool(torch.equal(w[others], w0[others]))
res["in_out_distinct"] = m.get_input_embeddings().weight.data_ptr() != m.get_output_embeddings().weight.data_ptr()
print(json.dumps(res))
"""


@pytest.mark.backend
def test_prep_renames_reserved_slots_and_mean_initialises_their_rows(prepared, tiny_assets):
    source = tiny_assets / "models" / "tiny-delphi"
    got = json.loads(_py(_INSPECT, str(source), str(prepared)).strip().splitlines()[-1])
    assert got["vocab"] == got["vocab_before"] == 128256
    assert got["names_before"] == [f"<|reserved_special_token_{i}|>" for i in range(6)]
    assert got["names"] == list(DELPHI_TOKENS)
    assert got["encoded"] == {t: [i] for t, i in DELPHI_TOKENS.items()}
    assert got["tied"] is False and got["in_out_distinct"]
    for side in ("in", "out"):
        assert got[f"{side}_rows_are_mean"] and not got[f"{side}_rows_were_mean"]
        assert got[f"{side}_others_same"]
    assert got["chat_template"] is None  # the template comes from the cell, never from the prep
    # a Delphi tokenizer has no pad: the prep names Llama-3.1's padding token, never eos or the turn's end
    assert got["pad_before"] is None and got["pad"] == "<|finetune_right_pad_id|>" and got["pad_id"] == 128004
    assert got["pad_id"] not in (got["eos_id"], got["eot_id"]) and got["config_pad"] == 128004
    # float32 as stored, kept float32 in the prepared copy (training loads it in the cluster's precision)
    assert got["dtype_before"] == got["dtype"] == "torch.float32"
    marker = json.loads((prepared / inputs.MARKER).read_text())
    assert marker["version"] == inputs.PREP_VERSION and marker["source"] == str(source)


@pytest.mark.backend
def test_the_stand_in_is_built_like_a_delphi_checkpoint(tiny_assets):
    """tiny-delphi as the real ones are (marin's registry and the models' cards): a Qwen3ForCausalLM with QK-norm
    and no GQA, untied embeddings, float32 safetensors in shards with their index, Llama-3.1's tokenizer layout with
    no pad token and no chat template; its parameter count is the one Delphi's shape formula gives."""
    from tests.hubtools import safetensors_header

    model = tiny_assets / "models" / "tiny-delphi"
    cfg = json.loads((model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["tie_word_embeddings"] is False and (cfg.get("dtype") or cfg.get("torch_dtype")) == "float32"
    assert cfg["vocab_size"] == 128256 and (cfg["bos_token_id"], cfg["eos_token_id"]) == (128000, 128001)
    assert cfg.get("pad_token_id") is None and cfg["num_attention_heads"] == cfg["num_key_value_heads"]
    rope = cfg.get("rope_parameters") or {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta")}
    assert rope["rope_type"] == "llama3" and rope["rope_theta"] == 500000.0 and rope["factor"] == 8.0
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 2
    tensors = {k: v for shard in shards for k, v in safetensors_header(model / shard).items() if k != "__metadata__"}
    assert {v["dtype"] for v in tensors.values()} == {"F32"} and set(tensors) == set(index["weight_map"])
    layers, d, head_dim = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["head_dim"]
    for i in range(layers):
        assert tensors[f"model.layers.{i}.self_attn.q_norm.weight"]["shape"] == [head_dim]
        assert tensors[f"model.layers.{i}.self_attn.k_norm.weight"]["shape"] == [head_dim]
    assert "lm_head.weight" in tensors and "model.embed_tokens.weight" in tensors
    counted = sum(math.prod(v["shape"]) for v in tensors.values())
    assert cfg["num_attention_heads"] * head_dim == d and cfg["intermediate_size"] == 4 * d
    assert counted == 2 * 128256 * d + layers * (16 * d * d + 2 * d + 2 * head_dim) + d
    tok = json.loads((model / "tokenizer.json").read_text())
    specials = {t["id"]: t["content"] for t in tok["added_tokens"]}
    assert sorted(specials) == list(range(128000, 128256))
    assert [specials[i] for i in (128000, 128001, 128002, 128004, 128009, 128011)] == [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|finetune_right_pad_id|>",
        "<|eot_id|>",
        "<|reserved_special_token_3|>",
    ]
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    assert not tok_cfg.get("chat_template") and not tok_cfg.get("pad_token")
    assert not (model / "chat_template.jinja").exists()


@pytest.mark.backend
def test_the_template_follows_the_tokenizer_not_the_architecture(tiny_assets, tmp_path):
    """A Qwen3ForCausalLM that carries Llama-3's tokenizer: told it is a qwen3 model with the qwen3 template, the
    check reads the tokenizer itself and refuses before anything is written, naming the key and the fix."""
    runs = tmp_path / "runs"
    proc = run_sft(*TINY, "model.tokenizer_family=qwen3", "model.template=qwen3", f"runs_root={runs}")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())
    assert "model.template" in err and "<|im_start|>" in err, err
    assert "model.template=delphi model.tokenizer_family=delphi" in err, err
    assert "the template follows the tokenizer, not the model's architecture" in err
    assert not any(runs.rglob("cell.yaml")) and not any(runs.rglob("launch.sh"))
    # told nothing, the same checkpoint trains with the delphi template of its model conf
    (cell,) = [_plan(f"runs_root={runs}")]
    assert cell.spec.model.template == "delphi"


@pytest.mark.backend
def test_prep_refuses_a_tokenizer_whose_slot_is_not_reserved(tiny_assets, tmp_path):
    python = VenvSpec.load("llamafactory").path / "bin" / "python"
    proc = subprocess.run(
        [
            str(python),
            str(prep.PROBE),
            "--model",
            str(tiny_assets / "models" / "tiny-llama3"),
            "--output",
            str(tmp_path / "out"),
            "--tokens",
            json.dumps(DELPHI_TOKENS),
        ],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1 and "delphi tokenizer prep failed" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


# -- train == serve ------------------------------------------------------------------------------------------

CALL = {"name": "add", "arguments": {"a": 2, "b": 3}}
CONVERSATIONS = [
    # no reasoning: no think block at all (LLaMA-Factory's ReasoningTemplate would add an empty one)
    [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there."}],
    # inline <think>, with a system turn
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2 plus 2?"},
        {"role": "assistant", "content": "<think>two and two make four</think>\n\nIt is 4."},
    ],
    # a tool call and its result, then the answer
    [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": CALL}]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "The sum is 5."},
    ],
    # multi-turn, reasoning in one turn only, and the Delphi think tokens already inline (canonical data)
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "<think>not blue again</think>Green."},
        {"role": "user", "content": "And one more?"},
        {"role": "assistant", "content": "<|start_think|>\npick a warm one\n<|end_think|>\n\nRed."},
    ],
]
TAGS = [
    "dataset.tiny_messages.tags.function_tag=function_call",
    "dataset.tiny_messages.tags.observation_tag=observation",
]


def _sharegpt(conversation: list[dict]) -> dict:
    """The conversation as LLaMA-Factory reads it: a tool call is a function_call turn with the call as JSON."""
    out = []
    for m in conversation:
        if m.get("tool_calls"):
            calls = [c["function"] for c in m["tool_calls"]]
            out.append({"role": "function_call", "content": json.dumps(calls[0] if len(calls) == 1 else calls)})
        elif m["role"] == "tool":
            out.append({"role": "observation", "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return {"messages": out}


_RENDER = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
jinja = open(sys.argv[2]).read()
print(json.dumps([tok.apply_chat_template(c, chat_template=jinja, tokenize=False) for c in json.loads(sys.argv[3])]))
"""
_ASSISTANT = re.compile(r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(.*?<\|eot_id\|>)", re.DOTALL)


def _trained_runs(segments: list) -> list[str]:
    runs, current = [], None
    for text, trained, _markup in segments:
        if trained:
            current = (current or "") + text
        elif current is not None:
            runs.append(current)
            current = None
    return runs + ([current] if current is not None else [])


def _check_train_equals_serve(rows: list[dict], renders: list[str]) -> None:
    assert len(rows) == len(renders) == len(CONVERSATIONS)
    for row, render in zip(rows, renders, strict=True):
        assert not row["dropped"], row["warnings"]
        assert "".join(s[0] for s in row["segments"]) == render
        # exactly the assistant parts: content (think block and tool call included) and <|eot_id|>
        assert _trained_runs(row["segments"]) == _ASSISTANT.findall(render)


def _probe_rows(cell) -> list[dict]:
    (probed,) = mask.probe(mask.checks_for(cell), use_cache=False)
    assert probed.outcome is None and probed.result is not None and "error" not in probed.result, (
        probed.outcome,
        probed.result,
    )
    return probed.result["rows"]


@pytest.mark.backend
def test_llamafactory_trains_exactly_the_jinja_render(make_cells, prepared, tmp_path, monkeypatch):
    data = tmp_path / "delphi_lf.jsonl"
    data.write_text("".join(json.dumps(_sharegpt(c)) + "\n" for c in CONVERSATIONS))
    monkeypatch.setattr(mask, "MASK_ROWS", len(CONVERSATIONS))
    cell = _plan(f"dataset.tiny_messages.source={data}", *TAGS, _root(prepared))
    renders = json.loads(_py(_RENDER, str(prepared), str(JINJA), json.dumps(CONVERSATIONS)))
    assert "<|start_think|>" not in renders[0] and renders[2].count("<|tool_call|>") == 1
    _check_train_equals_serve(_probe_rows(cell), renders)


@pytest.mark.backend
def test_axolotl_trains_exactly_the_jinja_render(make_cells, prepared, tmp_path, monkeypatch):
    if not (VenvSpec.load("axolotl").path / "bin" / "python").is_file():
        build("axolotl")
    data = tmp_path / "delphi_axolotl.jsonl"
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    monkeypatch.setattr(mask, "MASK_ROWS", len(CONVERSATIONS))
    cell = _plan("backend=axolotl", f"dataset.tiny_messages.source={data}", _root(prepared))
    renders = json.loads(_py(_RENDER, str(prepared), str(JINJA), json.dumps(CONVERSATIONS)))
    _check_train_equals_serve(_probe_rows(cell), renders)


# -- rendering (pure) -------------------------------------------------------------------------------------------


def test_delphi_cell_renders_its_template_the_prepared_model_and_the_wrapper(make_cells, tmp_path):
    from sft_grid.grid import render

    cell = _cell(make_cells)
    rendered = render.render(cell, tmp_path / "cell", [])
    prep_dir = inputs.prep_for(cell)
    assert prep_dir.dir.parent == cell.runs_root / inputs.PREPARED and prep_dir.dir.name.startswith("tiny_delphi-")
    assert f"model_name_or_path: {prep_dir.model_dir}\n" in rendered.files["train_config.yaml"]
    assert "template: delphi\n" in rendered.files["train_config.yaml"]
    assert rendered.files["delphi.jinja"] == JINJA.read_text()
    assert (
        f"sft_grid_lf.py --template delphi={tmp_path / 'cell' / 'delphi.jinja'} train "
        f"{tmp_path / 'cell' / 'train_config.yaml'}"
    ) in rendered.files["launch.sh"]
    # a template LLaMA-Factory ships registers nothing (the wrapper only adds the loss watchdog), and a model
    # without prep loads its own path
    (llama,) = make_cells(["model=tiny_llama"])
    plain = render.render(llama, tmp_path / "llama", [])
    assert f"sft_grid_lf.py train {tmp_path / 'llama' / 'train_config.yaml'}" in plain.files["launch.sh"]
    assert "--template" not in plain.files["launch.sh"]
    assert not any(f.endswith(".jinja") for f in plain.files) and inputs.model_source(llama) == llama.spec.model.path


def test_a_float32_checkpoint_trains_in_the_sites_precision_and_is_counted_at_4_bytes(
    make_cells, tmp_path, monkeypatch
):
    """Delphi is stored in float32. On a bf16 GPU site both backends train it in bf16 (axolotl loads the weights
    in bf16: no fp32 master copy, as the users' guide asks for an 8B on 96 GiB); nothing tells a backend to keep
    float32. What is staged and prepared weighs 4 bytes a parameter; the kept checkpoints, saved in the training
    precision, 2 bytes a weight."""
    import yaml

    from sft_grid.core.schema import weights_bytes
    from sft_grid.grid import render
    from sft_grid.planning import costs

    for var in ("ACCOUNT", "RUNS", "ENV"):
        monkeypatch.setenv(f"SFT_GRID_JUPITER_{var}", str(tmp_path / var.lower()))
    for backend, name in (("llamafactory", "train_config.yaml"), ("axolotl", "axolotl_config.yaml")):
        (cell,) = make_cells(["model=delphi", f"backend={backend}", "cluster=jupiter", "global_batch_size=64"])
        assert cell.spec.model.weights_dtype == "float32" and cell.spec.cluster.precision == "bf16"
        cfg = yaml.safe_load(render.render(cell, tmp_path / backend, []).files[name])
        assert cfg["bf16"] is True and not cfg.get("fp16") and "torch_dtype" not in cfg and "pure_bf16" not in cfg
        if backend == "axolotl":
            assert cfg["bfloat16"] is True  # the weights themselves in bf16
    assert weights_bytes(cell.spec.model) == 447_244_032 * 4
    plan, _, _ = costs.plan_of(cell, {})
    assert plan.model.params == 447_244_032 and plan.precision == "bf16"
    assert costs.estimate([cell], {}).prepared_bytes == {inputs.prep_for(cell).dir: 447_244_032 * 4}


def test_prep_directory_is_shared_by_cells_of_a_model_and_differs_by_source(make_cells):
    a, b, other = make_cells(
        ["model=tiny_delphi", "lr=1e-4"],
        ["model=tiny_delphi", "lr=2e-4"],
        ["model=tiny_delphi", "model.path=/elsewhere/tiny-delphi"],
    )
    assert inputs.prep_for(a) == inputs.prep_for(b)
    assert inputs.prep_for(other).dir != inputs.prep_for(a).dir
    assert inputs.prep_for(other).source == "/elsewhere/tiny-delphi"


def test_preps_of_a_grid_are_one_array_its_cells_wait_for(make_cells):
    """One prep job for every model of the grid that needs one; the cells that wait for it are apart from those
    that do not, and they wait for it to end (afterany): each cell's first step checks its own model's prep."""
    from sft_grid.grid.decide import Action, Decision
    from sft_grid.grid.jobs import build as build_plan

    cells = make_cells(
        ["model=tiny_delphi", "cluster=slurm_local", "lr=1e-4"],
        ["model=tiny_delphi", "cluster=slurm_local", "lr=2e-4"],
        ["model=tiny_delphi", "model.name=other_delphi", "cluster=slurm_local"],
        ["model=tiny_llama", "cluster=slurm_local"],
    )
    decisions = [
        Decision(cell=c, dir=c.sweep_dir / c.name, state=CellState(state=State.PLANNED), action=Action.RUN)
        for c in cells
    ]
    plan = build_plan(decisions, {}, None, 1001)
    roles = [(j.role.value, len(j.targets)) for j in plan.slurm]
    assert roles == [("prep", 2), ("train", 3), ("post", 3), ("train", 1), ("post", 1)]
    prep_job, delphi_train, _, llama_train, _ = plan.slurm
    assert delphi_train.dependency.kind == "afterany" and delphi_train.dependency.job == prep_job.name
    assert llama_train.dependency is None
    assert {w.cell_dir for w in plan.waits} == set(delphi_train.targets)


# -- guards ---------------------------------------------------------------------------------------------------


def test_delphi_model_with_a_chatml_template_is_refused_with_the_delphi_fix(make_cells):
    from sft_grid.planning.validate import validate

    problems = [p for p in validate([_cell(make_cells, "model.template=qwen3")]) if p.rule == "template-tokenizer"]
    assert len(problems) == 1
    assert problems[0].key == "model.template" and problems[0].value == "qwen3"
    assert "Delphi" in problems[0].message and problems[0].fix == "model.template=delphi"


@pytest.mark.backend
def test_unprepared_delphi_tokenizer_without_prep_stage_is_refused(make_cells, tiny_assets):
    (problem,) = [
        p for p in preflight([_cell(make_cells, "model.needs=[]")]).problems if p.rule == "preflight-template_tokens"
    ]
    assert "not prepared" in problem.message and "<|start_think|>" in problem.message
    assert inputs.PREP_NEED in problem.fix


@pytest.mark.backend
def test_prepared_tokenizer_is_what_the_token_check_reads(make_cells, prepared):
    cell = _plan(_root(prepared))
    (check,) = list(prep_checks(cell))
    assert check.target == str(prepared) and set(DELPHI_TOKENS) <= set(check.tokens)
    assert not [p for p in preflight([cell]).problems if p.rule == "preflight-template_tokens"]


def prep_checks(cell):
    from sft_grid.checks.preflight import checks_for

    return [c for c in checks_for(cell) if c.kind == "template_tokens"]


# -- the grid: local and Slurm ---------------------------------------------------------------------------


@pytest.mark.backend
def test_local_grid_prepares_once_then_trains_from_the_prepared_copy(tmp_path, tiny_assets):
    first = run_sft("-m", *TINY, "seed=1,2", f"runs_root={tmp_path}", check=True)
    assert first.stdout.count("tokenizer prep of tiny_delphi") == 1, first.stdout
    (prep_dir,) = (tmp_path / inputs.PREPARED).iterdir()
    assert [e["event"] for e in ledger_of(prep_dir)] == ["submitted", "running", "completed"]
    cells = list(iter_cell_dirs(tmp_path / "default"))
    assert len(cells) == 2
    for cell in cells:
        assert states_of([cell])[cell].state is State.COMPLETED
        config = (cell / "train_config.yaml").read_text()
        assert f"model_name_or_path: {prep_dir / inputs.MODEL_DIR}" in config
        assert (cell / "delphi.jinja").read_text() == JINJA.read_text()  # the cell keeps its own template
        saved = json.loads((cell / "output" / "tokenizer_config.json").read_text())
        assert saved["eos_token"] == "<|eot_id|>"
    # a second grid with a new cell of the same model: the prep is done, nothing is prepared again
    second = run_sft("-m", *TINY, "seed=1,2,3", f"runs_root={tmp_path}", check=True)
    assert "tokenizer prep" not in second.stdout, second.stdout
    assert [e["event"] for e in ledger_of(prep_dir)] == ["submitted", "running", "completed"]
    assert "1 to run" in second.stdout


@pytest.mark.backend
def test_failed_prep_fails_its_cells_with_the_reason_and_queues_nothing(tmp_path, tiny_assets):
    # tiny-llama3 has no reserved slots at the Delphi ids: the prep refuses it
    proc = run_sft(
        *TINY,
        f"model.path={tiny_assets / 'models' / 'tiny-llama3'}",
        "model.tokenizer_family=llama3",
        "model.template=llama3",
        f"runs_root={tmp_path}",
    )
    assert proc.returncode == 1
    (cell,) = iter_cell_dirs(tmp_path / "default")
    state = states_of([cell])[cell]
    assert state.state is State.FAILED and "tokenizer prep exited with 1" in state.reason
    assert not (cell / "output").exists()


@pytest.mark.slurm
@pytest.mark.backend
def test_slurm_prep_job_runs_first_and_the_cells_depend_on_it(tmp_path, tiny_assets):
    # the prep's own dependency (with tokenize once, the cells wait for the tokenize array, which waits for the
    # prep: tests/test_tokenize_plan.py)
    proc = run_sft(
        "-m",
        *TINY,
        "seed=1,2",
        "model=tiny_delphi,tiny_llama",
        "cluster=slurm_local",
        "tokenize_once=false",
        f"runs_root={tmp_path}",
        check=True,
    )
    match = re.search(r"tokenizer prep of tiny_delphi: job (\d+)", proc.stdout)
    assert match, proc.stdout
    prep_job = match.group(1)
    cells = list(iter_cell_dirs(tmp_path / "default"))
    delphi = [c for c in cells if c.name.startswith("tiny_delphi")]
    llama = [c for c in cells if c.name.startswith("tiny_llama")]
    job_of = {c: next(e["job_id"] for e in reversed(ledger_of(c)) if e.get("event") == "job") for c in cells}
    # the Delphi cells are their own array, which waits for the prep job; the tiny_llama array does not
    assert len({job_of[c].split("_")[0] for c in delphi}) == 1
    assert {job_of[c].split("_")[0] for c in delphi}.isdisjoint({job_of[c].split("_")[0] for c in llama})
    # the array's sbatch script asks for the dependency; while the prep runs, Slurm holds the array on it
    scripts = list((tmp_path / "default" / ".submitit").glob("*/*_submission.sh"))
    delphi_scripts = [p.read_text() for p in scripts if f"afterany:{prep_job}" in p.read_text()]
    assert len(delphi_scripts) == 1 and "--kill-on-invalid-dep=yes" in delphi_scripts[0]
    shown = subprocess.run(["scontrol", "show", "job", job_of[delphi[0]]], capture_output=True, text=True).stdout
    assert f"afterany:{prep_job}" in shown or "JobState=PENDING" not in shown, shown
    deadline = time.time() + 1800  # a prep, then the cells, on a shared cluster, on a busy machine
    while time.time() < deadline:
        states = states_of(cells)
        if all(not s.state.in_flight for s in states.values()):
            break
        time.sleep(2)
    assert {s.state.value for s in states.values()} == {"completed"}, states
    out = subprocess.run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "--format=JobID,Start,End,State",
            "-j",
            ",".join([prep_job, *{job_of[c].split("_")[0] for c in delphi}]),
        ],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    times = {line.split("|")[0]: line.split("|") for line in out}
    assert times[prep_job][3] == "COMPLETED"
    for c in delphi:
        assert times[job_of[c]][1] >= times[prep_job][2]  # started after the prep ended
    assert any(e.get("event") == "prep" and e.get("job_id_prep") == prep_job for e in ledger_of(delphi[0]))


def _wait(cell: Path, deadline_s: float = 1800) -> CellState:
    """The cell's state once its Slurm job is no longer queued or running."""
    deadline = time.time() + deadline_s
    while True:
        state = states_of([cell])[cell]
        if not state.state.in_flight or time.time() > deadline:
            return state
        time.sleep(2)


def _two_node_cell(tmp_path: Path, *overrides: str) -> Path:
    """A tiny Delphi cell trained on both nodes of the local cluster (4 steps, a checkpoint at the last): its
    directory once it completed, its one job having run on both nodes."""
    run_sft(
        "model=tiny_delphi",
        "max_steps=4",
        "save_steps=4",
        "cutoff_len=256",
        "global_batch_size=4",
        "micro_batch_size=2",
        "nodes=2",
        "cluster=slurm_local",
        f"runs_root={tmp_path}",
        *overrides,
        check=True,
    )
    (cell,) = iter_cell_dirs(tmp_path / "default")
    state = _wait(cell, deadline_s=1200)
    log = cell / "logs" / "train.log"
    assert state.state is State.COMPLETED, (state, log.read_text()[-3000:] if log.is_file() else "no train.log")
    nodes = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", state.job_id, "-o", "NodeList"], capture_output=True, text=True
    ).stdout.strip()
    assert nodes in ("n[1-2]", "n1,n2"), nodes
    return cell


@pytest.mark.slurm
@pytest.mark.backend
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_node_delphi_cell_trains_across_both_nodes_with_the_template_in_every_rank(tmp_path, tiny_assets, launcher):
    cell = _two_node_cell(tmp_path, f"cluster.launcher={launcher}")
    lead, other = (cell / "logs" / "train.log").read_text(), (cell / "logs" / "train.node1.log").read_text()
    # one rank on each node (with c10d rendezvous either node may get global rank 0), each through the wrapper
    # (LLaMA-Factory alone would not know the delphi template)
    assert "world size: 2" in lead and "world size: 2" in other
    assert {"Process rank: 0, world size: 2", "Process rank: 1, world size: 2"} <= {
        line.split(">> ")[-1].split(", device")[0] for line in (lead + other).splitlines() if "world size" in line
    }
    launch = (cell / "launch.sh").read_text()
    assert "sft_grid_lf.py --template delphi=" in launch
    if launcher == "torchrun":
        assert "Multi-node training enabled: num nodes: 2, node rank: 1" in other
    else:
        assert "accelerate launch --multi_gpu" in launch
    assert (cell / "output" / "checkpoint-4" / "optimizer.pt").is_file()
    saved = json.loads((cell / "output" / "tokenizer_config.json").read_text())
    # the turn's end is LLaMA-Factory's stop word; the pad stays the prepared one, never that end token
    assert saved["eos_token"] == "<|eot_id|>" and saved["pad_token"] == "<|finetune_right_pad_id|>"


@pytest.mark.slurm
@pytest.mark.backend
def test_two_node_delphi_cell_trains_with_axolotl_across_both_nodes(tmp_path, axolotl_env):
    """axolotl on the stand-in, through the prep, one rank on each node of the local cluster. Under DeepSpeed
    ZeRO-3: axolotl 0.19 gives every rank of a multi-process run the device map {"": LOCAL_RANK}, an accelerator
    index a CPU node does not have (its model load fails), and passes no device map under ZeRO-3."""
    cell = _two_node_cell(tmp_path, "backend=axolotl", "model.needs=[delphi_tokenizer_prep,zero3]")
    assert (cell / "logs" / "train.node1.log").stat().st_size > 0
    assert (cell / "output" / "checkpoint-4").is_dir()
    saved = json.loads((cell / "output" / "tokenizer_config.json").read_text())
    # trained from the prepared copy: its pad, and the delphi jinja saved with the model (train == serve)
    assert saved["pad_token"] == "<|finetune_right_pad_id|>" and "<|start_header_id|>" in saved["chat_template"]


@pytest.mark.slurm
@pytest.mark.backend
def test_slurm_cells_of_a_failed_prep_fail_with_its_reason(tmp_path, tiny_assets):
    proc = run_sft(
        *TINY,
        f"model.path={tiny_assets / 'models' / 'tiny-llama3'}",
        "model.tokenizer_family=llama3",
        "model.template=llama3",
        "cluster=slurm_local",
        f"runs_root={tmp_path}",
        check=True,
    )
    assert "tokenizer prep of tiny_delphi: job" in proc.stdout
    (cell,) = iter_cell_dirs(tmp_path / "default")
    state = _wait(cell)
    assert state.state is State.FAILED, state
    assert "its model prep failed: tokenizer prep exited with 1" in state.reason, state.reason
    assert not (cell / "output").exists()  # its first step stopped it: nothing was trained
    status = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "default", "--runs-root", str(tmp_path)],
        capture_output=True,
        text=True,
    ).stdout
    assert "its model prep failed" in status


@pytest.mark.backend
def test_dry_run_shows_the_first_example_of_each_source_before_the_prep(tmp_path, tiny_assets):
    """Before anything is prepared or queued, a Delphi grid's dry run shows the first example of each source
    as LLaMA-Factory trains on it with the delphi template: an instruction turn and a think example, the
    trained text marked; nothing is prepared by a dry run."""
    proc = run_sft(
        "-m",
        "model=tiny_delphi",
        "dataset=[tiny_messages,tiny_sharegpt]",
        "dry_run=true",
        f"runs_root={tmp_path}",
        check=True,
    )
    shown = proc.stdout.split("the first example of each source", 1)[1]
    for source in ("dataset.tiny_messages", "dataset.tiny_sharegpt"):
        assert f"--- {source} of " in shown and "(llamafactory, template delphi)" in shown
    # the think example: the think block is trained with the answer; the prompt is not
    assert "[[<|start_think|>" in shown and "<|end_think|>The answer is" in shown
    assert "<|start_header_id|>user<|end_header_id|>\n\nWhat is" in shown
    assert not any("[[<|start_header_id|>user" in line for line in shown.splitlines())
    assert not list((tmp_path / "_prepared").glob("*/model/prepared.json"))
