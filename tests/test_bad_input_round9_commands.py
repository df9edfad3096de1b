"""Round 9, the commands after a run (report, logs, status, results, show) given odd but plausible arguments: a
report folder that cannot be written, a log that will never come (eval=none, a cell that is planned, failed or
pruned), a cell's path or another grid's cell for CELL, a pattern or a cell's name for GRID, a grid's directory or
several for show. One small finished grid (the replay backend: seconds), its cells then set in each state."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sft_grid.cli.main import main
from sft_grid.core import events
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import iter_cell_dirs

from .conftest import run_sft

GRID = [
    "-m",
    "backend=replay",
    "cluster=local",
    "max_steps=4",
    "+extra.replay={dataset: flan}",
    "+extra.replay.model=gpt2,t5-small",
    "+extra.replay.examples=200,800",
]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished grid of four cells under <tmp>/runs/default, then one completed, one failed before its post
    stages, one planned (never started) and one pruned; keyed by state."""
    runs = tmp_path_factory.mktemp("r9") / "runs"
    run_sft(*GRID, f"runs_root={runs}", check=True, timeout=300)
    done, failed, planned, pruned = sorted(iter_cell_dirs(runs / "default"))
    for cell in (failed, planned, pruned):
        shutil.rmtree(cell / "output")
        (cell / "logs" / "post.log").unlink()
    events.append(failed, Event(Kind.FAILED, reason="exit code 1"))
    events.append(pruned, Event(Kind.PRUNED, reason="rung 1"))
    shutil.rmtree(planned / "logs")
    (planned / "events.jsonl").unlink()
    return {"completed": done, "failed": failed, "planned": planned, "pruned": pruned}


