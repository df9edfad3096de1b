"""`sft-grid logs GRID CELL`: a cell named by any unique part of its name, its logs (node 0's and node N's training
log, the evaluation's, the post stages'), the last lines, and `-f` following a log as it grows, across a rewrite,
waiting for one not written yet, and ending when the part of the cell that writes it ends."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sft_grid.cli.cmd_logs import Tail, follow, log_path, start_of_last_lines
from sft_grid.cli.main import main
from sft_grid.core import events
from sft_grid.core.cellfiles import PostFile
from sft_grid.core.events import Event, Kind
from sft_grid.core.layout import POST_FILE
from sft_grid.core.paths import REPO_ROOT
from sft_grid.stages import post_training

from .helpers import wait_for

NAMES = ("tiny_llama_lr1e-05-aaaa1111", "tiny_llama_lr2e-05-bbbb2222", "tiny_qwen3_lr1e-05-cccc3333")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A grid of three cells, each with node 0's and node 1's training logs; the Qwen3 cell has an eval log."""
    for name in NAMES:
        cell = tmp_path / "default" / name
        (cell / "logs").mkdir(parents=True)
        (cell / "cell.yaml").write_text("{}\n")
        (cell / "logs" / "train.log").write_text("".join(f"{name} node 0 line {i}\n" for i in range(1, 6)))
        (cell / "logs" / "train.node1.log").write_text(f"{name} node 1 line 1\n")
    (tmp_path / "default" / NAMES[2] / "logs" / "eval.log").write_text("lm-eval: gsm8k 0.42\n")
    return tmp_path


