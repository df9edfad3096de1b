"""Text a person reads: tables, the dry run (the check table, first examples and the submission plan), the launch
summary and the final states. Formatting only: the command line prints what these return.

Also the text about a grid's inputs (what is staged from the Hub and how much, a transfer's progress, the shared
tokenizations) and its costs (the dry run's cost table, its totals, where the throughput came from), and what the
commands that read a grid say of its damaged files and of a grid or cell that is not there.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sft_grid.core.cellfiles import Check
from sft_grid.core.human import count, duration, hours, size
from sft_grid.core.state import CellState, State
from sft_grid.core.submission import Role, SlurmJob, SubmissionPlan
from sft_grid.planning.gpus import GIB

if TYPE_CHECKING:  # (annotations only: the results table's formatting need not import the planner's schema)
    from pathlib import Path

    from sft_grid.core.cellfiles import Damage
    from sft_grid.grid.flow import GridResult
    from sft_grid.planning.cells import Cell
    from sft_grid.planning.costs import GridCosts
    from sft_grid.planning.inputs import Prep
    from sft_grid.stages.staging import StagingPlan
    from sft_grid.stages.tokenize import Tokenization

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

CHECK_HEADERS = (
    "cell",
    "model",
    "template",
    "length",
    "lr",
    "grad_acc",
    "layout",
    "mem/GPU",
    "data[role/user/assistant]",
    "push_to_hub",
    "output",
)


def _length(cell: Cell) -> str:
    s = cell.spec
    return f"{s.max_steps} steps" if s.max_steps > 0 else f"{s.epochs:g} ep"


def _tags(cell: Cell) -> str:
    return "; ".join(
        f"{name}:{ds.messages}[{ds.tags.role_tag}/{ds.tags.user_tag}/{ds.tags.assistant_tag}]"
        for name, ds in cell.spec.dataset.items()
    )


def memory_cell(cell: Cell) -> str:
    """The predicted peak per GPU against the GPU's memory ('41.2/64 GiB'), '-' on a CPU-only cluster, and the
    peak alone where the cluster does not state its GPU's memory."""
    lay = cell.layout
    if lay.memory is None:
        return "-"
    peak = f"{lay.memory.total / GIB:.1f}"
    return f"{peak}/{lay.gpu_mem_gb:g} GiB" if lay.gpu_mem_gb else f"{peak} GiB/?"


def layout_lines(cells: Sequence[Cell]) -> list[str]:
    """What a global batch counts (packed sequences of cutoff tokens, or conversations), and the fullest GPU."""
    packed = [c for c in cells if c.layout.packing]
    plain = [c for c in cells if not c.layout.packing]
    lines = []
    if packed:
        batch = sorted({f"{c.spec.global_batch_size} x {c.spec.cutoff_len}" for c in packed})
        lines.append(
            f"  {len(packed)} packed cell(s): a global batch is {' or '.join(batch)} tokens, several examples a"
            " sequence, none attending to another"
        )
    if plain:
        batch = sorted({str(c.spec.global_batch_size) for c in plain})
        lines.append(f"  {len(plain)} unpacked cell(s): a global batch is {' or '.join(batch)} examples")
    sized = [c for c in cells if c.layout.memory is not None and c.layout.gpu_mem_gb]
    if sized:
        full = max(sized, key=lambda c: (c.layout.memory.total if c.layout.memory else 0) / (c.layout.gpu_mem_gb or 1))
        assert full.layout.memory is not None
        lines.append(
            f"  GPU memory (predicted peak per GPU, mem/GPU above): the fullest is {full.name},"
            f" {full.layout.memory.text()} of {full.layout.gpu_mem_gb:g} GiB"
        )
    return lines


def check_rows(cells: Sequence[Cell], dirs: Sequence[os.PathLike[str]]) -> list[tuple[object, ...]]:
    return [
        (
            c.name,
            c.spec.model.name,
            c.spec.model.template,
            _length(c),
            f"{c.spec.lr:g}",
            c.grad_accum,
            c.layout.summary(),
            memory_cell(c),
            _tags(c),
            c.spec.push_to_hub,
            relative(os.path.join(d, "output")),
        )
        for c, d in zip(cells, dirs, strict=True)
    ]


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


