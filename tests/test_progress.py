"""The first seconds of a grid: the plan is on the screen before any check that needs a backend, each long
phase says how far it is, and a local cell that alone needs its tokenization tokenizes in its own job (no backend
process of its own before it). Pure or dry runs: no backend runs here."""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

from sft_grid.cli.live import Live
from sft_grid.core.layout import Progress
from sft_grid.core.state import CellState, State
from sft_grid.core.submission import LocalJob, Role
from sft_grid.grid import flow
from sft_grid.planning.compose import GridComposer
from sft_grid.stages import tokenize

from .conftest import run_sft


class Recorder(flow.Observer):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def planned(self, cells, counts):
        self.calls.append(("planned", cells, dict(counts)))

    def phase(self, name, done, total, detail=""):
        self.calls.append(("phase", name, done, total))


def test_the_plan_is_told_before_any_check(hydra_loader, tmp_path, monkeypatch):
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "cache"))  # nothing cached: the probe would run
    import sft_grid.grid.flow as flow_module

    seen: list[str] = []
    real = flow_module.preflight
    monkeypatch.setattr(
        flow_module, "preflight", lambda cells, on_phase=None, **kw: seen.append("preflight") or real([], on_phase)
    )
    composer = GridComposer(hydra_loader, "config")
    composed, errors = composer.compose_all(
        [["model=tiny_llama", f"seed={s}", f"runs_root={tmp_path / 'runs'}", "dry_run=true"] for s in (1, 2, 3)]
    )
    recorder = Recorder()

    def planned(cells, counts):
        recorder.calls.append(("planned", cells, dict(counts)))
        seen.append("planned")

    recorder.planned = planned
    flow.run(composed, errors, recorder)
    assert seen[:2] == ["planned", "preflight"]
    assert recorder.calls[0] == ("planned", 3, {"to run": 3})


def test_a_log_gets_one_line_per_step_and_a_terminal_line_is_left_alone():
    stream = io.StringIO()
    live = Live(stream, every_s=0, beat_s=0)  # no heartbeat here (its own test is below)
    live.phase("tokenizing", 0, 2, "a")
    live.phase("tokenizing", 1, 2, "a: done")
    live.phase("tokenizing", 2, 2, "b: done")
    lines = stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "  tokenizing: 0/2 a",
        "  tokenizing: 1/2 a: done",
        "  tokenizing: 2/2 b: done",
    ]
    assert all(line.endswith(" s)") for line in lines)  # the time so far
    job = LocalJob(Role.TRAIN, Path("/x/c1"), "c1", 60)
    for step, loss in ((None, None), (1, 6.9), (1, 6.9), (2, 6.8)):
        live.cells({job: CellState(state=State.RUNNING, progress=Progress(step, 4, loss))})
    cell_lines = stream.getvalue().splitlines()[3:]
    assert [line.split(" (")[0] for line in cell_lines] == [
        "  training c1: no step yet starting",
        "  training c1: step 1/4 loss 6.9",
        "  training c1: step 2/4 loss 6.8",
    ]


class Said(io.StringIO):
    """A log's stream that tells each line written to it (a test waits on it, not on the clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        with self.changed:
            self.lines += [line for line in text.splitlines() if line]
            self.changed.notify_all()
        return super().write(text)

    def wait_for(self, test, what: str, budget_s: float = 60) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: test(self.lines), budget_s), f"no {what} in {self.lines}"


def test_a_log_hears_a_heartbeat_while_a_phase_or_a_cell_is_silent_and_what_the_command_does_between():
    """A log or a pipe hears at least every 3 s while the command works, with what and for how long."""
    stream = Said()
    live = Live(stream, beat_s=0.3)
    live.note("grid of 2 cell(s) (2 to run): checking every cell", doing="checking and planning the grid")
    stream.wait_for(lambda lines: len(lines) >= 2, "heartbeat with no line open")
    assert re.fullmatch(r"  checking and planning the grid \(\d+\.\d s\)", stream.lines[1]), stream.lines
    live.phase("checks", 0, 2, "llamafactory's own preprocessing of each source, one process")
    stream.wait_for(lambda lines: len(lines) >= 5, "two heartbeats of the open phase")
    beats = stream.lines[3:5]
    assert all(b.startswith("  checks: 0/2 llamafactory's own preprocessing") and b.endswith(" s)") for b in beats)
    said = [float(b.rsplit("(", 1)[1].split(" ")[0]) for b in beats]
    assert 0 < said[0] < said[1]  # for how long, growing
    live.phase("checks", 2, 2, "done")
    job = LocalJob(Role.TRAIN, Path("/x/c1"), "c1", 60)
    live.cells({job: CellState(State.RUNNING, progress=Progress(None, 4, None))})
    n = len(stream.lines)
    stream.wait_for(lambda lines: len(lines) >= n + 1, "a heartbeat of the starting cell")
    assert stream.lines[n].startswith("  training c1: no step yet starting (")
    live.stop()
    assert live.beats >= 4


def test_a_local_cell_alone_on_its_data_tokenizes_in_its_own_job(make_cells):
    alone, *pair = make_cells(["model=tiny_qwen3"], ["model=tiny_llama", "seed=1"], ["model=tiny_llama", "seed=2"])
    planned = tokenize.plan([alone, *pair])
    assert not tokenize.worth_a_job(planned[alone.name], [alone])
    assert tokenize.worth_a_job(planned[pair[0].name], pair)  # two cells load one tokenization
    (on_slurm,) = make_cells(["model=tiny_qwen3", "cluster=slurm_local"])
    assert tokenize.worth_a_job(tokenize.plan([on_slurm])[on_slurm.name], [on_slurm])  # off the GPU node
    (two_nodes,) = make_cells(["model=tiny_qwen3", "nodes=2", "global_batch_size=16"])
    assert tokenize.worth_a_job(tokenize.plan([two_nodes])[two_nodes.name], [two_nodes])  # every rank would


def test_a_local_dry_run_plans_no_tokenize_job_for_a_cell_alone_and_says_nothing_is_deferred(tmp_path, tiny_assets):
    proc = run_sft("-m", "model=tiny_llama,tiny_qwen3", "lr=4e-5", "dry_run=true", f"runs_root={tmp_path}", check=True)
    assert "local: 2 train" in proc.stdout and "tokenize" not in proc.stdout.split("submission plan", 1)[1]
    assert "deferred to the job's first step" not in proc.stdout
    # said first, on stderr with the other progress lines: stdout is the plan alone
    assert proc.stderr.splitlines()[0].startswith("grid of 2 cell(s) (2 to run)")
    assert "grid of" not in proc.stdout and proc.stdout.startswith("cell ")
    shared = run_sft("-m", "model=tiny_llama", "seed=1,2", "dry_run=true", f"runs_root={tmp_path / 'b'}", check=True)
    assert "local: 1 tokenize, 2 train" in shared.stdout
    # what a job builds before the cells is built by this command here: not a check "deferred to the job"
    assert "the shared tokenized dataset is built" not in shared.stdout
