"""A damaged file never makes a whole grid unreadable: `status`, `results`, `report`, `show` and `logs`, run as a
user runs them (`python -m sft_grid ...`), on a grid written the way real cells are (cells from the real renderer,
what a run leaves from tests/grid_fixture.py), with one cell's file damaged in each of its shapes: cut short at a
line's end or within one, bytes that are not UTF-8, empty, a directory where the file should be, JSON of another
kind. Each command exits without a traceback, names the damaged cell with its file and where, shows every other
cell as the undamaged grid shows it, and writes nothing (report: its page and data only). A grid or a cell that is
not there is one line naming it and what is there.

The classes of files, each in at least two shapes: cell.yaml, the ledger, the per-step trainer log of a completed
cell (ends before its last step: flagged, its final loss from trainer_state.json), the trainer's state (the state
file, output/latest), score files, estimate.json, post.json, the trainer's results (all_results.json), the grid's
own records (.site.json, adaptive.json, the steering records)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sft_grid.core.paths import PACKAGE_CONF
from sft_grid.planning.cells import plan_cell
from sft_grid.planning.compose import GridComposer

from . import grid_fixture as gf
from .conftest import run_sft

pytestmark = pytest.mark.xdist_group("damaged")  # its tests share the module's pristine grid, built once

GRID = "g"
STEPS = 100
# what a parser's own error looks like: none of it may reach a person
INTERNALS = ("Traceback", "JSONDecodeError", "UnicodeDecodeError", "ScannerError", "ParserError", "omegaconf", "yaml.")


# -- the grid ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pristine:
    root: Path  # the runs root, GRID under it
    names: list[str]  # its cells: three completed (scored, estimated), one failed
    status: dict[str, str]  # cell -> its line of `status`
    results: dict[str, dict[str, Any]]  # cell -> its row of `results --format json`, its directory left out
    report: dict[str, dict[str, Any]]  # cell -> its entry of report.json (state, step, final loss, scores)


def _compose(root: Path) -> list[Path]:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base=None):
            loader: Any = GlobalHydra.instance().config_loader()
            composed, errors = GridComposer(loader, "config").compose_all(
                [
                    [f"model={m}", f"lr={lr}", f"sweep_name={GRID}", f"runs_root={root}"]
                    for m in ("tiny_llama", "tiny_llama_m")
                    for lr in ("1e-5", "2e-5")
                ]
            )
    finally:
        GlobalHydra.instance().clear()
    assert not errors, [e.message for e in errors]
    return gf.render_cells([plan_cell(c.overrides, c.config) for c in composed])


def _rows(proc: Any) -> dict[str, str]:
    """Each cell's line of the status table, its columns' padding left out (a wider column widens them all)."""
    return {line.split()[0]: " ".join(line.split()) for line in proc.stdout.splitlines() if line.startswith("tiny_")}


def _results(proc: Any) -> dict[str, dict[str, Any]]:
    return {c["name"]: {k: v for k, v in c.items() if k != "dir"} for c in json.loads(proc.stdout)["cells"]}


def _report(root: Path) -> dict[str, dict[str, Any]]:
    data = json.loads((root / GRID / "report.json").read_text())
    keys = ("state", "step", "total_steps", "final_loss", "scores", "gpu_hours", "estimate_gpu_hours", "values")
    return {c["name"]: {k: c.get(k) for k in keys} for c in data["cells"]}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """Four cells of a 2 x 2 grid: three completed (100 steps, a score, an estimate), the fourth failed at step 3.
    Read once, whole, by each command: what every undamaged cell must still show."""
    root = tmp_path_factory.mktemp("pristine") / "runs"
    dirs = _compose(root)
    for i, d in enumerate(dirs):
        if i == len(dirs) - 1:
            gf.run(d, "failed", gf.curve(STEPS, 1.7)[:3], STEPS, start=gf.T0 + 1000 * i, seconds=30.0)
            continue
        gf.run(d, "completed", gf.curve(STEPS, 1.5 + i / 10), STEPS, start=gf.T0 + 1000 * i, seconds=360.0)
        gf.score(d, "tiny_mc", {"acc,none": 0.5 + i / 10, "acc_stderr,none": 0.03})
        gf.estimate(d, 2e5, 6000, STEPS, gpu_hours=0.125)
    status = run_sft("status", GRID, "--runs-root", str(root), check=True)
    results = run_sft("results", GRID, "--runs-root", str(root), "--format", "json", check=True)
    report_root = tmp_path_factory.mktemp("pristine_report") / "runs"
    shutil.copytree(root, report_root)
    run_sft("report", GRID, "--runs-root", str(report_root), "--resamples", "0", check=True)
    return Pristine(root, [d.name for d in dirs], _rows(status), _results(results), _report(report_root))


@pytest.fixture
def grid(pristine: Pristine, tmp_path: Path) -> Path:
    """A copy of the pristine grid's runs root, to damage."""
    shutil.copytree(pristine.root, tmp_path / "runs")
    return tmp_path / "runs"


