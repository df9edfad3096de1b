"""The grid report's data (report.json) from the cells x values table; analysis/page.py draws the page from it.

Everything the page shows is in the data, and the data is written whole as report.json: the grid at a glance
(cells by state, GPU-hours used and estimated, the sweep file and the git revision that last changed it), each
cell's row (analysis/table.py) with its loss curve (every logged step; tokens seen = step x the tokens per step
its estimate counted), the base models, the scaling fits (analysis/scaling.py: final loss and each score per
recipe, against parameters and against the pretraining compute budget where model names carry one; where a grid
crosses sizes with fine-tuning data amounts, the joint form L(N, D) weighed against each size's own curve), and the
estimate against the actual: each completed cell's estimate made when it was queued (estimate.json), what the
calibration of today says of it without it (leave-one-out: planning/estimate.py's calibration fitted to the grid's other
completed cells), and what it took (its completing run's wall time x GPUs; CPU time on CPU-only nodes).

Damaged files are read around (analysis/table.py): each cell says its own (`damaged`, a line per file; `flags`, what
the damage changes beside its state, "log ends at step 10 of 100"), and the grid its records' (`grid.damaged`); a
cell whose files stop a reader here (its curve, its scored checkpoints, its measured run) loses that part only.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sft_grid.analysis.along import cell_points
from sft_grid.analysis.figures import CURVE_POINTS, decimate_index
from sft_grid.analysis.forms import positive
from sft_grid.analysis.table import LOG_LOSS, GridTable, Row, read_table, state_losses
from sft_grid.core import events, project
from sft_grid.core.cellfiles import READ_ERRORS, Damage, damage_of, json_damage, load_json, not_utf8
from sft_grid.core.events import Kind
from sft_grid.core.layout import OUTPUT_DIR, TRAIN_RESULTS, TRAINER_LOG
from sft_grid.planning.costs import measured
from sft_grid.planning.estimate import Measured, calibrate, leave_one_out

# an adaptive grid's latest round, beside its cells (sft_grid/adaptive/steer.py)
ADAPTIVE_FILE = "adaptive.json"


def _git(where: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=20)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def sweep_file(rows: Sequence[Row]) -> Path | None:
    """The sweep file the grid's cells name (`+sweep=<name>`), as the config search finds it here (the team's
    repository's, else the shipped one)."""
    for r in rows:
        for o in r.overrides:
            key, _, name = o.lstrip("+").partition("=")
            if key == "sweep" and name:
                return project.find_option("sweep", name)
    return None


def launched_from(rows: Sequence[Row]) -> set[tuple[str, bool]]:
    """The (git revision, dirty) of the checkout each cell's latest submission was made from, as its ledger
    records it (a revision of "unknown": launched from outside a git checkout, left out)."""
    out = set()
    for r in rows:
        sub = events.last(events.scan(r.dir).events, Kind.SUBMITTED)
        git = (sub.details or {}).get("git") if sub is not None else None
        if isinstance(git, dict) and git.get("revision") not in (None, "", "unknown"):
            out.add((str(git["revision"]), bool(git.get("dirty"))))
    return out


def grid_facts(table: GridTable) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for r in table.rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    sweep = sweep_file(table.rows)
    rel = None
    if sweep is not None:  # shown relative to its git repository (the team's, or sft_grid's checkout)
        top = _git(sweep.parent, "rev-parse", "--show-toplevel")
        rel = str(sweep.relative_to(top)) if top and sweep.is_relative_to(top) else str(sweep)
    launched = launched_from(table.rows)
    if launched:  # what each cell's submission recorded: the grid's revision wherever it was launched from
        revision = ", ".join(sorted({rev[:12] for rev, _ in launched}))
        dirty = any(d for _, d in launched)
    else:  # cells never submitted: the sweep file's last commit here
        revision = _git(sweep.parent, "log", "-1", "--format=%h", "--", str(sweep)) if sweep else ""
        dirty = bool(_git(sweep.parent, "status", "--porcelain", "--", str(sweep))) if sweep else False
    est = [r.estimate_gpu_hours for r in table.rows if r.estimate_gpu_hours is not None]
    cpu = bool(table.rows) and all(r.cpu for r in table.rows)
    return {
        "name": table.name,
        "sweep_file": rel,
        "git_revision": revision or None,
        "git_dirty": dirty,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs_root": str(table.sweep_dir.parent),
        "counts": counts,
        "gpu_hours_used": sum(r.gpu_hours or 0.0 for r in table.rows),
        "gpu_hours_estimated": sum(est) if est else None,
        "device": "CPU (CPU-hours stand in for GPU-hours)" if cpu else "GPU",
        "damaged": [d.text() for d in table.damaged],
    }


