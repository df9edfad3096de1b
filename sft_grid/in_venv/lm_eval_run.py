"""Evaluate one saved model on a list of lm-evaluation-harness tasks, offline; one JSON result file per task.

Runs with the python of the harness environment (conf/harness/lm_eval.yaml), never the orchestrator's (the
evaluation stage, sft_grid/stages/evaluate.py, writes the spec and turns each result into a score file):

    python lm_eval_run.py <spec.json>

The spec (JSON object):

    model         local HF model directory (config.json, weights, tokenizer), or a hub id in the local cache
    tasks         [{name, id, num_fewshot, limit, gen_kwargs, apply_chat_template, fewshot_as_multiturn, ...}];
                  `id` names the task's result file (default: its name); other keys (a content version, say)
                  are kept: the whole dict is written back as `settings`
    include_path  a directory of extra task YAMLs (the tiny local tasks), a list of them, or null
    engine        "hf", or "vllm" where the environment has vllm (passed through to lm-eval as is)
    batch_size    int or "auto";  device: "cpu", "cuda", ...;  dtype: "float32", "bfloat16", "auto", ...
    output_dir    where <task>.json files go;  seed: int (python, numpy, torch and few-shot sampling)
    model_args    optional {key: value} added to the engine's arguments (e.g. tensor_parallel_size for vllm)
    datasets      optional {hub dataset id: local snapshot folder}: a task that loads that id loads the folder
                  (the grid staged it; offline, `datasets` finds no Hub repository by its id in the Hub cache)

Each result, <id>.json, written to a temp name and renamed (a reader sees a whole file or none):

    {"task", "metrics": {"<metric>[/<filter>]": value, "<metric>[/<filter>]_stderr": value or null}, "n_samples",
     "harness_version", "seconds"}

A task that fails writes <id>.error.json ({"task", "error"}) instead, and the others still run.

lm-eval's Python API (``simple_evaluate``), not its CLI: the CLI applies one few-shot count, chat template and
generation setting to a whole run; here the model and the task index load once and each task has its own.

Invariants: stdlib at import time (lm_eval is imported only after the offline switches are set, since the Hugging
Face libraries read them once at import); never imports sft_grid; exit status 0 only when every task's result
file is written; on failure the last line on stderr is one sentence starting "lm_eval_run.py: error:", exit status 1
(2 for a usage error).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = ("hf", "vllm")
# Compute nodes have no network, and a hub lookup that cannot fail fast hangs until the job's time limit.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

log = logging.getLogger("evaluate")


class EvalError(Exception):
    """A failure the user can act on, said in one line (no traceback)."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    id: str  # the name of its result file
    num_fewshot: int
    limit: int | float | None
    gen_kwargs: dict[str, Any]
    apply_chat_template: bool
    fewshot_as_multiturn: bool

    @classmethod
    def parse(cls, raw: Any) -> TaskSpec:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise EvalError(f"each task needs a `name`, got {raw!r}")
        name = raw["name"]
        num_fewshot = raw.get("num_fewshot", 0)
        limit = raw.get("limit")
        gen_kwargs = raw.get("gen_kwargs") or {}
        if not isinstance(num_fewshot, int) or isinstance(num_fewshot, bool) or num_fewshot < 0:
            raise EvalError(f"task {name}: num_fewshot must be an integer >= 0, got {num_fewshot!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
            raise EvalError(f"task {name}: limit must be null, a count, or a fraction in (0, 1), got {limit!r}")
        if not isinstance(gen_kwargs, dict):
            raise EvalError(f"task {name}: gen_kwargs must be an object, got {gen_kwargs!r}")
        chat, multiturn = bool(raw.get("apply_chat_template", False)), bool(raw.get("fewshot_as_multiturn", False))
        if multiturn and not chat:
            raise EvalError(f"task {name}: fewshot_as_multiturn needs apply_chat_template")
        task_id = str(raw.get("id") or name)
        if "/" in task_id or task_id.startswith("."):
            raise EvalError(f"task {name}: id must be a plain file name, got {task_id!r}")
        return cls(name, task_id, num_fewshot, limit, dict(gen_kwargs), chat, multiturn)


@dataclass(frozen=True)
class EvalSpec:
    model: Path
    tasks: tuple[TaskSpec, ...]
    include_paths: tuple[Path, ...]
    engine: str
    batch_size: int | str
    device: str
    dtype: str
    output_dir: Path
    seed: int
    model_args: dict[str, Any]
    datasets: dict[str, Path]

    @classmethod
    def parse(cls, raw: Any) -> EvalSpec:
        if not isinstance(raw, dict):
            raise EvalError("the spec must be a JSON object")
        missing = [k for k in ("model", "tasks", "output_dir") if not raw.get(k)]
        if missing:
            raise EvalError(f"the spec lacks {', '.join(missing)}")
        if not isinstance(raw["tasks"], list):
            raise EvalError("`tasks` must be a list")
        tasks = tuple(TaskSpec.parse(t) for t in raw["tasks"])
        ids = [t.id for t in tasks]
        if len(set(ids)) != len(ids):
            raise EvalError(f"a task id is listed twice in {ids}: each writes <id>.json")
        engine = raw.get("engine", "hf")
        if engine not in ENGINES:
            raise EvalError(f"unknown engine {engine!r}: expected one of {list(ENGINES)}")
        batch_size = raw.get("batch_size", 1)
        if batch_size != "auto" and (not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1):
            raise EvalError(f'batch_size must be a positive integer or "auto", got {batch_size!r}')
        seed = raw.get("seed", 1234)
        if type(seed) is not int:
            raise EvalError(f"seed must be an integer, got {seed!r}")
        staged = raw.get("datasets") or {}
        if not isinstance(staged, dict) or not all(isinstance(v, str) and v for v in staged.values()):
            raise EvalError(f"`datasets` must map each hub dataset id to its snapshot folder, got {staged!r}")
        include = raw.get("include_path") or []
        include = [include] if isinstance(include, str) else include
        return cls(
            model=Path(raw["model"]),
            tasks=tasks,
            include_paths=tuple(Path(p) for p in include),
            engine=engine,
            batch_size=batch_size,
            device=str(raw.get("device", "cpu")),
            dtype=str(raw.get("dtype", "auto")),
            output_dir=Path(raw["output_dir"]),
            seed=seed,
            model_args=dict(raw.get("model_args") or {}),
            datasets={str(k): Path(v) for k, v in staged.items()},
        )


def load_spec(path: Path) -> EvalSpec:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise EvalError(f"spec file {path} is not readable JSON: {err}") from None
    return EvalSpec.parse(raw)


def has_chat_template(model: Path) -> bool:
    """Whether transformers would find a chat template in this saved tokenizer (the .jinja file or the config key)."""
    jinja, config = model / "chat_template.jinja", model / "tokenizer_config.json"
    if jinja.is_file() and jinja.read_text(encoding="utf-8").strip():
        return True
    return config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


def check_inputs(spec: EvalSpec) -> None:
    """Fail before the slow imports on what the spec alone shows to be wrong (a hub id, a base model in the local
    Hugging Face cache, is left to lm-eval, which loads it offline or says it is not there)."""
    hub_id = not spec.model.is_absolute() and not str(spec.model).startswith(".") and len(spec.model.parts) == 2
    if not hub_id and not spec.model.is_dir():
        raise EvalError(f"model directory {spec.model} does not exist")
    if not hub_id and not (spec.model / "config.json").is_file():
        raise EvalError(f"{spec.model} is not a saved model: it has no config.json")
    chat = [t.name for t in spec.tasks if t.apply_chat_template]
    if chat and not hub_id and not has_chat_template(spec.model):
        raise EvalError(
            f"apply_chat_template is set for {', '.join(chat)}, but {spec.model} has no chat template"
            " (no chat_template.jinja, no `chat_template` in tokenizer_config.json): evaluate a base"
            " model without it, or save the template it was trained with into its tokenizer"
        )
    for path in spec.include_paths:
        if not path.is_dir():
            raise EvalError(f"include_path {path} is not a directory")
    for repo_id, path in spec.datasets.items():
        if not path.is_dir():
            raise EvalError(
                f"dataset {repo_id} is not staged where the grid pinned it ({path} is not a directory): stage it"
                " with `sft-grid stage` and the grid's overrides, then run the grid again"
            )
    if spec.engine == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise EvalError(f"engine vllm is not installed in {sys.prefix}: use engine hf, or an environment with vllm")


def _number(value: Any) -> float | None:
    """A metric value as JSON can hold it: lm-eval writes "N/A" (and NaN) where it has no stderr."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def task_metrics(results: dict[str, Any]) -> dict[str, float | None]:
    """{"<metric>": value, "<metric>_stderr": value} from lm-eval's per-task dict ("acc,none", "acc_stderr,none",
    ...): a metric keeps lm-eval's name, with its filter after a slash unless the filter is "none"."""
    metrics: dict[str, float | None] = {}
    for key, value in results.items():
        metric, sep, filt = key.partition(",")
        if not sep or metric.endswith("_stderr"):
            continue  # "alias", "name", and the stderr entries read below
        name = metric if filt == "none" else f"{metric}/{filt}"
        metrics[name] = _number(value)
        metrics[f"{name}_stderr"] = _number(results.get(f"{metric}_stderr,{filt}"))
    return metrics


