"""The post-training chain (sft_grid/stages/post_training.py): stages planned from the model's needs and the grid,
each with its state in the cell's ledger; a rerun runs only what is pending or failed, never the training; the tokenizer
check repairs what transformers 5 writes; the preprocessor copy; the upload's clear, retryable failure with
the real huggingface_hub (the Hub cannot be reached here); consolidation of a real DeepSpeed ZeRO-3 checkpoint
trained on the CPU; ZeRO-3 rendered for the models that need it; the environment a model's needs select; and on
the local Slurm cluster, a post job that waits for its training job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sft_grid.core.cellfiles import PostFile
from sft_grid.core.layout import POST_FILE, iter_cell_dirs, output_complete
from sft_grid.core.paths import torch_extensions
from sft_grid.core.state import State
from sft_grid.grid.render import render, write
from sft_grid.planning import environments
from sft_grid.planning.environments import VenvSpec
from sft_grid.planning.validate import validate
from sft_grid.stages import post_training
from sft_grid.stages.venv_build import build

from .conftest import run_sft
from .helpers import ledger as ledger_of
from .helpers import states_of

# the DeepSpeed file of a ZeRO-3 cell (backends/zero.py file_name)
DS3 = "ds_zero3.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def stage_events(cell: Path, state: str | None = None) -> list[tuple[str, str]]:
    return [
        (e["stage"], e["state"])
        for e in ledger_of(cell)
        if e["event"] == "stage" and (state is None or e["state"] == state)
    ]


def cell_dir(root: Path, sweep: str = "default") -> Path:
    (found,) = iter_cell_dirs(root / sweep)
    return found


# -- planning (pure) --------------------------------------------------------------------------------------


def test_stages_follow_the_models_needs_and_the_grid(make_cells):
    # the 32B on this CPU-only cluster: its layout is ZeRO-3 only when asked (on a GPU site, when it must fit)
    big, hybrid, small, registered, big_lf = make_cells(
        ["model=qwen3_32b", "backend=axolotl", "layout.sharding=zero3"],
        ["model=qwen3_5_27b", "backend=axolotl"],
        ["model=tiny_llama", "push_to_hub=true", "hub_model_id='org/{model}-{data}-sft-{key}'"],
        [
            "model=tiny_llama",
            "push_to_hub=true",
            "hub_model_id=org/x",
            "register_db=true",
            "register_command=[echo,'{hub_model_id}']",
        ],
        ["model=qwen3_32b", "layout.sharding=zero3"],
    )
    assert post_training.stages_for(big.spec) == ["consolidate", "tokenizer"]
    assert post_training.stages_for(hybrid.spec) == ["consolidate", "preprocessor_config", "tokenizer"]
    assert post_training.stages_for(small.spec) == ["tokenizer", "upload", "cleanup"]
    assert post_training.stages_for(registered.spec) == ["tokenizer", "upload", "register", "cleanup"]
    # the hub id is derived from the cell's identity
    assert small.spec.hub_model_id == f"org/tiny_llama-tiny_messages-sft-{small.key}"
    # (small and registered train the same model: they would be one grid's duplicate, so they are checked apart)
    assert validate([big, hybrid, small]) == [] and validate([registered]) == []
    # ZeRO-3 in the managed LLaMA-Factory environment, which has no DeepSpeed: stopped before anything is queued
    (problem,) = validate([big_lf])
    assert problem.rule == "venv-deepspeed" and "backend=axolotl" in problem.fix
    assert not post_training.upload_in_job(small.spec)  # cluster=local: no internet on its "compute node"


def test_an_offline_site_uploads_from_its_post_partition_when_it_names_one(make_cells):
    from sft_grid.grid.jobs import post_request_for

    hub = ["model=tiny_llama", "cluster=slurm_local", "push_to_hub=true", "hub_model_id=org/x"]
    (plain,) = make_cells(hub)
    (routed,) = make_cells([*hub, "cluster.post_partition=high"])
    assert not post_training.upload_in_job(plain.spec) and post_training.upload_in_job(routed.spec)
    params = dict(post_request_for(routed.spec, needs_hub=True).params)
    assert params["partition"] == "high" and params["nodes"] == 1 and "gres" not in params
    assert dict(post_request_for(routed.spec, needs_hub=False).params)["partition"] == "debug"
    assert dict(post_request_for(plain.spec, needs_hub=True).params)["partition"] == "debug"


def test_jobs_without_gpus_keep_the_clusters_own_sbatch_options_but_not_its_gpu_requests(make_cells):
    """cluster.sbatch_extra holds what every job of the site must carry (capella's file-system licenses, a
    reservation, a hold) and, on sites whose GPU request names a type, the request itself (empireai's
    `gres: gpu:b200:4`): the tokenize-once and post-training jobs keep the first and drop the second."""
    from sft_grid.grid.jobs import post_request_for, request_for, tokenize_request

    extra = {"licenses": "walrus:1", "gres": "gpu:b200:4", "gpus-per-task": 1, "reservation": "r1"}
    (cell,) = make_cells(
        [
            "model=tiny_llama",
            "cluster=slurm_local",
            *(f"+cluster.sbatch_extra.{k}={v}" for k, v in extra.items()),
        ]
    )
    train = dict(dict(request_for(cell.spec, 60).params)["additional_parameters"])
    assert train == {"requeue": True, **extra}
    kept = {"licenses": "walrus:1", "reservation": "r1"}
    assert dict(dict(tokenize_request(cell.spec).params)["additional_parameters"]) == kept  # never requeued
    post = dict(post_request_for(cell.spec, needs_hub=False).params)
    assert dict(post["additional_parameters"]) == {"requeue": True, **kept} and "gres" not in post
    # a gres that is no GPU (a licence-like resource) is kept
    (nvme,) = make_cells(["model=tiny_llama", "cluster=slurm_local", "+cluster.sbatch_extra.gres=nvme:1"])
    assert dict(dict(tokenize_request(nvme.spec).params)["additional_parameters"]) == {"gres": "nvme:1"}


def test_zero3_models_get_a_deepspeed_config_in_both_backends(make_cells, tmp_path):
    zero3 = ["layout.sharding=zero3", "layout.offload=all"]  # as the layout chooses it where nothing lighter fits
    big, small = make_cells(["model=qwen3_32b", "micro_batch_size=2", *zero3], ["model=qwen3_8b"])
    files = render(big, tmp_path / "big", []).files
    ds = json.loads(files[DS3])
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is False  # shards -> consolidate
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"  # layout.offload=all
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_accumulation_steps"] == big.grad_accum == 8
    assert yaml.safe_load(files["train_config.yaml"])["deepspeed"] == str(tmp_path / "big" / DS3)
    assert json.loads(files[POST_FILE])["stages"][0] == "consolidate"
    assert DS3 not in render(small, tmp_path / "small", []).files
    (ax,) = make_cells(["model=qwen3_32b", "backend=axolotl", *zero3])
    ax_files = render(ax, tmp_path / "ax", []).files
    assert DS3 in ax_files
    assert yaml.safe_load(ax_files["axolotl_config.yaml"])["deepspeed"] == str(tmp_path / "ax" / DS3)


def test_qwen3_5_needs_an_environment_with_transformers_5_3(make_cells, monkeypatch, tmp_path):
    for kind in ("ACCOUNT", "RUNS", "ENV"):
        monkeypatch.setenv(f"SFT_GRID_LEONARDO_{kind}", f"/x/{kind.lower()}")
    # the site names only its general environment: not known to have transformers >= 5.3
    (cell,) = make_cells(["model=qwen3_5_9b", "cluster=leonardo"])
    (problem,) = [p for p in validate([cell]) if p.rule == "venv-need"]
    assert problem.key == "cluster.need_venvs.transformers_ge_5_3.llamafactory"
    assert "transformers >= 5.3" in problem.message and "leonardo" in problem.message
    assert "need_venvs: {transformers_ge_5_3: {llamafactory: <venv dir>}}" in problem.fix
    # ... naming one selects it for Qwen3.5 and only for Qwen3.5 (the deprecated spelling need_envs still works)
    qwen35, qwen3 = make_cells(
        ["model=qwen3_5_9b", "cluster=leonardo", "+cluster.need_envs.transformers_ge_5_3={llamafactory:/envs/qwen35}"],
        ["model=qwen3_8b", "cluster=leonardo", "+cluster.need_envs.transformers_ge_5_3={llamafactory:/envs/qwen35}"],
    )
    assert [p for p in validate([qwen35, qwen3]) if p.rule == "venv-need"] == []
    assert environments.select(qwen35.spec) == (Path("/envs/qwen35"), None)
    assert environments.select(qwen3.spec) == (Path("/x/env"), None)
    launch = render(qwen35, tmp_path / "c", []).files["launch.sh"]
    assert "export PATH=/envs/qwen35/bin:" in launch
    # the managed environments pin transformers 5.6.0 (LLaMA-Factory) and 5.16.1 (axolotl): both qualify
    local, ax = make_cells(["model=qwen3_5_9b"], ["model=qwen3_5_9b", "backend=axolotl"])
    assert validate([local, ax]) == [] and environments.select(local.spec)[0] == VenvSpec.load("llamafactory").path
    assert environments.select(ax.spec)[0] == VenvSpec.load("axolotl").path
    # ... unless the backend no longer declares it: then the need is unmet
    (bare,) = make_cells(["model=qwen3_5_9b", "backend=axolotl", "backend.provides=[]"])
    assert [p.rule for p in validate([bare])] == ["venv-need"]


def test_tokenizer_check_repairs_the_list_and_fails_without_a_template(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    config = {
        "extra_special_tokens": ["<a>", "<b>"],
        "additional_special_tokens": ["<b>"],
        "tokenizer_class": "TokenizersBackend",
    }
    (model / "chat_template.jinja").write_text("{{ messages }}")
    fixed, changes = post_training.tokenizer_problems(config, model)
    assert "extra_special_tokens" not in fixed and fixed["additional_special_tokens"] == ["<b>", "<a>"]
    assert fixed["tokenizer_class"] == "PreTrainedTokenizerFast" and fixed["chat_template"] == "{{ messages }}"
    assert len(changes) == 3
    named = {"extra_special_tokens": {"image_token": "<img>"}, "chat_template": "x"}
    assert post_training.tokenizer_problems(named, model) == (named, [])  # already a dict: nothing to do
    (model / "chat_template.jinja").unlink()
    with pytest.raises(post_training.StageFailed, match="has no chat template"):
        post_training.tokenizer_problems({"extra_special_tokens": {}}, model)
    with pytest.raises(post_training.StageFailed, match="neither a dict nor a list"):
        post_training.tokenizer_problems({"extra_special_tokens": "<a>", "chat_template": "x"}, model)


def test_the_database_hook_runs_the_grids_command_and_fails_clearly(tmp_path):
    """Registration runs only where a grid sets register_db (after the upload); sft_grid ships no database
    client, so the hook is the grid's own register_command, run for real here."""
    record = tmp_path / "registered.txt"
    from dataclasses import replace

    spec = PostFile(
        cell="c1",
        stages=("register",),
        python=sys.executable,
        hub_model_id="org/m",
        base_model="base/b",
        datasets=("magpie", "delphi_warmup"),
        register_command=(
            sys.executable,
            "-c",
            "import sys; open(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))",
            str(record),
            "{hub_model_id}",
            "{base_model}",
            "{datasets}",
            "{cell}",
        ),
    )
    post_training.register(tmp_path, spec, post_training.LOGIN)
    assert record.read_text() == "org/m base/b magpie,delphi_warmup c1"
    with pytest.raises(post_training.StageFailed, match="register_command is empty"):
        post_training.register(tmp_path, replace(spec, register_command=()), post_training.LOGIN)
    with pytest.raises(post_training.StageFailed, match="exited 1: no endpoint"):
        post_training.register(
            tmp_path,
            replace(spec, register_command=(sys.executable, "-c", "import sys; sys.exit('no endpoint')")),
            post_training.LOGIN,
        )


