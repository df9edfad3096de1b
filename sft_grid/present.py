"""Text a person reads: tables, the dry run (the check table, first examples and the submission plan), the launch
summary and the final states. Formatting only: the command line prints what these return."""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

from sft_grid.core.cellfiles import Check
from sft_grid.core.state import CellState
from sft_grid.core.submission import Role, SlurmJob, SubmissionPlan
from sft_grid.planning.cells import Cell

GREEN, DIM, RESET = "\x1b[32m", "\x1b[2m", "\x1b[0m"
OPEN, CLOSE = "[[", "]]"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    body = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in body]
    return "\n".join(lines)


def relative(path: os.PathLike[str] | str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("../..") else str(path)


def progress_text(state: CellState) -> str:
    p = state.progress
    if p.step is None:
        return ""
    total = f"/{p.total}" if p.total else ""
    loss = f" loss {p.loss:.4g}" if isinstance(p.loss, (int, float)) else ""
    return f"step {p.step}{total}{loss}"


# -- the dry run's check table ------------------------------------------------------------------------------

CHECK_HEADERS = ("cell", "model", "template", "length", "lr", "grad_acc", "data[role/user/assistant]", "push_to_hub",
                 "output")


def _length(cell: Cell) -> str:
    s = cell.spec
    return f"{s.max_steps} steps" if s.max_steps > 0 else f"{s.epochs:g} ep"


def _tags(cell: Cell) -> str:
    return "; ".join(f"{name}:{ds.messages}[{ds.tags.role_tag}/{ds.tags.user_tag}/{ds.tags.assistant_tag}]"
                     for name, ds in cell.spec.dataset.items())


def check_rows(cells: Sequence[Cell], dirs: Sequence[os.PathLike[str]]) -> list[tuple[object, ...]]:
    return [(c.name, c.spec.model.name, c.spec.model.template, _length(c), f"{c.spec.lr:g}", c.grad_accum, _tags(c),
             c.spec.push_to_hub, relative(os.path.join(d, "output"))) for c, d in zip(cells, dirs)]


# -- a cell's training text, marked ---------------------------------------------------------------------------


def marked(segments: Sequence[Sequence[Any]], color: bool) -> str:
    """An example's text with its trained spans marked (colour, or [[ ]] in plain text)."""
    out: list[str] = []
    run: list[str] = []
    flag: bool | None = None

    def flush() -> None:
        if not run:
            return
        text = "".join(run)
        if color:
            out.append(f"{GREEN if flag else DIM}{text}{RESET}")
        else:
            out.append(f"{OPEN}{text}{CLOSE}" if flag else text)
        run.clear()

    for text, trained, _markup in segments:
        if bool(trained) != flag:
            flush()
            flag = bool(trained)
        run.append(text)
    flush()
    return "".join(out)


def example(label: str, row: Mapping[str, Any], index: int, color: bool) -> str:
    head = f"--- {label}, example {index}: "
    if row.get("dropped"):
        return head + "dropped by the backend: " + ("; ".join(row.get("warnings") or []) or "no reason logged")
    head += f"{row['n_tokens']} tokens, {row['n_trained']} trained"
    return f"{head}\n{marked(row['segments'], color)}"


# -- deferred checks ----------------------------------------------------------------------------------------

_DEFERRED_KIND = {
    "template_tokens": "template tokens are single tokens of the tokenizer",
    "assistant_turns": "the schema tags find assistant turns",
    "loss_mask": "the loss mask trains the assistant turns and nothing else",
    "path": "a local path exists",
    "prepared": "the model's prep succeeded (it runs first)",
    "staged": "the Hub input is staged (staging runs first)",
    "tokenized": "the shared tokenized dataset is built (it is built first)",
}


def passed_line(passed: Mapping[str, int]) -> list[str]:
    """The checks that ran here, before anything was queued, and passed: once per kind, with how many inputs."""
    if not passed:
        return []
    kinds = ", ".join(f"{_DEFERRED_KIND.get(k, k)}: {n}" for k, n in sorted(passed.items()))
    return [f"  checked here before queueing, every one passed ({sum(passed.values())} distinct inputs): {kinds}"]


def deferred_lines(deferred: Mapping[str, Sequence[Check]], full: bool = False) -> list[str]:
    """Checks deferred to the jobs' first step, once per kind of check with how many (every one with `full`)."""
    if not deferred:
        return []
    if full:
        by_check: dict[str, list[str]] = defaultdict(list)
        for name, checks in deferred.items():
            for check in checks:
                by_check[check.describe()].append(name)
        return [f"  deferred to the job's first step (input not readable here): {what}: {len(names)} cell(s):"
                f" {', '.join(names)}" for what, names in by_check.items()]
    kinds: dict[str, set[tuple[str, str]]] = defaultdict(set)
    cells: dict[str, set[str]] = defaultdict(set)
    for name, checks in deferred.items():
        for check in checks:
            kinds[check.kind].add((check.key, check.target))
            cells[check.kind].add(name)
    lines = []
    for kind, inputs in kinds.items():
        targets = sorted({target for _, target in inputs})
        shown = ", ".join(targets[:3]) + (f" and {len(targets) - 3} more" if len(targets) > 3 else "")
        lines.append(f"  deferred to the job's first step (input not readable here): {_DEFERRED_KIND.get(kind, kind)}:"
                     f" {len(inputs)} input(s) of {len(cells[kind])} cell(s): {shown}")
    return lines + ["  (every deferred check with its cells: SFT_GRID_VERBOSE=1 before the command)"]


# -- the submission plan ---------------------------------------------------------------------------------------


def job_line(job: SlurmJob) -> str:
    what = {Role.STAGE: "staging of the Hub inputs", Role.PREP: "model prep", Role.TOKENIZE: "tokenize once",
            Role.TRAIN: "training", Role.POST: "post-training stages"}[job.role]
    tasks = f"{len(job.targets)} task(s)" if len(job.targets) > 1 else "1 job"
    throttle = f", at most {job.throttle} at once" if job.throttle else ""
    after = f", after {job.dependency.text()}" if job.dependency else ""
    return f"  {job.name}: {what}, {tasks}{throttle}{after}"


def plan_lines(plan: SubmissionPlan) -> list[str]:
    lines: list[str] = []
    for r in plan.recoveries:
        lines.append(f"  recover job {r.job_id} of {r.array} ({r.action}) for {r.cell_dir.name}")
    for d in plan.archives:
        lines.append(f"  move {relative(d / 'output')} aside (force=true)")
    if plan.slurm:
        lines.append(f"Slurm: {len(plan.slurm)} sbatch call(s), arrays split at MaxArraySize {plan.max_array_size}:")
        if len(plan.slurm) <= 24:
            lines += [job_line(j) for j in plan.slurm]
        else:
            count = Counter(j.role for j in plan.slurm)
            lines += [f"  {n} {role.value} job(s)" for role, n in count.items()]
    if plan.local:
        roles = Counter(j.role for j in plan.local)
        lines.append("local: " + ", ".join(f"{n} {role.value}" for role, n in roles.items())
                     + f" (at most {plan.max_parallel} at once)")
    return lines


def normalise_ids(script: str) -> str:
    """An sbatch script with the ids Slurm handed out replaced: what a dry run's preview must equal."""
    return re.sub(r"(after(?:ok|corr|any|notok)?):\S+", r"\1:<id>", script)
