"""The cleanup post stage (intermediate checkpoints removed once the final model is uploaded and verified; on by
default where the cell uploads) and W&B grouping (runs grouped by grid, named by cell, swept values as config and
tags, as the report names them)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from sft_grid.backends import wandb
from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile
from sft_grid.core.layout import POST_FILE
from sft_grid.grid.render import render
from sft_grid.stages import post_training
from sft_grid.stages.post_training import StageFailed

HUB = ["push_to_hub=true", "hub_model_id=org/x"]


def test_cleanup_follows_the_upload_unless_the_grid_says_otherwise(make_cells) -> None:
    up, kept, plain, forced = make_cells(
        ["model=tiny_llama", *HUB],
        ["model=tiny_llama", *HUB, "cleanup_checkpoints=false"],
        ["model=tiny_llama"],
        ["model=tiny_llama", "cleanup_checkpoints=true"],
    )
    assert post_training.stages_for(up.spec) == ["tokenizer", "upload", "cleanup"]
    assert post_training.stages_for(kept.spec) == ["tokenizer", "upload"]
    assert post_training.stages_for(plain.spec) == ["tokenizer"]
    assert post_training.stages_for(forced.spec) == ["tokenizer", "cleanup"]
    assert up.key == kept.key  # where checkpoints go is not what the cell trains


def completed_cell(tmp_path: Path, stages: tuple[str, ...]) -> Path:
    cell = tmp_path / "cell"
    out = cell / "output"
    for ckpt in ("checkpoint-2", "checkpoint-4"):
        (out / ckpt).mkdir(parents=True)
        (out / ckpt / "optimizer.pt").write_bytes(b"\0" * 1000)
    (out / "model.safetensors").write_bytes(b"\0" * 10)
    (out / "trainer_state.json").write_text("{}")
    (cell / POST_FILE).write_text(
        PostFile(cell="cell", stages=stages, python="/nonexistent/python", hub_model_id="org/x").dumps()
    )
    return cell


def test_checkpoints_go_only_after_a_verified_upload(tmp_path: Path, monkeypatch) -> None:
    cell = completed_cell(tmp_path, ("upload", "cleanup"))
    outcome = {"fail": True}

    def upload(cell_dir: Path, p: PostFile, where: str) -> dict[str, object]:
        if outcome["fail"]:
            raise StageFailed("uploaded, but 1 file(s) are missing there or differ in size: model.safetensors")
        return {"url": "https://huggingface.co/org/x", "commit": "abc", "verified": 3}

    monkeypatch.setitem(post_training.STAGE_RUNNERS, "upload", upload)
    assert post_training.run(cell, post_training.LOGIN) is False
    st = post_training.states(cell)
    assert st["upload"].state == "failed" and st["cleanup"].state == "pending"
    assert (cell / "output" / "checkpoint-2").is_dir() and (cell / "output" / "checkpoint-4").is_dir()
    outcome["fail"] = False
    assert post_training.run(cell, post_training.LOGIN) is True
    assert post_training.states(cell)["cleanup"].state == "completed"
    assert sorted(p.name for p in (cell / "output").iterdir()) == ["model.safetensors", "trainer_state.json"]
    done = [e for e in events.read(cell) if e.stage == "cleanup" and e.state == "completed"][-1]
    assert done.details["removed"] == ["checkpoint-2", "checkpoint-4"] and done.details["freed_bytes"] == 2000


def test_cleanup_never_removes_the_only_copy(tmp_path: Path) -> None:
    cell = completed_cell(tmp_path, ("cleanup",))
    (cell / "output" / "model.safetensors").unlink()  # no final model: the checkpoints are all there is
    assert post_training.run(cell, post_training.LOGIN) is False
    st = post_training.states(cell)["cleanup"]
    assert st.state == "failed" and "holds no final model" in st.reason
    assert (cell / "output" / "checkpoint-2").is_dir()


def test_wandb_runs_are_grouped_by_grid_and_named_by_cell(make_cells, tmp_path: Path) -> None:
    on, off = make_cells(
        [
            "model=tiny_llama",
            "report_to=wandb",
            "sweep_name=grid1",
            "lr=2e-5",
            "dataset=[tiny_messages,tiny_sharegpt]",
            "runs_root=/srv/runs",
        ],
        ["model=tiny_llama", "sweep_name=grid1"],
    )
    files = render(on, tmp_path / on.name, []).files
    config = yaml.safe_load(files[wandb.CONFIG_FILE])
    assert config == {
        "grid": "grid1",
        "grid/cell": on.name,
        "grid/key": on.key,
        "grid/model": "tiny_llama",
        "grid/lr": "2e-5",
        "grid/dataset": "[tiny_messages,tiny_sharegpt]",
    }
    launch = files["launch.sh"]
    assert isinstance(launch, str)
    exports = "\n".join(line for line in launch.splitlines() if line.startswith("export WANDB"))
    seen = {}
    for project in ("", "team-project"):
        env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
        env.update({"WANDB_PROJECT": project} if project else {})
        out = subprocess.run(
            ["bash", "-c", f"set -eu\n{exports}\nenv"], capture_output=True, text=True, env=env, check=True
        ).stdout
        seen[project] = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("WANDB_"))
    mine = seen[""]
    assert mine["WANDB_RUN_GROUP"] == "grid1" and mine["WANDB_NAME"] == on.name and mine["WANDB_PROJECT"] == "grid1"
    assert mine["WANDB_TAGS"].split(",") == ["model=tiny_llama", "lr=2e-5", "dataset=tiny_messages+tiny_sharegpt"]
    assert mine["WANDB_CONFIG_PATHS"] == str(tmp_path / on.name / wandb.CONFIG_FILE)
    assert mine["WANDB_RUN_ID"] == f"grid1-{on.key}"
    assert seen["team-project"]["WANDB_PROJECT"] == "team-project"  # the user's own project wins
    plain = render(off, tmp_path / off.name, []).files
    assert wandb.CONFIG_FILE not in plain and "WANDB_RUN_GROUP" not in plain["launch.sh"]
