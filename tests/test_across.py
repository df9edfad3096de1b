"""One view of a grid across remote sites (read by sites/merged.py, printed by cli/across.py), each "site" a directory
of this machine reached through the local transport: every site runs the real `sft-grid status --format json`, `cancel`
and the pull from its code (this checkout), as it would over ssh. The grid's cells are written as their runs leave them
(tests/grid_fixture.py) over cells the real renderer wrote: cell 0 completed on site a; cell 1 queued on a, moved (a's
copy failed, with its move journal, and later than b's run) and completed on b; cell 2 failed on b. The same grid on one
site holds the three as the spread grid's chosen copies."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from sft_grid.cli import across, cmd_results
from sft_grid.core.paths import REPO_ROOT
from sft_grid.sites import merged, remote
from sft_grid.sites.merged import Copy, choose
from sft_grid.sites.moves import MOVE_FILE
from sft_grid.sites.remote import Placed, Site, write_record
from sft_grid.sites.transport import Local, SiteTimeout, SiteUnreachable, Transport

from . import grid_fixture as gf

SWEEP = "g"
LATER = gf.T0 + 3600  # a's failed copy of cell 1 is later than b's completed one


@dataclass
class Spread:
    here: Path  # the runs root here (the record)
    one: Path  # the runs root of the same grid on one site
    placed: list[Placed]
    cells: list[str]

    @property
    def grid_here(self) -> Path:
        return self.here / SWEEP


def _site(tmp: Path, name: str) -> Site:
    return Site(name, f"{name}.example", str(tmp / name), sys.executable, None, str(tmp / name / "runs"))


@pytest.fixture
def spread(make_cells, tmp_path: Path) -> Spread:
    return make_spread(make_cells, tmp_path)


def make_spread(make_cells: Any, tmp_path: Path, site: Callable[[Path, str], Site] = _site) -> Spread:
    """The spread grid (the module's docstring), each site made by `site` (tests/test_sites_ssh.py: a Host of a
    real sshd)."""
    overrides = [["model=tiny_llama", "lr=1e-5"], ["model=tiny_llama", "lr=2e-5"], ["model=tiny_llama_m", "lr=1e-5"]]

    def grid(root: Path) -> list[Path]:
        return gf.render_cells(make_cells(*[[*o, f"sweep_name={SWEEP}", f"runs_root={root}"] for o in overrides]))

    def completed(cell: Path, acc: float) -> None:
        gf.run(cell, "completed", gf.curve(20, 1.5), 20, seconds=360.0)
        gf.score(cell, "tiny_mc", {"acc,none": acc, "acc_stderr,none": 0.03}, score_id=f"mc-{cell.name}")

    one = grid(tmp_path / "one" / "runs")
    a = grid(tmp_path / "a" / "runs")
    b = grid(tmp_path / "b" / "runs")
    for cells in (one, a):
        completed(cells[0], 0.625)
    for cells in (one, b):
        completed(cells[1], 0.5)
        gf.run(cells[2], "failed", gf.curve(20, 1.7)[:3], 20, seconds=30.0)
    gf.run(a[1], "failed", [], 20, start=LATER, reason="cancelled: moved to site b")
    (a[1] / MOVE_FILE).write_text(json.dumps({"step": "confirmed", "cell": a[1].name}))
    for root in (tmp_path / "one" / "runs", tmp_path / "a" / "runs"):
        gf.base_score(root / SWEEP, "tiny-llama3-0a1b2c3d", "tiny_llama", "", "tiny_mc", {"acc": 0.25})
    # site b holds no copy of cell 0
    shutil.rmtree(b[0])
    here = tmp_path / "here" / "runs"
    placed = [Placed(site=site(tmp_path, n), code_dir=REPO_ROOT, code="k", commit="c") for n in ("a", "b")]
    names = [d.name for d in one]
    write_record(here / SWEEP, placed, {names[0]: "a", names[1]: "b", names[2]: "b"})
    return Spread(here, tmp_path / "one" / "runs", placed, names)


@dataclass
class Fake:
    """The transports a forward opened, by site: the local one, or one that never connects (site down)."""

    down: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)  # sites whose commands outlive their bound
    opened: dict[str, Transport] = field(default_factory=dict)
    closed: list[str] = field(default_factory=list)

    def __call__(self, site: Site) -> Transport:
        fake = self

        @dataclass
        class Tracked(Local):
            def run(
                self,
                argv: Sequence[str],
                stdin: bytes | None = None,
                check: bool = True,
                timeout: float | None = None,
                out: IO[bytes] | None = None,
            ):
                if self.name in fake.down:
                    raise SiteUnreachable(f"ssh {self.name}.example: Connection refused")
                if self.name in fake.stuck:
                    raise SiteTimeout(f"ssh {self.name}.example: no answer within 3 s (... stopped)")
                return super().run(argv, stdin, check, timeout, out)

            def close(self) -> None:
                fake.closed.append(self.name)

        self.opened[site.name] = Tracked(name=site.name)
        return self.opened[site.name]


def forward(spread: Spread, command: str, *args: str, fake: Fake | None = None) -> int:
    argv = [SWEEP, "--runs-root", str(spread.here), *args]
    return across.forward(command, argv, SWEEP, spread.grid_here, spread.placed, connect=fake or Fake())


def table_rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()[2:] if line.strip() and "cell(s)" not in line}


def test_the_merge_rule_prefers_completed_then_in_flight_then_the_latest_and_a_moved_copy_last() -> None:
    moved = Copy("a", "failed", "2026-12-02T10:00:00", moved=True, order=0)
    assert choose([moved, Copy("b", "completed", "2026-12-01T10:00:00", order=1)]).site == "b"
    assert choose([Copy("a", "submitted", order=0), Copy("b", "running", order=1)]).site == "b"
    assert choose([Copy("a", "submitted", moved=True, order=0), Copy("b", "failed", order=1)]).site == "b"
    assert (
        choose(
            [Copy("a", "failed", "2026-12-01T10:00:00"), Copy("b", "cancelled", "2026-12-02T10:00:00", order=1)]
        ).site
        == "b"
    )
    assert choose([Copy("a", "completed", moved=True), Copy("b", "running", order=1)]).site == "a"
    assert choose([Copy("a", "unknown"), Copy("b", "failed", "2026-12-02T10:00:00", order=1)]).site == "a"


def test_status_merges_each_sites_copy_of_a_cell_and_names_its_site(spread: Spread, capsys) -> None:
    fake = Fake()
    assert forward(spread, "status", fake=fake) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    c0, c1, c2 = (rows[c] for c in spread.cells)
    assert "site" in out.splitlines()[0].split()
    assert c0[1] == "completed" and c0[-1] == "a"
    assert c1[1] == "completed" and c1[-1] == "b"  # b's completed copy wins over a's later, moved, failed one
    assert c2[1] == "failed" and c2[-1] == "b"
    assert "3 cell(s): 2 completed, 1 failed" in out
    assert sorted(fake.closed) == ["a", "b"]  # every transport closed


def test_status_json_of_one_site_and_of_the_spread_grid(spread: Spread, capsys) -> None:
    from sft_grid.cli.main import main

    assert main(["status", str(spread.one / SWEEP), "--format", "json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["headers"][:2] == ["cell", "state"] and one["headers"][-1] == "site"
    states = {r["cell"]: r["state"] for r in one["rows"]}
    assert [states[c] for c in spread.cells] == ["completed", "completed", "failed"]
    assert all(isinstance(r["under_way"], list) for r in one["rows"])
    assert forward(spread, "status", "--format", "json") == 0
    merged = {r["cell"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert merged[spread.cells[1]]["site"] == "b" and merged[spread.cells[1]]["state"] == "completed"
    assert merged[spread.cells[0]]["site"] == "a"


def test_a_site_that_does_not_answer_is_named_and_the_other_still_answers(spread: Spread, capsys) -> None:
    fake = Fake(down={"b"})
    assert forward(spread, "status", fake=fake) == 1
    out, err = capsys.readouterr()
    assert "site b did not answer" in err and "Connection refused" in err
    rows = table_rows(out)
    assert rows[spread.cells[0]][1] == "completed" and rows[spread.cells[0]][-1] == "a"
    # the record puts cells 1 and 2 on b: unknown (cell 1's moved copy on a does not stand for it)
    for cell in spread.cells[1:]:
        assert rows[cell][1] == "unknown" and rows[cell][-1] == "b", rows[cell]
        assert "site b did not answer" in " ".join(rows[cell])
    assert sorted(fake.closed) == ["a", "b"]


def _one_site_results(spread: Spread, fmt: str, capsys) -> str:
    assert cmd_results.show(spread.one / SWEEP, SWEEP, fmt, False) == 0
    return str(capsys.readouterr().out)


def _cells(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k not in ("site", "dir")} for c in [*data["cells"], *data["base_models"]]]


def test_results_of_the_spread_grid_equal_the_one_site_results_the_site_aside(spread: Spread, capsys) -> None:
    one = json.loads(_one_site_results(spread, "json", capsys))
    assert forward(spread, "results", "--format", "json") == 0
    spread_json = json.loads(capsys.readouterr().out)
    assert _cells(spread_json) == _cells(one)
    assert spread_json["axes"] == one["axes"] and spread_json["columns"] == one["columns"]
    assert [c["site"] for c in spread_json["cells"]] == ["a", "b", "b"]
    assert [c["state"] for c in spread_json["cells"]] == ["completed", "completed", "failed"]
    # csv: the same rows, the site column aside
    one_csv = list(csv.DictReader(io.StringIO(_one_site_results(spread, "csv", capsys))))
    assert forward(spread, "results", "--format", "csv") == 0
    spread_csv = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert "site" in spread_csv[0] and "site" not in one_csv[0]
    assert [{k: v for k, v in r.items() if k != "site"} for r in spread_csv] == one_csv
    # the pull left the weights out but their names in: the completed copies read as completed
    weights = spread.grid_here / ".sites" / "b" / spread.cells[1] / "output" / "model.safetensors"
    assert weights.is_file() and weights.stat().st_size == 0
    for fmt in ("markdown", "table"):
        assert forward(spread, "results", "--format", fmt) == 0
        text = capsys.readouterr().out
        assert "site" in text.splitlines()[0] and text.count("completed") >= 2


def test_results_with_a_site_down_still_print_the_other_and_fail(spread: Spread, capsys) -> None:
    assert forward(spread, "results", "--format", "json", fake=Fake(down={"b"})) == 1
    out, err = capsys.readouterr()
    assert "site b did not answer" in err and spread.cells[2] in err  # the record's cells of b, named
    cells = {c["name"]: c for c in json.loads(out)["cells"]}
    assert cells[spread.cells[0]]["state"] == "completed"
    # only a's copies of b's cells are here: the moved one of cell 1, cell 2 as a rendered it (never run)
    assert cells[spread.cells[1]]["state"] == "failed" and cells[spread.cells[2]]["state"] == "planned"


def test_report_is_written_here_with_each_cells_site(spread: Spread, capsys) -> None:
    assert forward(spread, "report", "--resamples", "0") == 0
    html, data = (Path(p) for p in capsys.readouterr().out.split())
    assert html == spread.grid_here / "report.html" and html.is_file()
    cells = {c["name"]: c for c in json.loads(data.read_text())["cells"]}
    assert [cells[c]["site"] for c in spread.cells] == ["a", "b", "b"]
    assert ">site<" in html.read_text()


def test_report_of_a_grid_across_sites_goes_to_out_and_a_folder_that_cannot_take_it_is_said_first(
    spread: Spread, capsys, tmp_path
) -> None:
    """--out used to be read only for a grid here: across sites the pages landed in the grid's directory."""
    out = tmp_path / "elsewhere"
    assert forward(spread, "report", "--resamples", "0", "--out", str(out)) == 0
    html, data = (Path(p) for p in capsys.readouterr().out.split())
    assert (html, data) == (out / "report.html", out / "report.json") and html.is_file() and data.is_file()
    assert not (spread.grid_here / "report.html").exists()
    blocked = tmp_path / "blocked"
    (blocked / "report.json").mkdir(parents=True)  # a directory where a file goes: nothing is pulled, nothing written
    assert forward(spread, "report", "--resamples", "0", "--out", str(blocked)) == 1
    err = capsys.readouterr().err
    assert "cannot be written" in err and "Nothing was written" in err and not (blocked / "report.html").exists()


