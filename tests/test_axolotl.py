"""The axolotl backend: rendered configs pass axolotl's own validation, tiny cells really train through the
orchestrator (local executor and the local Slurm cluster), resume from a checkpoint, interleave a mix as a
seeded data step identical to LLaMA-Factory's, keep the chat template in every checkpoint's
tokenizer_config.json, and land close to LLaMA-Factory on the same cell."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sft_grid import backends
from sft_grid.backends import axolotl
from sft_grid.checks import preflight
from sft_grid.core.cellfiles import Check
from sft_grid.core.layout import LAUNCH_FILE
from sft_grid.core.paths import IN_VENV_DIR, PACKAGE_CONF
from sft_grid.grid import render
from sft_grid.in_venv import template_integrity
from sft_grid.planning import resolvers
from sft_grid.planning.environments import VenvSpec

from .conftest import AXOLOTL_MIX, run_sft

TINY = ["backend=axolotl", "model=tiny_llama", "global_batch_size=4", "micro_batch_size=2", "cutoff_len=128"]
MIX = ["dataset=[tiny_messages,tiny_sharegpt]", "mix.strategy=interleave_under", "mix.probs=[0.7,0.3]"]


def cells(root: Path, sweep: str = "default") -> list[Path]:
    return sorted(p for p in (root / sweep).glob("*") if (p / "cell.yaml").is_file())


def events(cell: Path) -> list[dict]:
    return [json.loads(line) for line in (cell / "events.jsonl").read_text().splitlines()]


def losses(output: Path) -> list[float]:
    state = json.loads((output / "trainer_state.json").read_text())
    return [h["loss"] for h in state["log_history"] if "loss" in h]


def set_user_env(monkeypatch: pytest.MonkeyPatch, *clusters: str) -> None:
    for name in clusters:
        for var in resolvers.variables((PACKAGE_CONF / "cluster" / f"{name}.yaml").read_text()):
            monkeypatch.setenv(var, f"/dummy/{var.lower()}")


def write_cell(cell) -> Path:
    rendered = render.render(cell, cell.sweep_dir / cell.name, [])
    cell.sweep_dir.mkdir(parents=True, exist_ok=True)
    render.write(rendered)
    return rendered.dir


def axolotl_check(configs: list[Path], *site: str) -> dict[str, dict]:
    """axolotl's own validation (in_venv/axolotl_check.py in the axolotl venv): config path -> its result."""
    python = VenvSpec.load("axolotl").path / "bin" / "python"
    proc = subprocess.run(
        [str(python), str(IN_VENV_DIR / "axolotl_check.py"), *site, *map(str, configs)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(IN_VENV_DIR)},
    )
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"config"')]
    assert len(results) == len(configs), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["config"]: r for r in results}


# -- rendering, validated by axolotl itself --------------------------------------------------------------


