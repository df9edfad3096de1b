"""The project's one file lock (sft_grid/core/lock.py): exclusive, waits with a deadline or without one, recovers from
holders that died."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sft_grid.core.lock import Holder, Lock, LockTimeout, _read, hold_all
from tests.hubtools import wait_for


def _holder(path: Path) -> Holder:
    """Who holds the lock file, as it names them (these tests expect it to name someone)."""
    holder = _read(path)
    assert holder is not None, f"{path} names no holder"
    return holder


def test_second_taker_waits_until_release(tmp_path: Path):
    path = tmp_path / "repo.lock"
    first = Lock(path, timeout_s=5)
    first.acquire()
    got, waiting = threading.Event(), threading.Event()

    def take() -> None:
        with Lock(path, timeout_s=30, on_wait=lambda holder, waited: waiting.set()):
            got.set()

    t = threading.Thread(target=take)
    t.start()
    assert waiting.wait(timeout=30) and not got.is_set()
    first.release()
    t.join(timeout=30)
    assert got.is_set() and not path.exists()


def test_timeout_names_the_holder(tmp_path: Path):
    path = tmp_path / "repo.lock"
    with Lock(path, timeout_s=5), pytest.raises(LockTimeout) as e:
        Lock(path, timeout_s=0.2).acquire()
    assert e.value.holder is not None and e.value.holder.pid == os.getpid()
    assert f"pid {os.getpid()}" in str(e.value)


def test_lock_of_a_killed_process_on_this_host_is_broken_at_once(tmp_path: Path):
    path = tmp_path / "repo.lock"
    code = (
        "import sys, time; from sft_grid.core.lock import Lock; "
        "Lock(__import__('pathlib').Path(sys.argv[1]), timeout_s=5).acquire(); print('held', flush=True); "
        "time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert _holder(path).pid == child.pid  # left behind by kill -9
    waits: list[float] = []
    with Lock(path, timeout_s=30, stale_s=3600, on_wait=lambda holder, waited: waits.append(waited)) as lock:
        assert _holder(path).token == lock.me.token
    assert waits == []  # taken at once: no waiting for a heartbeat to age (stale_s is an hour)


def test_lock_from_another_host_is_stale_only_when_its_heartbeat_stopped(tmp_path: Path):
    path = tmp_path / "repo.lock"
    path.write_text(json.dumps({"host": "login02", "pid": 1, "token": "t", "since": time.time()}))
    with pytest.raises(LockTimeout):  # fresh mtime: the other node's stager may be alive
        Lock(path, timeout_s=0.3, stale_s=60).acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    with Lock(path, timeout_s=5, stale_s=60) as lock:
        assert _holder(path).token == lock.me.token


def test_holder_notices_when_its_lock_was_taken(tmp_path: Path):
    path = tmp_path / "repo.lock"
    lock = Lock(path, timeout_s=5, heartbeat_s=0.05)
    lock.acquire()
    path.write_text(json.dumps({"host": "elsewhere", "pid": 2, "token": "other", "since": time.time()}))
    wait_for(lambda: lock.lost, "the heartbeat to notice the takeover", 10, 0.01)
    lock.release()
    assert _holder(path).token == "other"  # a lost lock is not deleted on release


def test_without_a_deadline_a_waiter_waits_as_long_as_the_holder_lives(tmp_path: Path):
    path = tmp_path / "build.lock"
    first = Lock(path)
    first.acquire()
    got, waiting = threading.Event(), threading.Event()

    def take() -> None:
        with Lock(path, on_wait=lambda holder, waited: waiting.set()):  # no timeout_s: as flock waited
            got.set()

    t = threading.Thread(target=take)
    t.start()
    assert waiting.wait(timeout=30) and not got.is_set()
    first.release()
    t.join(timeout=30)
    assert got.is_set() and not path.exists()


def test_several_locks_are_taken_in_order_and_released(tmp_path: Path):
    paths = [tmp_path / "b" / ".sft_grid.lock", tmp_path / "a" / ".sft_grid.lock"]
    with hold_all(paths, timeout_s=5) as locks:
        assert [lock.path for lock in locks] == sorted(paths) and all(p.is_file() for p in paths)
        with pytest.raises(LockTimeout):
            Lock(paths[0], timeout_s=0.2).acquire()
    assert not any(p.exists() for p in paths)


def test_an_old_lock_file_that_names_no_holder_is_taken(tmp_path: Path):
    """What flock left behind (an empty file), or a taker killed between creating the file and writing it."""
    path = tmp_path / ".sft_grid.lock"
    path.write_text("")
    with pytest.raises(LockTimeout):  # fresh: a taker may be writing its name into it right now
        Lock(path, timeout_s=0.3, stale_s=60).acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    with Lock(path, timeout_s=5, stale_s=60) as lock:
        assert _holder(path).token == lock.me.token


def test_a_fresh_lock_taken_while_a_stale_one_is_broken_is_put_back(tmp_path: Path, monkeypatch):
    """Two breakers of one stale lock: the second must not remove the lock the first took meanwhile."""
    path = tmp_path / "repo.lock"
    path.write_text(json.dumps({"host": "gone", "pid": 1, "token": "dead", "since": 0.0}))
    old = time.time() - 120
    os.utime(path, (old, old))
    st = path.stat()
    judged = (st.st_dev, st.st_ino, st.st_mtime_ns)
    path.unlink()  # the first breaker broke it and took the lock: a new file at the same path
    path.write_text(json.dumps({"host": "login02", "pid": 7, "token": "fresh", "since": time.time()}))
    Lock(path, timeout_s=1)._break(judged)  # the second breaker acts on what it judged before
    assert _holder(path).token == "fresh"


def test_every_lock_of_sft_grid_is_this_one():
    """No flock left anywhere in sft_grid: on Lustre, GPFS and some NFS mounts it can succeed for everyone."""
    package = Path(__file__).resolve().parents[1] / "sft_grid"
    users = [str(p.relative_to(package)) for p in package.rglob("*.py") if "fcntl" in p.read_text()]
    assert users == []
