"""When a site of a grid across sites is down (sft_grid/sites/facts.py, schedulers/slurm.py): a look asks its controller
several times with backoff before it counts as silent, and the site is down only once its silence, recorded in the
grid's sites.json, has lasted its site_down_after_s over later looks; an answer ends it. Fast: a fake `sinfo` on
PATH and a clock given by the test."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sft_grid.core.schema import ClusterConf
from sft_grid.schedulers import slurm
from sft_grid.sites import facts
from sft_grid.sites.placement import SiteFacts

SITE = ClusterConf(name="b", executor="slurm", site_down_after_s=60)


def _fake_sinfo(tmp_path: Path, failures: int) -> dict[str, str]:
    """A `sinfo` that fails `failures` times (as a stopped controller does), then names two nodes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "count"
    count.write_text("0")
    script = bin_dir / "sinfo"
    script.write_text(
        f"#!/bin/sh\nn=$(cat {count}); echo $((n + 1)) > {count}\n"
        f'if [ "$n" -lt {failures} ]; then echo "sinfo: error: Unable to contact slurm controller" >&2; exit 1; fi\n'
        "echo n1; echo n2\n"
    )
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_one_missed_answer_is_asked_again_with_backoff(tmp_path: Path) -> None:
    waits: list[float] = []
    env = _fake_sinfo(tmp_path, failures=2)
    assert slurm.node_count(env, tries=3, sleep=waits.append) == 2
    assert waits == [2.0, 4.0]
    (tmp_path / "count").write_text("0")
    with pytest.raises(subprocess.CalledProcessError):
        slurm.node_count(env, tries=2, sleep=waits.append)


def test_a_site_is_down_only_once_its_silence_has_lasted(tmp_path: Path) -> None:
    silent = SiteFacts(name="b", cluster=SITE, reachable=False, error="no answer to sinfo in 3 tries")
    answered = replace(silent, reachable=True, error="")
    silences, down = facts.look(tmp_path, [silent], now=1000.0, record=True)
    assert not down and silences["b"].since == 1000.0 and silences["b"].looks == 1
    assert facts.read_record(tmp_path)["b"]["silent_since"] == 1000.0  # remembered across invocations
    silences, down = facts.look(tmp_path, [silent], now=1030.0, record=True)
    assert not down and silences["b"].looks == 2
    # a dry run looks without writing
    assert facts.look(tmp_path, [silent], now=1061.0, record=False)[1] == {"b"}
    assert facts.read_record(tmp_path)["b"]["looks"] == 2
    _, down = facts.look(tmp_path, [silent], now=1060.0, record=True)
    assert down == {"b"}
    # it answers: the silence ends, and the next one starts from zero
    _, down = facts.look(tmp_path, [answered], now=1100.0, record=True)
    assert not down and "b" not in facts.read_record(tmp_path)
    _, down = facts.look(tmp_path, [silent], now=1200.0, record=True)
    assert not down
    # site_down_after_s 0: down at its first silent look
    now = facts.look(tmp_path / "g", [replace(silent, cluster=replace(SITE, site_down_after_s=0))], 5.0, True)
    assert now[1] == {"b"}


def test_a_request_the_scheduler_refuses_has_no_estimate(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text('#!/bin/sh\necho "sbatch: error: Invalid generic resource (gres) specification" >&2\nexit 1\n')
    sbatch.chmod(0o755)
    request = facts.request_at(replace(SITE, gpus_per_node=4, gpu_directive="gres"), 1, 30)
    assert slurm.test_only(request, {"PATH": f"{bin_dir}:{os.environ['PATH']}"}) is None
