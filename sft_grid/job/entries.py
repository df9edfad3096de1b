"""The functions a scheduler's job calls (core/submission.py ENTRIES names them), each with its target directory."""

from __future__ import annotations

from pathlib import Path

from sft_grid.job.runner import evaluate_here, run_cell
from sft_grid.stages import evaluate as evaluate_stage
from sft_grid.stages import prep as prep_stage
from sft_grid.stages import tokenize as tokenize_stage
from sft_grid.stages.post_training import IN_JOB
from sft_grid.stages.post_training import run as run_post
from sft_grid.stages.staging import in_job


def train(cell_dir: str) -> str:
    return run_cell(cell_dir)


def post(cell_dir: str) -> bool:
    """The post-training stages; then, where the cell evaluates in its own job (the local executor), the evaluation."""
    done = run_post(cell_dir, IN_JOB)
    evaluate_here(Path(cell_dir).resolve())
    return done


def evaluate(target_dir: str) -> bool:
    """A cell's evaluation after its post-training stages (Slurm), or a base model's."""
    return evaluate_stage.run(target_dir)


def prep(prep_dir: str) -> str:
    return prep_stage.run(Path(prep_dir))


def stage(stage_dir: str) -> str:
    from pathlib import Path

    return in_job.run(Path(stage_dir))


def tokenize(tok_dir: str) -> str:
    from pathlib import Path

    return tokenize_stage.run(Path(tok_dir))