# what a job before the cell builds (staging, the model's prep, the shared tokenization): where the cell runs here,
# this command builds it itself before the cell, so it is no check "deferred to the job" for a person to wait on
BUILT_BEFORE = frozenset({"staged", "prepared", "tokenized"})


def deferred_lines(
    deferred: Mapping[str, Sequence[Check]], full: bool = False, here: frozenset[str] = frozenset()
) -> list[str]:
    """Checks deferred to the jobs' first step, once per kind of check with how many (every one with `full`). For
    the cells in `here` (they run on this machine), what a job before the cell builds is left out: this command
    builds it before them (the prep and tokenize lines say so)."""
    deferred = {
        name: [c for c in checks if not (name in here and c.kind in BUILT_BEFORE)] for name, checks in deferred.items()
    }
    deferred = {name: checks for name, checks in deferred.items() if checks}
    if not deferred:
        return []
    if full:
        by_check: dict[str, list[str]] = defaultdict(list)
        for name, checks in deferred.items():
            for check in checks:
                by_check[check.describe()].append(name)
        return [
            f"  deferred to the job's first step (input not readable here): {what}: {len(names)} cell(s):"
            f" {', '.join(names)}"
            for what, names in by_check.items()
        ]
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
        lines.append(
            f"  deferred to the job's first step (input not readable here): {_DEFERRED_KIND.get(kind, kind)}:"
            f" {len(inputs)} input(s) of {len(cells[kind])} cell(s): {shown}"
        )
    return [*lines, "  (every deferred check with its cells: SFT_GRID_VERBOSE=1 before the command)"]


def _along_text(along: Any) -> str:
    if along == "checkpoint":
        return "each saved checkpoint too"
    return f"the checkpoints at every {along} steps too"


def eval_lines(result: GridResult) -> list[str]:
    """What the grid evaluates: each suite's cells and scores, and the base models (once per grid)."""
    from sft_grid.planning.evaluation import cell_scores, suites_of

    suites: dict[str, list[int]] = {}
    along: dict[str, Any] = {}
    for cell in result.cells:
        for suite in suites_of(cell):
            suites.setdefault(suite.name, [0, len(suite.tasks)])[0] += 1
            along.setdefault(suite.name, suite.along)
    lines = [
        f"  evaluation suite {name}: {n} cell(s) x {tasks} task(s), after the post-training stages"
        + ("" if along[name] is None else f"; along training: {_along_text(along[name])}")
        for name, (n, tasks) in suites.items()
    ]
    scored = sum(len(cell_scores(c)) for c in result.cells)
    if scored:
        lines.append(
            f"  {scored} cell score(s) in all; scores already computed (<cell>/eval/<score id>.json) are"
            " not computed again"
        )
    lines += [
        f"  base model {b.target.name}: {len(b.target.scores)} score(s) under {relative(b.target.dir)}"
        f" ({'to evaluate' if b.evaluate else b.why})"
        for b in result.bases
    ]
    return lines


def prep_lines(result: GridResult) -> list[str]:
    """One line per model prep (one in all when there are many): done, or to run before its cells."""

    def state(prep: Prep, users: Sequence[Cell]) -> str:
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
        return [
            f"  tokenizer prep of {len(preps)} models for {sum(map(len, preps.values()))} cell(s), under"
            f" {relative(root)}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
        ]
    return [
        f"  tokenizer prep of {prep.model} for {len(users)} cell(s): {prep.model_dir} ({state(prep, users)})"
        for prep, users in preps.items()
    ]


def post_lines(cells: Sequence[Cell]) -> list[str]:
    """Which stages follow the training of how many cells, and where the upload runs."""
    from sft_grid.stages.post_training import stages_for, upload_in_job

    groups: dict[tuple[str, ...], list[Cell]] = {}
    for cell in cells:
        groups.setdefault(tuple(stages_for(cell.spec)), []).append(cell)
    lines = []
    for stages, members in groups.items():
        line = f"  post-training stages of {len(members)} cell(s): {', '.join(stages)}"
        if "upload" in stages:
            line += (
                "; the upload runs in the post job"
                if upload_in_job(members[0].spec)
                else f"; the upload waits for the login node: sft-grid post {members[0].sweep_dir}"
            )
        lines.append(line)
    return lines


