"""The functions a scheduler's job calls (core/submission.py ENTRIES names them), each with its target directory."""

from __future__ import annotations

from sft_grid.job.runner import run_cell
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import stage_job
from sft_grid.stages import tokenize as tokenize_stage
from sft_grid.stages.post import IN_JOB
from sft_grid.stages.post_run import run as run_post


def train(cell_dir: str) -> str:
    return run_cell(cell_dir)


def post(cell_dir: str) -> bool:
    return run_post(cell_dir, IN_JOB)


def prep(prep_dir: str) -> str:
    from pathlib import Path

    return prep_stage.run(Path(prep_dir))


def stage(stage_dir: str) -> str:
    from pathlib import Path

    return stage_job.run(Path(stage_dir))


def tokenize(tok_dir: str) -> str:
    from pathlib import Path

    return tokenize_stage.run(Path(tok_dir))