def files(root: Path) -> dict[str, tuple[str, str]]:
    """Every file and directory under `root`, with its content's digest: what a read command must leave as it is."""
    out = {}
    for where, dirnames, names in os.walk(root):
        for n in dirnames:
            out[os.path.join(where, n)] = ("dir", "")
        for n in names:
            p = os.path.join(where, n)
            out[p] = ("file", hashlib.sha256(Path(p).read_bytes()).hexdigest())
    return out


def read_only(root: Path, *args: str, allowed: tuple[str, ...] = ()) -> Any:
    """`python -m sft_grid <args> --runs-root <root>`: checked to exit without a traceback or a parser's words, and
    to write nothing (but the files named `allowed`)."""
    before = files(root)
    proc = run_sft(*args, "--runs-root", str(root), timeout=120)
    after = files(root)
    changed = sorted(p for p in {*before, *after} if before.get(p) != after.get(p) and Path(p).name not in allowed)
    assert not changed, f"{args[0]} wrote {changed}"
    said = proc.stdout + proc.stderr
    assert not any(w in said for w in INTERNALS), said
    return proc


# -- the damages --------------------------------------------------------------------------------------------------


def cut_bytes(path: Path, share: float) -> None:
    """Keep the first `share` of the file, cut inside a line and a character: where that point falls just after a
    newline (it depends on how long the paths in the file are, so on the machine) it moves on to the next byte."""
    data = path.read_bytes()
    at = int(len(data) * share)
    while 0 < at < len(data) and (data[at - 1] == ord("\n") or 0x80 <= data[at] < 0xC0):
        at += 1
    assert 0 < at < len(data), f"no place to cut {path} within a line"
    path.write_bytes(data[:at])


def keep_lines(path: Path, n: int) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:n]))


def insert(path: Path, at: int, data: bytes) -> None:
    old = path.read_bytes()
    path.write_bytes(old[:at] + data + old[at:])


def as_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


def only(path: Path, text: str) -> None:
    path.write_text(text)


def each_score(cell: Path, damage: Callable[[Path], None]) -> None:
    for path in (cell / "eval").glob("*.json"):
        damage(path)


def zero_shards(cell: Path) -> None:
    """Final weights as ZeRO shards named by output/latest (whose name is not UTF-8)."""
    (cell / "output" / "model.safetensors").unlink()
    (cell / "output" / "latest").write_bytes(b"\xfe\xff")


def no_log(cell: Path) -> Path:
    """The cell without its per-step log (its state then comes from trainer_state.json)."""
    (cell / "output" / "trainer_log.jsonl").unlink()
    return cell / "output" / "trainer_state.json"


@dataclass(frozen=True)
class Shape:
    """One damage of one cell: what it does, what the commands must say of the cell (a text each damaged line
    holds), and how the cell then shows: `damaged` (it cannot be read as what it is), or its state with a flag."""

    id: str
    damage: Callable[[Path], Any]
    says: str  # "<file>: <what>", as the damaged-files line says it
    state: str  # the state column of `status` and `results`
    report: bool = False  # also run `report` on it (one shape of each class: the page is slower to write)