# -- the submission plan ---------------------------------------------------------------------------------------


def job_line(job: SlurmJob) -> str:
    what = {
        Role.STAGE: "staging of the Hub inputs",
        Role.PREP: "model prep",
        Role.TOKENIZE: "tokenize once",
        Role.TRAIN: "training",
        Role.POST: "post-training stages",
        Role.EVAL: "evaluation",
    }[job.role]
    tasks = f"{len(job.targets)} task(s)" if len(job.targets) > 1 else "1 job"
    throttle = f", at most {job.throttle} at once" if job.throttle else ""
    after = f", after {job.dependency.text()}" if job.dependency else ""
    where = f", on site {job.request.site}" if job.request.site else ""
    return f"  {job.name}: {what}, {tasks}{throttle}{after}{where}"


def plan_lines(plan: SubmissionPlan) -> list[str]:
    lines = [f"  recover job {r.job_id} of {r.array} ({r.action}) for {r.cell_dir.name}" for r in plan.recoveries]
    lines += [f"  move {relative(d / 'output')} aside (force=true)" for d in plan.archives]
    if plan.slurm:
        lines.append(f"Slurm: {len(plan.slurm)} sbatch call(s), arrays split at MaxArraySize {plan.max_array_size}:")
        if len(plan.slurm) <= 24:
            lines += [job_line(j) for j in plan.slurm]
        else:
            count = Counter(j.role for j in plan.slurm)
            lines += [f"  {n} {role.value} job(s)" for role, n in count.items()]
    if plan.local:
        roles = Counter(j.role for j in plan.local)
        lines.append(
            "local: "
            + ", ".join(f"{n} {role.value}" for role, n in roles.items())
            + f" (at most {plan.max_parallel} at once)"
        )
    return lines


def normalise_ids(script: str) -> str:
    """An sbatch script with the ids Slurm handed out replaced: what a dry run's preview must equal."""
    return re.sub(r"(after(?:ok|corr|any|notok)?):\S+", r"\1:<id>", script)


def failure_lines(items: Sequence[tuple[str, CellState]], per_class: int = 3) -> list[str]:
    """Failed and cancelled cells grouped by their failure's class: the class, its cells, and for a few of
    them what the policy did and what to change (with the exact rerun command)."""
    groups: dict[str, list[tuple[str, CellState]]] = {}
    for name, st in items:
        if st.state in (State.FAILED, State.CANCELLED):
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
            lines.append(f"    ... and {len(members) - per_class} more: sft-grid status shows each")
    return lines


def staging_lines(staging: StagingPlan | None, limit: int = 8) -> list[str]:
    """What a grid stages: each Hub repository with its files and sizes (a count when there are many), where the
    transfers run, and the free space of each filesystem against what must be fetched."""
    if staging is None or not staging.items:
        return []
    from sft_grid.core import human

    users = {cell for item in staging.items for cell, _ in item.users}
    pending = staging.pending
    if staging.unreachable:
        unresolved = [i for i in staging.items if i.pin is None]
        head = f"staging: the Hub cannot be reached from here: {staging.unreachable.rstrip('.')}; " + (
            f"{len(unresolved)} of {len(staging.items)} Hub repositories for {len(users)} cell(s) are not"
            " staged, sizes unknown"
            if unresolved
            else f"all {len(staging.items)} Hub repositories for {len(users)} cell(s) are taken as staged"
        )
        return (
            [head]
            + [f"  {i.text()}" for i in (unresolved or staging.items)[:limit]]
            + ([f"  ... and {len(unresolved) - limit} more"] if len(unresolved) > limit else [])
        )
    needed = sum(i.bytes_needed for i in staging.items)
    lines = [
        (
            f"staging: {len(staging.items)} Hub repositories for {len(users)} cell(s),"
            f" {human.size(needed)} for training,"
            f" {len(pending)} to stage ({human.size(staging.to_fetch)} to fetch)"
        )
    ]
    shown = pending if len(pending) <= limit else pending[:limit]
    lines += [f"  {i.text()}" for i in (shown or staging.items[:limit])]
    if len(pending) > limit:
        lines.append(f"  ... and {len(pending) - limit} more to stage")
    for s in staging.space:
        lines.append(
            f"  {human.size(s.to_fetch)} to fetch into {s.cache}: {human.size(s.free)} free there"
            + (" (fits)" if s.fits else " (does NOT fit)")
        )
    where = {i.here for i in pending}
    if True in where:
        lines.append("  transfers run here, before anything is queued (cluster.staging.where=login)")
    if False in where:
        lines.append("  transfers run in a staging job that the cells wait for (cluster.staging.where=job)")
    return lines


