"""An evaluation's files: eval.json (what a target's evaluation computes) and eval/<score_id>.json (one score each).

A target is a cell (its trained output) or a base model (`<sweep dir>/_base/<model slug>-<key>/`, evaluated once per
grid and shared by the cells that train from it). The grid renders eval.json; the evaluation stage reads it back,
never conf/, and writes one score file per task it computed. A score file is the unit of "computed once":

    <target>/eval/<score_id>.json   {"score_id", "task", "suite", "settings", "harness", "model", "model_path",
                                     "template_digest", "metrics": {"<metric>": v, "<metric>_stderr": v, ...},
                                     "time", "seconds"}  (+ "base": true in a base model's)

`score_id` is a short hash of (the target's identity key, the task's settings, the harness and its version), so a
score that exists is never computed again, a changed setting is a new score, and a score file says exactly what it
is. A metric is named as the harness names it, with its filter after a slash where the task has one
(`exact_match/strict-match`); its standard error is `<metric>_stderr` (null where the harness has none). Files are
written to a temporary name and renamed: a reader (sft-grid results, status) sees a whole file or none.

Scores along training: a suite with `along` also scores the cell's saved checkpoints (`checkpoint-N`),
each under its own id, `along_id(<the final score's id>, N)`, with `"step": N` in its settings. Which checkpoints:
`along: checkpoint` every one saved, `along: <N>` those at multiples of N steps. A checkpoint counts once it is
whole (its trainer_state.json, which the trainer writes after the weights). Since the id names the step, a score of
a checkpoint is computed once whichever job finds it, and a resumed or requeued cell finds its earlier ones.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sft_grid.core.cellfiles import dump_json, read_json
from sft_grid.core.layout import TRAINER_STATE, checkpoints

EVAL_FILE = "eval.json"
SCORES_DIR = "eval"
BASE_DIR = "_base"
SCORE_ID_LEN = 12


def score_id(key: str, settings: Mapping[str, Any], harness: str) -> str:
    """The identity of a score: (the target's identity key, the task's settings, the harness==version)."""
    blob = json.dumps([key, settings, harness], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:SCORE_ID_LEN]


def along_id(final_id: str, step: int) -> str:
    """The identity of a checkpoint's score: the final score's identity (target, settings, harness) and the step."""
    return hashlib.sha256(f"{final_id}@{step}".encode()).hexdigest()[:SCORE_ID_LEN]


ALONG_EVERY = "checkpoint"  # `along: checkpoint`: every saved checkpoint


def along_steps(along: Any, steps: Sequence[int]) -> list[int]:
    """The steps of these checkpoints that `along` scores (none when it is null)."""
    if along is None:
        return []
    if along == ALONG_EVERY:
        return sorted(steps)
    return sorted(s for s in steps if isinstance(along, int) and along >= 1 and s % along == 0)


def along(scores: Sequence[ScoreSpec], steps: Sequence[int]) -> list[ScoreSpec]:
    """The scores of the checkpoints at these steps that these final scores' `along` asks for, oldest first."""
    wanted = [(step, s) for s in scores for step in along_steps(s.along, steps)]
    return [s.at(step) for step, s in sorted(wanted, key=lambda w: w[0])]


def checkpoint_steps(output_dir: Path) -> tuple[int, ...]:
    """The steps of the whole checkpoints in a cell's output (a checkpoint being written has no trainer state yet)."""
    return tuple(int(p.name.rsplit("-", 1)[1]) for p in checkpoints(output_dir) if (p / TRAINER_STATE).is_file())


def score_path(target_dir: Path, sid: str) -> Path:
    return target_dir / SCORES_DIR / f"{sid}.json"


def has_score(target_dir: Path, sid: str) -> bool:
    return score_path(target_dir, sid).is_file()