@pytest.mark.backend
def test_rendered_configs_pass_axolotls_own_validation(make_cells, monkeypatch, axolotl_env):
    set_user_env(monkeypatch, "leonardo", "jupiter", "vista")
    cpu = make_cells(
        [*TINY],
        ["backend=axolotl", "model=tiny_qwen3", "dataset=[tiny_messages,tiny_sharegpt]", "finetuning_type=lora"],
        [*TINY, *MIX, "report_to=wandb", "max_steps=7", "save_total_limit=2"],
    )
    gpu = make_cells(
        ["backend=axolotl", "model=qwen3_8b", "cluster=leonardo", "nodes=2", "global_batch_size=64", "report_to=wandb"],
        ["backend=axolotl", "model=delphi", "cluster=jupiter", "global_batch_size=64"],
        ["backend=axolotl", "model=qwen3_32b", "cluster=jupiter", "nodes=2", "global_batch_size=64"],
        ["backend=axolotl", "model=qwen3_8b", "cluster=vista", "dataset=tiny_sharegpt"],
    )
    cpu_dirs = [write_cell(c) for c in cpu]
    gpu_dirs = [write_cell(c) for c in gpu]
    checked = axolotl_check([d / axolotl.CONFIG_FILE for d in cpu_dirs])
    checked |= axolotl_check([d / axolotl.CONFIG_FILE for d in gpu_dirs], "--gpu", "sm_90", "--world-size", "8")
    for d in cpu_dirs + gpu_dirs:
        result = checked[str(d / axolotl.CONFIG_FILE)]
        assert result["ok"], result
        assert result["dropped"] == [], f"axolotl silently drops {result['dropped']} of {d.name}"
    results = [checked[str(d / axolotl.CONFIG_FILE)] for d in cpu_dirs + gpu_dirs]
    tiny, qwen_lora, mixed, leonardo, delphi, big, vista = results
    # CPU: fp32 and eager; GPU sites: the model itself in bf16 (no fp32 master weights), FlashAttention 2 where the
    # site's environment has it (Leonardo's kernels), sdpa elsewhere (aarch64 has no flash-attn wheels)
    assert (tiny["torch_dtype"], tiny["attn_implementation"]) == ("torch.float32", "eager")
    for site, kernel in ((leonardo, "flash_attention_2"), (delphi, "sdpa"), (big, "sdpa"), (vista, "sdpa")):
        assert (site["torch_dtype"], site["bf16"], site["attn_implementation"]) == ("torch.bfloat16", True, kernel)
    # each source keeps its own fields and role values; a mix is the one file of the data step
    sharegpt = qwen_lora["datasets"][1]
    assert sharegpt["field_messages"] == "conversations" and sharegpt["roles"]["user"] == ["human"]
    assert sharegpt["message_property_mappings"] == {"role": "from", "content": "value"}
    assert [d["path"] for d in mixed["datasets"]] == [str(cpu_dirs[2] / axolotl.MIX_DATA)]
    assert tiny["chat_template"].endswith("llama3") and leonardo["chat_template"].endswith("qwen3")
    assert delphi["chat_template"].endswith("jinja")
    cfg = {d.name: (d / axolotl.CONFIG_FILE).read_text() for d in cpu_dirs + gpu_dirs}
    assert "adapter: lora" in cfg[cpu_dirs[1].name] and "wandb_name: " + cpu[2].name in cfg[cpu_dirs[2].name]
    # the layouts chosen to fit: the 32B with ZeRO-3; the 8B's 65 GB of bf16 states exceed Leonardo's 64 GB: ZeRO-2;
    # the 447M Delphi on 96 GB GH200s: plain data parallel
    assert "ds_zero3.json" in cfg[gpu_dirs[2].name] and "ds_zero2.json" in cfg[gpu_dirs[0].name]
    assert "deepspeed" not in cfg[gpu_dirs[1].name]
    # the launch scripts: one process here, accelerate on each node at Leonardo, the plugins on the path
    tiny_launch = (cpu_dirs[0] / LAUNCH_FILE).read_text()
    assert "axolotl train" in tiny_launch and "--launcher python" in tiny_launch
    assert f"export PYTHONPATH={IN_VENV_DIR}" in tiny_launch and "AXOLOTL_DO_NOT_TRACK=1" in tiny_launch
    leo_launch = (gpu_dirs[0] / LAUNCH_FILE).read_text()
    assert "accelerate launch --multi_gpu" in leo_launch and "-m axolotl.cli.train" in leo_launch
    assert "mix_data.py" in (cpu_dirs[2] / LAUNCH_FILE).read_text()