SHAPES = [
    # cell.yaml: the cell's config
    Shape("yaml-cut-mid-line", lambda c: cut_bytes(c / "cell.yaml", 0.4), "cell.yaml: ends within line", "damaged"),
    Shape(
        "yaml-cut-at-line",
        lambda c: keep_lines(c / "cell.yaml", 12),
        "cell.yaml: ends at line 12, before `backend` (cut short?)",
        "damaged",
        report=True,
    ),
    Shape(
        "yaml-not-utf8",
        lambda c: insert(
            c / "cell.yaml", len("".join((c / "cell.yaml").read_text().splitlines(True)[:6])), b"\xff\xfe"
        ),
        "cell.yaml: line 7 is not UTF-8 (byte 0xff at byte",
        "damaged",
    ),
    Shape("yaml-empty", lambda c: only(c / "cell.yaml", ""), "cell.yaml: empty", "damaged"),
    Shape(
        "yaml-not-yaml", lambda c: only(c / "cell.yaml", "model: {name: [x\n"), "cell.yaml: not YAML at line", "damaged"
    ),
    Shape("yaml-a-directory", lambda c: as_directory(c / "cell.yaml"), "cell.yaml: a directory, not a file", "damaged"),
    Shape("yaml-missing", lambda c: (c / "cell.yaml").unlink(), "cell.yaml: missing", "damaged"),
    # the ledger
    Shape(
        "ledger-not-utf8",
        lambda c: insert(c / "events.jsonl", 150, b"\xc3\x28"),
        "events.jsonl: line 2 is not UTF-8 (byte 0xc3 at byte 150)",
        "damaged",
        report=True,
    ),
    Shape(
        "ledger-latin1",
        lambda c: insert(c / "events.jsonl", 0, '{"event": "running", "note": "é"}\n'.encode("latin-1")),
        "events.jsonl: line 1 is not UTF-8 (byte 0xe9",
        "damaged",
    ),
    Shape(
        "ledger-line-not-json",
        lambda c: insert(c / "events.jsonl", 0, b'{"time": "2026-12-01T00:00:00", "ev\n'),
        "events.jsonl: line 1 is not JSON",
        "damaged",
    ),
    Shape(
        "ledger-line-a-list",
        lambda c: insert(c / "events.jsonl", 0, b"[1, 2]\n"),
        "events.jsonl: line 1 is not an event",
        "damaged",
    ),
    Shape("ledger-a-directory", lambda c: as_directory(c / "events.jsonl"), "events.jsonl: a directory", "damaged"),
    # the per-step log of a completed training
    Shape(
        "log-cut-at-line",
        lambda c: keep_lines(c / "output" / "trainer_log.jsonl", 10),
        "output/trainer_log.jsonl: ends at step 10 of 100 (cut short?)",
        "completed, log ends at step 10 of 100",
        report=True,
    ),
    Shape(
        "log-cut-mid-line",
        lambda c: cut_bytes(c / "output" / "trainer_log.jsonl", 0.5),
        "output/trainer_log.jsonl: its last line is cut short",
        "completed, log cut short",
    ),
    Shape(
        "log-not-utf8",
        lambda c: insert(c / "output" / "trainer_log.jsonl", 4000, b"\xff"),
        "output/trainer_log.jsonl: not UTF-8 at byte 4000",
        "completed, log damaged",
    ),
    Shape(
        "log-empty",
        lambda c: only(c / "output" / "trainer_log.jsonl", ""),
        "output/trainer_log.jsonl: empty",
        "completed, log empty",
    ),
    Shape(
        "log-a-directory",
        lambda c: as_directory(c / "output" / "trainer_log.jsonl"),
        "output/trainer_log.jsonl: a directory",
        "completed, no log",
    ),
    # the trainer's state, which says whether the output is complete
    Shape(
        "state-cut",
        lambda c: cut_bytes(no_log(c), 0.5),
        "output/trainer_state.json: not JSON at line",
        "damaged",
        report=True,
    ),
    Shape(
        "state-not-utf8",
        lambda c: insert(no_log(c), 10, b"\xff"),
        "output/trainer_state.json: line 2 is not UTF-8 (byte 0xff at byte 10)",
        "damaged",
    ),
    Shape(
        "state-a-directory",
        lambda c: as_directory(c / "output" / "trainer_state.json"),
        "output/trainer_state.json: a directory, not a file",
        "damaged",
    ),
    Shape(
        "latest-not-utf8",
        zero_shards,
        "output/latest: line 1 is not UTF-8",
        "damaged",
    ),
]
# files a cell's row reads beside its state: the cell keeps its state, the column they feed says `damaged`
RESULTS_SHAPES = [
    Shape(
        "score-cut",
        lambda c: each_score(c, lambda p: cut_bytes(p, 0.5)),
        "eval/tiny_mc-",
        "completed",
        report=True,
    ),
    Shape(
        "score-not-utf8",
        lambda c: each_score(c, lambda p: insert(p, 5, b"\xff")),
        "line 1 is not UTF-8 (byte 0xff at byte 5)",
        "completed",
    ),
    Shape(
        "score-without-metrics",
        lambda c: each_score(c, lambda p: only(p, '{"task": "tiny_mc", "metrics": [0.5]}')),
        "holds no metrics",
        "completed",
    ),
    Shape("estimate-cut", lambda c: cut_bytes(c / "estimate.json", 0.5), "estimate.json: not JSON", "completed"),
    Shape(
        "estimate-a-list",
        lambda c: only(c / "estimate.json", "[1, 2]"),
        "estimate.json: not a JSON object (it holds a list)",
        "completed",
        report=True,
    ),
]