def curve(row: Row, damaged: list[Damage] | None = None) -> list[list[float | None]]:
    """[step, tokens seen, loss] of the logged steps the page draws (at most CURVE_POINTS, each bucket's lowest
    and highest loss, so spikes survive: decimate_index), from the trainer's per-step log; tokens seen are
    step x the tokens per step the cell's estimate counted. The log is read whole: where some of it is not UTF-8,
    that is added to `damaged` (the steps it can read are drawn)."""
    import numpy as np

    path = row.dir / OUTPUT_DIR / TRAINER_LOG
    if path.is_file():
        data = path.read_bytes()
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            text = data.decode(errors="replace")
            name = f"{OUTPUT_DIR}/{TRAINER_LOG}"
            if damaged is not None and not any(d.file == name for d in [*damaged, *row.damaged]):
                damaged.append(Damage(name, not_utf8(data, exc), False, "log damaged"))
        found: list[tuple[Any, Any]] = LOG_LOSS.findall(text)
    else:
        found = list(state_losses(path.parent))
    a = np.array([float(v) for pair in found for v in pair]).reshape(-1, 2)
    if not len(a):
        return []
    a = a[decimate_index(a[:, 1], CURVE_POINTS)]
    est = row.estimate or {}
    per_step = est["tokens"] / est["steps"] if est.get("steps") and est.get("tokens") else None
    return [[s, None if per_step is None else s * per_step, v] for s, v in a.tolist()]