def write_score(target_dir: Path, record: Mapping[str, Any]) -> Path:
    """Write one score file atomically (a temporary name in the same directory, then a rename)."""
    path = score_path(target_dir, str(record["score_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def read_scores(target_dir: Path) -> dict[str, dict[str, Any]]:
    """score_id -> the score file's content, for every whole score file of a target."""
    out = {}
    for path in sorted((target_dir / SCORES_DIR).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("score_id") == path.stem:
            out[path.stem] = data
    return out


@dataclass(frozen=True, kw_only=True)
class ScoreSpec:
    """One score a target should have: its id, the suite that asks for it, the task's settings (its identity) and
    how it is computed (not its identity: the engine, the batch size, the device)."""

    score_id: str
    suite: str
    task: str  # the harness's task name
    settings: Mapping[str, Any]
    engine: str = "hf"
    batch_size: Any = 1
    device: str = "cpu"
    # the final model's score: which checkpoints its suite also scores (null, "checkpoint" or every N steps)
    along: Any = None
    # a checkpoint's score: its step (None: the final model's)
    step: int | None = None

    def at(self, step: int) -> ScoreSpec:
        """This score of the checkpoint at `step`."""
        return replace(
            self,
            score_id=along_id(self.score_id, step),
            settings={**self.settings, "step": step},
            along=None,
            step=step,
        )

    def to_json(self) -> dict[str, Any]:
        data = {
            "score_id": self.score_id,
            "suite": self.suite,
            "task": self.task,
            "settings": dict(self.settings),
            "engine": self.engine,
            "batch_size": self.batch_size,
            "device": self.device,
        }
        # only where set: the eval.json of a suite without `along` stays as it was
        return {**data, "along": self.along} if self.along is not None else data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScoreSpec:
        return cls(
            score_id=str(data["score_id"]),
            suite=str(data["suite"]),
            task=str(data["task"]),
            settings=dict(data["settings"]),
            engine=str(data.get("engine") or "hf"),
            batch_size=data.get("batch_size", 1),
            device=str(data.get("device") or "cpu"),
            along=data.get("along"),
        )


@dataclass(frozen=True, kw_only=True)
class EvalFile:
    """eval.json: what a target's evaluation computes and how, without conf/."""

    target: str  # the cell's name, or the base model's
    base: bool  # a base model (nothing trained: no train == serve check)
    model_path: str  # the saved model (a cell's output/), a local directory or a hub id
    harness: str  # "lm-eval==0.4.13": part of every score's identity
    python: str  # the harness environment's python
    include_paths: tuple[str, ...] = ()
    variables: Mapping[str, str] = field(default_factory=dict)
    # local cells evaluate in their training job (after the post stages); Slurm ones in their own job
    in_train_job: bool = False
    scores: tuple[ScoreSpec, ...] = ()
    # hub dataset id -> its staged snapshot folder: the tasks read it there, offline (in_venv/lm_eval_run.py)
    datasets: Mapping[str, str] = field(default_factory=dict)

    def dumps(self) -> str:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        data.update(
            include_paths=list(self.include_paths),
            variables=dict(self.variables),
            scores=[s.to_json() for s in self.scores],
            datasets=dict(self.datasets),
        )
        if not self.datasets:  # only where set: an eval.json that reads no staged dataset stays as it was
            del data["datasets"]
        return dump_json(data)

    @classmethod
    def load(cls, target_dir: Path) -> EvalFile | None:
        data = read_json(target_dir, EVAL_FILE)
        return None if data is None else cls.from_json(data, target_dir.name)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], name: str) -> EvalFile:
        return cls(
            target=str(data.get("target") or name),
            base=bool(data.get("base")),
            model_path=str(data["model_path"]),
            harness=str(data["harness"]),
            python=str(data["python"]),
            include_paths=tuple(data.get("include_paths") or ()),
            variables=dict(data.get("variables") or {}),
            in_train_job=bool(data.get("in_train_job")),
            scores=tuple(ScoreSpec.from_json(s) for s in data.get("scores") or ()),
            datasets=dict(data.get("datasets") or {}),
        )

    def wanted(self, target_dir: Path) -> list[ScoreSpec]:
        """Every score this file asks for now: the final model's, and those of the checkpoints saved so far."""
        if self.base or not any(s.along is not None for s in self.scores):
            return list(self.scores)
        return [*self.scores, *along(self.scores, checkpoint_steps(Path(self.model_path)))]

    def missing(self, target_dir: Path) -> list[ScoreSpec]:
        """The scores this file asks for that the target does not have yet."""
        return [s for s in self.wanted(target_dir) if not has_score(target_dir, s.score_id)]

    def todo(self, target_dir: Path) -> list[ScoreSpec]:
        """What an evaluation computes now: the missing scores, but while the cell trains (or after it failed) only
        its checkpoints' (its final model's come with the evaluation after its post-training stages)."""
        missing = self.missing(target_dir)
        if self.base or (Path(self.model_path) / "config.json").is_file() or not any(s.step for s in missing):
            return missing
        return [s for s in missing if s.step is not None]