def test_cancel_runs_on_every_site_and_logs_on_the_chosen_copys_site(spread: Spread, capfd) -> None:
    assert forward(spread, "cancel") == 0
    out = capfd.readouterr().out
    assert "== site a" in out and "== site b" in out and out.count("0 cell(s) cancelled") == 2
    assert forward(spread, "logs", spread.cells[1]) == 1  # b's copy has no train.log: b's own answer says so
    err = capfd.readouterr().err
    assert f"cell {spread.cells[1]} on site b" in err and str(spread.placed[1].site.runs_root) in err


def test_the_cli_sends_a_grid_of_several_sites_to_the_merge(spread: Spread, capsys, monkeypatch) -> None:
    from sft_grid.cli.main import main

    monkeypatch.setattr(remote.Site, "transport", lambda self, check=True: Local(name=self.name))
    assert main(["status", SWEEP, "--runs-root", str(spread.here)]) == 0
    out, err = capsys.readouterr()
    assert "on 2 sites (a, b)" in err and table_rows(out)[spread.cells[1]][-1] == "b"


def test_watch_of_a_spread_grid_ends_when_nothing_is_under_way(spread: Spread, capsys) -> None:
    import os
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # the runs' process (this one, in the fixture) ended: their local jobs are no longer under way
    for ledger in spread.here.parent.parent.glob("*/runs/g/*/events.jsonl"):
        ledger.write_text(ledger.read_text().replace(f'"pid": {os.getpid()}', f'"pid": {gone.pid}'))
    fake = Fake()
    assert forward(spread, "status", "--watch", "--interval", "0.01", fake=fake) == 0
    out = capsys.readouterr().out
    assert "the grid has ended" in out and out.count("== ") == 1  # one read: every cell had ended
    assert table_rows(out.split("\n", 1)[1])[spread.cells[1]][-1] == "b" and sorted(fake.closed) == ["a", "b"]