def model_lines(cells: Sequence[Cell], staging: StagingPlan | None) -> list[str]:
    """Each checkpoint the grid trains, once: where it comes from, the commit it trains (as the model's conf pins
    it, and as staging resolved it here), its size and what its weights weigh as stored (what staging fetches and
    the tokenizer prep writes again)."""
    from sft_grid.core.schema import exact_params, weights_bytes
    from sft_grid.planning.inputs import pin_of

    seen: dict[tuple[str, str | None, str | None], list[Cell]] = {}
    for cell in cells:
        m = cell.spec.model
        seen.setdefault((m.name, m.hub_id, m.path), []).append(cell)
    resolved = {(i.wanted.repo_id, i.wanted.revision): i.pin.sha for i in getattr(staging, "items", ()) if i.pin}
    lines = [f"models: {len(seen)} checkpoint(s), each at the commit it trains:"]
    for (name, hub_id, path), users in seen.items():
        m, first = users[0].spec.model, users[0]
        if path:
            where = f"{path} (a local directory)"
        else:
            asked = m.revision or "main"
            pin = pin_of(first, "model", hub_id or "")
            sha = pin.sha if pin else resolved.get((hub_id or "", asked))
            shown = asked if m.revision else "main"
            where = f"{hub_id}@{shown}" + (
                f" (resolved here: {sha[:12]})" if sha and sha != asked else "" if sha else " (not resolved here)"
            )
            if not m.confirmed:
                where += "; id unconfirmed: queued only once resolved on the site's Hub"
        params = exact_params(m)
        lines.append(
            f"  {name}: {where}; {params:,} parameters, {m.weights_dtype}"
            f" ({size(weights_bytes(m))} as stored); {len(users)} cell(s)"
        )
    return lines


HUB_HEADERS = ("kind", "repository", "asked", "resolves to", "main now", "files", "size", "cells", "verdict")


def check_table(staging: StagingPlan | None) -> tuple[str, bool]:
    """`sft-grid check`'s table: each Hub input of the grid as the site's Hub answers for it, and whether all were
    found."""
    from sft_grid.core import human

    rows: list[tuple[object, ...]] = []
    ok = True
    if staging is None:
        return table(HUB_HEADERS, rows), ok
    for item in staging.items:
        w = item.wanted
        asked = w.revision[:12] if len(w.revision) == 40 else w.revision
        sha = item.pin.sha[:12] if item.pin else "-"
        head = staging.heads.get((w.kind, w.repo_id), "")
        main = head[:12] if len(head) == 40 else head or "-"
        if item.pin and len(head) == 40 and head != item.pin.sha:
            main += " (moved on)"
        files = item.plan.resolved.files if item.plan else ()
        count, total = (str(len(files)), human.size(sum(f.size or 0 for f in files))) if files else ("-", "-")
        if item.error is not None:
            verdict, ok = str(item.error).partition(" Fix: ")[0], False
        elif item.pin is None:
            verdict, ok = "not resolved: the Hub cannot be reached from here (below)", False
        else:
            verdict = "found" + (", staged here" if item.plan is None or item.complete else "")
            if item.unconfirmed:
                verdict += " (an unconfirmed id: now resolved)"
        rows.append((w.kind, w.repo_id, asked, sha, main, count, total, len({c for c, _ in item.users}), verdict))
    return table(HUB_HEADERS, rows), ok


