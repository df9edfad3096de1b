"""The loss-mask preflight: the backend's own preprocessing, run on a few rows of every data source, must
train the assistant turns (think blocks included) and nothing of the prompt.

A cell whose role tags, columns or template do not match its data trains on nothing, or on the prompt,
without any error: the users' guide calls this "the #1 silent ruin". So before anything is queued, each
(backend, its virtual environment, tokenizer, template, dataset source and fields) of the grid is checked once:

- the probe (sft_grid/in_venv/mask_probe.py) runs in the backend's virtual environment, one process per
  environment for the whole grid, and reports per row the tokens and which of them are trained;
- `judge.judge` (pure) decides from that token data: every assistant turn is trained (with its think block);
  every trained span lies inside assistant content, apart from the template's special tokens and
  whitespace (its end-of-turn token, an empty think block); no row is dropped or trains zero tokens.

Probe results are cached on disk under <cache root>/preflight/, keyed by the check and the size and
mtime of the tokenizer files, the data file, the probe and the backend's virtual environment, so invoking the
same grid again pays no subprocess. Inputs not readable here (hub ids, a site's own venv) are deferred
to the job's first step like every other preflight check.

The judgement is pure and lives here too (`judge`, `judge_row`): from the probe's token data, every assistant turn
is trained with its think block and the token that ends it, nothing of the system or user prompt, no row dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sft_grid.backends import get as backend_of
from sft_grid.checks import own_envs, venv_facts
from sft_grid.checks.cache import cache_dir, env_state
from sft_grid.checks.cache import stat_key as _stat
from sft_grid.core.cellfiles import Check, Verdict
from sft_grid.core.paths import IN_VENV_DIR
from sft_grid.core.problems import Problem
from sft_grid.core.secrets import shown_source
from sft_grid.core.templates import TEMPLATES
from sft_grid.planning.cells import Cell, is_local
from sft_grid.planning.environments import bin_dir
from sft_grid.planning.inputs import dataset_source
from sft_grid.planning.readable import SAMPLE_ROWS, data_files, locate, read_sample, row_lines

log = logging.getLogger(__name__)

KIND = "loss_mask"
MASK_ROWS = 8
PROBE = IN_VENV_DIR / "mask_probe.py"
FETCHER = IN_VENV_DIR / "fetch_sample.py"
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "added_tokens.json",
    "tokenizer.model",
)


@dataclass
class Stats:
    """What the last preflight did: checks judged, probe results read from the cache, processes run."""

    checks: int = 0
    cached: int = 0
    probed: int = 0
    subprocesses: int = 0


STATS = Stats()
# what a long step tells the caller as it goes: (done, total, what)
Phase = Callable[[int, int, str], None]


# -- the checks of a cell ----------------------------------------------------------------------------------


def checks_for(cell: Cell) -> list[Check]:
    """One loss-mask check per data source of the cell; equal checks (shared inputs) run once."""
    s = cell.spec
    spec = backend_of(s.backend.name).mask_spec(cell)
    if not spec.tokenizer:
        return []
    python = str(bin_dir(s) / "python")
    checks = []
    for name, ds in s.dataset.items():
        tags = tuple((k, v) for k, v in dataclasses.asdict(ds.tags).items() if v is not None)
        # the cell's cutoff_len: the probe also truncates each row as the job will
        source_spec = {**spec.sources[name], "reader": spec.reader, "cutoff_len": s.cutoff_len}
        template = TEMPLATES.get(s.model.template)
        if template is not None:
            source_spec["end_of_turn"] = template.end_of_turn
        checks.append(
            Check(
                KIND,
                f"dataset.{name}",
                dataset_source(cell, name),
                column=ds.messages,
                tags=tags,
                split=ds.split,
                backend=s.backend.name,
                python=python,
                model=spec.tokenizer,
                spec=json.dumps(source_spec, sort_keys=True, default=str),
            )
        )
    return checks


def root_causes(problems: Sequence[Problem]) -> list[Problem]:
    """A loss-mask problem is left out where a cheaper check of the same cell already names its cause (the
    tags or column of the same dataset, a template the tokenizer cannot render, a model directory that cannot load),
    and so is a template-tokens problem of a model directory that cannot load: one problem, one fix."""
    rule = f"preflight-{KIND}"
    causes = {(p.cell, p.key) for p in problems if p.rule != rule}
    # a template the tokenizer cannot render, or a model directory that cannot load: every source's probe fails
    causes |= {(p.cell, "*") for p in problems if p.rule in ("preflight-template_tokens", "preflight-model")}
    # a model directory that cannot load is also one without the tokenizer the template check reads: one problem
    unloadable = {(p.cell, str(p.value)) for p in problems if p.rule == "preflight-model"}
    return [
        p
        for p in problems
        if (p.rule != rule or not ({(p.cell, p.key), (p.cell, "*")} & causes))
        and not (p.rule == "preflight-template_tokens" and (p.cell, str(p.value)) in unloadable)
    ]


# -- running the probe -----------------------------------------------------------------------------------


@dataclass
class Probed:
    """A check's inputs as found here, or why it cannot run here."""

    check: Check
    rows: list[dict[str, Any]] = field(default_factory=list)
    model_dir: Path | None = None
    data_file: Path | None = None
    outcome: Verdict | None = None  # when the check cannot (or need not) run here
    result: dict[str, Any] | None = None  # the probe's answer