def test_the_pulled_copies_are_read_from_their_files_never_from_the_schedulers_here(
    spread: Spread, capsys, monkeypatch
) -> None:
    """A laptop that is itself a login node of another cluster: its sacct knows other jobs by the same ids. The
    pulled copies' states come from their files and ledgers; no scheduler here is asked."""
    from sft_grid.analysis.table import read_table
    from sft_grid.core import events
    from sft_grid.core.events import Event, Kind
    from sft_grid.schedulers import slurm

    asked: list[object] = []

    def query(*a: object, **kw: object) -> list[object]:
        asked.append(a)
        return []

    monkeypatch.setattr(slurm, "query", query)
    # cell 2's copy on b: queued on b's Slurm (job 5_0), as a site's ledger says it
    queued = Path(spread.placed[1].site.runs_root) / SWEEP / spread.cells[2]
    events.append(queued, Event(Kind.SUBMITTED, executor="slurm", array="sft_grid-x", index=0, details={"site": "b"}))
    events.append(queued, Event(Kind.JOB, job_id="5_0"))
    read_table(queued.parent)  # the site's own reading asks its scheduler
    assert asked
    asked.clear()
    assert forward(spread, "results", "--format", "json") == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert not asked, asked
    assert [c["state"] for c in cells] == ["completed", "completed", "submitted"]