def accuracy(rows: Sequence[Row], ms: dict[str, Measured]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per completed cell: its estimate at launch, the leave-one-out estimate of today's calibration, and what it
    took; and the median absolute relative error of each kind."""
    out: dict[str, dict[str, Any]] = {}
    others = leave_one_out(ms.values())
    for r in rows:
        m = ms.get(r.name)
        if m is None:
            continue
        took = m.seconds * m.gpus / 3600
        cal = others.get(r.name)
        now = cal.throughput(r.name).seconds(m.tokens, m.flops, m.gpus) * m.gpus / 3600 if cal else None
        out[r.name] = {
            "measured_gpu_hours": took,
            "at_launch": r.estimate_gpu_hours,
            "now": now,
            "at_launch_error": None if r.estimate_gpu_hours is None else r.estimate_gpu_hours / took - 1,
            "now_error": None if now is None else now / took - 1,
        }

    def med(kind: str) -> float | None:
        errs = [abs(v[kind]) for v in out.values() if v[kind] is not None]
        return statistics.median(errs) if errs else None

    return out, {
        "cells": len(out),
        "median_abs_error_at_launch": med("at_launch_error"),
        "median_abs_error_now": med("now_error"),
    }


def build(sweep_dir: Path, resamples: int = 300, sites: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The report's data: read the grid, fit, and say how good the estimates were. `sites`: as read_table's."""
    from sft_grid.analysis import forms
    from sft_grid.analysis.scaling import report_fits

    table = read_table(sweep_dir, sites)
    more: dict[str, list[Damage]] = {r.name: [] for r in table.rows}
    ms = {}
    for r in table.rows:
        if r.state == "completed":
            for name in TRAIN_RESULTS:
                found = json_damage(r.dir / OUTPUT_DIR / name, f"{OUTPUT_DIR}/{name}", whole=False)
                more[r.name] += [found] if found is not None else []
            m = _guarded(r, more[r.name], None, measured, r.dir)
            if m is not None:
                ms[m.cell] = m
    per_cell, summary = accuracy(table.rows, ms)
    cells = []
    for r in table.rows:
        drawn = _guarded(r, more[r.name], [], curve, r, more[r.name])
        points = _guarded(r, more[r.name], [], cell_points, r)
        damaged = list(dict.fromkeys([*r.damaged, *more[r.name]]))
        parts = [d.text() for d in damaged if not d.whole]
        cells.append(
            {
                **r.to_json(),
                "reason": "; ".join([*([r.reason] if r.reason else []), *parts]),
                "damaged": [d.text() for d in damaged],
                "flags": [d.flag for d in damaged if d.flag and not d.whole],
                "key": r.key,
                "scores": {c: s.to_json() for c, s in r.scores.items() if s.status == "ok"},
                "score_status": {c: s.to_json() for c, s in r.scores.items() if s.status != "ok"},
                "estimate_now_gpu_hours": (per_cell.get(r.name) or {}).get("now"),
                "compute_budget": r.compute_budget,
                # the fine-tuning tokens its estimate counted (every epoch's, or max_steps' batches'): the joint
                # fits' data amount. The simulators' cells (synthetic, replay) have no estimate (no token sample
                # of their data), so none: their grids get no joint fit
                "tokens": _tokens(r),
                "recipe": r.recipe or None,
                "curve": drawn,
                # its scored checkpoints (step, tokens, loss, scores: analysis/along.py)
                "along": [p.to_json() for p in points],
            }
        )
    bases = [
        {
            "name": b.name,
            "model": b.model,
            "params": b.params,
            "compute_budget": b.compute_budget,
            "scores": {c: s.to_json() for c, s in b.scores.items() if s.status == "ok"},
        }
        for b in table.bases
    ]
    data: dict[str, Any] = {
        "grid": grid_facts(table),
        "axes": table.axes,
        "columns": table.columns,
        "along_columns": sorted({c for cell in cells for p in cell["along"] for c in p["scores"]}),
        "cells": cells,
        "base_models": bases,
        "estimates": {
            "cells": per_cell,
            "summary": summary,
            "calibration": {k: c.throughput().detail for k, c in calibrate(ms.values()).items()},
        },
    }
    data["fits"] = report_fits(data, resamples=resamples, select=lambda pts: forms.select(pts).as_dict())
    data["joint_fits"] = joint_fits(data)
    # an adaptive grid's latest round (sft_grid/adaptive/steer.py writes it): each holdout's forecast
    # and band beside its realised value
    with contextlib.suppress(OSError, ValueError):  # a damaged one is among the grid's damaged records (grid_damage)
        data["adaptive"] = load_json(sweep_dir / ADAPTIVE_FILE)
    return data


def _tokens(row: Row) -> float | None:
    v = (row.estimate or {}).get("tokens")
    return float(v) if isinstance(v, (int, float)) and positive(v) else None


def _number(v: object) -> bool:
    try:
        return math.isfinite(float(str(v)))
    except ValueError:
        return False


def _sets(cells: Sequence[Mapping[str, Any]], axis: str, key: str) -> bool:
    """Whether each of the axis's values among the cells has one `key` (params, tokens): the axis sets it."""
    seen: dict[str, set[Any]] = {}
    for c in cells:
        seen.setdefault(str((c.get("values") or {}).get(axis)), set()).add(c.get(key))
    return all(len(v) == 1 for v in seen.values())


def joint_fits(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report's "joint_fits": per group of completed cells that crosses sizes with fine-tuning data amounts, the
    joint form L(N, D) against each size's own curve over D, chosen on the held-out largest D (analysis/joint.py's
    select_joint; N the cell's params, D its `tokens`, L its final loss).

    A cell's recipe (analysis/table.py) is its values on every axis that does not set the size, so an axis that sets
    the data amount (max_steps, epochs, a dataset's rows) splits the recipes into one amount each: the groups here
    are the cells' values on the axes that set neither the size nor the data amount (an axis of numbers each of
    whose values has one amount; a dataset's name, which sets its amount too, stays a group: other data, not more
    of it); without axes, the cells' recipe. A group qualifies with 2 or more sizes, 3 or more amounts, and 2 sizes
    each with 2 or more amounts (where the amount differs only with the size, a tokenizer's count, there is no
    curve over D to weigh)."""
    from sft_grid.analysis.joint import select_joint

    cells = [
        c
        for c in data.get("cells") or []
        if c.get("state") == "completed" and all(positive(c.get(k)) for k in ("params", "tokens", "final_loss"))
    ]
    axes = [str(a) for a in data.get("axes") or []]
    data_axes = {
        a
        for a in axes
        if not _sets(cells, a, "params")
        and _sets(cells, a, "tokens")
        and all(_number((c.get("values") or {}).get(a)) for c in cells)
    }
    keep = [a for a in axes if not _sets(cells, a, "params") and a not in data_axes]
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for c in cells:
        values = c.get("values") or {}
        label = ", ".join(str(values.get(a, "")).strip("[]") for a in keep) if axes else str(c.get("recipe") or "")
        groups.setdefault(label, []).append((float(c["params"]), float(c["tokens"]), float(c["final_loss"])))
    out = []
    for label, pts in sorted(groups.items()):
        amounts: dict[float, set[float]] = {}
        for n, d, _ in pts:
            amounts.setdefault(n, set()).add(d)
        crossed = sum(len(ds) >= 2 for ds in amounts.values()) >= 2
        if len(amounts) >= 2 and len({d for _, d, _ in pts}) >= 3 and crossed:
            out.append({"metric": "final_loss", "recipe": label, **select_joint(pts).as_dict()})
    return out


def _guarded(row: Row, damaged: list[Damage], default: Any, reader: Callable[..., Any], *args: Any) -> Any:
    """What a reader of one cell's files returns (`reader(*args)`); where a file it parses is damaged, the default,
    and that file added to the cell's `damaged`."""
    try:
        return reader(*args)
    except READ_ERRORS as exc:
        found = damage_of(row.dir, exc, whole=False)
        if found not in damaged and found not in row.damaged:
            damaged.append(found)
        return default