def cache_key(p: Probed) -> str:
    check = p.check
    # the key a check is reported under (a dataset's name) does not change what the backend does with its input
    parts: list[Any] = [
        replace(check, key="").to_json(),
        MASK_ROWS,
        _stat(PROBE),
        env_state(check.python),
        _stat(Path(check.python)),
    ]
    assert p.model_dir is not None and p.data_file is not None
    parts += [_stat(p.model_dir / f) for f in _TOKENIZER_FILES]
    parts.append(_stat(p.data_file))
    for jinja in json.loads(check.spec or "{}").get("templates", {}).values():
        parts.append(_stat(Path(jinja)))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def sample_rows(where: Path, column: str, limit: int, split: str, python: str) -> list[dict[str, Any]]:
    """readable.read_sample; where this process lacks pyarrow (a parquet source), the same rows read in the backend's
    environment (`python`, which has it: the backends' datasets needs it). ImportError only where that environment is
    not on this machine either (the job reads them); ValueError where it could not read them (its last line)."""
    try:
        return read_sample(where, column, limit, split)
    except ImportError:
        if not python or not Path(python).is_file():
            raise
    file = data_files(where, split)[0]
    with tempfile.TemporaryDirectory(prefix="sft_grid_rows_") as tmp:
        out = Path(tmp) / "rows.jsonl"
        proc = subprocess.run(
            [python, str(FETCHER), "parquet", str(file), column, str(limit), str(out)], capture_output=True, text=True
        )
        if proc.returncode != 0 or not out.is_file():
            last = (proc.stderr.strip().splitlines() or [f"it exited with status {proc.returncode}"])[-1]
            raise ValueError(f"the backend's environment could not read {file}: {last[:300]}")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _locate(check: Check) -> Probed:
    """Find the tokenizer, the data and the backend's venv here; otherwise say why the check waits for the job."""
    p = Probed(check)
    if not Path(check.python).is_file():
        p.outcome = Verdict(
            False,
            f"the backend's virtual environment {Path(check.python).parent.parent} is not on"
            " this machine; the check runs as the first step of the job, before training",
            unreachable=True,
        )
        return p
    for target, kind, what in ((check.model, "models", "tokenizer"), (check.target, "datasets", "dataset")):
        where = locate(target, kind)
        if where is None and is_local(target) and kind == "datasets":
            p.outcome = Verdict(True)  # a missing local data path is reported by its own path check, once
            return p
        if where is None:
            # a hub id, or a tokenizer the job prepares first (a missing model.path has its own path check)
            p.outcome = Verdict(
                False,
                f"{what} {shown_source(target)!r} is not readable from this machine; the check runs as"
                " the first step of the job, before training",
                unreachable=True,
            )
            return p
        if kind == "models":
            p.model_dir = where
    assert where is not None  # the data's location
    try:
        files = data_files(where, check.split)
        p.data_file = files[0]
        p.rows = sample_rows(where, check.column, MASK_ROWS, check.split, check.python)
    except ImportError:
        p.outcome = Verdict(False, f"reading {where} needs pyarrow, which this environment lacks", unreachable=True)
    except (OSError, ValueError) as exc:
        p.outcome = Verdict(
            False, f"cannot read a sample of {where}: {exc}", "point the dataset's source at a data file"
        )
    return p


