"""One way to say each command: `sft-grid <command>`, and `python -m sft_grid <command>` as its module form (no
module per command at the package's root). A bare first word that names no command is refused with the commands'
names, never handed to Hydra as an override; anything else is the Hydra app's (`sft-grid run`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from sft_grid.cli import main as cli
from sft_grid.core.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "sft_grid"
NAMES = {**cli.COMMANDS, **cli.INTERNAL}
# the one module entry point besides `python -m sft_grid`: a rendered cell run here as its job runs it (a subpackage
# with its own __main__, not a command's alias)
KEPT = "python -m sft_grid.job"


def module(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}  # this checkout's sft_grid, wherever the command runs
    return subprocess.run(
        [sys.executable, "-m", "sft_grid", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_module_form_runs_a_command_and_a_bare_word_is_refused(tmp_path):
    status = module("status", "--help", cwd=REPO_ROOT)
    assert status.returncode == 0 and status.stdout.startswith("usage: sft-grid status"), status.stderr
    typo = module("statsu", "smoke", cwd=tmp_path)
    assert typo.returncode == 2 and typo.stdout == ""
    assert "'statsu' is not a command (did you mean status?)" in typo.stderr
    assert "the commands: run, status, logs, cancel, results, report" in typo.stderr
    assert "Traceback" not in typo.stderr and list(tmp_path.iterdir()) == []  # nothing written


def test_an_override_first_still_goes_to_hydra(tmp_path):
    proc = module("model=no_such_model", cwd=REPO_ROOT)
    assert proc.returncode == 1 and "Could not find 'model/no_such_model'" in proc.stderr  # Hydra's own error


@pytest.mark.parametrize(
    "argv, hydra",
    [
        (["-m", "model=tiny_llama,tiny_qwen3"], True),
        (["model=tiny_llama"], True),
        (["+sweep=smoke"], True),
        (["~eval"], True),
        (["--cfg", "job"], True),
        ([], True),
        (["smoke"], False),
        (["dry_run"], False),
    ],
)
def test_what_the_module_form_hands_to_hydra(monkeypatch, capsys, argv, hydra):
    from sft_grid.cli import app

    seen: list[list[str]] = []
    monkeypatch.setattr(app, "hydra_app", lambda: seen.append(argv))
    rc = cli.module_main(argv)
    assert (seen == [argv]) is hydra and rc == (0 if hydra else 2)
    if not hydra:
        assert f"{argv[0]!r} is not a command" in capsys.readouterr().err


def test_a_sweeps_name_as_a_command_says_how_to_run_the_sweep(capsys):
    assert cli.module_main(["smoke"]) == 2
    assert "(sweep/smoke.yaml is a grid: sft-grid run -m +sweep=smoke)" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["statsu", "model=tiny_llama", "+sweep=smoke"])
def test_the_console_script_names_the_commands_for_a_word_it_does_not_know(capsys, word):
    assert cli.main([word, "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sft-grid: {word!r} is ") and err.count("\n") == 1
    assert ("the commands: run, status" in err) or (f"sft-grid run {word}" in err)


def test_every_command_is_reached_through_the_module_form():
    """Each command's own parser answers `--help` through `module_main` (in this process: no import per command)."""
    for name in [*cli.COMMANDS, *cli.INTERNAL]:
        if name == "run" or (hasattr(cli._module(name), "main") and name != "completion"):
            continue  # commands that read their arguments as they are (the Hydra app, stage, check)
        with pytest.raises(SystemExit) as exc:
            cli.module_main([name, "--help"])
        assert exc.value.code == 0, name


def test_no_module_per_command_at_the_package_root():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def _strings_and_comments(path: Path) -> list[tuple[int, str]]:
    with path.open("rb") as fh:
        tokens = list(tokenize.tokenize(fh.readline))
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.STRING, tokenize.COMMENT)]


def test_the_package_says_each_command_one_way():
    """Every string literal and comment of the package: no `python -m sft_grid.<x>` but the job's own entry point,
    no module path of a command handed to `-m`, and every `sft-grid <word>` names a real command."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO_ROOT)
        for line, text in _strings_and_comments(path):
            old = [m.group() for m in re.finditer(r"python3? -m sft_grid\.\w+", text) if m.group() != KEPT]
            bad += [f"{rel}:{line}: {o}" for o in old]
            named = re.fullmatch(r"['\"]sft_grid\.(\w+)['\"]", text)
            if named and named.group(1) in NAMES:
                bad.append(f"{rel}:{line}: {text} (run `sft_grid` with the command as its first argument)")
            words = re.findall(r"sft-grid ([a-z][a-z_]*)\b", text)
            bad += [f"{rel}:{line}: sft-grid {w} (no such command)" for w in words if w not in NAMES]
    assert not bad, "\n".join(bad)


def test_the_check_above_fails_on_the_old_spelling(tmp_path):
    """The scan reads f-strings and comments too: the old spelling in either is found."""
    sample = tmp_path / "sample.py"
    sample.write_text('x = f"run python -m sft_grid.post {1}"  # or python -m sft_grid.status\nKEEP = "sft_grid.job"\n')
    found = [m.group() for _, t in _strings_and_comments(sample) for m in re.finditer(r"python3? -m sft_grid\.\w+", t)]
    assert found == ["python -m sft_grid.post", "python -m sft_grid.status"]
    assert len(_strings_and_comments(Path(__file__))) > 20  # the scan reads this file's own strings, not nothing