@pytest.mark.backend
def test_axolotl_validation_rejects_what_it_cannot_use(make_cells, tmp_path, axolotl_env):
    """The check above can fail: a wrong type is an error, an unknown key (LLaMA-Factory's pure_bf16) is
    reported as silently dropped."""
    bad, unknown = make_cells([*TINY, "+extra.sequence_len=long"], [*TINY, "+extra.pure_bf16=true"])
    checked = axolotl_check([write_cell(bad) / axolotl.CONFIG_FILE, write_cell(unknown) / axolotl.CONFIG_FILE])
    bad_result, unknown_result = checked.values()
    assert not bad_result["ok"] and "sequence_len" in bad_result["error"]
    assert unknown_result["ok"] and unknown_result["dropped"] == ["pure_bf16"]
    # the grid's own check of extra keys (checks/preflight.py) refuses what axolotl drops, before anything is
    # queued, and takes its keys (a plugin's included: Liger's, which the shipped layouts use)
    python = str(axolotl_env / "bin" / "python")
    verdicts = {
        key: preflight.check_backend_key(Check("backend_key", f"extra.{key}", key, backend="axolotl", python=python))
        for key in ("pure_bf16", "sample_packin", "sample_packing", "liger_rms_norm", "packing")
    }
    assert [k for k, v in verdicts.items() if not v.ok] == ["pure_bf16", "sample_packin", "packing"]
    assert "drops a key it does not know" in verdicts["pure_bf16"].message
    assert "did you mean sample_packing" in verdicts["sample_packin"].fix
    assert "packing is sft_grid's own key" in verdicts["packing"].fix
    # and its value: the refusal axolotl's own validation gives above (sequence_len: long), before anything is queued;
    # what pydantic's lax mode takes (a whole number written as a string, "yes" for a bool) passes
    valued = {
        (key, str(value)): preflight.check_backend_key(
            Check("backend_key", f"extra.{key}", key, backend="axolotl", python=python, spec=json.dumps(value))
        )
        for key, value in (
            ("sequence_len", "long"),
            ("sequence_len", 2048),
            ("sequence_len", "2048"),
            ("sample_packing", "yes"),
            ("sample_packing", "often"),
            ("val_set_size", 0.05),
        )
    }
    assert [k for k, v in valued.items() if not v.ok] == [("sequence_len", "long"), ("sample_packing", "often")]
    assert (
        "axolotl's config takes a whole number for sequence_len, not 'long'" in valued[("sequence_len", "long")].message
    )


def test_resume_args_per_backend(tmp_path):
    ckpt = tmp_path / "output" / "checkpoint-20"
    assert backends.get("llamafactory").resume_args(ckpt) == [f"resume_from_checkpoint={ckpt}"]
    assert backends.get("axolotl").resume_args(ckpt) == []  # auto_resume_from_checkpoints in the config


# -- the chat template in tokenizer_config.json ----------------------------------------------------------


def test_template_repair_is_idempotent_and_sorts_keys(tmp_path):
    template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"z": 1, "a": 2, "chat_template": "old"}))
    (tmp_path / "chat_template.jinja").write_text("old")
    assert template_integrity.check(tmp_path, template) != []
    assert template_integrity.repair(tmp_path, template) == ["tokenizer_config.json", "chat_template.jinja"]
    text = (tmp_path / "tokenizer_config.json").read_text()
    assert list(json.loads(text)) == ["a", "chat_template", "z"]
    assert (tmp_path / "chat_template.jinja").read_text() == template
    assert template_integrity.repair(tmp_path, template) == []  # the second call changes nothing
    assert (tmp_path / "tokenizer_config.json").read_text() == text
    assert template_integrity.check(tmp_path, template) == []
    # named templates: a list in the config, each extra one in additional_chat_templates/
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text("old")
    named = {"default": template, "tool_use": "{{ tools }}"}
    assert template_integrity.repair(tmp_path, named) == [
        "tokenizer_config.json",
        "additional_chat_templates/tool_use.jinja",
    ]
    assert template_integrity.repair(tmp_path, named) == []
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"][1]["name"] == "tool_use"


# -- the interleaved mix as a data step ------------------------------------------------------------------