def _job(p: Probed, job_id: str) -> dict[str, Any]:
    c = p.check
    spec = json.loads(c.spec or "{}")
    return {
        "id": job_id,
        "reader": spec.get("reader", c.backend),
        "model": str(p.model_dir),
        "rows": p.rows,
        "column": c.column,
        "tags": dict(c.tags),
        "spec": spec,
    }


def _run_probe(
    python: str,
    jobs: list[dict[str, Any]],
    variables: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """One process of the backend's environment answers every job given, and the environment's own facts
    (checks/venv_facts.py: what its transformers knows) where they are not cached yet: the model check asks them
    next, and this process has imported transformers already. Not where the cluster's variables set Python's own
    (PYTHONPATH, ...): the facts are the environment's as a plain process sees it."""
    with tempfile.TemporaryDirectory(prefix="sft_grid_mask_") as tmp:
        batch, out, facts = Path(tmp) / "batch.json", Path(tmp) / "out.json", Path(tmp) / "facts.json"
        ask = venv_facts.wanted(python) and not any(k.startswith("PYTHON") for k in variables or {})
        batch.write_text(json.dumps({"jobs": jobs, "facts": venv_facts.request(facts)} if ask else jobs, default=str))
        run_env = {
            **os.environ,
            **(variables or {}),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "AXOLOTL_DO_NOT_TRACK": "1",
            "WANDB_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
        }
        run_env["PATH"] = f"{Path(python).parent}:{run_env.get('PATH', '')}"
        STATS.subprocesses += 1
        proc = subprocess.run([python, str(PROBE), str(batch), str(out)], capture_output=True, text=True, env=run_env)
        if ask:
            venv_facts.store(python, facts)
        if proc.returncode != 0 or not out.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {
                j["id"]: {"id": j["id"], "error": f"the probe failed ({proc.returncode}): {last[:400]}"} for j in jobs
            }
        return {r["id"]: r for r in json.loads(out.read_text())}


def probe(
    checks: Iterable[Check],
    variables: Mapping[str, str] | None = None,
    use_cache: bool = True,
    on_phase: Phase | None = None,
) -> list[Probed]:
    """The probe's token data for each check (from the cache, else one process per backend venv). `on_phase` hears
    (done, total, what) as the processes start and end (only when one runs: a cached answer takes a millisecond)."""
    found = [_locate(c) for c in checks]
    todo: dict[str, list[tuple[Probed, str]]] = {}
    for p in found:
        if p.outcome is not None:
            continue
        key = cache_key(p)
        cached = cache_dir() / f"{key}.json"
        if use_cache and cached.is_file():
            try:
                p.result = json.loads(cached.read_text())
                STATS.cached += 1
                continue
            except (OSError, ValueError):
                pass
        todo.setdefault(p.check.python, []).append((p, key))
    total, done = sum(len(items) for items in todo.values()), 0
    for python, items in todo.items():
        if on_phase is not None:
            on_phase(done, total, f"{items[0][0].check.backend}'s own preprocessing of each source, one process")
        answers = _run_probe(python, [_job(p, key) for p, key in items], variables)
        done += len(items)
        if on_phase is not None:
            on_phase(done, total, f"{items[0][0].check.backend}'s own preprocessing of each source, one process")
        for p, key in items:
            p.result = answers.get(key) or {"error": "the probe gave no answer"}
            STATS.probed += 1
            if "error" not in p.result and use_cache:
                _store(cache_dir() / f"{key}.json", p.result)
    return found


def _store(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def verdict_of(p: Probed) -> Verdict:
    """A probed check's verdict: why it could not run here, the backend's failure, or the judgement of its rows."""
    if p.outcome is not None:
        return p.outcome
    if "error" in (p.result or {}):
        error = str(p.result["error"])  # type: ignore[index]
        return Verdict(False, f"the backend could not preprocess it: {error}", _probe_fix(p.check, error))
    rows = p.result["rows"]  # type: ignore[index]
    lines = row_lines(p.data_file, len(rows)) if p.data_file is not None else []
    return verdict(p.check, rows, [f"line {n} of {p.data_file}" for n in lines])


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '?([\w.]+)")


def _probe_fix(check: Check, error: str) -> str:
    """The fix for a probe that failed: where its backend's environment cannot import what the backend needs, that
    environment (install it there, or name another); otherwise the cell's fields the backend reads the rows with."""
    missing = _MISSING_MODULE.search(error)
    if missing is None:
        return "fix the cell's template, tokenizer or dataset fields so the backend reads the rows"
    module = missing.group(1)
    top = module.split(".")[0]
    # the backend's own package: what sft_grid pins (llamafactory==0.9.5); a dependency of it: by its name
    requirement = own_envs.pinned(check.backend) if top == venv_facts.BACKEND_MODULES.get(check.backend) else top
    venv = Path(check.python).parent.parent
    return (
        f"the backend's environment {venv} cannot import {module}: install it there ({check.python} -m pip install"
        f" {requirement}), or point cluster.backend_venvs.{check.backend} at an environment that has the backend"
        " and what it needs"
    )


def run_checks(
    checks: Sequence[Check],
    variables: Mapping[str, str] | None = None,
    lengths: dict[Check, tuple[int, ...]] | None = None,
    on_phase: Phase | None = None,
) -> dict[Check, Verdict]:
    """Every loss-mask check's verdict; the grid's preflight calls this once with all of them. `lengths`, when
    given, gets each probed check's token counts (the rows the backend kept): the estimates' token sample."""
    outcomes: dict[Check, Verdict] = {}
    for p in probe(checks, variables, on_phase=on_phase):
        outcome = verdict_of(p)
        if lengths is not None and p.result is not None and p.result.get("rows"):
            lengths[p.check] = tuple(int(r["n_tokens"]) for r in p.result["rows"] if not r.get("dropped"))
        if p.result is not None and "rows" in p.result and not outcome.ok:
            outcome = replace(
                outcome,
                message=f"{p.check.backend}'s own preprocessing of {len(p.result['rows'])} rows: {outcome.message}",
            )
        outcomes[p.check] = outcome
    STATS.checks += len(checks)
    return outcomes


def verdict(check: Check, rows: Sequence[Mapping[str, Any]], where: Sequence[str] = ()) -> Verdict:
    """The check's verdict from the probe's rows; a backend may train only the last assistant turn on purpose.
    `where`: each row's place in its file (`line 12 of <file>`), where known."""
    spec = json.loads(check.spec or "{}")
    judged = judge(rows, dict(check.tags), bool(spec.get("last_turn_only")), spec.get("end_of_turn"), where)
    return cutoff_verdict(rows, spec.get("cutoff_len")) if judged.ok else judged


def cutoff_verdict(rows: Sequence[Mapping[str, Any]], cutoff: int | None) -> Verdict:
    """Most rows must still train a token once the backend truncates them at the cell's cutoff_len (the probe's
    `n_trained_cut`): a cutoff that cuts the answers away trains on nothing, or on a handful of rows."""
    cut = [r for r in rows if "n_trained_cut" in r]
    empty = [r for r in cut if not r["n_trained_cut"]]
    if not cutoff or len(empty) * 2 <= len(cut):
        return Verdict(True)
    longest = max(int(r.get("n_tokens") or 0) for r in cut)
    return Verdict(
        False,
        f"cutoff_len={cutoff} leaves {len(empty)} of {len(cut)} sampled rows with no trained token (truncated as the"
        f" job truncates them, their answers are cut away or the rows dropped; the longest row has {longest} tokens)",
        f"raise cutoff_len (e.g. cutoff_len={1 << max(longest - 1, 1).bit_length()}), or train on shorter rows",
    )


def fetch_and_probe(
    check: Check,
    python: str,
    workdir: Path,
    variables: Mapping[str, str] | None = None,
) -> Verdict:
    """Job side: fetch what is not on disk with the backend's loaders, then run the same check on it."""
    if not Path(python).is_file():
        return Verdict(
            False,
            f"the backend's virtual environment has no python at {python} on this node",
            f"point cluster.backend_venvs.{check.backend} at an environment of this site, or unset it",
        )
    workdir.mkdir(parents=True, exist_ok=True)
    model, target = check.model, check.target
    fetches = []
    if locate(model, "models") is None:
        model = str(workdir / "mask_tokenizer")
        fetches.append([python, str(FETCHER), "tokenizer", check.model, model])
    if locate(target, "datasets") is None:
        target = str(workdir / f"mask_{check.key.replace('.', '_')}.jsonl")
        fetches.append(
            [python, str(FETCHER), "rows", check.target, check.split, str(min(SAMPLE_ROWS, MASK_ROWS)), target]
        )
    for argv in fetches:
        proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(variables or {})})
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return Verdict(
                False,
                f"could not read {argv[3]!r} from this node either: {last[:300]}",
                "make the input reachable from compute nodes (hub access, or a local copy in the HF cache)",
            )
    fetched = replace(check, model=model, target=target, python=python)
    return run_checks([fetched], variables)[fetched]