def pinned_lines(staging: StagingPlan | None) -> list[str]:
    """A real run's word on its inputs: the Hub could not be asked (taken as staged), or how many are pinned."""
    if staging is None or not staging.items:
        return []
    if staging.unreachable:
        return staging_lines(staging)[:1]
    done = [i for i in staging.items if i.complete]
    return [
        (
            f"  {len(done)} of {len(staging.items)} Hub repositories staged and pinned (each cell's ledger records"
            " the commits it trains on)"
        )
    ]


def staged_lines(staging: StagingPlan | None, cells: int, dry_run: bool) -> list[str]:
    """What `sft-grid stage` (stage_only=true) did; nothing is rendered or queued either way."""
    if dry_run:
        return [*staging_lines(staging), "dry run: nothing staged"]
    items = staging.items if staging else []
    left = staging.pending if staging else []
    lines = [
        f"{len(items) - len(left)} of {len(items)} Hub repositories of {cells} cell(s) staged; nothing rendered"
        " or queued"
        + (
            f"; {len(left)} left for a staging job (cluster.staging.where=job), which the grid command queues"
            if left
            else ""
        )
    ]
    return lines + [
        f"  {i.wanted.kind} {i.wanted.repo_id}@{i.pin.sha}: {i.pin.path}"
        for i in items
        if i.pin is not None and i.complete
    ]


def tokenize_lines(tokenized: Mapping[Path, Tokenization], limit: int = 6) -> list[str]:
    """Tokenize once: how many tokenized datasets the running cells share, and what tells them apart."""
    if not tokenized:
        return []
    groups = Counter(t.dir for t in tokenized.values())
    toks = {t.dir: t for t in tokenized.values()}
    lines = [
        (
            f"  tokenize once: {len(groups)} tokenized dataset(s) for {len(tokenized)} cell(s), each built once"
            " before its cells:"
        )
    ]
    for directory, n in list(groups.items())[:limit]:
        tok = toks[directory]
        ident = tok.identity
        tokenizer = ident["tokenizer"].get("digest") or f"{ident['tokenizer'].get('name')} (by name: not readable here)"
        sources = "+".join(f"{s[0]}@{str(s[2])[:12]}" if s[1] == "hub" else s[0] for s in ident["sources"])
        state = "built" if tok.data.complete else "to build"
        seed = ident["data"].get("config", {}).get("seed")
        lines.append(
            f"    {tok.backend} {tok.data.key}: {n} cell(s), tokenizer {tokenizer}, template"
            f" {ident['template']}, {sources}, mix {ident['mix'][0]}"
            + (f", seed {seed}" if seed is not None else "")
            + f", cutoff"
            f" {ident['cutoff_len']} ({state}: {relative(tok.dir)})"
        )
    if len(groups) > limit:
        lines.append(f"    ... and {len(groups) - limit} more")
    return lines


COST_HEADERS = ("cell", "tokens", "steps", "FLOPs", "GPUs", "GPU-h", "MFU", "wall", "disk")


def cost_rows(names: Sequence[str], costs: GridCosts) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name in names:
        e = costs.estimates.get(name)
        if e is None:
            bound = costs.disk_bounds.get(name)
            rows.append((name, "?", "?", "?", "", "?", "", "?", "?" if bound is None else f"<= {size(bound)}"))
            continue
        gpus = costs.inputs[name]["gpus"]
        rows.append(
            (
                name,
                count(e.tokens.tokens),
                str(e.tokens.steps),
                f"{e.flops:.2g}",
                str(gpus),
                hours(e.gpu_hours),
                # what the default throughput comes to for this layout (compute, dispatch, exchange, offload)
                f"{e.mfu:.0%}" if e.mfu is not None else "",
                duration(e.wall_seconds),
                f"{size(e.disk_bytes)} ({e.checkpoints_kept} ckpt)",
            )
        )
    return rows