def sft(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, err


def test_a_report_folder_that_cannot_be_written_is_said_first_with_one_that_can_and_nothing_is_half_written(
    grid: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = grid["completed"].parent
    (tmp_path / "a_file").write_text("x\n")
    rc, out, err = sft(capsys, "report", str(sweep), "--out", str(tmp_path / "a_file" / "report"))
    assert rc == 1 and not out, err
    assert f"the report cannot be written in {tmp_path}/a_file/report (Not a directory)" in err, err
    assert f"write it elsewhere: sft-grid report {sweep} --out " in err and "Nothing was written." in err, err
    # report.json a directory where --out is: neither file is written (report.html was, before)
    taken = tmp_path / "taken"
    (taken / "report.json").mkdir(parents=True)
    rc, _, err = sft(capsys, "report", str(sweep), "--out", str(taken))
    assert rc == 1 and "(Is a directory: report.json" in err, err
    assert sorted(p.name for p in taken.iterdir()) == ["report.json"]
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder refuses only others
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        rc, _, err = sft(capsys, "report", str(sweep), "--out", str(ro))
        assert rc == 1 and "(Permission denied)" in err and not list(ro.iterdir()), err
    # --out a folder that is not there yet: made, and the report there, not in the grid's directory
    rc, out, err = sft(capsys, "report", str(sweep), "--out", str(tmp_path / "new" / "report"))
    assert rc == 0 and out.split() == [f"{tmp_path}/new/report/report.html", f"{tmp_path}/new/report/report.json"]
    assert not (sweep / "report.html").exists()


def test_eval_log_of_a_grid_that_evaluates_nothing_is_refused_at_once_with_how_to_add_one(
    grid: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = grid["completed"].parent
    for state in ("completed", "failed", "planned"):
        for follow in ([], ["-f"]):
            rc, out, err = sft(capsys, "logs", str(sweep), grid[state].name, "--eval", *follow)
            assert rc == 2 and not out, err
            assert "evaluates nothing (eval=none; no cell of its grid 'default' does)" in err, err
            assert "eval=tiny" in err and "backend=replay" in err and "waits" not in err, err


@pytest.mark.parametrize(
    ("state", "which", "said"),
    [
        ("planned", [], "(the cell is planned: the grid's next `sft-grid run` starts it)"),
        ("planned", ["--post"], "(the cell is planned: the grid's next `sft-grid run` starts it)"),
        ("failed", ["--post"], "(the cell is failed, and nothing that writes it is under way: why: sft-grid status"),
        ("pruned", ["--post"], "(the cell is pruned, and nothing that writes it is under way: it was stopped at"),
    ],
)
def test_a_log_nothing_will_write_is_said_at_once_never_waited_for(
    grid: dict[str, Path], capsys: pytest.CaptureFixture[str], state: str, which: list[str], said: str
) -> None:
    sweep = grid[state].parent
    for follow in ([], ["-f"]):
        rc, out, err = sft(capsys, "logs", str(sweep), grid[state].name, *which, *follow)
        assert rc == 1 and not out and said in err, err
        assert "waits for it" not in err and "waiting" not in err, err


def test_a_cell_given_by_its_path_or_from_another_grid_is_found_or_named_with_its_grid(
    grid: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = grid["completed"]
    rc, out, _ = sft(capsys, "logs", str(cell.parent), f"{cell}/", "-n", "1")
    assert rc == 0 and out.startswith("[replay] done"), out
    other = cell.parent.parent / "other"
    other.mkdir(exist_ok=True)
    shutil.copytree(grid["failed"], other / grid["failed"].name, dirs_exist_ok=True)
    rc, _, err = sft(capsys, "logs", str(other), cell.name)
    assert rc == 1 and f"{cell.name!r} is a cell of " in err and f"runs/default, not of {other}" in err, err
    rc, _, err = sft(capsys, "logs", str(other), str(cell))
    assert rc == 1 and "is a cell of " in err and "sft-grid logs " in err and cell.name in err, err


@pytest.mark.parametrize("command", ["status", "results", "report"])
def test_a_pattern_or_a_cells_name_for_grid_says_which_grid(
    grid: dict[str, Path], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    runs = grid["completed"].parent.parent
    rc, _, err = sft(capsys, command, "def*", "--runs-root", str(runs))
    assert rc == 1 and "'def*' is a pattern, and GRID names one grid" in err and "runs/default" in err, err
    rc, _, err = sft(capsys, command, grid["failed"].name, "--runs-root", str(runs))
    assert rc == 1 and "it is a cell of the grid default, not a grid; name its grid" in err, err


def test_show_of_a_grid_or_of_several_cells_names_one_cell_and_a_cell_dir_by_its_own_name(
    grid: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cell = grid["completed"]
    rc, _, err = sft(capsys, "show", f"{cell.parent}/")
    assert rc == 1 and "is a grid's directory, not a cell's (4 cells:" in err, err
    assert f"give one of its cells, sft-grid show {cell.parent}/" in err, err
    rc, _, err = sft(capsys, "show", str(cell), str(grid["failed"]))
    assert rc == 1 and "show takes one cell's directory, and 2 were given" in err, err
    rc, out, _ = sft(capsys, "show", str(cell))
    assert rc == 0 and out.startswith(f"{cell.name}: no loss-mask probe"), out


@pytest.mark.parametrize("command", ["status", "results"])
def test_json_is_format_json(grid: dict[str, Path], capsys: pytest.CaptureFixture[str], command: str) -> None:
    rc, out, _ = sft(capsys, command, str(grid["completed"].parent), "--json")
    assert rc == 0 and json.loads(out), out


def test_an_empty_runs_root_or_an_interval_without_watch_is_refused(
    grid: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--runs-root "$RUNS"` with RUNS unset read the working folder as the runs root; `--interval 5` without
    --watch was taken and nothing waited: both are said, nothing done."""
    sweep = str(grid["completed"].parent)
    rc, _, err = sft(capsys, "status", "default", "--runs-root", "")
    assert rc == 2 and "--runs-root is empty (an unset shell variable?)" in err, err
    rc, out, err = sft(capsys, "status", sweep, "--interval", "5")
    assert rc == 2 and not out and f"add --watch (sft-grid status {sweep} --watch --interval 5)" in err, err
