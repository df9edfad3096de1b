"""The estimates as a person reads them: the dry run's cost table, its totals, where the throughput came from, and
the disk a grid needs against the free space of its runs root (formatting only; grid/estimates.py computes)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from sft_grid.present import table

COST_HEADERS = ("cell", "tokens", "steps", "FLOPs", "GPUs", "GPU-h", "wall", "disk")


def count(v: float) -> str:
    """12, 4.5k, 1.23M, 7.1B, 2.2T."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def size(b: float) -> str:
    for div, suffix in ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if b >= div:
            return f"{b / div:.3g} {suffix}"
    return f"{b:.0f} B"


def hours(h: float | None) -> str:
    if h is None:
        return "?"
    return f"{h:.0f}" if h >= 100 else f"{h:.3g}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    days, rest = divmod(s, 86400)
    clock = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def cost_rows(names: Sequence[str], costs: Any) -> list[tuple[str, ...]]:
    rows = []
    for name in names:
        e = costs.estimates.get(name)
        if e is None:
            bound = costs.disk_bounds.get(name)
            rows.append((name, "?", "?", "?", "", "?", "?", "?" if bound is None else f"<= {size(bound)}"))
            continue
        gpus = costs.inputs[name]["gpus"]
        rows.append((name, count(e.tokens.tokens), str(e.tokens.steps), f"{e.flops:.2g}", str(gpus),
                     hours(e.gpu_hours), duration(e.wall_seconds),
                     f"{size(e.disk_bytes)} ({e.checkpoints_kept} ckpt)"))
    return rows


def cost_lines(names: Sequence[str], to_run: Sequence[str], costs: Any) -> list[str]:
    """The cost table of these cells, the totals (all, and those a real run would queue), the throughput's
    source per cluster, cells without an estimate and why, and the disk against the free space."""
    if costs is None:
        return []
    known = [costs.estimates[n] for n in names if n in costs.estimates]
    lines = ["", "estimates (tokens: the backend's own tokenisation of each source's sample rows, scaled to its",
             "rows and epochs; FLOPs: 6ND + attention; disk: the checkpoints kept and the final model):",
             table(COST_HEADERS, cost_rows(names, costs))]

    def totals(which: Sequence[str]) -> str:
        es = [costs.estimates[n] for n in which if n in costs.estimates]
        h = [e.gpu_hours for e in es if e.gpu_hours is not None]
        return (f"{len(es)} of {len(which)} cell(s) estimated: {count(sum(e.tokens.tokens for e in es))} tokens, "
                f"{sum(e.flops for e in es):.3g} FLOPs, {hours(sum(h)) if h else '?'} GPU-hours, "
                f"disk {size(sum(e.disk_bytes for e in es))}")

    lines.append(f"total of the grid, {totals(names)}")
    if list(to_run) != list(names):
        lines.append(f"to run now, {totals(to_run)}")
    sources: dict[str, str] = {}
    for e in known:
        if e.throughput is not None:
            sources.setdefault(e.throughput.source + ": " + e.throughput.detail, "")
    lines += [f"  throughput ({s.split(': ', 1)[0]}): {s.split(': ', 1)[1]}" for s in sources]
    if known and any(e.throughput is None for e in known):
        lines.append("  no GPU-hours for cells whose cluster names no known gpu_type: set cluster.gpu_type (or"
                     " cluster.gpu_peak_tflops)")
    why = Counter(costs.unknown[n] for n in names if n in costs.unknown)
    for reason, n in why.most_common(3):
        lines.append(f"  no estimate for {n} cell(s): {reason}")
    if len(why) > 3:
        lines.append(f"  ... and {sum(why.values()) - sum(n for _, n in why.most_common(3))} more without one")
    lines += disk_lines(to_run, costs)
    return lines


def disk_lines(to_run: Sequence[str], costs: Any) -> list[str]:
    need = sum(costs.estimates[n].disk_bytes for n in to_run if n in costs.estimates)
    bound = sum(costs.disk_bounds.get(n, 0.0) for n in to_run if n not in costs.estimates)
    unbounded = sum(1 for n in to_run if n not in costs.estimates and n not in costs.disk_bounds)
    what = size(need) if not bound else f"<= {size(need + bound)}"
    what += f" (and {unbounded} cell(s) that keep every checkpoint, steps unknown)" if unbounded else ""
    out = []
    for root, free in costs.free_bytes.items():
        verdict = "NOT ENOUGH: lower save_total_limit or free space" if need + bound > free else "enough"
        out.append(f"  disk: the cells to run keep {what}; {size(free)} free under {root} ({verdict})")
    return out