_THINK = re.compile(r"(<think>.*?</think>|<\|start_think\|>.*?<\|end_think\|>)", re.DOTALL)


@dataclass(frozen=True)
class RowVerdict:
    row: int
    problems: tuple[str, ...]


def _strip_think(text: str) -> str:
    return _THINK.sub("", text).strip()


def trained_text(segments: Sequence[Sequence[Any]]) -> str:
    """The trained text of a row; \\x00 between runs that are not adjacent in the sequence."""
    parts: list[str] = []
    last_trained = False
    for text, trained, _markup in segments:
        if trained:
            parts.append(text)
        elif last_trained:
            parts.append("\x00")
        last_trained = bool(trained)
    return "".join(parts)


def judge_row(row: Mapping[str, Any], last_turn_only: bool = False, end_of_turn: str | None = None) -> list[str]:
    """What is wrong with one row's mask, from the probe's token data (empty: nothing). With `end_of_turn`, the
    trained run that holds each assistant turn must go on to that token (after a tool call the turn renders, if
    any): a pad token equal to it would mask it."""
    said = f" (backend said: {'; '.join(w[:100] for w in row['warnings'][:2])})" if row.get("warnings") else ""
    if row.get("dropped"):
        return ["dropped by the backend" + said]
    if not row.get("n_trained"):
        return ["0 trained tokens" + said]
    segments = row["segments"]
    full = "".join(s[0] for s in segments)
    trained = trained_text(segments)
    problems = []
    roles = row.get("roles") or []  # not strict: a row without its raw roles names none
    unmatched = list(
        dict.fromkeys(role for (kind, _), role in zip(row["messages"], roles, strict=False) if kind == "other")
    )
    if unmatched:
        problems.append(
            f"role(s) {', '.join(map(repr, unmatched))} match no tag of the dataset (the backend renders"
            " them as they are, never as the template's user or assistant)"
        )
    if any("not trainable" in w for w in row.get("warnings") or []):
        problems.append("the backend skipped the last turn as not trainable" + said)
    rest = trained
    assistant = [c for kind, c in row["messages"] if kind == "assistant"]
    required = assistant[-1:] if last_turn_only else assistant
    for i, content in enumerate(assistant):
        text = content.strip()
        if not text:
            continue
        if text in rest:
            if content in required and not _ends_trained(rest, text):
                problems.append(f"the end of assistant turn {i + 1} is not trained (the model never learns to stop)")
            elif content in required and end_of_turn and end_of_turn not in _after(rest, text):
                problems.append(
                    f"the end-of-turn token {end_of_turn} of assistant turn {i + 1} is not trained (the model never"
                    " learns to stop; a pad token equal to it masks it)"
                )
            rest = rest.replace(text, "\x00", 1)
            continue
        plain = _strip_think(text)
        if plain and plain in rest and plain != text:
            rest = rest.replace(plain, "\x00", 1)
            problems.append(f"the think block of assistant turn {i + 1} is not trained")
        elif content not in required:
            continue
        elif text in full or (plain and plain in full):
            problems.append(f"assistant turn {i + 1} is masked (not trained): {_short(text)}")
        else:
            problems.append(f"assistant turn {i + 1} does not appear in the rendered text: {_short(text)}")
    leaked = _leak(rest, [s[0] for s in segments if s[2]])
    if leaked:
        prompt = [(kind, c.strip()) for kind, c in row["messages"] if kind in ("user", "system") and c.strip()]
        which = sorted({kind for kind, c in prompt if c in trained}) or ["template"]
        # a function call is trained as the template renders it (not verbatim): only prompt text is a leak there
        if which != ["template"] or not any(kind == "function" for kind, _ in row["messages"]):
            problems.append(f"{'/'.join(which)} text trained: {_short(leaked)}")
    return problems