def _pairs(shapes: list[Shape]) -> list[tuple[Shape, Shape]]:
    """The shapes two at a time: each pair damages two cells of one grid, the other two stay whole (one read of the
    grid by each command tests two shapes; a single shape left over is paired with the first)."""
    padded = shapes + shapes[:1] if len(shapes) % 2 else shapes
    return [(padded[i], padded[i + 1]) for i in range(0, len(padded), 2)]


VICTIMS = (1, 0)  # the damaged cells: completed, scored and estimated; 2 (completed) and 3 (failed) stay whole


def _others_as_before(pristine: Pristine, got: dict[str, Any], expected: dict[str, Any], damaged: int = 2) -> None:
    victims = {pristine.names[i] for i in VICTIMS[:damaged]}
    for name in pristine.names:
        if name not in victims:
            assert got.get(name) == expected[name], name


def _damage(grid: Path, pristine: Pristine, shapes: tuple[Shape, ...]) -> list[Path]:
    cells = [grid / GRID / pristine.names[i] for i in VICTIMS[: len(shapes)]]
    for shape, cell in zip(shapes, cells, strict=True):
        shape.damage(cell)
    return cells


# -- status, results, report -------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", _pairs(SHAPES), ids=lambda p: "+".join(s.id for s in p))
def test_status_and_results_show_the_damaged_cells_and_every_other(
    pristine: Pristine, grid: Path, pair: tuple[Shape, Shape]
):
    cells = _damage(grid, pristine, pair)

    status = read_only(grid, "status", GRID)
    assert status.returncode == 0, status.stderr
    rows = _rows(status)
    results = read_only(grid, "results", GRID, "--format", "json")
    assert results.returncode == 0, results.stderr
    found = _results(results)
    for shape, cell in zip(pair, cells, strict=True):
        assert rows[cell.name].split()[1 : 1 + len(shape.state.split())] == shape.state.split(), rows[cell.name]
        assert f"  {cell.name}: {shape.says}" in status.stdout, status.stdout  # a line per damaged file
        row = found[cell.name]
        assert row["state"] == shape.state.split(",")[0]
        assert any(shape.says in d for d in row["damaged"]), row["damaged"]
        assert f"{cell.name}: {shape.says}" in results.stderr
        if shape.state == "damaged":  # never a final loss of a cell that cannot be read
            assert row["final_loss"] is None
        elif shape.state.startswith("completed, log"):  # the trainer's own, never the damaged log's
            assert row["final_loss"] in (pristine.results[cell.name]["final_loss"], None)
    _others_as_before(pristine, rows, pristine.status)
    _others_as_before(pristine, found, pristine.results)


@pytest.mark.parametrize("pair", _pairs(RESULTS_SHAPES), ids=lambda p: "+".join(s.id for s in p))
def test_a_damaged_score_or_estimate_is_damaged_in_its_column(
    pristine: Pristine, grid: Path, pair: tuple[Shape, Shape]
):
    cells = _damage(grid, pristine, pair)
    proc = read_only(grid, "results", GRID)
    assert proc.returncode == 0, proc.stderr
    lines = {x.split()[0]: x for x in proc.stdout.splitlines() if x.startswith("tiny_")}
    listed = proc.stdout.split("damaged files:", 1)[1]
    for shape, cell in zip(pair, cells, strict=True):
        assert lines[cell.name].split()[3] == "completed" and "damaged" in lines[cell.name].split()[4:]
        assert f"{cell.name}: " in listed and shape.says in listed, proc.stdout
    for name in pristine.names[2:]:  # the others: their scores and estimates as ever
        assert "damaged" not in lines[name], lines[name]
    _others_as_before(pristine, _results(read_only(grid, "results", GRID, "--format", "json")), pristine.results)


