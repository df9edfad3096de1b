"""A grid's cells x values table: what `sft-grid results` prints and the report shows, one module for both.

Read from each cell's own files only (no harness, no backend, no numpy): cell.yaml (read with PyYAML's C loader: its
rerun command names the swept values; the config gives model, size, GPUs), the ledger and the trainer's output
(state, steps, final loss: the shared rules of core/state.py and analysis/view.py, one sacct for a Slurm grid), the
score files, estimate.json (what the grid estimated when it queued the cell) and the ledger's run times (GPU-hours
used: every run's wall time x the cell's GPUs; on a CPU-only node the runs' CPU time, one device).

Columns: the swept values (the keys whose values differ between the grid's cells), state, steps, final loss
(the mean training loss logged over the last 10% of the steps, at least the last logged one: a single step's
loss is noisy), each score, GPU-hours used and estimated. Base models (the evaluation's `_base/`) are rows too,
marked `base`.

Scores: the evaluation stage writes one file a score, `<cell>/eval/<score_id>.json` (base models: `<sweep>/_base/
<model slug>-<key>/eval/<score_id>.json`, with "base": true; the format is core/scores.py's). Metrics are read in
that flat form, and in lm-eval's (`acc,none` / `acc_stderr,none`) and the nested one (`{"acc": {"value",
"stderr"}}`); a `,none` filter suffix is dropped. A column is `<task>/<metric>`; when one task has several score
files (its settings changed, so a new score id), the latest (`time`) is shown. A failed evaluation is in the
ledger: a `stage` event whose stage starts with `eval`, state `failed`, naming its task (`task` or `tasks`; none
named: every task of the cell without a score). A score the grid's other cells have and this completed cell has
not is `missing`; one that may still come is `pending`.

Damaged files (core/cellfiles.py `Damage`) are read around, never raised: a cell whose cell.yaml, ledger or trainer
state cannot be read is a row in state `damaged` (its swept values from its cell.yaml's header where that is
whole), a completed cell whose per-step log ends before its last step keeps its state with the damage beside it
(`Row.damaged`) and its final loss from trainer_state.json (none where that cannot say it either), a score file or an
estimate that cannot be read is `damaged` in its column; the grid's own damaged records are the table's `damaged`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sft_grid.analysis.view import cell_dirs, grid_damage, read_view
from sft_grid.backends import replay
from sft_grid.core.cellfiles import CellYaml, Damage, DamagedFile, load_json
from sft_grid.core.events import Event, Kind, submitted_site
from sft_grid.core.layout import BASE_DIR, CELL_FILE, ESTIMATE_FILE, EVAL_DIR, OUTPUT_DIR, TRAINER_LOG, TRAINER_STATE
from sft_grid.core.overrides import overrides_of, swept_values
from sft_grid.planning.costs import used_seconds

# a pretraining compute budget in a model's name: delphi-3e18-base -> 3e18 FLOPs
_BUDGET = re.compile(r"(?<![\w.])(\d(?:\.\d+)?e\+?(1[5-9]|2\d))(?![\w.])")
# the (step, loss) and total steps of LLaMA-Factory's trainer_log.jsonl lines (the axolotl plugin writes the same)
LOG_LOSS = re.compile(r'"current_steps": (\d+)[^\n]*?"loss": ([-0-9.eE+]+)')
_LOG_TOTAL = re.compile(r'"total_steps": (\d+)')
FINAL_SHARE = 0.1
OK, MISSING, FAILED, PENDING, DAMAGED = "ok", "missing", "failed", "pending", "damaged"
_UNDONE = ("planned", "submitted", "running")  # states whose missing scores may still come: pending


# -- scores ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    value: float | None = None
    stderr: float | None = None
    # ok, missing (the cell is done, the score is not there), failed, pending (cell not done), damaged (its file)
    status: str = OK
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "stderr": self.stderr,
            "status": self.status,
            **({"reason": self.reason} if self.reason else {}),
        }


@dataclass(frozen=True)
class ScoreFile:
    task: str
    metrics: dict[str, Score]
    time: str
    model: str
    model_path: str
    base: bool


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _metric_name(key: str) -> str:
    return key[: -len(",none")] if key.endswith(",none") else key


def parse_metrics(metrics: Mapping[str, Any]) -> dict[str, Score]:
    out = {}
    for key, v in metrics.items():
        if isinstance(v, Mapping):
            out[_metric_name(key)] = Score(_number(v.get("value")), _number(v.get("stderr")))
            continue
        metric, _, filt = key.partition(",")
        if metric.endswith("_stderr") or (isinstance(v, str) and v != "N/A"):  # an alias, a name: not a metric
            continue
        err = metrics.get(f"{metric}_stderr,{filt}" if filt else f"{metric}_stderr")
        out[_metric_name(key)] = Score(_number(v), _number(err))
    return out


def read_files(eval_dir: Path) -> list[ScoreFile]:
    """The final model's score files of a cell (or a base model), the latest per task; unreadable ones are skipped,
    and so are the scores of its checkpoints."""
    return score_files(eval_dir)[0]


def score_files(eval_dir: Path) -> tuple[list[ScoreFile], list[Damage]]:
    """read_files, and the damaged score files (a checkpoint's too): each one not JSON, no object, or without
    metrics."""
    latest: dict[str, ScoreFile] = {}
    damaged: list[Damage] = []
    for path in sorted(eval_dir.glob("*.json")) if eval_dir.is_dir() else ():
        name = f"{EVAL_DIR}/{path.name}"
        try:
            data = load_json(path, name, whole=False)
        except DamagedFile as exc:
            damaged.append(exc.damage)
            continue
        except OSError:
            continue
        if not isinstance(data.get("metrics"), Mapping):
            damaged.append(Damage(name, "holds no metrics (an object)", False))
            continue
        settings = data.get("settings")
        if isinstance(settings, Mapping) and settings.get("step") is not None:  # a checkpoint's (analysis/along.py)
            continue
        f = ScoreFile(
            str(data.get("task") or path.stem),
            parse_metrics(data["metrics"]),
            str(data.get("time") or ""),
            str(data.get("model") or ""),
            str(data.get("model_path") or ""),
            bool(data.get("base")),
        )
        if f.task not in latest or f.time >= latest[f.task].time:
            latest[f.task] = f
    return list(latest.values()), damaged


def failed_tasks(history: Sequence[Event]) -> dict[str, str]:
    """task -> reason of the evaluations the ledger says failed ("" names every task), the latest state winning."""
    state: dict[str, tuple[str, str]] = {}
    for e in history:
        if e.kind is not Kind.STAGE or not e.stage.startswith("eval"):
            continue
        tasks = e.details.get("tasks") or [e.details.get("task") or ""]
        for task in tasks if isinstance(tasks, list) else [tasks]:
            state[str(task)] = (e.state, e.reason)
    return {t: why for t, (s, why) in state.items() if s == "failed"}


def _score_table(files: Iterable[ScoreFile]) -> dict[str, Score]:
    return {f"{f.task}/{m}": s for f in files for m, s in f.metrics.items()}


def mark(
    scores: Mapping[str, Score],
    failed: Mapping[str, str],
    all_columns: Sequence[str],
    done: bool,
    damaged: Sequence[Damage] = (),
) -> dict[str, Score]:
    """A cell's scores with every column of the grid: what is there, else damaged (a score file of its task cannot be
    read: `damaged`, named `eval/<task>-<hash>.json`), failed (its task's evaluation failed), missing (the cell is
    done: completed, or failed and never evaluated), pending (it may still come)."""
    unread: dict[str, Damage] = {}
    for d in damaged:
        unread.setdefault(Path(d.file).stem.rsplit("-", 1)[0], d)
    out = {}
    for col in all_columns:
        if col in scores:
            out[col] = scores[col]
            continue
        task = col.split("/", 1)[0]
        if task in unread:
            out[col] = Score(status=DAMAGED, reason=unread[task].text())
            continue
        why = failed.get(task, failed.get("")) if failed else None
        if why is not None:
            out[col] = Score(status=FAILED, reason=why or "the evaluation failed")
        else:
            out[col] = Score(status=MISSING if done else PENDING)
    return out


# -- rows -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    name: str
    dir: Path
    key: str = ""
    values: dict[str, str] = field(default_factory=dict)
    state: str = ""
    reason: str = ""
    step: int | None = None
    total: int | None = None
    final_loss: float | None = None
    latest_loss: float | None = None
    scores: dict[str, Score] = field(default_factory=dict)
    wall_seconds: float | None = None
    gpus: int = 1
    cpu: bool = False  # a CPU-only node: its runs are counted in CPU time (CPU-hours stand in for GPU-hours)
    gpu_hours: float | None = None
    model: str = ""
    model_source: str = ""
    params: float | None = None
    compute_budget: float | None = None
    cluster: str = ""
    # the site its latest submission went to, in a grid across sites; "" otherwise
    site: str = ""
    recipe: str = ""
    estimate: dict[str, Any] | None = None
    overrides: list[str] = field(default_factory=list)  # its rerun command's
    base: bool = False
    damaged: tuple[Damage, ...] = ()  # its damaged files (any `whole`: its state is `damaged`)

    @property
    def estimate_gpu_hours(self) -> float | None:
        v = (self.estimate or {}).get("gpu_hours")
        return float(v) if isinstance(v, (int, float)) else None

    def to_json(self) -> dict[str, Any]:
        """What `results --format json` and the report's data both say of a row; each adds its own keys."""
        return {
            "name": self.name,
            "dir": str(self.dir),
            "values": self.values,
            "state": self.state,
            "reason": self.reason,
            "step": self.step,
            "total_steps": self.total,
            "final_loss": self.final_loss,
            "latest_loss": self.latest_loss,
            "wall_seconds": self.wall_seconds,
            "gpus": self.gpus,
            "gpu_hours": self.gpu_hours,
            "estimate_gpu_hours": self.estimate_gpu_hours,
            "model": self.model,
            "params": self.params,
            "site": self.site,
            "damaged": [d.text() for d in self.damaged],
        }

    @property
    def flags(self) -> list[str]:
        """What a damaged part of the cell changes in its row, in a few words each ("log ends at step 10 of 100")."""
        return [d.flag for d in self.damaged if d.flag and not d.whole]

    def damaged_file(self, name: str) -> Damage | None:
        return next((d for d in self.damaged if d.file == name), None)


