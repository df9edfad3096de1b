"""Bad input, eighth round: local data files broken past the sample's first rows, or not UTF-8 text at all.

The sample check read the first 200 rows of the first file: a line that does not parse at 11001, a last line cut off
by an interrupted write, a folder whose second file is broken, a row with a number for its content or another name
for its conversation column all passed planning and failed the job after its queue wait. Every line of every local
JSON-lines file is read now (once a file version), and the file, the line and what is wrong are named with the fix.
A UTF-8 byte-order mark is read as the backends read it; a gzip or UTF-16 file is named as what it is."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sft_grid.checks.preflight import preflight
from sft_grid.planning import readable

from .conftest import run_sft
from .test_loss_mask import TAGS

NO_VENV = "cluster.backend_venvs.llamafactory=/nonexistent/venv"


def _row(i: int, content: object = None) -> bytes:
    answer = f"The answer is {i}." if content is None else content
    row = {"messages": [{"role": "user", "content": f"What is {i}?"}, {"role": "assistant", "content": answer}]}
    return (json.dumps(row) + "\n").encode()


def _rows(n: int) -> bytes:
    return b"".join(_row(i) for i in range(n))


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def _problem(make_cells, tmp_path: Path, source: Path, *extra: str):
    (cell,) = make_cells(["model=qwen3_8b", f"dataset.tiny_messages.source={source}", NO_VENV, *extra])
    before = _tree(tmp_path)
    found = [p for p in preflight([cell]).problems if p.rule == "preflight-assistant_turns"]
    assert _tree(tmp_path) == before  # nothing written
    return found


def _one(make_cells, tmp_path: Path, source: Path, *extra: str):
    found = _problem(make_cells, tmp_path, source, *extra)
    assert len(found) == 1, [p.render() for p in found]
    assert found[0].key == "dataset.tiny_messages", found[0].render()
    return found[0]


# -- 1. every line of every local file, not the first 200 rows of the first ----------------------------------------


def test_a_line_that_does_not_parse_far_past_the_sample_is_named_with_its_line(make_cells, tmp_path):
    f = tmp_path / "big.jsonl"
    f.write_bytes(_rows(11000) + b"{oops\n" + _rows(999))
    p = _one(make_cells, tmp_path, f)
    assert f"line 11001 of {f} is not JSON" in p.message, p.render()
    assert f"sed -n 11001p {f}" in p.fix and "fix that line" in p.fix, p.render()


@pytest.mark.parametrize("in_folder", [False, True], ids=["file", "second-file-of-folder"])
def test_a_last_line_cut_off_by_an_interrupted_write_is_named_as_such(make_cells, tmp_path, in_folder):
    cut = _rows(300) + _row(300)[:40]  # no closing brace, no newline
    if in_folder:
        d = tmp_path / "data"
        d.mkdir()
        (d / "train-0.jsonl").write_bytes(_rows(300))
        f = d / "train-1.jsonl"
        f.write_bytes(cut)
        source = d
    else:
        f = source = tmp_path / "cut.jsonl"
        f.write_bytes(cut)
    p = _one(make_cells, tmp_path, source)
    assert f"the last line (301) of {f} is cut off" in p.message, p.render()
    assert f"sed -i '301d' {f}" in p.fix, p.render()


def test_a_content_that_is_not_text_past_the_sample_is_named_with_its_line(make_cells, tmp_path):
    f = tmp_path / "mixed.jsonl"
    f.write_bytes(_rows(250) + _row(250, content=7) + _rows(10))
    p = _one(make_cells, tmp_path, f)
    assert f"line 251 of {f} has 'content' of message 2 as a JSON number (7), not a string" in p.message, p.render()
    assert "sed -n 251p" in p.fix, p.render()


def test_a_row_without_the_conversation_column_the_others_have_is_named(make_cells, tmp_path):
    f = tmp_path / "onecol.jsonl"
    other = json.dumps({"conversation": [{"role": "user", "content": "hi"}]}).encode() + b"\n"
    f.write_bytes(_rows(300) + other + _rows(5))
    p = _one(make_cells, tmp_path, f)
    assert f"line 301 of {f} has no column 'messages' (its columns: conversation)" in p.message, p.render()
    assert "fails in the job" in p.message and "sed -n 301p" in p.fix, p.render()
    # a column no row has: the dataset's `messages:` is the setting to change, not one row
    g = tmp_path / "conv.jsonl"
    g.write_bytes(other * 3)
    p = _one(make_cells, tmp_path, g)
    assert "no column 'messages' in the data" in p.message and "conversation" in p.fix, p.render()


def test_a_message_with_text_instead_of_content_is_named(make_cells, tmp_path):
    f = tmp_path / "textkey.jsonl"
    other = json.dumps({"messages": [{"role": "user", "text": "hi"}, {"role": "assistant", "content": "yo"}]})
    f.write_bytes(_rows(3) + other.encode() + b"\n")
    p = _one(make_cells, tmp_path, f)
    assert f"line 4 of {f} has no 'content' in message 1 (its keys: role, text)" in p.message, p.render()


def test_a_sound_file_is_scanned_once_per_version(make_cells, tmp_path, monkeypatch):
    f = tmp_path / "good.jsonl"
    f.write_bytes(_rows(50))
    scans: list[Path] = []
    real = readable._scan_lines
    monkeypatch.setattr(readable, "_scan_lines", lambda file, *a: scans.append(file) or real(file, *a))
    tags = {"role_tag": "role", "content_tag": "content"}
    for _ in range(3):
        readable.scan_rows(f, "messages", tags)
    assert scans == [f]
    f.write_bytes(_rows(50) + b"{oops\n")  # another version: read again
    with pytest.raises(readable.NotData, match="line 51 of"):
        readable.scan_rows(f, "messages", tags)
    assert scans == [f, f]


def test_a_json_list_is_checked_row_by_row(make_cells, tmp_path):
    f = tmp_path / "rows.json"
    rows = [json.loads(_row(i)) for i in range(4)]
    rows[3]["messages"][1]["content"] = None
    f.write_text(json.dumps(rows))
    p = _one(make_cells, tmp_path, f)
    assert f"row 4 of {f} (a JSON list) has 'content' of message 2 as a JSON null, not a string" in p.message, (
        p.render()
    )


# -- 2. a UTF-8 byte-order mark is read as the backends read it ----------------------------------------------------


def test_a_utf8_byte_order_mark_is_accepted(make_cells, tmp_path):
    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + _rows(5))
    assert _problem(make_cells, tmp_path, f) == []
    assert len(readable.read_sample(f, "messages")) == 5


# -- 3. a file that is not UTF-8 text at all is named as what it is ------------------------------------------------


@pytest.mark.parametrize(
    "encode, says, fix",
    [
        (gzip.compress, "is gzip-compressed (it starts with bytes 1f 8b)", "gunzip -c {f} > "),
        (
            lambda b: b.decode().encode("utf-16"),
            "is UTF-16 text (it starts with the byte-order mark ff fe)",
            "iconv -f utf-16 -t utf-8 {f}",
        ),
        (
            lambda b: b.decode().encode("utf-32"),
            "is UTF-32 text (it starts with the byte-order mark ff fe 00 00)",
            "iconv -f utf-32 -t utf-8 {f}",
        ),
    ],
    ids=["gzip", "utf-16", "utf-32"],
)
def test_a_file_that_is_not_utf8_text_is_named_as_what_it_is(make_cells, tmp_path, encode, says, fix):
    f = tmp_path / "data.jsonl"
    f.write_bytes(encode(_rows(5)))
    p = _one(make_cells, tmp_path, f)
    assert f"{f} {says}" in p.message and fix.format(f=f) in p.fix, p.render()
    assert "latin1" not in p.fix, p.render()


def test_the_cli_refuses_a_broken_line_past_the_sample_before_anything_is_written(tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    f = tmp_path / "late.jsonl"
    f.write_bytes(_rows(400) + b'{"messages": [}\n')
    proc = run_sft(
        "model=tiny_llama",
        f"dataset.tiny_messages.source={f}",
        "dry_run=true",
        f"runs_root={here / 'runs'}",
        cwd=here,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in said, said
    assert f"line 401 of {f} is not JSON" in said and f"sed -n 401p {f}" in said, said
    assert list(here.iterdir()) == [], said


# -- 4. a row the backend drops: where it is in its file and what is wrong with it ---------------------------------


def _dropped(*roles: str) -> dict[str, object]:
    kinds = {"user": "user", "assistant": "assistant", "system": "system"}
    return {
        "messages": [[kinds.get(r, "other"), "x"] for r in roles],
        "roles": list(roles),
        "warnings": ["Invalid role tag in [...]"],
        "dropped": True,
        "segments": [],
        "n_tokens": 0,
        "n_trained": 0,
    }


@pytest.mark.parametrize(
    "roles, says",
    [
        (("assistant", "user"), "message 1 has role 'assistant' where 'user' is due"),
        (("user", "user", "assistant"), "message 2 has role 'user' where 'assistant' is due"),
        (("user", "system", "assistant"), "message 2 has a second system turn"),
        (("system", "user", "assistant", "user"), "it ends with a 'user' turn that no 'assistant' turn answers"),
        ((), "it has no messages"),
    ],
    ids=["order", "double-user", "system-mid", "ends-with-user", "empty"],
)
def test_a_dropped_row_is_told_by_its_file_line_and_what_is_wrong_with_it(roles, says):
    from sft_grid.checks.mask import judge

    good = {
        **_dropped("user", "assistant"),
        "dropped": False,
        "warnings": [],
        "messages": [["user", "q"], ["assistant", "a"]],
        "segments": [["q", False, False], ["a", True, False], ["<eot>", True, True]],
        "n_trained": 2,
    }
    outcome = judge([good, _dropped(*roles)], TAGS, where=["line 1 of d.jsonl", "line 3 of d.jsonl"])
    assert not outcome.ok and "line 3 of d.jsonl: dropped by the backend" in outcome.message, outcome
    assert says in outcome.message and "row 1" not in outcome.message, outcome
    assert "fix or remove the rows the backend drops (the first: line 3 of d.jsonl)" in outcome.fix, outcome
    assert "check the template" not in outcome.fix, outcome


def test_the_file_lines_of_a_sample_skip_blank_lines(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_bytes(_row(0) + b"\n  \n" + _row(1) + _row(2))
    assert readable.row_lines(f, 2) == [1, 4]


def test_a_user_tag_equal_to_the_assistant_tag_is_told_as_such():
    from sft_grid.checks.mask import judge

    tags = {**TAGS, "user_tag": "assistant"}
    row = {**_dropped("user", "assistant"), "messages": [["other", "q"], ["user", "a"]]}
    outcome = judge([row] * 8, tags)
    assert "tags.user_tag and tags.assistant_tag are both 'assistant'" in outcome.fix, outcome
    assert "user_tag=user" in outcome.fix and "none equals assistant_tag" not in outcome.fix, outcome