REPORTED = [s for s in SHAPES + RESULTS_SHAPES if s.report]


@pytest.mark.parametrize("pair", _pairs(REPORTED), ids=lambda p: "+".join(s.id for s in p))
def test_the_report_is_written_with_the_damaged_cells_on_it(pristine: Pristine, grid: Path, pair: tuple[Shape, Shape]):
    cells = _damage(grid, pristine, pair)
    proc = read_only(grid, "report", GRID, "--resamples", "0", allowed=("report.html", "report.json"))
    assert proc.returncode == 0, proc.stderr
    data = {c["name"]: c for c in json.loads((grid / GRID / "report.json").read_text())["cells"]}
    page = (grid / GRID / "report.html").read_text()
    listed = page.split('id="damaged"', 1)[1]
    for shape, cell in zip(pair, cells, strict=True):
        assert f"{cell.name}: " in proc.stderr and shape.says in proc.stderr, proc.stderr
        assert data[cell.name]["state"] == shape.state.split(",")[0]
        assert any(shape.says in d for d in data[cell.name]["damaged"])
        assert cell.name in listed
        if "," in shape.state:
            assert shape.state in page  # "completed, log ends at step 10 of 100" on the cell's badge
    _others_as_before(pristine, _report(grid), pristine.report)


def test_a_completed_cell_whose_log_ends_early_says_so_in_the_results_table(pristine: Pristine, grid: Path):
    """The user's case: a completed cell at 10 of 100 steps is never shown as a whole run: its state says where the
    log ends, and its final loss is the trainer's own (trainer_state.json), not the cut log's."""
    victim = grid / GRID / pristine.names[VICTIMS[0]]
    keep_lines(victim / "output" / "trainer_log.jsonl", 10)
    proc = read_only(grid, "results", GRID)
    line = next(x for x in proc.stdout.splitlines() if x.startswith(victim.name))
    assert "completed, log ends at step 10 of 100" in line and "10/100" in line
    final = pristine.results[victim.name]["final_loss"]
    assert f"{final:.4g}" in line.split()  # trainer_state.json's, the same as the whole log's
    assert "1 damaged file(s)" in proc.stdout
    # and where the trainer's state cannot say it either, there is no final loss at all
    (victim / "output" / "trainer_state.json").write_text('{"global_step": 100, "max_steps": 100}')
    cells = _results(read_only(grid, "results", GRID, "--format", "json"))
    assert cells[victim.name]["final_loss"] is None and cells[victim.name]["state"] == "completed"


def test_a_damaged_post_json_is_damaged_in_the_post_column(pristine: Pristine, grid: Path):
    a, b = (grid / GRID / pristine.names[i] for i in VICTIMS)
    cut_bytes(a / "post.json", 0.5)
    only(b / "post.json", "[]")
    proc = read_only(grid, "status", GRID)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc)
    for cell, says in ((a, "post.json: not JSON at line"), (b, "post.json: not a JSON object (it holds a list)")):
        assert rows[cell.name].split()[1] == "completed" and "damaged" in rows[cell.name].split()[2:]
        assert f"{cell.name}: {says}" in proc.stdout
    _others_as_before(pristine, rows, pristine.status)


def test_a_damaged_trainer_results_file_is_said_by_the_report(pristine: Pristine, grid: Path):
    a, b = (grid / GRID / pristine.names[i] for i in VICTIMS)
    cut_bytes(a / "output" / "all_results.json", 0.5)
    (b / "output" / "all_results.json").unlink()
    (b / "output" / "train_results.json").write_bytes(b'{"tr\xffain_runtime": 288.0}')
    proc = read_only(grid, "report", GRID, "--resamples", "0", allowed=("report.html", "report.json"))
    assert proc.returncode == 0, proc.stderr
    assert f"{a.name}: output/all_results.json: not JSON at line 1 (cut short?)" in proc.stderr, proc.stderr
    assert f"{b.name}: output/train_results.json: line 1 is not UTF-8 (byte 0xff at byte 4)" in proc.stderr
    _others_as_before(pristine, _report(grid), pristine.report)