@dataclass(frozen=True)
class GridTable:
    name: str
    sweep_dir: Path
    axes: list[str]
    rows: list[Row]
    bases: list[Row]
    columns: list[str]  # score columns, <task>/<metric>
    damaged: list[Damage] = field(default_factory=list)  # the grid's own damaged records (grid/view.grid_damage)


def _budget(model: Mapping[str, Any]) -> float | None:
    """The model's stated pretraining compute, else the budget its name carries."""
    stated = model.get("compute_budget")
    if isinstance(stated, (int, float)) and stated > 0:
        return float(stated)
    return budget_of(str(model.get("name") or ""))


def budget_of(model: str) -> float | None:
    m = _BUDGET.search(model)
    return float(m.group(1)) if m else None


def state_losses(output: Path) -> list[tuple[int, float]]:
    """Every logged (step, loss) of trainer_state.json (where the trainer's per-step log is missing); none where it
    cannot be read."""
    try:
        history = load_json(output / TRAINER_STATE).get("log_history") or ()
    except (OSError, ValueError):
        return []
    return [
        (int(h.get("step") or 0), float(h["loss"]))
        for h in (history if isinstance(history, list) else ())
        if isinstance(h, dict) and isinstance(h.get("loss"), (int, float)) and isinstance(h.get("step") or 0, int)
    ]