def heavy(cell: Path) -> None:
    """What a trained cell holds that neither results nor report reads: its logs (the training's, the evaluation's
    results and samples), a checkpoint with its optimizer state, the tokenizer; and weights of a real size."""
    (cell / "logs").mkdir(exist_ok=True)
    (cell / "logs" / "train.log").write_bytes(b"step\n" * (64 << 10))
    samples = cell / "logs" / "eval" / "20261201-000000-mc" / "results"
    samples.mkdir(parents=True)
    (samples / "samples_tiny_mc.jsonl").write_bytes(b"{}\n" * (16 << 10))
    (samples / "mc.json").write_text("{}")
    checkpoint = cell / "output" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        (checkpoint / name).write_bytes(b"\0" * (64 << 10))
    (cell / "output" / "tokenizer.json").write_text("{}")
    (cell / "output" / "model.safetensors").write_bytes(b"\0" * (1 << 20))


def pulled(grid_here: Path, site: str) -> dict[str, int]:
    """The files a pull brought from a site: path under its grid directory -> size."""
    top = grid_here / ".sites" / site
    return {str(p.relative_to(top)): p.stat().st_size for p in sorted(top.rglob("*")) if p.is_file()}


def site_cell(spread: Spread, site: int, cell: int) -> Path:
    return Path(spread.placed[site].site.runs_root) / SWEEP / spread.cells[cell]