def cost_lines(names: Sequence[str], to_run: Sequence[str], costs: GridCosts | None) -> list[str]:
    """The cost table of these cells, the totals (all, and those a real run would queue), the throughput's
    source per cluster, cells without an estimate and why, and the disk against the free space."""
    if costs is None:
        return []
    known = [costs.estimates[n] for n in names if n in costs.estimates]
    lines = [
        "",
        "estimates (tokens: the backend's own tokenisation of each source's sample rows, scaled to its",
        "rows and epochs; FLOPs: 6ND + attention; disk: the checkpoints kept and the final model):",
        table(COST_HEADERS, cost_rows(names, costs)),
    ]

    def totals(which: Sequence[str]) -> str:
        es = [costs.estimates[n] for n in which if n in costs.estimates]
        h = [e.gpu_hours for e in es if e.gpu_hours is not None]
        return (
            f"{len(es)} of {len(which)} cell(s) estimated: {count(sum(e.tokens.tokens for e in es))} tokens, "
            f"{sum(e.flops for e in es):.3g} FLOPs, {hours(sum(h)) if h else '?'} GPU-hours, "
            f"disk {size(sum(e.disk_bytes for e in es))}"
        )

    lines.append(f"total of the grid, {totals(names)}")
    if list(to_run) != list(names):
        lines.append(f"to run now, {totals(to_run)}")
    sources: dict[str, str] = {}
    for e in known:
        if e.throughput is not None:
            sources.setdefault(e.throughput.source + ": " + e.throughput.detail, "")
    lines += [f"  throughput ({s.split(': ', 1)[0]}): {s.split(': ', 1)[1]}" for s in sources]
    lines += no_throughput_lines(names, costs)
    why = Counter(costs.unknown[n] for n in names if n in costs.unknown)
    for reason, n in why.most_common(3):
        lines.append(f"  no estimate for {n} cell(s): {reason}")
    if len(why) > 3:
        lines.append(f"  ... and {sum(why.values()) - sum(n for _, n in why.most_common(3))} more without one")
    lines += disk_lines(to_run, costs)
    return lines


def no_throughput_lines(names: Sequence[str], costs: GridCosts | None) -> list[str]:
    """What the estimates cannot say for cells whose cluster names no GPU type of the peak table (no calibration
    either): the same line in the dry run's estimates and in a real run's launch summary, once per cluster."""
    if costs is None:
        return []
    by_cluster: dict[tuple[str, str], int] = Counter()
    for n in names:
        e = costs.estimates.get(n)
        if e is not None and e.throughput is None:
            inputs = costs.inputs.get(n, {})
            by_cluster[(str(inputs.get("cluster", "?")), str(inputs.get("gpu") or "none"))] += 1
    from sft_grid.planning.estimate import PEAK_FLOPS

    return [
        f"  no GPU-hours or wall-time estimate for {k} cell(s), so no check that they finish within `time`: cluster"
        f" {cluster!r} names no known gpu_type (it says {gpu!r}); set cluster.gpu_type (one of"
        f" {', '.join(PEAK_FLOPS)}) or cluster.gpu_peak_tflops"
        for (cluster, gpu), k in by_cluster.items()
    ]


def disk_lines(to_run: Sequence[str], costs: GridCosts) -> list[str]:
    need = sum(costs.estimates[n].disk_bytes for n in to_run if n in costs.estimates)
    bound = sum(costs.disk_bounds.get(n, 0.0) for n in to_run if n not in costs.estimates)
    unbounded = sum(1 for n in to_run if n not in costs.estimates and n not in costs.disk_bounds)
    what = size(need) if not bound else f"<= {size(need + bound)}"
    what += f" (and {unbounded} cell(s) that keep every checkpoint, steps unknown)" if unbounded else ""
    prepared = sum(costs.prepared_bytes.values())
    if prepared:
        what += (
            f", and {len(costs.prepared_bytes)} prepared model copies {size(prepared)} (as the checkpoints are stored)"
        )
    out = []
    for root, free in costs.free_bytes.items():
        verdict = "NOT ENOUGH: lower save_total_limit or free space" if need + bound + prepared > free else "enough"
        out.append(f"  disk: the cells to run keep {what}; {size(free)} free under {root} ({verdict})")
    return out