def final_losses(output: Path) -> list[tuple[int, float]]:
    """The logged (step, loss) of the last 10% of the steps, read from the tail of the trainer's per-step log
    (grown until it reaches back that far), else from trainer_state.json."""
    log = output / TRAINER_LOG
    if not log.is_file():
        return last_share(state_losses(output))
    size, want = log.stat().st_size, 0
    while True:
        want = max(2 * want, int(size * FINAL_SHARE * 1.2) + 8192)
        with log.open("rb") as fh:
            fh.seek(max(0, size - want))
            text = fh.read().decode(errors="replace")
        pairs = [(int(s), float(v)) for s, v in LOG_LOSS.findall(text)]
        totals = _LOG_TOTAL.findall(text)
        total = int(totals[-1]) if totals else (pairs[-1][0] if pairs else 0)
        if want >= size or not pairs or pairs[0][0] <= (1 - FINAL_SHARE) * total:
            return [p for p in pairs if p[0] > (1 - FINAL_SHARE) * total] or pairs[-1:]


def last_share(losses: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    if not losses:
        return []
    edge = (1 - FINAL_SHARE) * max(s for s, _ in losses)
    return [p for p in losses if p[0] > edge] or list(losses[-1:])


def final_loss(losses: Sequence[tuple[int, float]]) -> float | None:
    return sum(v for _, v in losses) / len(losses) if losses else None


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}