def logs(capsys: pytest.CaptureFixture[str], runs: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["logs", "default", *args, "--runs-root", str(runs)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_a_unique_part_of_a_name_picks_the_cell_and_its_logs(runs, capsys):
    rc, out, _ = logs(capsys, runs, "qwen3")
    assert rc == 0 and out == "".join(f"{NAMES[2]} node 0 line {i}\n" for i in range(1, 6))
    assert logs(capsys, runs, "bbbb2222", "--node", "1")[1] == f"{NAMES[1]} node 1 line 1\n"
    assert logs(capsys, runs, "lr2e-05", "--lines", "2")[1] == f"{NAMES[1]} node 0 line 4\n{NAMES[1]} node 0 line 5\n"
    assert logs(capsys, runs, "qwen3", "--eval")[1] == "lm-eval: gsm8k 0.42\n"
    assert logs(capsys, runs, NAMES[0])[1].startswith(f"{NAMES[0]} node 0 line 1\n")  # a whole name


def test_python_m_sft_grid_logs_is_the_command(runs, capsys):
    proc = subprocess.run(
        [sys.executable, "-m", "sft_grid", "logs", "default", "qwen3", "--lines", "1", "--runs-root", str(runs)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0 and proc.stdout == f"{NAMES[2]} node 0 line 5\n", proc.stderr
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "    logs      a cell's training, evaluation or post-stage log" in capsys.readouterr().out


def test_an_ambiguous_or_unknown_part_names_the_cells(runs, capsys):
    rc, out, err = logs(capsys, runs, "tiny_llama")
    assert rc == 1 and not out and "'tiny_llama' is in the names of 2 cells" in err
    assert NAMES[0] in err and NAMES[1] in err and NAMES[2] not in err
    rc, out, err = logs(capsys, runs, "qwen2")
    assert rc == 1 and "no cell of" in err and "has 'qwen2' in its name; its cells: " + ", ".join(NAMES) in err


def test_a_log_not_written_yet_says_where_it_will_be(runs, capsys):
    rc, out, err = logs(capsys, runs, "aaaa", "--post")
    assert rc == 1 and not out
    assert f"post-training stages' log is not written yet: it will be {runs}/default/{NAMES[0]}/logs/post.log" in err
    rc, _, err = logs(capsys, runs, "aaaa", "--node", "3")
    assert rc == 1 and "train.node3.log" in err


def test_a_node_the_cell_does_not_train_on_is_refused_at_once_even_with_follow(runs, capsys):
    """A node past the cell's own (cell.yaml's `nodes`) will never write a log: refused at once, not waited for."""
    (runs / "default" / NAMES[1] / "cell.yaml").write_text("nodes: 2\n")
    assert logs(capsys, runs, "bbbb2222", "--node", "1")[1] == f"{NAMES[1]} node 1 line 1\n"
    for follow_it in ([], ["-f"]):
        rc, out, err = logs(capsys, runs, "bbbb2222", "--node", "2", *follow_it)
        assert rc == 2 and not out, err
        assert err == f"{NAMES[1]} trains on 2 node(s), so it has no node 2: --node takes nodes 0 to 1\n"


def test_the_post_stages_write_their_log(runs, capsys, monkeypatch):
    """The post-training chain writes logs/post.log (each stage's states, what its processes said), which
    `logs --post` shows."""
    cell = runs / "default" / NAMES[0]
    (cell / "output").mkdir()
    (cell / "output" / "model.safetensors").write_bytes(b"w")
    (cell / "output" / "trainer_state.json").write_text("{}")
    (cell / POST_FILE).write_text(
        PostFile(cell=NAMES[0], stages=("upload",), python="/nonexistent/python", hub_model_id="org/x").dumps()
    )

    def upload(cell_dir: Path, post: PostFile, where: str) -> dict[str, str]:
        post_training.say(cell_dir, "uploading 1 file")
        return {"url": "https://huggingface.co/org/x"}

    monkeypatch.setitem(post_training.STAGE_RUNNERS, "upload", upload)
    assert post_training.run(cell, post_training.LOGIN) is True
    rc, out, _ = logs(capsys, runs, "aaaa", "--post")
    lines = out.splitlines()
    header = f"post-training stages (login, pid {os.getpid()} on {socket.gethostname()}): upload"
    assert rc == 0 and lines[1].startswith("=== sft_grid: ") and lines[1].endswith(header)
    assert lines[2].endswith(" upload: running") and lines[3] == "uploading 1 file"
    assert lines[4].endswith(' upload: completed {"url": "https://huggingface.co/org/x"}')


def test_start_of_last_lines():
    import tempfile

    with tempfile.NamedTemporaryFile("wb") as fh:
        fh.write(b"a\nbb\nccc\nno newline")
        fh.flush()
        path = Path(fh.name)
        assert [start_of_last_lines(path, n, block=3) for n in (0, 1, 2, 4, 9)] == [19, 9, 5, 0, 0]
        fh.write(b"\n")
        fh.flush()
        assert [start_of_last_lines(path, n, block=4) for n in (1, 2)] == [9, 5]


@pytest.fixture
def job() -> Iterator[subprocess.Popen[bytes]]:
    """A process that stands for a local cell's job while it runs."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def running(cell: Path, job: subprocess.Popen[bytes]) -> None:
    pid, host = job.pid, socket.gethostname()
    events.append(cell, Event(Kind.SUBMITTED, executor="local", pid=pid, host=host))
    events.append(cell, Event(Kind.RUNNING, pid=pid, host=host))


def start(cell: Path, which: str, lines: int | None = None) -> tuple[io.StringIO, threading.Thread, list]:
    out, outcome = io.StringIO(), []
    tail = Tail(log_path(cell, which), out, lines)
    thread = threading.Thread(
        target=lambda: outcome.append(follow(tail, cell, which, poll_s=0.02, state_s=0.05)), daemon=True
    )
    thread.start()
    return out, thread, outcome


def test_follow_prints_a_growing_log_across_a_rewrite_until_the_training_ends(runs, job):
    cell = runs / "default" / NAMES[0]
    running(cell, job)
    out, thread, outcome = start(cell, "train", lines=1)
    wait_for(lambda: out.getvalue() == f"{NAMES[0]} node 0 line 5\n", "the last line", 30, 0.02)
    log = cell / "logs" / "train.log"
    with log.open("a") as fh:
        fh.write("step 1 loss 2.5\nstep 2 lo")
    wait_for(lambda: out.getvalue().endswith("step 1 loss 2.5\nstep 2 lo"), "the lines added", 30, 0.02)
    with log.open("a") as fh:
        fh.write("ss 2.4 \u2713\n")
    wait_for(lambda: out.getvalue().endswith("step 2 loss 2.4 \u2713\n"), "the rest of the line", 30, 0.02)
    log.write_text("=== the next leg\n")  # shorter than what was read: rewritten
    wait_for(
        lambda: out.getvalue().endswith("train.log was rewritten; from its start:\n=== the next leg\n"),
        "the rewritten log",
        30,
        0.02,
    )
    assert thread.is_alive()
    (cell / "output").mkdir()
    (cell / "output" / "model.safetensors").write_bytes(b"w")
    (cell / "output" / "trainer_state.json").write_text("{}")
    with log.open("a") as fh:
        fh.write("training done\n")
    events.append(cell, Event(Kind.COMPLETED, pid=job.pid, host=socket.gethostname()))
    # its job still runs (post stages, evaluation), but the training log is no longer written: the end
    thread.join(30)
    assert not thread.is_alive() and out.getvalue().endswith("=== the next leg\ntraining done\n")
    assert outcome[0].note == f"--- {NAMES[0]} is completed; train.log ends here"


def test_follow_waits_for_a_log_not_written_yet_and_for_the_job_that_writes_it(runs, job):
    cell = runs / "default" / NAMES[1]
    running(cell, job)
    out, thread, outcome = start(cell, "eval")
    assert thread.is_alive()
    (cell / "logs" / "eval.log").write_text("lm-eval: starting\n")
    wait_for(lambda: out.getvalue() == "lm-eval: starting\n", "the new log", 30, 0.02)
    (cell / "output").mkdir()
    (cell / "output" / "model.safetensors").write_bytes(b"w")
    (cell / "output" / "trainer_state.json").write_text("{}")
    events.append(cell, Event(Kind.COMPLETED, pid=job.pid, host=socket.gethostname()))
    with (cell / "logs" / "eval.log").open("a") as fh:
        fh.write("lm-eval: gsm8k 0.40\n")
    wait_for(lambda: out.getvalue().endswith("gsm8k 0.40\n"), "the evaluation's line", 30, 0.02)
    assert thread.is_alive()  # the cell completed, its job still evaluates
    job.kill()
    job.wait()
    thread.join(30)
    assert not thread.is_alive() and outcome[0].note == f"--- {NAMES[1]} is completed; eval.log ends here"


def test_follow_of_a_log_never_written_ends_with_the_cell(runs, capsys):
    cell = runs / "default" / NAMES[2]
    events.append(cell, Event(Kind.FAILED, reason="preflight: no data"))
    rc, out, err = logs(capsys, runs, "cccc", "--post", "-f")
    assert rc == 1 and not out
    assert "waiting" not in err  # nothing that writes it is under way: said at once
    assert f"it will be {cell}/logs/post.log (the cell is failed, and nothing that writes it is under way" in err