# -- real: the backend environments, the orchestrator ----------------------------------------------------


def _fake_completed_cell(root: Path, model: Path, stages: list[str], python: Path, **fields) -> Path:
    """A cell whose training completed: the tiny model's own saved files as output/ and one checkpoint."""
    cell = root / "cell"
    output = cell / "output"
    shutil.copytree(model, output)
    shutil.copytree(model, output / "checkpoint-2")
    (output / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2, "log_history": []}))
    (cell / POST_FILE).write_text(
        json.dumps({"cell": "cell", "stages": stages, "python": str(python), "env": {}, "in_train_job": True, **fields})
    )
    (cell / "cell.yaml").write_text("{}\n")
    return cell


@pytest.mark.backend
def test_repaired_tokenizer_loads_the_same_in_transformers_5_6_and_5_16(tmp_path, tiny_assets):
    model = tiny_assets / "models" / "tiny-llama3"
    assert isinstance(json.loads((model / "tokenizer_config.json").read_text())["extra_special_tokens"], list)
    cell = _fake_completed_cell(tmp_path, model, ["tokenizer"], Path(sys.executable))
    assert post_training.run(cell) is True
    for d in (cell / "output", cell / "output" / "checkpoint-2"):
        config = json.loads((d / "tokenizer_config.json").read_text())
        assert "extra_special_tokens" not in config and config["chat_template"]
    probe = (
        "import json, sys; from transformers import AutoTokenizer as A; a, b = A.from_pretrained(sys.argv[1]),"
        " A.from_pretrained(sys.argv[2]); print(json.dumps([a.all_special_tokens == b.all_special_tokens,"
        " a.chat_template == b.chat_template, a.convert_tokens_to_ids('<|start_think|>'),"
        " a('hi <|eot_id|>').input_ids == b('hi <|eot_id|>').input_ids]))"
    )
    for backend in ("llamafactory", "axolotl"):
        python = build(backend) / "bin" / "python"
        out = subprocess.run(
            [str(python), "-c", probe, str(model), str(cell / "output" / "checkpoint-2")],
            capture_output=True,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            check=True,
        )
        same_tokens, same_template, think_id, same_ids = json.loads(out.stdout.strip().splitlines()[-1])
        assert same_tokens and same_template and same_ids and think_id == 7, backend