def _cell_row(cell_dir: Path) -> Row:
    """A cell's row from its cell.yaml and estimate; a damaged cell.yaml makes a row of its name, its swept values
    (where its header can still be read) and its damage."""
    try:
        cell_yaml = CellYaml.read(cell_dir, ("model", "cluster", "nodes"))
    except (OSError, ValueError) as exc:
        damage = exc.damage if isinstance(exc, DamagedFile) else Damage(CELL_FILE, "missing")
        try:  # its header (the rerun command) is the first lines: whole where the damage is further on
            overrides = overrides_of((cell_dir / CELL_FILE).read_bytes().decode(errors="replace"))
        except (OSError, ValueError):
            overrides = []
        return Row(
            name=cell_dir.name,
            dir=cell_dir,
            key=cell_dir.name.rsplit("-", 1)[-1],
            overrides=overrides,
            values=swept_values(overrides),
            damaged=(damage,),
        )
    text, cfg = cell_yaml.text, cell_yaml.config
    model, cluster = _section(cfg, "model"), _section(cfg, "cluster")
    gpus = _count(cfg.get("nodes")) * max(1, _count(cluster.get("gpus_per_node"), 0))
    cpu = cluster.get("gpu_type") == "CPU" or (not cluster.get("gpus_per_node") and not cluster.get("gpu_type"))
    # the exact count where the model gives it (the Delphi table does), else its size in billions
    exact, params = model.get("params"), model.get("params_b")
    if isinstance(exact, int) and exact > 0:
        params = exact / 1e9
    name = str(model.get("name") or "")
    replayed = _replayed(cell_dir)
    if replayed is not None:
        name, params = replayed[0], replayed[1] / 1e9
    overrides = overrides_of(text)
    estimate: dict[str, Any] | None = None
    damaged: tuple[Damage, ...] = ()
    try:
        estimate = load_json(cell_dir / ESTIMATE_FILE, whole=False)
    except DamagedFile as exc:
        damaged = (exc.damage,)
    except OSError:
        pass
    return Row(
        name=cell_dir.name,
        dir=cell_dir,
        key=cell_dir.name.rsplit("-", 1)[-1],
        overrides=overrides,
        values=swept_values(overrides),
        gpus=gpus,
        cpu=cpu,
        model=name,
        model_source=str(model.get("path") or model.get("hub_id") or ""),
        params=float(params) * 1e9 if isinstance(params, (int, float)) else None,
        compute_budget=_budget(model),
        cluster=str(cluster.get("name") or ""),
        estimate=estimate,
        damaged=damaged,
    )


def _replayed(cell_dir: Path) -> tuple[str, int] | None:
    """A replay cell's model and parameter count: the replayed model's (backends/replay.py writes them into its
    config), not the stand-in model of the cell's config, which every replay cell shares; None for other cells."""
    try:
        cfg = load_json(cell_dir / replay.CONFIG_FILE)
    except (OSError, ValueError):
        return None
    params = cfg.get("params") if isinstance(cfg, dict) and cfg.get("replayed") else None
    if not isinstance(params, int) or isinstance(params, bool) or params <= 0:
        return None
    return str(cfg.get("model") or ""), params


