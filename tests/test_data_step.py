"""The data step's record (sft_grid/in_venv/data_step.py), driven here with plain functions; the backends' real
data steps are recorded in tests/test_tokenize_train.py (tokenize job and cells, both backends)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from sft_grid.in_venv import data_step


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _burn(n):
    return sum(i * i for i in range(n))


def test_a_call_records_its_start_and_its_end_with_the_cpu_it_spent(tmp_path, monkeypatch):
    path = tmp_path / "data_step.jsonl"
    monkeypatch.setenv(data_step.ENV, str(path))
    monkeypatch.setenv("RANK", "1")
    step = data_step.timed(_burn, "get_dataset")
    assert step(200_000) == _burn(200_000)
    start, end = _records(path)
    assert (start["event"], end["event"]) == ("start", "end")
    assert start["what"] == end["what"] == "get_dataset" and start["rank"] == end["rank"] == 1
    assert end["ok"] is True and end["cpu_s"] > 0 and end["wall_s"] > 0 and end["time"] >= start["time"]


def test_a_failing_call_records_its_end_not_ok_and_raises(tmp_path, monkeypatch):
    path = tmp_path / "data_step.jsonl"
    monkeypatch.setenv(data_step.ENV, str(path))

    def broken():
        raise ValueError("bad data")

    with pytest.raises(ValueError, match="bad data"):
        data_step.timed(broken, "load_datasets")()
    assert [(r["event"], r.get("ok")) for r in _records(path)] == [("start", None), ("end", False)]


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(data_step.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert data_step.timed(_burn, "get_dataset")(10) == _burn(10)
    assert list(tmp_path.iterdir()) == []


def test_wrap_rebinds_the_name_where_it_was_imported_and_only_once(tmp_path, monkeypatch):
    path = tmp_path / "data_step.jsonl"
    monkeypatch.setenv(data_step.ENV, str(path))
    source, user, other = (types.ModuleType(n) for n in ("fake_loader", "fake_workflow", "fake_other"))
    source.get_dataset = user.get_dataset = _burn
    for module in (source, user, other):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    data_step.wrap("get_dataset", ("fake_loader", "fake_workflow", "fake_other", "not_imported"))
    data_step.wrap("get_dataset", ("fake_loader", "fake_workflow"))  # patched twice: still one record per call
    assert user.get_dataset is source.get_dataset is not _burn
    assert not hasattr(other, "get_dataset")  # a module that never imported the name gets none
    user.get_dataset(10)
    assert [r["event"] for r in _records(path)] == ["start", "end"]