# -- the grid's own records --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "records",
    [
        {
            ".site.json": (b'{"sites": [{"site": {"name": "x"', "not JSON at line 1 (cut short?)"),
            ".sft_grid_prune.jsonl": (b'{"bracket": "a"}\n{"bracket": \xff\n', "line 2 is not UTF-8"),
        },
        {
            ".site.json": (b'{"sites": \xff}', "line 1 is not UTF-8 (byte 0xff at byte 10)"),
            "adaptive.json": (b'{"round": 1, "holdouts": [', "not JSON at line 1 (cut short?)"),
        },
        {
            ".sft_grid_adaptive.jsonl": (b'{"round": 1, "cho\n{"round": 2}\n', "line 1 is not JSON"),
            "adaptive.json": (b"[1, 2]", "not a JSON object (it holds a list)"),
        },
    ],
    ids=["site-cut+prune-not-utf8", "site-not-utf8+adaptive-cut", "steering-line-not-json+adaptive-a-list"],
)
def test_a_damaged_record_of_the_grid_is_said_once_and_the_grid_read(
    pristine: Pristine, grid: Path, records: dict[str, tuple[bytes, str]]
):
    for name, (content, _) in records.items():
        (grid / GRID / name).write_bytes(content)
    status = read_only(grid, "status", GRID)
    results = read_only(grid, "results", GRID, "--format", "json")
    assert status.returncode == 0 and results.returncode == 0, status.stderr + results.stderr
    for name, (_, says) in records.items():
        for said in (status.stdout + status.stderr, results.stderr):  # (json: the data says it too, as "damaged")
            assert f"{name}: {says}" in said and said.count(f"{name}: ") == 1, said
    assert _rows(status) == pristine.status  # every cell read as ever, here
    assert _results(results) == pristine.results


# -- show, logs, and what is not there ---------------------------------------------------------------------------


SHOWN = ("yaml-cut-mid-line", "yaml-cut-at-line", "yaml-not-utf8", "yaml-a-directory", "yaml-missing")


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.id in SHOWN], ids=lambda s: s.id)
def test_show_of_a_cell_whose_config_is_damaged_says_it_in_one_line(pristine: Pristine, grid: Path, shape: Shape):
    victim = grid / GRID / pristine.names[VICTIMS[0]]
    shape.damage(victim)
    before = files(grid)
    proc = run_sft("show", str(victim), timeout=120)
    assert files(grid) == before
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and str(victim) in lines[0], proc.stderr
    if shape.id != "yaml-missing":
        assert shape.says in lines[0]
    else:
        assert "is not a cell's directory (it has no cell.yaml)" in lines[0]
    assert not any(w in proc.stderr for w in INTERNALS)