def _after(rest: str, text: str) -> str:
    """The trained text that follows an assistant turn's content in the same run."""
    return rest[rest.index(text) + len(text) :].split("\x00", 1)[0]


def _ends_trained(rest: str, text: str) -> bool:
    """Whether the trained run holding an assistant turn goes on past its content: the end-of-turn token
    (or the tool call after it) is trained with it."""
    return bool(_after(rest, text).strip())


def _leak(rest: str, markup: Sequence[str]) -> str:
    """Trained text that is neither assistant content nor the template's special tokens or whitespace."""
    for token in sorted(set(markup), key=len, reverse=True):
        rest = rest.replace(token, "\x00")
    pieces = [p.strip() for p in rest.split("\x00")]
    return " | ".join(p for p in pieces if p)


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "...")


def judge(
    rows: Sequence[Mapping[str, Any]],
    tags: Mapping[str, str],
    last_turn_only: bool = False,
    end_of_turn: str | None = None,
    where: Sequence[str] = (),
) -> Verdict:
    """The verdict of a loss-mask check from the probe's rows: every row must pass. `where`: each row's place in
    its file, where known (else its position in the sample)."""
    if not rows:
        return Verdict(False, "the sample has no rows", "point the dataset at non-empty data")
    verdicts = [RowVerdict(i, tuple(judge_row(r, last_turn_only, end_of_turn))) for i, r in enumerate(rows)]
    bad = [v for v in verdicts if v.problems]
    if not bad:
        return Verdict(True)
    n = len(rows)
    zero = sum(1 for r in rows if not r.get("n_trained"))
    kinds = Counter(p.split(":")[0].split(" (")[0] for v in bad for p in v.problems)
    first = bad[0]
    summary = f"{zero}/{n} sampled rows train 0 tokens" if zero else f"{len(bad)}/{n} sampled rows are trained wrongly"
    place = where[first.row] if first.row < len(where) else f"sampled row {first.row + 1}"
    shape = row_shape(rows[first.row].get("roles") or [], tags) if rows[first.row].get("dropped") else None
    detail = f"{place}: {'; '.join(first.problems)}" + (f": {shape}" if shape else "")
    message = f"{summary} ({', '.join(f'{k}: {c}' for k, c in kinds.most_common(3))}); {detail}"
    return Verdict(False, message, _fix(rows, tags, bad, place))


