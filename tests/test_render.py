"""Rendered cell files: golden-tested, and the launch script is shell-safe when really run by bash."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sft_grid.core.paths import REPO_ROOT
from sft_grid.grid.render import render, write

GOLDEN = Path(__file__).parent / "golden"
REGEN = "SFT_GRID_REGEN_GOLDEN=1 python -m pytest tests/test_render.py"


@pytest.fixture
def fixed_cache(monkeypatch):
    # the managed env's path is part of launch.sh: pin it so the golden files hold on any machine
    monkeypatch.setenv("SFT_GRID_CACHE", "/opt/sft_grid_cache")


CASES = {
    "qwen3_8b_delphi_mix": [
        "model=qwen3_8b",
        "dataset=[magpie,delphi_warmup]",
        "mix.strategy=interleave_under",
        "mix.probs=[0.9,0.1]",
        "lr=2e-5",
        "max_steps=100",
        "save_total_limit=2",
    ],
    "tiny_llama_sharegpt": [
        "model=tiny_llama",
        "dataset=tiny_sharegpt",
        "global_batch_size=4",
        "micro_batch_size=2",
        "warmup_ratio=0.1",
        "+extra.gradient_checkpointing=false",
    ],
    # axolotl: its own config, the interleaved mix's data step, the delphi jinja inline, two nodes on Leonardo-like GPUs
    "axolotl_delphi_mix_2_nodes": [
        "backend=axolotl",
        "model=delphi",
        "dataset=[magpie,delphi_warmup]",
        "mix.strategy=interleave_under",
        "mix.probs=[0.9,0.1]",
        "cluster=slurm_local",
        "cluster.gpus_per_node=4",
        "cluster.precision=bf16",
        "nodes=2",
        "cluster.launcher=accelerate",
        "lr=2e-5",
        "save_total_limit=3",
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(make_cells, fixed_cache, monkeypatch, case):
    monkeypatch.setenv("HOME", "/home/user")  # tiny model paths come from ${oc.env:HOME}
    (cell,) = make_cells(CASES[case])
    rendered = render(cell, Path("/srv/runs/grid") / cell.name, [])
    golden_dir = GOLDEN / case

    def portable(text: str) -> str:  # the same on any machine and in any clone
        return text.replace(str(cell.runs_root), "<runs_root>").replace(str(REPO_ROOT), "<repo>")

    if os.environ.get("SFT_GRID_REGEN_GOLDEN"):
        golden_dir.mkdir(parents=True, exist_ok=True)
        for rel, text in rendered.files.items():
            (golden_dir / rel).write_text(portable(text))
    for rel, text in rendered.files.items():
        expected = (golden_dir / rel).read_text()
        assert portable(text) == expected, (
            f"{case}/{rel} differs from its golden copy; if the change is intended, regenerate: {REGEN}"
        )


def test_the_sbatch_scripts_of_a_prep_train_post_plan_are_golden(make_cells, fixed_cache, monkeypatch):
    """The submission plan of a grid with a model prep, two training arrays and their post arrays, as sbatch scripts
    (submitit's own renderer), against golden copies: the jobs, their names, sizes and dependencies."""
    import sys

    from sft_grid.core.state import CellState, State
    from sft_grid.grid.decide import Action, Decision
    from sft_grid.grid.jobs import build
    from sft_grid.schedulers import slurm

    monkeypatch.setenv("HOME", "/home/user")
    cells = make_cells(
        *[
            [f"model={m}", f"seed={s}", "cluster=slurm_local", "concurrency=2", "runs_root=/srv/runs"]
            for m in ("tiny_delphi", "tiny_llama")
            for s in (1, 2)
        ]
    )
    plan = build(
        [
            Decision(cell=c, dir=c.sweep_dir / c.name, state=CellState(state=State.PLANNED), action=Action.RUN)
            for c in cells
        ],
        {},
        None,
        1001,
    )
    assert [(j.role.value, len(j.targets)) for j in plan.slurm] == [
        ("prep", 1),
        ("train", 2),
        ("post", 2),
        ("train", 2),
        ("post", 2),
    ]
    golden_dir = GOLDEN / "sbatch_prep_train_post"
    for n, job in enumerate(plan.slurm):
        script = slurm.sbatch_script(job, job.dependency.text() if job.dependency else None)
        script = script.replace(sys.executable, "<python>").replace(str(REPO_ROOT), "<repo>")
        path = golden_dir / f"{n}_{job.role.value}.sbatch"
        if os.environ.get("SFT_GRID_REGEN_GOLDEN"):
            golden_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(script)
        assert script == path.read_text(), f"{path.name} differs from its golden copy; if intended, regenerate: {REGEN}"


def test_mix_keeps_each_datasets_own_tags(make_cells):
    (cell,) = make_cells(["dataset=[magpie,delphi_warmup]", "mix.strategy=interleave_under", "mix.probs=[0.9,0.1]"])
    files = render(cell, Path("/x"), []).files
    info = json.loads(files["dataset_info.json"])
    assert info["magpie"]["tags"]["assistant_tag"] == "gpt"
    assert info["magpie"]["columns"] == {"messages": "conversations"}
    assert info["delphi_warmup"]["tags"]["assistant_tag"] == "assistant"
    cfg = yaml.safe_load(files["train_config.yaml"])
    assert cfg["dataset"] == "magpie,delphi_warmup" and cfg["interleave_probs"] == "0.9,0.1"
    assert cfg["mix_strategy"] == "interleave_under"
    # LLaMA-Factory's global schema keys would override every dataset's own: never written
    assert not {"role_tag", "user_tag", "assistant_tag", "content_tag", "messages", "formatting"} & set(cfg)


def test_launch_script_quotes_config_values_when_run(make_cells, tmp_path):
    env_dir = tmp_path / "fake env"
    (env_dir / "bin").mkdir(parents=True)
    # stands in for the environment's python: records its argv and one env var
    cli = env_dir / "bin" / "python"
    cli.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$OUT_FILE"\nprintf "%s" "$TRICKY" >> "$OUT_FILE"\n')
    cli.chmod(0o755)
    tricky = 'a b; echo pwned $(touch /tmp/sft_grid_pwned) "q" `x` && | > <'
    (cell,) = make_cells(
        [
            f"+cluster.backend_envs.llamafactory='{env_dir}'",
            f"+cluster.env.TRICKY='{tricky}'",
            f"+cluster.env.OUT_FILE='{tmp_path}/out.txt'",
        ]
    )
    rendered = render(cell, tmp_path / "cell dir", [])
    write(rendered)
    proc = subprocess.run(["bash", str(rendered.dir / "launch.sh"), "max_steps=1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "out.txt").read_text().split("\n")
    assert lines[:4] == [
        str(REPO_ROOT / "sft_grid" / "in_venv" / "sft_grid_lf.py"),
        "train",
        str(rendered.dir / "train_config.yaml"),
        "max_steps=1",
    ]
    assert lines[4] == tricky
    assert not Path("/tmp/sft_grid_pwned").exists()


def test_files_are_written_cell_yaml_last_and_atomically(make_cells, tmp_path):
    (cell,) = make_cells([])
    rendered = render(cell, tmp_path / "c", [])
    write(rendered)
    names = sorted(p.name for p in rendered.dir.iterdir())
    assert names == ["cell.yaml", "dataset_info.json", "launch.sh", "post.json", "train_config.yaml"]
    assert os.access(rendered.dir / "launch.sh", os.X_OK)
    # the resolved config, its layout as chosen; deprecated spellings of cluster keys only where a profile sets them
    expected = {
        **cell.resolved,
        "cluster": {k: v for k, v in cell.config["cluster"].items() if v or k not in ("backend_envs", "need_envs")},
    }
    assert yaml.safe_load((rendered.dir / "cell.yaml").read_text()) == expected
    # rewriting an existing cell replaces its files in place and reports it is not new
    assert write(rendered) is False and sorted(p.name for p in rendered.dir.iterdir()) == names


def test_a_rewrite_replaces_only_files_that_differ_from_what_it_would_write(make_cells, tmp_path):
    """A re-invocation over an existing grid reads each file instead of replacing it when it is already what the
    replacement would be (content, mode, owner, a single link); anything else is replaced as before."""
    (cell,) = make_cells([])
    rendered = render(cell, tmp_path / "c", [])
    write(rendered)
    d = rendered.dir
    inodes = {p.name: p.stat().st_ino for p in d.iterdir()}
    assert write(rendered) is False and {p.name: p.stat().st_ino for p in d.iterdir()} == inodes
    (d / "train_config.yaml").write_text("edited by hand\n")  # another content
    (d / "launch.sh").chmod(0o644)  # another mode
    os.link(d / "post.json", tmp_path / "elsewhere.json")  # another link: replacing it leaves that one alone
    (d / "dataset_info.json").unlink()
    (d / "dataset_info.json").symlink_to(tmp_path / "elsewhere.json")  # a link to another file
    write(rendered)
    for rel, text in rendered.files.items():
        assert (d / rel).read_text() == text and not (d / rel).is_symlink()
    assert os.access(d / "launch.sh", os.X_OK) and (d / "post.json").stat().st_nlink == 1
    assert (d / "cell.yaml").stat().st_ino == inodes["cell.yaml"]  # unchanged: left as it was
    assert {p.name for p in d.iterdir()} == set(inodes)  # no scratch file left


def test_dump_mapping_writes_what_yaml_dump_writes():
    """The fast path for plain strings must give yaml.dump's exact text, including for strings YAML reads as
    something else (booleans, nulls, numbers, dates), which it must quote."""
    import random

    from sft_grid.grid.render import dump_mapping, dump_yaml

    edge = [
        "yes",
        "No",
        "on",
        "OFF",
        "null",
        "~",
        "1e-5",
        "1.0e-5",
        "2e-5",
        "0x1F",
        "0o17",
        "017",
        "1_000",
        "2026-11-30",
        "12:30",
        ".inf",
        ".nan",
        "=",
        "a,b",
        "org/model-1.5B",
        "path/to/x.yaml",
        "_x",
        "1",
        "3.14",
        "+1",
        "-1",
        "a=b",
        "x@y",
        "Qwen/Qwen3-8B",
        "true",
        "False",
        "Y",
        "n",
        "a" * 300,
    ]
    rng = random.Random(7)
    alphabet = "abcXYZ019_./+=@,-eE:"
    generated = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(2000)]
    for value in edge + generated:
        data = {"key": value, "other_key": value}
        assert dump_mapping(data) == dump_yaml(data), value
        assert yaml.safe_load(dump_mapping(data)) == data, value


def test_a_gpu_site_names_bf16_and_sdpa_in_llamafactorys_config(make_cells, tmp_path):
    """What the GPU profiles set: LLaMA-Factory trains in bf16 with torch's sdpa kernels, said in its own config (not
    left to its `auto`); a CPU site trains in fp32 with eager attention (LLaMA-Factory's `disabled`), said too."""
    from sft_grid.grid.render import render

    gpu, cpu = make_cells(
        ["model=tiny_llama", "cluster.gpus_per_node=4", "cluster.precision=bf16", "global_batch_size=16"],
        ["model=tiny_llama"],
    )
    on_gpu = yaml.safe_load(render(gpu, tmp_path / "g", []).files["train_config.yaml"])
    on_cpu = yaml.safe_load(render(cpu, tmp_path / "c", []).files["train_config.yaml"])
    assert (on_gpu["bf16"], on_gpu["flash_attn"]) == (True, "sdpa")
    assert "bf16" not in on_cpu and on_cpu["flash_attn"] == "disabled"