def test_a_grid_or_cell_that_is_not_there_is_one_line_naming_what_is(pristine: Pristine, grid: Path):
    for command in ("status", "results", "report", "logs"):
        args = [command, "gg", *(["419d"] if command == "logs" else [])]
        proc = read_only(grid, *args)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f"no cells under {grid / 'gg'}: there is no grid 'gg'; did you mean 'g'?" in proc.stderr
        assert not (grid / "gg").exists()
    proc = read_only(grid / "nowhere", "results", GRID)
    assert proc.returncode == 1 and f"there is no runs root {grid / 'nowhere'}" in proc.stderr
    cell = grid / GRID / pristine.names[VICTIMS[0]]
    proc = run_sft("show", str(cell) + "x", timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"no cell directory {cell}x; did you mean" in proc.stderr and cell.name in proc.stderr
    proc = run_sft("show", "model=no_such_model", timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_logs_of_a_damaged_cell_print_its_log_and_say_its_state(pristine: Pristine, grid: Path):
    victim = grid / GRID / pristine.names[VICTIMS[0]]
    insert(victim / "events.jsonl", 150, b"\xc3\x28")
    (victim / "logs").mkdir()
    (victim / "logs" / "train.log").write_bytes(b"step 1\n\xff\xfe not UTF-8\nstep 2\n")
    proc = read_only(grid, "logs", GRID, victim.name)
    assert proc.returncode == 0 and "step 1" in proc.stdout and "step 2" in proc.stdout, proc.stderr
    (victim / "cell.yaml").unlink()  # still found by its name; its state said as damaged
    proc = read_only(grid, "logs", GRID, victim.name, "--eval")
    assert proc.returncode == 1 and "the cell is damaged: cell.yaml: missing" in proc.stderr, proc.stderr


# -- the readers, in process -------------------------------------------------------------------------------------


def test_the_ledger_reader_keeps_its_contract_and_scan_names_the_line(tmp_path: Path):
    from sft_grid.core import events
    from sft_grid.core.cellfiles import DamagedFile

    (tmp_path / "events.jsonl").write_bytes(b'{"event": "submitted"}\n{"event": "runn')  # a torn last line
    found = events.scan(tmp_path)
    assert [e.kind.value for e in found.events] == ["submitted"] and found.damage is None
    assert events.read(tmp_path) == found.events
    (tmp_path / "events.jsonl").write_bytes(b'{"event": "submitted"}\n{"event": "runn\n{"event": "running"}\n')
    found = events.scan(tmp_path)  # a line cut within the file: the others read, the line named
    assert [e.kind.value for e in found.events] == ["submitted", "running"]
    assert found.damage is not None and found.damage.text() == "events.jsonl: line 2 is not JSON"
    assert events.read(tmp_path) == found.events  # (read leaves such a line out, as it always has)
    (tmp_path / "events.jsonl").write_bytes(b'{"event": "submitted", "note": "\xff"}\n')
    with pytest.raises(ValueError, match="line 1 is not UTF-8") as raised:  # what acts on a ledger never acts on part
        events.read(tmp_path)
    assert isinstance(raised.value, DamagedFile)


def test_the_grid_records_checked_are_the_ones_their_writers_write():
    from sft_grid.adaptive import halving, steer
    from sft_grid.analysis.report_data import ADAPTIVE_FILE
    from sft_grid.analysis.view import GRID_RECORDS

    assert [name for name, _ in GRID_RECORDS] == [ADAPTIVE_FILE, halving.RECORD_FILE, steer.RECORD_FILE]


def test_a_cut_rendered_cell_yaml_is_told_from_a_whole_one_without_parsing_it(pristine: Pristine, tmp_path: Path):
    from sft_grid.core.cellfiles import ALWAYS_KEYS, CellYaml, cut_short

    cell = pristine.root / GRID / pristine.names[0]
    text = (cell / "cell.yaml").read_text()
    assert cut_short(text, None) == "" and CellYaml.damage(cell) is None
    assert all(f"\n{k}:" in text for k in ALWAYS_KEYS)
    lines = text.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith("rerun_failed:"))
    assert cut_short("".join(lines[:last]), None) == f"ends at line {last}, before `rerun_failed` (cut short?)"
    # a file written by hand (no header) is only parsed: `{}` is a config
    (tmp_path / "cell.yaml").write_text("{}\n")
    assert CellYaml.damage(tmp_path) is None


def test_every_format_of_results_carries_the_damage(pristine: Pristine, grid: Path):
    """csv gets a `damaged` column (only where some cell has a damaged file), markdown the flag beside the state,
    json a line per damaged file; a cell.yaml damaged past its header still gives the cell's swept values."""
    from sft_grid.analysis.table import read_table
    from sft_grid.cli.cmd_results import render

    a, b = (grid / GRID / pristine.names[i] for i in VICTIMS)
    keep_lines(a / "output" / "trainer_log.jsonl", 10)
    insert(b / "cell.yaml", len("".join((b / "cell.yaml").read_text().splitlines(True)[:6])), b"\xff")
    table = read_table(grid / GRID)
    rows = {r["cell"]: r for r in csv.DictReader(io.StringIO(render(table, "csv")))}
    assert rows[a.name]["state"] == "completed" and "ends at step 10 of 100" in rows[a.name]["damaged"]
    assert rows[b.name]["state"] == "damaged" and rows[b.name]["damaged"].startswith("cell.yaml: line 7 is not UTF-8")
    assert rows[b.name]["model"] == "tiny_llama" and rows[b.name]["lr"] == "1e-5"  # from its header
    assert all(rows[n]["damaged"] == "" for n in pristine.names[2:])
    assert "| completed, log ends at step 10 of 100 | 10/100 |" in render(table, "markdown")
    cells = {c["name"]: c for c in json.loads(render(table, "json"))["cells"]}
    assert cells[b.name]["damaged"] == [rows[b.name]["damaged"]]
    assert "damaged" not in render(read_table(pristine.root / GRID), "csv").splitlines()[0]