def row_shape(roles: Sequence[str], tags: Mapping[str, str]) -> str | None:
    """What in a row's sequence of roles makes the backend drop it (LLaMA-Factory's sharegpt reading: a system
    turn first or none, then user and assistant turns in turn, tool results and calls in their places, an even
    count), or None."""
    user, assistant = tags.get("user_tag", "user"), tags.get("assistant_tag", "assistant")
    if user == assistant:
        return None  # the tags' fault, not the row's (the fix says so)
    if not roles:
        return "it has no messages"
    system = tags.get("system_tag")
    start = 1 if system and roles[0] == system else 0
    turns = roles[start:]
    asks = {user, tags.get("observation_tag")} - {None}
    answers = {assistant, tags.get("function_tag")} - {None}
    for k, role in enumerate(turns):
        if role not in (asks if k % 2 == 0 else answers):
            due = user if k % 2 == 0 else assistant
            what = "a second system turn (only the first message may be one)" if role == system else f"role {role!r}"
            return (
                f"message {start + k + 1} has {what} where {due!r} is due (the roles must alternate {user!r},"
                f" {assistant!r}, ...)"
            )
    if not turns:
        return f"it has no {user!r} or {assistant!r} turn"
    if len(turns) % 2:
        return f"it ends with a {turns[-1]!r} turn that no {assistant!r} turn answers"
    return None