@pytest.mark.backend
def test_stages_record_states_and_a_rerun_runs_only_the_failed_ones(tmp_path, tiny_assets, monkeypatch):
    base = tmp_path / "base"
    base.mkdir()
    python = build("llamafactory") / "bin" / "python"
    cell = _fake_completed_cell(
        tmp_path,
        tiny_assets / "models" / "tiny-qwen3",
        ["preprocessor_config", "tokenizer", "upload"],
        python,
        base_model=str(base),
        hub_model_id="org/tiny-sft",
        upload_in_job=False,
    )
    (cell / "output" / "checkpoint-2" / "chat_template.jinja").unlink()  # a checkpoint without its template
    # the base has no preprocessor_config.json: the first stage fails, and nothing after it runs
    assert post_training.run(cell, post_training.LOGIN) is False
    st = post_training.states(cell)
    assert st["preprocessor_config"].state == "failed"
    assert "preprocessor_config.json is not in the base" in st["preprocessor_config"].reason
    assert st["tokenizer"].state == "pending" and st["upload"].state == "pending"
    (base / "preprocessor_config.json").write_text('{"processor_class": "X"}')
    assert post_training.run(cell, post_training.LOGIN) is False
    st = post_training.states(cell)
    assert st["preprocessor_config"].state == "completed"
    for d in (cell / "output", cell / "output" / "checkpoint-2"):
        assert json.loads((d / "preprocessor_config.json").read_text()) == {"processor_class": "X"}
    assert st["tokenizer"].state == "failed"
    assert "checkpoint-2/tokenizer_config.json has no chat template" in st["tokenizer"].reason
    shutil.copy(cell / "output" / "chat_template.jinja", cell / "output" / "checkpoint-2")
    # the Hub: offline here. The real huggingface_hub in the backend environment says why, with the repository
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert post_training.run(cell, post_training.LOGIN) is False
    st = post_training.states(cell)
    assert st["tokenizer"].state == "completed" and st["upload"].state == "failed"
    reason = st["upload"].reason
    assert "https://huggingface.co/org/tiny-sft" in reason and "OfflineModeIsEnabled" in reason
    assert f"sft-grid post {cell} --stage upload" in reason
    # an unreachable endpoint: the cause is the connection
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "post", str(cell), "--stage", "upload"],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert proc.returncode == 1 and "upload failed" in proc.stdout and "Connection refused" in proc.stdout
    # each rerun ran only what had not completed
    runs = [s for s, state in stage_events(cell, "running")]
    assert runs == ["preprocessor_config", "preprocessor_config", "tokenizer", "tokenizer", "upload", "upload"]
    assert [e["event"] for e in ledger_of(cell)] == ["stage"] * len(stage_events(cell))