def _count(value: Any, default: int = 1) -> int:
    """A count the config gives (nodes, GPUs per node), or `default` where it gives none that is one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def axes_of(rows: Sequence[Row]) -> list[str]:
    """Swept keys whose values differ between cells (a single cell: all of its own). In a grid across sites the
    cluster is where a cell was placed, shown in the site column: not an axis (a site's share of a grid across
    remote sites runs with `cluster=<site>`, sites/coordinate.py)."""
    placed = any(r.site for r in rows)
    keys = list(dict.fromkeys(k for r in rows for k in r.values if not (placed and k == "cluster")))
    if len(rows) == 1:
        return keys
    return [k for k in keys if len({r.values.get(k) for r in rows}) > 1]


def _sets_size(rows: Sequence[Row], axis: str) -> bool:
    seen: dict[str | None, set[float | None]] = {}
    for r in rows:
        seen.setdefault(r.values.get(axis), set()).add(r.params)
    return all(len(s) == 1 for s in seen.values())


def _recipe_of(rows: Sequence[Row], axes: Sequence[str]) -> list[str]:
    """Each cell's recipe: its values on the axes that do not set the model's size (the Delphi grid: its data);
    "" for every cell when the grid has a single size."""
    if len({r.params for r in rows}) < 2:
        return ["" for _ in rows]
    others = [a for a in axes if not _sets_size(rows, a)]
    return [", ".join(str(r.values.get(a, "")).strip("[]") for a in others) for r in rows]


def _base_rows(sweep_dir: Path, cells: Sequence[Row]) -> tuple[list[Row], list[list[Damage]]]:
    out, damaged = [], []
    base_root = sweep_dir / BASE_DIR
    for d in sorted(base_root.iterdir()) if base_root.is_dir() else ():
        files, bad = score_files(d / EVAL_DIR)
        if not files and not bad:
            continue
        model, path = (files[0].model, files[0].model_path) if files else ("", "")
        like = next(
            (
                c
                for c in cells
                if c.model == model or (path and c.model_source == path) or (model and c.model_source == model)
            ),
            None,
        )
        out.append(
            Row(
                name=d.name,
                dir=d,
                state="base",
                base=True,
                model=model or (like.model if like else ""),
                params=like.params if like else None,
                compute_budget=like.compute_budget if like else None,
                values={a: v for a, v in (like.values.items() if like else ()) if _sets_size(cells, a)},
                scores=_score_table(files),
                damaged=tuple(bad),
            )
        )
        damaged.append(bad)
    return out, damaged


def _final_loss(output: Path, log_damage: Damage | None) -> float | None:
    """The final loss of a completed run: from its per-step log, or (that log damaged: cut short, say) from
    trainer_state.json's own history, none where that cannot say it either."""
    if log_damage is None:
        return final_loss(final_losses(output))
    return final_loss(last_share(state_losses(output)))


def read_table(sweep_dir: Path, sites: Mapping[str, str] | None = None) -> GridTable:
    """The table of the grid in `sweep_dir`. `sites`: cell name -> its site, where its ledger names none (a grid
    across remote sites, read from the copies pulled here: the site each cell's copy came from, sites/merged.py); their
    states are read from their files, no scheduler asked (this machine's Slurm, if any, is not their sites'). Read
    leniently: see the module's docstring for damaged files."""
    dirs = cell_dirs(sweep_dir)
    view = read_view(dirs, ask=sites is None, lenient=True)
    rows, raw, failed, bad = [], [], [], []
    for d in dirs:
        row = _cell_row(d)
        st = view.state(d)
        history = view.histories[d]
        damaged = tuple(dict.fromkeys((*view.damaged(d), *row.damaged)))
        whole = any(x.whole for x in damaged)
        completed = st.state.value == "completed" and not whole
        log = next((x for x in damaged if x.file == f"{OUTPUT_DIR}/{TRAINER_LOG}"), None)
        wall = used_seconds(history, st.state.in_flight, row.cpu)
        files, broken = score_files(d / EVAL_DIR)
        rows.append(
            replace(
                row,
                state="damaged" if whole else st.state.value,
                reason="; ".join(x.text() for x in damaged if x.whole) if whole else st.reason,
                step=st.progress.step,
                total=st.progress.total,
                latest_loss=st.progress.loss,
                final_loss=_final_loss(d / OUTPUT_DIR, log) if completed else None,
                wall_seconds=wall,
                gpu_hours=None if wall is None else wall * row.gpus / 3600,
                site=submitted_site(history)[0] or (sites or {}).get(d.name, ""),
                damaged=tuple(dict.fromkeys((*damaged, *broken))),
            )
        )
        raw.append(_score_table(files))
        failed.append(failed_tasks(history))
        bad.append(broken)
    bases, bases_bad = _base_rows(sweep_dir, rows)
    columns = sorted({c for t in [*raw, *(b.scores for b in bases)] for c in t})
    bases = [replace(b, scores=mark(b.scores, {}, columns, True, bb)) for b, bb in zip(bases, bases_bad, strict=True)]
    axes = axes_of(rows)
    rows = [
        replace(r, recipe=recipe, scores=mark(got, fails, columns, r.state not in _UNDONE, broken))
        for r, recipe, got, fails, broken in zip(rows, _recipe_of(rows, axes), raw, failed, bad, strict=True)
    ]
    return GridTable(sweep_dir.name, sweep_dir, axes, rows, bases, columns, grid_damage(sweep_dir))
