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

from sft_grid.core.lock import Lock, LockTimeout, _read
from tests.hubtools import wait_for


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
    with Lock(path, timeout_s=5):
        with pytest.raises(LockTimeout) as e:
            Lock(path, timeout_s=0.2).acquire()
    assert e.value.holder is not None and e.value.holder.pid == os.getpid()
    assert f"pid {os.getpid()}" in str(e.value)


def test_lock_of_a_killed_process_on_this_host_is_broken_at_once(tmp_path: Path):
    path = tmp_path / "repo.lock"
    code = ("import sys, time; from sft_grid.core.lock import Lock; "
            "Lock(__import__('pathlib').Path(sys.argv[1]), timeout_s=5).acquire(); print('held', flush=True); "
            "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
    finally:
        child.kill()
        child.wait(timeout=30)
    assert _read(path).pid == child.pid  # left behind by kill -9
    t0 = time.monotonic()
    with Lock(path, timeout_s=30, stale_s=3600) as lock:
        assert _read(path).token == lock.me.token
    assert time.monotonic() - t0 < 5  # no waiting for a heartbeat to age


def test_lock_from_another_host_is_stale_only_when_its_heartbeat_stopped(tmp_path: Path):
    path = tmp_path / "repo.lock"
    path.write_text(json.dumps({"host": "login02", "pid": 1, "token": "t", "since": time.time()}))
    with pytest.raises(LockTimeout):  # fresh mtime: the other node's stager may be alive
        Lock(path, timeout_s=0.3, stale_s=60).acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    with Lock(path, timeout_s=5, stale_s=60) as lock:
        assert _read(path).token == lock.me.token


def test_holder_notices_when_its_lock_was_taken(tmp_path: Path):
    path = tmp_path / "repo.lock"
    lock = Lock(path, timeout_s=5, heartbeat_s=0.05)
    lock.acquire()
    path.write_text(json.dumps({"host": "elsewhere", "pid": 2, "token": "other", "since": time.time()}))
    wait_for(lambda: lock.lost, "the heartbeat to notice the takeover", 10, 0.01)
    lock.release()
    assert _read(path).token == "other"  # a lost lock is not deleted on release