def test_results_pull_only_the_files_results_and_report_read(spread: Spread, capsys) -> None:
    heavy(site_cell(spread, 1, 1))
    assert forward(spread, "results", "--format", "json") == 0
    cells = {c["name"]: c for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells[spread.cells[1]]["state"] == "completed" and cells[spread.cells[1]]["site"] == "b"
    got = pulled(spread.grid_here, "b")
    name = spread.cells[1]
    assert {k.removeprefix(f"{name}/") for k in got if k.startswith(f"{name}/")} == {
        "cell.yaml",
        "events.jsonl",
        "output/trainer_state.json",
        "output/trainer_log.jsonl",
        "output/all_results.json",
        "output/model.safetensors",
        f"eval/mc-{name}.json",
    }
    assert got[f"{name}/output/model.safetensors"] == 0  # its name only: the cell reads as completed
    assert not [k for k in got if "/logs/" in k or "checkpoint-" in k or k.endswith("tokenizer.json")], got
    assert sum(got.values()) < 64 << 10  # of the cell's ~2.5 MB
    # the pull's own note is not a file of the grid
    assert not (spread.grid_here / ".merged" / SWEEP / ".pull.json").exists()


def test_a_trainer_log_over_the_limit_comes_as_its_end_and_is_named(spread: Spread, capsys, monkeypatch) -> None:
    """A trainer log over PULL_LIMIT: its last PULL_LIMIT bytes, from a line's start; the final loss (its last 10%)
    is the one-site grid's, and stderr names the file and what came."""
    log = "".join(
        json.dumps({"current_steps": s, "total_steps": 2000, "loss": v, "lr": 1e-5}) + "\n"
        for s, v in gf.curve(2000, 1.5)
    )
    for cell in (site_cell(spread, 1, 1), spread.one / SWEEP / spread.cells[1]):
        (cell / "output" / "trainer_log.jsonl").write_text(log)
    monkeypatch.setattr(merged, "PULL_LIMIT", 40_000)
    one = {c["name"]: c for c in json.loads(_one_site_results(spread, "json", capsys))["cells"]}
    assert forward(spread, "results", "--format", "json") == 0
    out, err = capsys.readouterr()
    cells = {c["name"]: c for c in json.loads(out)["cells"]}
    assert cells[spread.cells[1]]["final_loss"] == one[spread.cells[1]]["final_loss"]
    assert cells[spread.cells[1]]["step"] == 2000
    rel = f"{spread.cells[1]}/output/trainer_log.jsonl"
    kept = pulled(spread.grid_here, "b")[rel]
    assert 39_000 < kept <= 40_000, kept
    assert f"site b: {rel} is {len(log)} bytes, over the pull's 40000 bytes: its last {kept} bytes came here" in err
    tail = (spread.grid_here / ".sites" / "b" / rel).read_text()
    assert tail.startswith('{"current_steps": ') and log.endswith(tail)


def test_a_site_that_outlives_its_bound_is_named_with_what_the_output_lacks(spread: Spread, capsys) -> None:
    """Site b's pull times out: its line names it, how long was waited, and each of its cells: missing, shown from
    another site's copy, or shown as an earlier pull left it; site a's cells are shown."""
    shutil.rmtree(site_cell(spread, 0, 2))  # site a holds no copy of cell 2: without b's answer it is missing
    assert forward(spread, "results", "--format", "json", fake=Fake(stuck={"b"})) == 1
    out, err = capsys.readouterr()
    (line,) = [ln for ln in err.splitlines() if ln.startswith("site b")]
    assert line.startswith("site b did not answer: ssh b.example: no answer within 3 s"), line
    assert f"1 of its cells are missing from the output: {spread.cells[2]}" in line, line
    assert f"1 are shown from another site's copy: {spread.cells[1]}" in line, line
    cells = {c["name"]: c for c in json.loads(out)["cells"]}
    assert cells[spread.cells[0]]["state"] == "completed" and cells[spread.cells[0]]["site"] == "a"
    assert spread.cells[2] not in cells
    # once b has answered, a later timeout shows its cells as that pull left them, and says when
    assert forward(spread, "results", "--format", "json") == 0
    capsys.readouterr()
    assert forward(spread, "results", "--format", "json", fake=Fake(stuck={"b"})) == 1
    out, err = capsys.readouterr()
    assert "2 are shown as pulled at " in err, err
    assert {c["name"]: c["state"] for c in json.loads(out)["cells"]}[spread.cells[2]] == "failed"
