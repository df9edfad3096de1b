"""Text a person reads: tables, the dry run (the check table, first examples and the submission plan), the launch
summary and the final states. Formatting only: the command line prints what these return."""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sft_grid.core.cellfiles import Check
from sft_grid.core.state import CellState
from sft_grid.core.submission import Role, SlurmJob, SubmissionPlan

if TYPE_CHECKING:  # (annotations only: the results table's formatting need not import the planner's schema)
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


def eval_lines(result: Any) -> list[str]:
    """What the grid evaluates: each suite's cells and scores, and the base models (once per grid)."""
    from sft_grid.planning.evals import cell_scores, suites_of

    suites: dict[str, list[int]] = {}
    for cell in result.cells:
        for suite in suites_of(cell):
            suites.setdefault(suite.name, [0, len(suite.tasks)])[0] += 1
    lines = [f"  evaluation suite {name}: {n} cell(s) x {tasks} task(s), after the post-training stages"
             for name, (n, tasks) in suites.items()]
    scored = sum(len(cell_scores(c)) for c in result.cells)
    if scored:
        lines.append(f"  {scored} cell score(s) in all; scores already computed (<cell>/eval/<score id>.json) are"
                     " not computed again")
    lines += [f"  base model {b.target.name}: {len(b.target.scores)} score(s) under {relative(b.target.dir)}"
              f" ({'to evaluate' if b.evaluate else b.why})" for b in result.bases]
    return lines


def prep_lines(result: Any) -> list[str]:
    """One line per model prep (one in all when there are many): done, or to run before its cells."""
    def state(prep: Any, users: Sequence[Any]) -> str:
        if prep.complete:
            return "done"
        slurm = users[0].spec.cluster.executor == "slurm"
        return "a Slurm job its cells wait for" if slurm else "runs before its cells"

    preps = result.preps
    if len(preps) > 6:
        counts: dict[str, int] = {}
        for prep, users in preps.items():
            counts[state(prep, users)] = counts.get(state(prep, users), 0) + 1
        root = next(iter(preps)).dir.parent
        return [f"  tokenizer prep of {len(preps)} models for {sum(map(len, preps.values()))} cell(s), under"
                f" {relative(root)}: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    return [f"  tokenizer prep of {prep.model} for {len(users)} cell(s): {prep.model_dir} ({state(prep, users)})"
            for prep, users in preps.items()]


def post_lines(cells: Sequence[Any]) -> list[str]:
    """Which stages follow the training of how many cells, and where the upload runs."""
    from sft_grid.stages.post import stages_for, upload_in_job

    groups: dict[tuple[str, ...], list[Any]] = {}
    for cell in cells:
        groups.setdefault(tuple(stages_for(cell.spec)), []).append(cell)
    lines = []
    for stages, members in groups.items():
        line = f"  post-training stages of {len(members)} cell(s): {', '.join(stages)}"
        if "upload" in stages:
            line += ("; the upload runs in the post job" if upload_in_job(members[0].spec) else
                     f"; the upload waits for the login node: python -m sft_grid.post {members[0].sweep_dir}")
        lines.append(line)
    return lines


# -- the submission plan ---------------------------------------------------------------------------------------


def job_line(job: SlurmJob) -> str:
    what = {Role.STAGE: "staging of the Hub inputs", Role.PREP: "model prep", Role.TOKENIZE: "tokenize once",
            Role.TRAIN: "training", Role.POST: "post-training stages", Role.EVAL: "evaluation"}[job.role]
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


def failure_lines(items: Sequence[tuple[str, CellState]], per_class: int = 3) -> list[str]:
    """Failed and cancelled cells grouped by their failure's class: the class, its cells, and for a few of
    them what the policy did and what to change (with the exact rerun command)."""
    groups: dict[str, list[tuple[str, CellState]]] = {}
    for name, st in items:
        if st.state.value in ("failed", "cancelled"):
            groups.setdefault(st.failure_class.value if st.failure_class else "unclassified", []).append((name, st))
    lines = []
    for klass, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = ", ".join(n for n, _ in members[:8]) + (f", ... ({len(members) - 8} more)" if len(members) > 8 else "")
        lines.append(f"  {klass} ({len(members)}): {names}")
        for name, st in members[:per_class]:
            lines.append(f"    {name}: {st.reason or 'no reason recorded'}")
            if st.advice and st.advice != st.reason:
                lines.append(f"      next: {st.advice}")
        if len(members) > per_class:
            lines.append(f"    ... and {len(members) - per_class} more: python -m sft_grid.status shows each")
    return lines
