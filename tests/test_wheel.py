"""sft_grid as a team installs it: the built wheel in a fresh virtual environment, run from the team's own repository.

The wheel is built from a copy of this checkout's sources (`pip wheel`, setuptools from the package registry) and
installed into a new virtualenv. The copy is the test's own: setuptools builds in the source tree (build/,
*.egg-info), so two workers building from the checkout itself would share one build/ and race (seen in CI: one
build's file gone from under the other, "[Errno 2] No such file or directory"), and a test would write into the
checkout. The virtualenv sees this machine's site-packages (`--system-site-packages`), so pip resolves the
wheel's dependencies against what is installed rather than downloading them again; sft_grid itself comes from the
wheel, which each test checks (`sft_grid.__file__` lies in the virtualenv, never in this checkout).

The team's repository is a temporary git repository laid out by `sft-grid init`, with its own cluster, model,
dataset (a local file of conversations) and sweep, some copied in with `sft-grid cp`. From a folder inside it:
`--help` lists its options beside the shipped ones, a dry run renders its grid under its runs/, the rerun line of
each cell composes the same cell from anywhere, nothing is written into the installed package, and (backend set)
the grid really trains with LLaMA-Factory on the CPU, and a second launch runs nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sft_grid.core.paths import REPO_ROOT

# what the build reads: pyproject.toml names the packages, README.md is its readme
SOURCES = ("pyproject.toml", "README.md", "sft_grid", "hydra_plugins")
CONVERSATIONS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": str(a + b)}]}
    for a in range(6)
    for b in range(4)
]
SWEEP = """\
# @package _global_
defaults:
  - override /cluster: team_cpu
  - override /model: team_tiny
  - override /dataset: team_chat
sweep_name: team_grid
max_steps: 2
global_batch_size: 2
micro_batch_size: 1
cutoff_len: 128
save_total_limit: 1
hydra:
  sweeper:
    params:
      lr: 1e-4,2e-4
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel built from this checkout installed."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)],
        check=True,
        timeout=600,
    )
    (wheel,) = (root / "dist").glob("sft_grid-*.whl")
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env)], check=True, timeout=300)
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    return env


def sft(venv: Path, *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None):
    """The installed `sft-grid` console script, as a user runs it (no PYTHONPATH pointing at this checkout)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SFT_GRID_CONF", "SFT_GRID_RUNS")}
    return subprocess.run(
        [str(venv / "bin" / "sft-grid"), *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def installed_package(venv: Path) -> Path:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sft_grid, os; print(os.path.dirname(sft_grid.__file__))"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def listing(package: Path) -> dict[str, float]:
    """Every file of the installed package and its mtime (Python's own bytecode caches left out)."""
    return {str(p.relative_to(package)): p.stat().st_mtime for p in package.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def team(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The team's experiment repository: init, its own cluster/model (copied and renamed), dataset and sweep."""
    repo = tmp_path_factory.mktemp("team") / "experiments"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert sft(venv, "init", str(repo), cwd=repo.parent).returncode == 0
    for what in (("cluster/local", "team_cpu"), ("model/tiny_llama", "team_tiny")):
        proc = sft(venv, "cp", *what, cwd=repo)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    data = repo / "data" / "chat.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    (repo / "conf" / "dataset" / "team_chat.yaml").write_text(
        yaml.safe_dump(
            {
                "team_chat": {
                    "source": str(data),
                    "formatting": "sharegpt",
                    "messages": "messages",
                    "tags": {
                        "role_tag": "role",
                        "content_tag": "content",
                        "user_tag": "user",
                        "assistant_tag": "assistant",
                        "system_tag": "system",
                    },
                }
            }
        )
    )
    (repo / "conf" / "sweep" / "team_grid.yaml").write_text(SWEEP)
    return repo


def test_the_wheel_carries_the_configs_and_composes_the_teams_first(venv, team):
    package = installed_package(venv)
    assert package.is_relative_to(venv) and not package.is_relative_to(REPO_ROOT)
    assert (package / "conf" / "sweep" / "delphi_scaling.yaml").is_file()
    inside = team / "data"  # anywhere in the repository
    helped = sft(venv, "run", "--help", cwd=inside)
    assert helped.returncode == 0, helped.stderr
    groups = {line.split(":")[0]: line.split(":", 1)[1] for line in helped.stdout.splitlines() if ": " in line}
    assert {"team_tiny", "qwen3_8b"} <= {o.strip() for o in groups["model"].split(",")}
    assert {"team_grid", "delphi_scaling"} <= {o.strip() for o in groups["sweep"].split(",")}
    # a team option of a shipped name wins: its cluster profile, copied under the shipped name and edited
    shown = sft(venv, "run", "--cfg", "job", "cluster=team_cpu", cwd=inside)
    assert shown.returncode == 0 and "name: team_cpu" in shown.stdout  # renamed inside by cp
    (team / "conf" / "cluster" / "local.yaml").write_text(
        (REPO_ROOT / "sft_grid" / "conf" / "cluster" / "local.yaml").read_text().replace("name: local", "name: ours")
    )
    try:
        mine = sft(venv, "run", "--cfg", "job", cwd=inside)
        assert mine.returncode == 0 and "name: ours" in mine.stdout
    finally:
        (team / "conf" / "cluster" / "local.yaml").unlink()


def test_a_dry_run_from_the_teams_repository_renders_there_and_writes_nothing_into_the_package(venv, team):
    package = installed_package(venv)
    before = listing(package)
    proc = sft(venv, "run", "-m", "+sweep=team_grid", "dry_run=true", cwd=team / "conf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = sorted((team / "runs" / "team_grid").glob("*/cell.yaml"))
    assert len(cells) == 2
    assert listing(package) == before
    # the rerun line names the team's config folder: run from outside the repository, it composes the same cell
    # into the same directory
    header = cells[0].read_text().splitlines()[2]
    assert header.startswith("# Rerun this cell: SFT_GRID_CONF=")
    words = shlex.split(header.removeprefix("# Rerun this cell: "))
    env = dict(w.split("=", 1) for w in words[: words.index("python")])
    assert env["SFT_GRID_CONF"] == str((team / "conf").resolve())
    again = sft(venv, "run", *words[words.index("sft_grid") + 1 :], "dry_run=true", cwd=Path("/"), env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert cells[0].parent.name in again.stdout
    assert not Path("/runs").exists()
    # without the folder the same overrides are refused: the team's options are not shipped
    lost = sft(venv, "run", *words[words.index("sft_grid") + 1 :], "dry_run=true", cwd=Path("/"))
    assert lost.returncode != 0 and "team_" in lost.stderr


@pytest.mark.backend
def test_the_teams_grid_trains_from_the_installed_wheel(venv, team, tiny_assets):
    proc = sft(venv, "run", "-m", "+sweep=team_grid", cwd=team)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = sft(venv, "status", "team_grid", "--format", "json", cwd=team / "data")
    assert status.returncode == 0, status.stderr
    states = [c["state"] for c in json.loads(status.stdout)["rows"]]
    assert states == ["completed", "completed"]
    for cell in (team / "runs" / "team_grid").glob("*/"):
        assert "team_tiny" in (cell / "cell.yaml").read_text()
    second = sft(venv, "run", "-m", "+sweep=team_grid", cwd=team)
    assert second.returncode == 0 and "nothing to run" in (second.stdout + second.stderr).lower()