def _fix(rows: Sequence[Mapping[str, Any]], tags: Mapping[str, str], bad: Sequence[RowVerdict], place: str = "") -> str:
    """The likeliest fix, from the role values the rows use and what went wrong."""
    if tags.get("user_tag") is not None and tags.get("user_tag") == tags.get("assistant_tag"):
        return (
            f"tags.user_tag and tags.assistant_tag are both {tags['assistant_tag']!r}: the backend cannot tell the"
            " prompt from the answer; set tags.user_tag to the role the rows' questions have (e.g. user_tag=user)"
        )
    roles = Counter(role for r in rows for role in r.get("roles") or [] if role != "None")
    # not strict: a row without its raw roles names none
    unmatched = Counter(
        role
        for r in rows
        for (kind, _), role in zip(r["messages"], r.get("roles") or [], strict=False)
        if kind == "other"
    )
    role_tag = tags.get("role_tag", "role")
    assistant_turns = sum(1 for r in rows for kind, _ in r["messages"] if kind == "assistant")
    seen = ", ".join(repr(k) for k, _ in roles.most_common(6))
    if not roles:
        return (
            f"no message of the rows has a {role_tag!r} key: set this dataset's `messages:` column and"
            " tags.role_tag/content_tag to the rows' own keys"
        )
    if not assistant_turns:
        return (
            f"role tag {role_tag!r} values seen: {seen}; none equals assistant_tag {tags.get('assistant_tag')!r}:"
            " set tags.assistant_tag (and user_tag) of this dataset to the values its rows use"
        )
    if unmatched:
        values = ", ".join(repr(k) for k in unmatched)
        return (
            f"role value(s) {values} match no tag (user_tag={tags.get('user_tag')!r},"
            f" assistant_tag={tags.get('assistant_tag')!r}, system_tag={tags.get('system_tag')!r}): set the"
            " matching tag of this dataset to them"
        )
    problems = " ".join(p for v in bad for p in v.problems)
    if "template text trained" in problems and "user" not in problems and "system" not in problems:
        return (
            "the template writes markup the tokenizer does not have as special tokens, or the backend trains"
            " template text: use the template of the model's own family (llama3 for Llama-3/Delphi, qwen3 for"
            " ChatML tokenizers)"
        )
    if "text trained" in problems:
        return (
            "the prompt is trained: use the model's own template and do not set train_on_prompt"
            " (or train_on_inputs / roles_to_train with user or system roles)"
        )
    shapes = [(v, row_shape(rows[v.row].get("roles") or [], tags)) for v in bad if rows[v.row].get("dropped")]
    shaped = [(v, shape) for v, shape in shapes if shape]
    if shaped:
        first = shaped[0][0]
        at = place if first is bad[0] and place else f"sampled row {first.row + 1}"
        return (
            f"fix or remove the rows the backend drops (the first: {at}); a row is a system turn or none, then"
            f" {tags.get('user_tag', 'user')!r} and {tags.get('assistant_tag', 'assistant')!r} turns in turn, ending"
            " with the assistant's"
        )
    return "check the template against the model's tokenizer and `sft-grid show` the cell to see what is trained"