def task_record(
    task: TaskSpec, results: dict[str, Any], spec: EvalSpec, version: str, seconds: float
) -> dict[str, Any]:
    """The result file of one task from simple_evaluate's output (a group's metrics are its aggregate)."""
    own = results.get("results", {}).get(task.name)
    metrics = task_metrics(own or {})
    if not metrics:
        raise EvalError(f"lm-eval returned no metrics for {task.name} (a tag or a group without aggregation?)")
    shots = results.get("n-shot", {}).get(task.name)
    if isinstance(shots, int) and shots != task.num_fewshot:
        # lm-eval keeps a YAML's `num_fewshot: 0` over the one asked for: such a score would carry false settings.
        raise EvalError(
            f"lm-eval ran {task.name} {shots}-shot, not the {task.num_fewshot}-shot asked for (its task"
            " YAML fixes num_fewshot): ask for what the task allows"
        )
    # One requested name per run, so every counted sample belongs to it (a group's subtasks included).
    n_samples = sum(int(c.get("effective", 0)) for c in results.get("n-samples", {}).values())
    return {
        "task": task.name,
        "metrics": metrics,
        "n_samples": n_samples,
        "harness_version": version,
        "seconds": round(seconds, 3),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def task_manager(manager_class: Any, spec: EvalSpec) -> Any:
    """lm-eval's task index: the include paths alone when every name asked for is a plain task there, else all
    (indexing lm-eval's own ~15k YAMLs takes ~25 s on a busy 2-core machine; local groups may name them)."""
    names = {t.name for t in spec.tasks}
    paths = [str(p) for p in spec.include_paths] or None
    if paths:
        local = manager_class(include_path=paths, include_defaults=False)
        if names <= set(local.all_subtasks):
            return local
    return manager_class(include_path=paths)


def load_staged(datasets: Any, staged: dict[str, Path]) -> None:
    """Make `datasets.load_dataset(path=<hub id>, name=<config>, ...)` load the staged snapshot folder of that id.

    lm-eval's tasks call it through the module (`datasets.load_dataset(path=self.DATASET_PATH, name=...)`, at call
    time), so replacing the module's attribute reaches every task, group member and task-file helper, and leaves
    the task configs (lm-eval's record of what it ran) as written. A folder of a parquet/json repository loads with
    the config name its README's `configs:` header gives; any other id loads as before."""
    if not staged:
        return
    load = datasets.load_dataset

    def load_dataset(path: Any, *args: Any, **kwargs: Any) -> Any:
        folder = staged.get(path) if isinstance(path, str) else None
        if folder is not None:
            kwargs.pop("revision", None)  # a revision names a commit on the Hub: the snapshot is the staged one
            log.info("dataset %s: loaded from its staged snapshot %s", path, folder)
        return load(str(folder) if folder is not None else path, *args, **kwargs)

    datasets.load_dataset = load_dataset


def evaluate(spec: EvalSpec) -> list[Path]:
    """Run every task of the spec; return the result files written (none on ranks other than 0). A task that fails
    writes its error file and the others run; EvalError names the failed ones at the end."""
    os.environ.update(OFFLINE_ENV)
    import datasets
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    started = time.monotonic()
    load_staged(datasets, spec.datasets)  # before the task index: a task file's helper may import load_dataset
    manager = task_manager(TaskManager, spec)
    unknown = [t.name for t in spec.tasks if t.name not in manager.all_tasks]
    if unknown:
        where = f" nor under include_path {', '.join(map(str, spec.include_paths))}" if spec.include_paths else ""
        raise EvalError(f"unknown task {', '.join(unknown)}: not in lm-eval {lm_eval.__version__}'s tasks{where}")
    model_args = {"pretrained": str(spec.model), "dtype": spec.dtype, **spec.model_args}
    # vLLM places the model itself and warns about a device argument; None is dropped by lm-eval.
    device = spec.device if spec.engine == "hf" else None
    lm = get_model(spec.engine).create_from_arg_obj(model_args, {"batch_size": spec.batch_size, "device": device})
    log.info("loaded %s (%s) and the task index in %.1f s", spec.model, spec.engine, time.monotonic() - started)
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    written, failed = [], []
    for task in spec.tasks:
        started = time.monotonic()
        try:
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=[task.name],
                num_fewshot=task.num_fewshot,
                limit=task.limit,
                gen_kwargs=task.gen_kwargs or None,
                apply_chat_template=task.apply_chat_template,
                fewshot_as_multiturn=task.fewshot_as_multiturn,
                task_manager=manager,
                log_samples=False,
                random_seed=spec.seed,
                numpy_random_seed=spec.seed,
                torch_random_seed=spec.seed,
                fewshot_random_seed=spec.seed,
            )
            if results is None:  # not rank 0: the rank that aggregates writes the files
                continue
            record = task_record(task, results, spec, lm_eval.__version__, time.monotonic() - started)
        except Exception as err:  # this task's failure is its own; the others still run
            traceback.print_exc()
            reason = str(err) if isinstance(err, EvalError) else " ".join(f"{type(err).__name__}: {err}".split())
            write_json(spec.output_dir / f"{task.id}.error.json", {"task": task.name, "error": reason})
            failed.append(f"{task.name}: {reason}")
            continue
        path = spec.output_dir / f"{task.id}.json"
        write_json(path, record)
        log.info("%s: %s -> %s", task.name, record["metrics"], path)
        written.append(path)
    if failed:
        raise EvalError(f"{len(failed)} of {len(spec.tasks)} task(s) failed: " + "; ".join(failed))
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python lm_eval_run.py <spec.json>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        spec = load_spec(Path(args[0]))
        check_inputs(spec)
        evaluate(spec)
    except Exception as err:  # anything lm-eval raises: keep its trace, end on one line
        if not isinstance(err, EvalError):
            traceback.print_exc()
        message = str(err) if isinstance(err, EvalError) else f"{type(err).__name__}: {err}"
        print(f"lm_eval_run.py: error: {' '.join(message.split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