@pytest.mark.backend
def test_mix_file_is_the_same_interleave_in_both_backend_envs(make_cells, tmp_path, axolotl_env):
    (cell,) = make_cells([*TINY, *MIX])
    cell_dir = write_cell(cell)
    spec_file = cell_dir / axolotl.MIX_SPEC
    out = {}
    for backend in ("axolotl", "llamafactory"):
        spec = json.loads(spec_file.read_text())
        spec["output"] = str(tmp_path / backend / "mix.jsonl")
        (tmp_path / f"{backend}.json").write_text(json.dumps(spec))
        python = VenvSpec.load(backend).path / "bin" / "python"
        subprocess.run(
            [str(python), str(axolotl.MIX_SCRIPT), str(tmp_path / f"{backend}.json")],
            check=True,
            capture_output=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "HF_DATASETS_OFFLINE": "1"},
        )
        out[backend] = (tmp_path / backend / "mix.jsonl").read_text()
    # datasets 4.8 (axolotl) and 4.0 (LLaMA-Factory): the same rows in the same order
    assert out["axolotl"] == out["llamafactory"]
    rows = [json.loads(line) for line in out["axolotl"].splitlines()]
    sources = json.loads(spec_file.read_text())["sources"]
    # every row is role/content with the template's role names, ShareGPT's human/gpt mapped
    roles = {m["role"] for r in rows for m in r["messages"]}
    assert roles == {"system", "user", "assistant"} and set(rows[0]) == {"messages"}
    n_messages = sum(1 for line in Path(sources[0]["source"]).read_text().splitlines() if line)
    # the ShareGPT source asks about subtraction, the role/content one never does
    from_sharegpt = sum(1 for r in rows if "minus" in next(m["content"] for m in r["messages"] if m["role"] == "user"))
    # first_exhausted: stops when the 60-row source runs out; the 40-row one contributed about 30%
    assert len(rows) > n_messages and 0.15 < from_sharegpt / len(rows) < 0.45
    # idempotent: a second run keeps the file (same stamp), a changed seed rewrites it
    before = (tmp_path / "axolotl" / "mix.jsonl").stat().st_mtime_ns
    python = VenvSpec.load("axolotl").path / "bin" / "python"
    again = subprocess.run(
        [str(python), str(axolotl.MIX_SCRIPT), str(tmp_path / "axolotl.json")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "up to date" in again.stdout and (tmp_path / "axolotl" / "mix.jsonl").stat().st_mtime_ns == before


# -- real training through the orchestrator --------------------------------------------------------------


def assert_template_everywhere(output: Path) -> None:
    template = json.loads((output / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|start_header_id|>" in template
    dirs = [output, *sorted(output.glob("checkpoint-*"))]
    assert len(dirs) >= 3
    for d in dirs:
        assert template_integrity.check(d, template) == [], d


@pytest.mark.backend
def test_mixed_cell_trains_with_axolotl_and_every_checkpoint_carries_the_template(axolotl_mix_grid):
    """The shared axolotl grid (tests/conftest.py): an interleaved mix, two cells, checkpoints every 4 of 8 steps."""
    root = axolotl_mix_grid.root
    for cell in cells(root):
        out = cell / "output"
        assert [e["event"] for e in events(cell)][:4] == ["submitted", "job", "running", "completed"]
        assert f"completed {cell.name}" in " ".join(axolotl_mix_grid.first.split())
        state = json.loads((out / "trainer_state.json").read_text())
        assert state["global_step"] == 8 and (out / "model.safetensors").is_file()
        assert len(losses(out)) == 8
        assert (out / "checkpoint-4" / "optimizer.pt").is_file() and (out / "checkpoint-8").is_dir()
        assert_template_everywhere(out)
        log = (cell / "logs" / "train.log").read_text()
        assert "Loading prepared dataset from disk at" in log and "mix_data: wrote" not in log
    assert "step 8/8" in axolotl_mix_grid.first
    # the grid's tokenize-once job wrote the interleaved mix and axolotl's prepared dataset; the cells loaded it
    (tok_dir,) = list((root / "_tokenized").iterdir())
    tok_log = (tok_dir / "tokenize.log").read_text()
    assert "mix_data: wrote" in tok_log and str(tok_dir / axolotl.MIX_DATA) in tok_log
    assert "0 to run, 2 completed" in axolotl_mix_grid.again


@pytest.mark.backend
def test_axolotl_cell_killed_after_a_checkpoint_resumes_from_it(tmp_path, axolotl_env):
    """A real kill: the job's whole process group dies mid-training, after a checkpoint; the rerun resumes
    from the newest checkpoint (axolotl's auto-resume), continuing the step count instead of restarting."""
    # the job is started by hand on a dry run's cell: nothing built the grid's shared tokenized dataset, so the
    # cell tokenizes in its own job (tokenize_once=false)
    args = [*TINY, "max_steps=40", "save_steps=2", "tokenize_once=false", f"runs_root={tmp_path}"]
    run_sft(*args, "dry_run=true", check=True)
    (cell,) = cells(tmp_path)
    out = cell / "output"
    job = subprocess.Popen(
        [sys.executable, "-m", "sft_grid.job", str(cell)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 900  # ~60 s here; a busy machine three times slower, with room
    while not (out / "checkpoint-4" / "trainer_state.json").is_file():
        assert job.poll() is None and time.time() < deadline, "no checkpoint-4 before the run ended"
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    newest = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    step = int(newest.name.split("-")[1])
    assert step < 40 and not (out / "model.safetensors").exists()

    listed = run_sft(*args, check=True)
    assert "ended without recording an outcome" in listed.stdout
    run_sft(*args, "rerun_failed=true", check=True)
    resumed = [e for e in events(cell) if e["event"] == "resumed"]
    assert resumed and resumed[-1]["checkpoint"] == newest.name
    log = (cell / "logs" / "train.log").read_text()
    assert f"resume from checkpoint at {newest}" in log
    records = [json.loads(x) for x in (out / "trainer_log.jsonl").read_text().splitlines()]
    steps = [r["current_steps"] for r in records if "loss" in r]
    # the killed run logged steps 1..k (k >= the checkpoint's step), the resumed one step+1..40: continued
    k = len(steps) - (40 - step)
    assert k >= step and steps == list(range(1, k + 1)) + list(range(step + 1, 41)), steps
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 40


@pytest.mark.backend
def test_parity_with_llamafactory_on_the_same_cell(tmp_path, axolotl_mix_grid):
    """Same model, data (the interleaved mix), batch, lr and steps: both losses decrease and the final
    losses agree within 10% (the users' stage6 parity gate); both backends train on the same mix rows. The axolotl
    side is the shared grid's lr=1e-3 cell; LLaMA-Factory trains the same cell here."""
    common = [a for a in AXOLOTL_MIX if not a.startswith("backend=")]
    run_sft("backend=llamafactory", *common, "lr=1e-3", f"runs_root={tmp_path}", check=True)
    (lf_cell,) = cells(tmp_path)
    (ax_cell,) = [
        c
        for c in cells(axolotl_mix_grid.root)
        if yaml.safe_load((c / "cell.yaml").read_text())["lr"] == pytest.approx(1e-3)
    ]
    final = {}
    for backend, cell in (("llamafactory", lf_cell), ("axolotl", ax_cell)):
        curve = losses(cell / "output")
        assert len(curve) == 8 and sum(curve[-2:]) < sum(curve[:2]), (backend, curve)
        final[backend] = sum(curve[-2:]) / 2
    lf_examples = int(re.search(r"Num examples = (\d+)", (lf_cell / "logs" / "train.log").read_text()).group(1))
    # the mix the grid's tokenize-once job wrote, which the axolotl cells trained on
    (tok_dir,) = list((axolotl_mix_grid.root / "_tokenized").iterdir())
    mix_rows = len((tok_dir / axolotl.MIX_DATA).read_text().splitlines())
    assert lf_examples == mix_rows
    rel = abs(final["axolotl"] - final["llamafactory"]) / final["llamafactory"]
    assert rel < 0.10, final


@pytest.mark.slurm
@pytest.mark.backend
def test_axolotl_cell_trains_on_the_local_slurm_cluster(tmp_path, axolotl_env):
    from .test_slurm import wait_until

    run_sft(*TINY, "cluster=slurm_local", "max_steps=4", "save_steps=2", f"runs_root={tmp_path}", check=True)
    (st,) = wait_until(tmp_path, {"completed", "failed"}).values()
    (cell,) = cells(tmp_path)
    assert st.state.value == "completed", (st, (cell / "logs" / "train.log").read_text()[-3000:])
    assert st.job_id and json.loads((cell / "output" / "trainer_state.json").read_text())["global_step"] == 4
    assert_template_everywhere(cell / "output")


def test_what_axolotl_cannot_train_is_a_validation_error(tmp_path):
    proc = run_sft("backend=axolotl", "finetuning_type=freeze", f"runs_root={tmp_path}", "dry_run=true")
    assert proc.returncode != 0 and "axolotl has no freeze fine-tuning" in proc.stdout + proc.stderr
    assert "fix: finetuning_type=full or finetuning_type=lora" in proc.stdout + proc.stderr
    assert not any(tmp_path.rglob("cell.yaml"))
