"""Budget arithmetic, plan verdicts and messages of Hub staging (pure, no server)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sft_grid.core.hubcache import RemoteFile, select_files
from sft_grid.stages.staging import HubError, HubUnreachable, download, resolve
from sft_grid.stages.staging.values import Budget, Plan, Resolved

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hf_env


def test_budget_counts_from_the_process_start_and_keeps_a_margin():
    now = time.monotonic()
    b = Budget(100.0, now - 30.0, margin_s=10.0)
    assert b.usable_s == 90.0 and b.left(now) == pytest.approx(60.0)
    assert b.runs_for(200.0) == 3 and b.runs_for(1.0) == 1
    assert Budget.from_now(100.0).margin_s == 10.0 and Budget.from_now(20.0).margin_s == 5.0
    assert Budget.since_process_start(100.0).started <= Budget.from_now(100.0).started


def test_budget_since_process_start_counts_the_time_already_spent():
    code = (
        "import time; time.sleep(0.5); from sft_grid.stages.staging.values import Budget; "
        "print(Budget.since_process_start(100.0, margin_s=10.0).left())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    ).stdout
    assert 60.0 < float(out) <= 89.5  # the half second slept (and the start-up) is already gone


def test_plan_fits_only_with_the_reserve_counted():
    files = (RemoteFile("a.safetensors", 600, "0" * 40, "1" * 64),)
    resolved = Resolved("org/a", "model", "main", "2" * 40, files)
    sel = select_files(files, "model")
    plan = Plan(
        resolved=resolved,
        cache=Path("/c"),
        selection=sel,
        cached=(),
        to_link=(),
        to_fetch=files,
        bytes_to_fetch=600,
        free_bytes=1000,
        reserve_bytes=300,
    )
    assert plan.bytes_needed == 600 and plan.fits
    assert not dataclasses.replace(plan, reserve_bytes=500).fits
    assert "1 files, 600 B needed, 600 B to fetch" in plan.describe()


def test_unreachable_hub_names_the_fix(hf_env, tmp_path):
    dead = "http://127.0.0.1:9"  # discard port: nothing listens, the connection is refused at once
    with pytest.raises(HubUnreachable, match=r"cannot reach http://127\.0\.0\.1:9.*login node"):
        resolve("org/tiny", endpoint=dead)
    with pytest.raises(HubUnreachable):
        download("org/tiny", "model", "main", tmp_path / "cache", endpoint=dead)
    with pytest.raises(ValueError, match="kind"):
        download("org/tiny", "space", "main", tmp_path / "cache", endpoint=dead)


def test_a_limit_that_leaves_no_time_names_the_smallest_that_works():
    now = time.monotonic()
    assert Budget(100.0, now - 3.0, 10.0, auto_margin=True).too_short(now) is None
    b = Budget(5.0, now - 0.4, 5.0, auto_margin=True)  # all of it is margin
    why = b.too_short(now)
    assert why is not None and "time limit of 5s" in why and "needs 0.4s" in why
    assert "the smallest limit that works here is 7s" in why and " Fix: " in why and "\n" not in why
    # the smallest limit keeps the default margin's rule: a tenth, at least 5 s
    assert b.limit_for(1.4) == 7 and b.limit_for(90.0) == 100 and Budget(5.0, now, 0.5).limit_for(1.4) == 2
    assert "smallest limit that works here is 19s" in Budget(10.0, now - 12.0, 5.0, auto_margin=True).refusal(2.0, now)


def test_a_cache_that_cannot_be_written_is_named(hf_env, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(HubError, match=r"cannot write into the Hugging Face cache .*Fix: point the cache"):
        download("org/tiny", "model", "main", blocker / "cache", endpoint="http://127.0.0.1:9")