@pytest.mark.backend
def test_local_grid_runs_the_stages_after_training_and_a_rerun_runs_only_the_stages(tmp_path, tiny_assets):
    base = tmp_path / "tiny-qwen3"
    shutil.copytree(tiny_assets / "models" / "tiny-qwen3", base)
    args = [
        "model=tiny_qwen3",
        f"model.path={base}",
        "model.needs=[preprocessor_config]",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "save_steps=2",
        "push_to_hub=true",
        "hub_model_id='org/{model}-sft-{key}'",
        f"runs_root={tmp_path / 'runs'}",
    ]
    run_sft(*args, check=True)
    cell = cell_dir(tmp_path / "runs")
    state = json.loads((cell / "output" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    events = [e["event"] for e in ledger_of(cell)]
    assert events[:4] == ["submitted", "job", "running", "completed"] and set(events[4:]) == {"stage"}
    st = post_training.states(cell)
    assert st["preprocessor_config"].state == "failed"  # the tiny model has none
    assert st["tokenizer"].state == "pending" and st["upload"].state == "pending"
    status = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "--runs-root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "preprocessor_config failed" in status
    # fixed at the base; the grid's rerun runs the stages only: no training, the same trainer state
    (base / "preprocessor_config.json").write_text("{}")
    again = run_sft(*args, check=True)
    assert "post stages to run: preprocessor_config, tokenizer" in again.stdout
    events = [e["event"] for e in ledger_of(cell)]
    # the stages ran alone: the training was neither submitted nor run again
    assert events.count("running") == 1 and events.count("submitted") == 1 and events[-1] == "stage"
    assert json.loads((cell / "output" / "trainer_state.json").read_text()) == state
    st = post_training.states(cell)
    assert st["preprocessor_config"].state == "completed" and st["tokenizer"].state == "completed"
    assert st["upload"].state == "waiting" and "from the login node" in st["upload"].reason
    # the upload waits for the login node: the grid does not queue it again
    third = run_sft(*args, check=True)
    assert "nothing to run" in third.stdout and f"upload waits: sft-grid post {cell}" in third.stdout
    status = subprocess.run(
        [sys.executable, "-m", "sft_grid", "status", "--runs-root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "upload waiting" in status
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "post", str(cell)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 1
    assert f"https://huggingface.co/org/tiny_qwen3-sft-{cell.name.rsplit('-', 1)[1]}" in proc.stdout


@pytest.mark.backend
def test_consolidation_of_a_real_zero3_checkpoint_equals_the_gathered_weights(tmp_path, tiny_assets, make_cells):
    """A tiny model trained with DeepSpeed ZeRO-3 on the CPU (HF Trainer, one process over gloo, the DeepSpeed
    JSON sft_grid renders for the cell), then the cell's consolidate stage."""
    (cell,) = make_cells(
        [
            "model=tiny_llama",
            "model.needs=[zero3,consolidate]",
            "backend=axolotl",
            "global_batch_size=4",
            "micro_batch_size=2",
        ]
    )
    rendered = render(cell, tmp_path / "cell", [])
    write(rendered)
    cell_path = rendered.dir
    assert json.loads((cell_path / POST_FILE).read_text())["stages"] == ["consolidate", "tokenizer"]
    bin_dir = build("axolotl") / "bin"
    ref = tmp_path / "gathered.safetensors"
    run_env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        # where the cells' jobs of this environment build DeepSpeed's ops: built once
        "TORCH_EXTENSIONS_DIR": torch_extensions(str(bin_dir / "python")),
    }
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(bin_dir / "torchrun"),
            "--nproc_per_node=1",
            str(Path(__file__).parent / "zero3_tiny_train.py"),
            str(tiny_assets / "models" / "tiny-llama3"),
            str(cell_path / DS3),
            str(cell_path / "output"),
            str(ref),
        ],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    output = cell_path / "output"
    # ZeRO-3 without gathering: shards named by `latest`, no weights file; training counts as complete
    assert (output / "latest").read_text().strip() == "global_step2" and not (output / "model.safetensors").exists()
    assert output_complete(output)
    trained_s = time.perf_counter() - started
    assert post_training.run(cell_path) is True, post_training.states(cell_path)
    assert stage_events(cell_path, "completed") == [("consolidate", "completed"), ("tokenizer", "completed")]
    compare = (
        "import sys; from safetensors.torch import load_file;"
        " a, b = load_file(sys.argv[1]), load_file(sys.argv[2]);"
        " assert sorted(a) == sorted(b), (sorted(a), sorted(b));"
        " print(len(a), max((a[k].float() - b[k].float()).abs().max().item() for k in a))"
    )
    out = subprocess.run(
        [str(bin_dir / "python"), "-c", compare, str(output / "model.safetensors"), str(ref)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert int(out[0]) == 21 and float(out[1]) == 0.0, (out, trained_s)


@pytest.mark.slurm
@pytest.mark.backend
@pytest.mark.parametrize("seeds, kind", [("1", "afterok"), ("1,2", "aftercorr")])
def test_on_slurm_the_post_job_waits_for_the_training_job(tmp_path, tiny_assets, seeds, kind):
    """One cell: its post job waits for its training job (afterok). A job array: the post array's task i
    waits for training task i (aftercorr). Either is cancelled if the training fails (kill-on-invalid-dep)."""
    root = tmp_path / "runs"
    args = [
        "-m",
        "model=tiny_llama",
        "cluster=slurm_local",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "save_steps=2",
        "push_to_hub=true",
        "hub_model_id='org/{model}-sft-{key}'",
        f"seed={seeds}",
        f"runs_root={root}",
    ]
    queued = run_sft(*args, check=True)
    cells = list(iter_cell_dirs(root / "default"))
    assert f"post-training stages of {len(cells)} cell(s): array sft_grid-" in queued.stdout
    jobs = []
    try:
        for cell in cells:
            train_job = next(e["job_id"] for e in ledger_of(cell) if e["event"] == "job")
            post_job = next(e for e in ledger_of(cell) if e["event"] == "post_job")
            jobs += [train_job, str(post_job["post_job_id"])]
            array = train_job.split("_")[0]
            assert post_job["after"] == array
            assert post_job["index"] == int(train_job.split("_")[1] if "_" in train_job else 0)
            script = next((root / "default" / ".submitit" / post_job["name"]).glob("*_submission.sh")).read_text()
            assert f"#SBATCH --dependency={kind}:{array}" in script and "#SBATCH --kill-on-invalid-dep=yes" in script
            assert "--gres" not in script and "#SBATCH --nodes=1" in script
        deadline = time.time() + 1800  # trainings and post jobs on a shared cluster, on a busy machine
        while any(post_training.states(c)["upload"].state != "waiting" for c in cells):
            assert time.time() < deadline, [(post_training.states(c), ledger_of(c)) for c in cells]
            time.sleep(2)
    finally:
        subprocess.run(["scancel", *jobs], check=False, capture_output=True)
    for cell in cells:
        # the stages ran in the post job, after the training completed
        events = ledger_of(cell)
        completed_at = next(i for i, e in enumerate(events) if e["event"] == "completed")
        stage_runs = [i for i, e in enumerate(events) if e["event"] == "stage"]
        assert stage_runs and min(stage_runs) > completed_at
        assert post_training.states(cell)["tokenizer"].state == "completed"
        assert states_of([cell])[cell].job_id == next(e["job_id"] for e in events if e["event"] == "job")
    # a rerun queues nothing: training is complete and the upload waits for the login node
    again = run_sft(*args, check=True)
    assert "nothing to run" in again.stdout and "upload waits" in again.stdout
    assert all([e["event"] for e in ledger_of(c)].count("post_job") == 1 for c in cells)


def test_the_training_builds_deepspeeds_ops_where_the_consolidation_finds_them(tmp_path, monkeypatch):
    """The job starts the backend with TORCH_EXTENSIONS_DIR a folder of the cell's environment (its python, from
    post.json) under the cache root, the job's own where it has one; the consolidate stage asks the same function
    for the same python: an op DeepSpeed builds with g++ (1-2 minutes) is built once, not again in each user's home,
    and never loaded into another environment's torch. The cell is written by hand: its launch.sh prints the
    variable and fails."""
    from sft_grid.job.runner import CellFailed, run_cell

    cell = tmp_path / "cell"
    cell.mkdir()
    (cell / "cell.yaml").write_text(yaml.safe_dump({"backend": {"name": "llamafactory"}}))
    (cell / "launch.sh").write_text('echo "ops: ${TORCH_EXTENSIONS_DIR:-unset}"; exit 3\n')
    cache = tmp_path / "cache"
    monkeypatch.setenv("SFT_GRID_CACHE", str(cache))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)

    def started_with(python: str | None) -> str:
        if python is not None:
            (cell / POST_FILE).write_text(PostFile(cell=cell.name, stages=("tokenizer",), python=python).dumps())
        with pytest.raises(CellFailed):
            run_cell(cell)
        return (cell / "logs" / "train.log").read_text().splitlines()[-1].removeprefix("ops: ")

    assert started_with(None) == "unset"  # no environment named: torch's own default
    envs = {name: tmp_path / "envs" / name / "bin" / "python" for name in ("axolotl-1", "axolotl-2")}
    folders = {name: started_with(str(python)) for name, python in envs.items()}
    for name, folder in folders.items():
        assert Path(folder).parent == cache / "torch_extensions" and Path(folder).name.startswith(f"{name}-")
        assert torch_extensions(str(envs[name])) == folder  # where the consolidation looks
    assert len(set(folders.values())) == 2  # each environment's ops apart
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ops"))
    assert started_with(str(envs["axolotl-1"])) == str(tmp_path / "ops")


@pytest.mark.backend
def test_a_zero3_cell_trains_through_the_orchestrator_and_is_consolidated(tmp_path, tiny_assets):
    """axolotl + DeepSpeed ZeRO-3 on the CPU, one process (on a CPU-only cluster the cell gets the gloo pre-init
    plugin, sft_grid/in_venv/zero_cpu.py, in place of the NCCL start-up axolotl does on GPUs) with nothing but the
    model's needs set: the cell's output holds ZeRO shards only, training counts as complete, and its job
    consolidates them into model.safetensors right after."""
    run_sft(
        "model=tiny_llama",
        "model.needs=[zero3,consolidate]",
        "backend=axolotl",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "save_steps=2",
        f"runs_root={tmp_path}",
        check=True,
    )
    cell = cell_dir(tmp_path)
    output = cell / "output"
    rendered = yaml.safe_load((cell / "axolotl_config.yaml").read_text())
    assert rendered["deepspeed"] == str(cell / DS3) and "zero_cpu.GlooPreInit" in rendered["plugins"]
    assert (output / "latest").is_file() and (output / "global_step2").is_dir()
    assert [s for s, _ in stage_events(cell, "completed")] == ["consolidate", "tokenizer"]
    check = (
        "import sys, torch; from safetensors.torch import load_file;"
        " from transformers import AutoModelForCausalLM;"
        " a, b = load_file(sys.argv[1] + '/model.safetensors'), load_file(sys.argv[2] + '/model.safetensors');"
        " assert sorted(a) == sorted(b) and all(a[k].shape == b[k].shape for k in a);"
        " m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); out = m(torch.tensor([[1, 2, 3]])).logits;"
        " print(len(a), sum(int(not torch.equal(a[k], b[k])) for k in a), bool(torch.isfinite(out).all()))"
    )
    python = build("axolotl") / "bin" / "python"
    n, changed, finite = subprocess.run(
        [str(python), "-c", check, str(output), str(tiny_assets / "models" / "tiny-llama3")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    ).stdout.split()[-3:]
    assert int(n) == 21 and int(changed) > 0 and finite == "True"  # all tensors, trained, loadable


@pytest.mark.slurm
@pytest.mark.backend
def test_on_slurm_a_failed_training_cancels_its_post_job(tmp_path, tiny_assets):
    root = tmp_path / "runs"
    run_sft(
        "model=tiny_llama",
        "cluster=slurm_local",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        "cluster.setup=['echo module cuda/99.9 not found >&2; exit 7']",  # the training fails in its job
        f"runs_root={root}",
        check=True,
    )
    cell = cell_dir(root)
    post_job = str(next(e for e in ledger_of(cell) if e["event"] == "post_job")["post_job_id"])
    deadline = time.time() + 900  # the training must fail first: a job on a shared cluster, on a busy machine
    while True:
        state = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", post_job, "-o", "State"], capture_output=True, text=True
        ).stdout.split()
        if state and state[0] not in ("PENDING", "RUNNING"):
            break
        assert time.time() < deadline, state
        time.sleep(2)
    assert state[0].startswith("CANCELLED"), state  # its dependency can never be met: Slurm dropped it
    assert states_of([cell])[cell].state is State.FAILED
    assert stage_events(cell) == []  # nothing of the chain ran on a failed training


@pytest.mark.slurm
@pytest.mark.backend
def test_on_slurm_a_rerun_queues_only_the_failed_stages(tmp_path, tiny_assets):
    base = tmp_path / "tiny-qwen3"
    shutil.copytree(tiny_assets / "models" / "tiny-qwen3", base)
    root = tmp_path / "runs"
    args = [
        "model=tiny_qwen3",
        f"model.path={base}",
        "model.needs=[preprocessor_config]",
        "cluster=slurm_local",
        "max_steps=2",
        "global_batch_size=4",
        "micro_batch_size=2",
        f"runs_root={root}",
    ]

    def wait_stage(cell: Path, stage: str, states: set[str]) -> None:
        deadline = time.time() + 1200
        while post_training.states(cell)[stage].state not in states:
            assert time.time() < deadline, ledger_of(cell)
            time.sleep(2)

    run_sft(*args, check=True)
    cell = cell_dir(root)
    wait_stage(cell, "preprocessor_config", {"failed"})  # the base has no preprocessor_config.json
    trained = (cell / "output" / "trainer_state.json").read_text()
    (base / "preprocessor_config.json").write_text("{}")
    again = run_sft(*args, check=True)
    assert "post stages to run: preprocessor_config, tokenizer" in again.stdout
    assert "post-training stages of 1 completed cell(s): array sft_grid-" in again.stdout
    wait_stage(cell, "tokenizer", {"completed", "failed"})
    assert [n for n, st in post_training.states(cell).items() if st.state != "completed"] == []
    kinds = [e["event"] for e in ledger_of(cell)]
    assert kinds.count("submitted") == 1 and kinds.count("running") == 1 and kinds.count("post_job") == 2
    assert (cell / "output" / "trainer_state.json").read_text() == trained  # training did not run again