# -- damaged files, and what is not there -------------------------------------------------------------------------


def damage_lines(cells: Sequence[tuple[str, Sequence[Damage | str]]], grid: Sequence[Damage | str] = ()) -> list[str]:
    """A line per damaged file, after a line that counts them: the grid's own records (`grid`), then each cell's
    (cell name, its damaged files, or their lines); [] when nothing is damaged."""

    def text(d: Damage | str) -> str:
        return d if isinstance(d, str) else d.text()

    lines = [f"  {text(d)}" for d in grid] + [f"  {name}: {text(d)}" for name, found in cells for d in found]
    if not lines:
        return []
    n = sum(1 for _, found in cells if found)
    where = [f"{n} cell(s)"] if n else []
    where += ["the grid's own records"] if grid else []
    return [f"damaged files: {len(lines)}, of {' and '.join(where)}:", *lines]


def _names(names: Sequence[str], limit: int = 12) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def no_grid(sweep_dir: Path, grid: str) -> str:
    """One line where a grid's directory is not there, saying what is (the grids under its runs root, the closest
    name first); "" where it is."""
    import difflib

    from sft_grid.core.layout import CELL_FILE

    head = f"no cells under {sweep_dir}"
    if (sweep_dir / CELL_FILE).is_file():  # a cell's own directory, named where its grid goes
        return (
            f"{head}: it is a cell's directory, not a grid's; name its grid, {relative(sweep_dir.parent)}"
            f" (sft-grid logs {relative(sweep_dir.parent)} {sweep_dir.name} names the cell)"
        )
    if sweep_dir.is_dir():
        return ""
    if sweep_dir.exists():
        return f"{head}: it is a file, not a grid's directory"
    if any(c in grid for c in "*?["):  # a pattern the shell left as it is (quoted, or matching nothing)
        import glob

        found = sorted({relative(d) for g in (grid, str(sweep_dir)) for d in glob.glob(g) if os.path.isdir(d)})
        which = f": one of {_names(found)}" if found else ""
        return f"{head}: {grid!r} is a pattern, and GRID names one grid (run the command once for each){which}"
    root = sweep_dir.parent
    if root.exists() and not root.is_dir():
        return f"{head}: the runs root {root} is a file, not a folder (--runs-root, else $SFT_GRID_RUNS, names it)"
    if not root.is_dir():
        return f"{head}: there is no runs root {root} (--runs-root, else $SFT_GRID_RUNS, says where grids are)"
    grids = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    owner = next((root / g for g in grids if (root / g / sweep_dir.name / CELL_FILE).is_file()), None)
    if owner is not None:  # a cell's name given for its grid
        return f"{head}: it is a cell of the grid {owner.name}, not a grid; name its grid, {relative(owner)}"
    if not grids:
        return f"{head}: there is no grid {grid!r}, and {root} holds none"
    close = difflib.get_close_matches(sweep_dir.name, grids, n=1, cutoff=0.5)
    return (
        f"{head}: there is no grid {grid!r}"
        + (f"; did you mean {close[0]!r}?" if close else "")
        + f" (the grids under {root}: {_names(grids)})"
    )


def no_cell(path: Path, cells: Sequence[Path]) -> str:
    """One line where a cell's directory is not there: the closest of its grid's cells (`cells`), or what its grid
    holds; where the grid itself is not there either, what no_grid says of it."""
    import difflib

    if not path.parent.is_dir():
        return f"no cell directory {path}; " + (no_grid(path.parent, path.parent.name) or "its grid is not there")
    names = [c.name for c in cells]
    if not names:
        return f"no cell directory {path}: {path.parent} holds no cells"
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.3)
    return (
        f"no cell directory {path}"
        + (f"; did you mean {relative(path.parent / close[0])}?" if close else "")
        + f" (the cells of {path.parent.name}: {_names(names, 6)})"
    )
