"""Bad input, fifth round: the commands besides `run` (cancel, status, init, cp), as a new user misuses them, and
settings that passed before but failed later (a wall time under a minute, a Hub id the Hub would not create, a
forced dry run over a finished cell). Each is refused or said in one line, before anything is written or stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sft_grid.core.layout import LEDGER_FILE, iter_cell_dirs

from .conftest import run_sft


def _grid(tmp_path):
    """A rendered grid (a dry run) and its one cell's directory."""
    runs = tmp_path / "runs"
    run_sft("-m", "model=tiny_llama", "dry_run=true", f"runs_root={runs}", check=True)
    (cell,) = iter_cell_dirs(runs / "default")
    return runs, cell


def _submitted(cell, **fields) -> None:
    """The cell's ledger as a local submission wrote it (its process, its host)."""
    event = {"event": "submitted", "executor": "local", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    (cell / LEDGER_FILE).write_text(json.dumps(event) + "\n")


# -- cancel: never a process that is not the cell's ------------------------------------------------------------


def test_cancel_signals_no_process_of_another_host_and_no_empty_pattern_cancels_the_grid(tmp_path):
    runs, cell = _grid(tmp_path)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        # the ledger names this number on another host (a grid on a shared file system): here it is someone else's
        _submitted(cell, pid=bystander.pid, host=f"not-{socket.gethostname()}")
        proc = run_sft("cancel", "default", "--runs-root", str(runs))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"not cancelled {cell.name}: it runs on not-{socket.gethostname()}" in proc.stderr, proc.stderr
        assert bystander.poll() is None  # still running
        assert "cancelled" not in (cell / LEDGER_FILE).read_text()  # nothing recorded that did not happen
        # an empty CELL (an unset shell variable) would match every cell: refused
        empty = run_sft("cancel", "default", "", "--runs-root", str(runs))
        assert empty.returncode == 2 and "an empty CELL" in empty.stderr, empty.stderr
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


def test_cancel_of_a_cell_whose_ledger_names_no_process_says_so(tmp_path):
    runs, cell = _grid(tmp_path)
    _submitted(cell)
    proc = run_sft("cancel", "default", "--runs-root", str(runs))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "its ledger names no process to stop" in proc.stderr


def test_cancel_stops_the_other_cells_where_one_ledger_is_damaged(tmp_path):
    """A ledger with a line that is not UTF-8 cannot be read whole: that cell is left, named with where it is damaged,
    its last job and the fix; the grid's other in-flight cell is still stopped (its process really signalled)."""
    runs = tmp_path / "runs"
    run_sft("-m", "model=tiny_llama", "lr=1e-5,2e-5", "dry_run=true", f"runs_root={runs}", check=True)
    good, bad = iter_cell_dirs(runs / "default")
    cell_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _submitted(good, pid=cell_proc.pid, host=socket.gethostname())
        _submitted(bad, pid=os.getpid(), host=socket.gethostname(), job_id="4242")
        with (bad / LEDGER_FILE).open("ab") as fh:
            fh.write(b"\xff\xfe broken\n")
        proc = run_sft("cancel", "default", "--runs-root", str(runs))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cancelled {good.name}" in proc.stdout and "1 cell(s) cancelled" in proc.stdout, proc.stdout
        assert cell_proc.wait(timeout=60) == -signal.SIGTERM
        said = proc.stderr
        assert f"not cancelled {bad.name}: its ledger is damaged" in said and "not UTF-8" in said, said
        assert "mend or move that file" in said and "last recorded job, 4242" in said, said
        assert b"cancelled" not in (bad / LEDGER_FILE).read_bytes()
    finally:
        cell_proc.kill()
        cell_proc.wait()


# -- a path the system refuses: one line, no traceback -----------------------------------------------------------


def test_a_path_the_system_refuses_is_one_line_in_every_command(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [
        (["status", "g" * 300, "--runs-root", str(tmp_path)], "longer than the file system takes"),
        (["cp", "model/tiny_llama", "--to", str(afile)], "Not a directory"),
        (["init", str(afile / "sub")], "Not a directory"),
    ]
    for args, said in cases:
        proc = run_sft(*args, cwd=tmp_path)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert said in proc.stdout + proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


def test_init_over_a_file_where_its_folder_goes_writes_nothing_and_can_be_run_again(tmp_path):
    repo = tmp_path / "exp"
    repo.mkdir()
    (repo / "conf").write_text("")
    proc = run_sft("init", str(repo), cwd=tmp_path)
    assert proc.returncode == 2 and f"{repo / 'conf'} is a file, where a folder goes" in proc.stderr, proc.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["conf"]  # no sft_grid.yaml that would stop the next init
    (repo / "conf").unlink()
    again = run_sft("init", str(repo), cwd=tmp_path)
    assert again.returncode == 0 and (repo / "conf" / "sweep" / "example.yaml").is_file(), again.stdout


@pytest.mark.parametrize(("name", "file"), [("..", None), (".hidden", None), ("mine.yaml", "mine.yaml")])
def test_cp_takes_only_a_name_a_cell_can_use(tmp_path, name, file):
    (tmp_path / "conf" / "model").mkdir(parents=True)
    proc = run_sft("cp", "model/tiny_llama", name, "--to", str(tmp_path / "conf"), cwd=tmp_path)
    written = sorted(p.name for p in (tmp_path / "conf" / "model").iterdir())
    if file is None:
        assert proc.returncode == 2 and "is not an option name" in proc.stderr and not written, proc.stderr
    else:
        assert proc.returncode == 0 and written == [file], (proc.stdout, written)  # not mine.yaml.yaml


# -- settings that passed before and failed later ---------------------------------------------------------------


def test_a_wall_time_under_a_minute_is_one_minute_not_no_limit(make_cells, tmp_path):
    from sft_grid.core.state import CellState, State
    from sft_grid.grid.decide import Action, Decision
    from sft_grid.grid.jobs import minutes

    (cell,) = make_cells(["time=00:00:30"])
    decision = Decision(cell=cell, dir=tmp_path, state=CellState(State.PLANNED), action=Action.RUN)
    assert minutes(decision) == 1  # Slurm reads --time=0 as no limit at all


def test_a_hub_id_the_hub_would_not_create_is_refused_and_its_fix_can_be_typed(tmp_path):
    proc = run_sft(
        "model=tiny_llama", "push_to_hub=true", "hub_model_id='örg/mödel'", "dry_run=true", f"runs_root={tmp_path}"
    )
    assert proc.returncode == 1 and "the Hub names a new repository in ASCII" in proc.stderr, proc.stderr
    fix = "hub_model_id='laion/{model}-sft-{key}'"
    assert f'"{fix}"' in proc.stderr
    typed = run_sft("model=tiny_llama", "push_to_hub=true", fix, "dry_run=true", f"runs_root={tmp_path / 'r2'}")
    assert typed.returncode == 0, typed.stderr  # the fix as printed is a valid override


@pytest.mark.parametrize(
    ("probs", "said", "fix"),
    [
        ("[1.5,-0.5]", "tiny_sharegpt (-0.5) would never be drawn", "give it a share above 0"),
        ("[0.6,0.6]", "they sum to 1.2", "mix.probs=[0.5,0.5]"),
    ],
)
def test_a_mix_probability_fix_says_what_is_wrong_and_a_mix_that_passes(make_cells, probs, said, fix):
    from sft_grid.planning.validate import mix_matches

    (cell,) = make_cells(
        ["dataset=[tiny_messages,tiny_sharegpt]", "mix.strategy=interleave_under", f"mix.probs={probs}"]
    )
    (p,) = mix_matches(cell)
    assert said in p.message and fix in p.fix, p.render()


def test_a_forced_dry_run_over_a_finished_cell_leaves_its_files_and_writes_the_rerun_beside_them(tmp_path):
    runs = tmp_path / "runs"
    grid = ["-m", "backend=synthetic", "max_steps=3", f"runs_root={runs}"]
    run_sft(*grid, check=True, timeout=300)  # a finished cell (the simulator: a second)
    (cell,) = iter_cell_dirs(runs / "default")
    before = {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()}
    dry = run_sft(*grid, "dry_run=true", "force=true", check=True, timeout=300)
    assert "aside (force=true)" in dry.stdout and ".dry_run/<cell>/" in dry.stdout, dry.stdout
    assert {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()} == before
    preview = runs / "default" / ".dry_run" / cell.name
    assert "force: true" in (preview / "cell.yaml").read_text()
    assert str(cell) in (preview / "launch.sh").read_text()  # as the rerun writes it: the cell's own directory
    assert not os.path.exists(cell / "output.old")
    # a stage asked by name that the cell does not have (no push_to_hub: no upload) is said, not read as pending
    post = run_sft("post", str(cell), "--stage", "upload")
    assert post.returncode == 1 and "upload is not a stage of this cell" in post.stderr, post.stdout + post.stderr


def test_a_report_over_a_folder_where_its_page_goes_is_one_line_and_leaves_no_copy(tmp_path):
    runs, _ = _grid(tmp_path)
    (runs / "default" / "report.html").mkdir()
    proc = run_sft("report", "default", "--runs-root", str(runs))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Is a directory" in proc.stderr, proc.stderr
    assert not list((runs / "default").glob(".report.html*"))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["logs", "g", "c", "--node", "-1"], "argument --node: -1 is below 0"),
        (["logs", "g", "c", "--lines", "0"], "argument -n/--lines: 0 is below 1"),
        (["report", "g", "--resamples", "abc"], "argument --resamples: 'abc' is not a whole number"),
        (["show", "model=tiny_llama", "--rows", "-2"], "argument --rows: -2 is below 1"),
    ],
)
def test_a_count_out_of_range_is_refused_by_the_option_that_takes_it(tmp_path, args, said):
    proc = run_sft(*args, cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
