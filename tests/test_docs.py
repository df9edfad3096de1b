"""The README and docs/ say what is true: every command in a fenced block of README.md and docs/*.md parses as the
program it names parses it (a `sft-grid`/`python -m sft_grid` command with options its parser accepts; Hydra's
overrides in Hydra's grammar, the cell they describe composed and validated; a make target the Makefile has), every
link to a file of the repository resolves, and the README stays a front page whose first commands are the two that
CI and a fresh machine run."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob

from sft_grid.cli import cmd_stage
from sft_grid.cli import main as cli
from sft_grid.core import project
from sft_grid.core.paths import PACKAGE_CONF, REPO_ROOT
from sft_grid.planning import resolvers
from sft_grid.planning.cells import plan_cell
from sft_grid.planning.hydra_errors import options
from sft_grid.planning.validate import validate

from .conftest import hydra_plain

README = REPO_ROOT / "README.md"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))
DOCS = [README, *PAGES]
SHELLS = ("", "bash", "sh", "shell", "console")
COMMAND_START = re.compile(r"^(sft-grid\b|python3? -m sft_grid\b|make\b)")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    argv: tuple[str, ...]
    refused: bool = False  # an example of bad input: its comment says `# refused: ...`

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line's number, lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(```+|~~~+)\s*([\w-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, lang, start = opening.group(1), opening.group(2), i + 2
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield lang, start, body


def _expand(word: str) -> str:
    """What the shell hands over for $VAR: a path-like value, so a line reads the same on any machine."""
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: f"/{m.group(1).lower()}", word)


def commands(path: Path) -> list[Command]:
    """Every command line of the file's shell blocks (continuations joined, comments dropped, `&&` split)."""
    found = []
    for lang, start, body in fenced_blocks(path.read_text()):
        if lang not in SHELLS:
            continue
        joined: list[tuple[int, str]] = []
        for n, line in enumerate(body, start):
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((n, line))
        for n, line in joined:
            try:
                words = [_expand(w) for w in shlex.split(line, comments=True)]
            except ValueError as exc:  # not shell: the check below fails on it
                found.append(Command(f"{path.relative_to(REPO_ROOT)}:{n}", ("(not shell)", str(exc), line)))
                continue
            part: list[str] = []
            for w in [*words, "&&"]:
                if w in ("&&", ";", "||", "|"):
                    if part:
                        refused = bool(re.search(r"\s#\s*refused\b", line))
                        found.append(Command(f"{path.relative_to(REPO_ROOT)}:{n}", tuple(part), refused))
                    part = []
                else:
                    part.append(w)
    return found


ALL = [c for p in DOCS for c in commands(p)]
CHECKED = [c for c in ALL if COMMAND_START.match(shlex.join(c.argv))]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))


def _argparse_ok(parser: argparse.ArgumentParser, args: list[str]) -> str:
    """'' when the parser takes these arguments (--help included), else what it said."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            return "" if exc.code == 0 else err.getvalue().strip() or f"exit {exc.code}"
    return ""


def _with_sweep_axes(overrides: list[str]) -> list[str]:
    """The command line's overrides, and the axes of the sweep file it names that it does not set itself."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    named = [str(ov.value()) for ov in parsed if ov.key_or_group == "sweep"]
    if not named:
        return overrides
    found = project.find_option("sweep", named[-1])
    assert found is not None, f"no sweep {named[-1]}"
    sweep = yaml.safe_load(found.read_text()) or {}
    axes = ((sweep.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    given = {ov.key_or_group for ov in parsed}
    return [*overrides, *(f"{k}={v}" for k, v in axes.items() if k not in given)]


def _first_cell(overrides: list[str]) -> list[str]:
    """The overrides of a grid's first cell: each swept value's first (a glob's first match among its options), the
    sweep file's axes included."""
    cell = []
    for ov in OverridesParser.create().parse_overrides(_with_sweep_axes(overrides)):
        value = ov.value()
        if isinstance(value, Glob):
            matches = value.filter(options(ov.key_or_group))
            assert matches, f"{ov.input_line} matches no option of {ov.key_or_group}"
            cell.append(f"{ov.get_key_element()}={matches[0]}")
        elif ov.is_sweep_override():
            cell.append(f"{ov.get_key_element()}={next(ov.sweep_string_iterator())}")
        else:
            cell.append(ov.input_line or "")
    return cell


def check_hydra(args: list[str], tmp_path: Path) -> str:
    """The Hydra app's arguments: its own flags, each override in its grammar, the first cell composed and valid."""
    parser = get_args_parser()
    said = _argparse_ok(parser, args)
    if said:
        return said
    ns = parser.parse_args(args)
    try:
        cell_overrides = _first_cell(ns.overrides)
    except Exception as exc:  # Hydra's grammar error, or a glob that matches nothing
        return f"{type(exc).__name__}: {exc}"
    if ns.help or ns.hydra_help or ns.shell_completion or ns.info:
        return ""
    cell_overrides.append(f"runs_root={tmp_path / 'runs'}")
    try:
        cell = plan_cell(cell_overrides, hydra_plain(cell_overrides))
    except Exception as exc:
        return f"does not compose: {type(exc).__name__}: {exc}"
    problems = validate([cell])
    return "; ".join(p.render() for p in problems)


def check_sft_grid(args: list[str], tmp_path: Path, module: bool) -> str:
    """`sft-grid ARGS` (module=False) or `python -m sft_grid ARGS` (module=True), as each program reads them."""
    first = args[0] if args else ""
    if module and first not in cli.COMMANDS and first not in cli.INTERNAL:
        return (
            cli.not_a_command(first)
            if first and not first.startswith(("-", "+", "~")) and "=" not in first
            else (check_hydra(args, tmp_path))
        )
    if first.startswith("-") or not first:
        return _argparse_ok(cli._parser(None), args)
    if cli.not_a_command(first):
        return cli.not_a_command(first)
    rest = args[1:]
    if first in ("run", "check") or (first == "stage" and not any(a.startswith("--repo") for a in rest)):
        return check_hydra(rest, tmp_path) if rest not in (["-h"], ["--help"]) else ""
    if first == "stage":
        return _argparse_ok(cmd_stage.repo_parser(), rest)
    return _argparse_ok(cli._parser(first), args)


@pytest.fixture
def site_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dummy value for every per-user variable a shipped cluster reads (${user_env:VAR}), as a user exports them."""
    for path in (PACKAGE_CONF / "cluster").glob("*.yaml"):
        for name in resolvers.variables(path.read_text()):
            monkeypatch.setenv(name, f"dummy-{name.lower()}")


@pytest.fixture
def a_team_repository(tmp_path, monkeypatch):
    """A repository as `sft-grid init` lays it out, its config folder searched first ($SFT_GRID_CONF): the commands
    of docs/your-repository.md run in one (its example sweep is not shipped)."""
    from sft_grid.cli import cmd_init

    for path, text in cmd_init.plan(tmp_path / "team").items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv(project.CONF_ENV, str(tmp_path / "team" / "conf"))


@pytest.mark.parametrize("command", CHECKED, ids=str)
def test_every_documented_command_parses(command, a_team_repository, hydra_loader, site_variables, tmp_path):
    argv = list(command.argv)
    if argv[0] == "make":
        unknown = [t for t in argv[1:] if not t.startswith("-") and "=" not in t and t not in makefile_targets()]
        assert not unknown, f"{command}: no such make target {unknown}"
        return
    if argv[0] == "sft-grid":
        said = check_sft_grid(argv[1:], tmp_path, module=False)
    elif argv[2] == "sft_grid":
        said = check_sft_grid(argv[3:], tmp_path, module=True)
    elif argv[2] == "sft_grid.job":  # a rendered cell, run here as its job runs it
        said = "" if len(argv) == 4 else "usage: python -m sft_grid.job CELL_DIR"
    else:
        pytest.fail(f"{command}: not a command of this project")
    if command.refused:
        assert said, f"{command}: documented as refused, and it is taken"
    else:
        assert not said, f"{command}\n  {said}"


def test_what_the_prose_names_exists():
    """`sft-grid <word>` anywhere in a page names a command; a repository path a command line names is there."""
    wrong = []
    for path in DOCS:
        words = re.findall(r"sft-grid ([a-z][a-z_]*)\b", path.read_text())
        wrong += [
            f"{path.relative_to(REPO_ROOT)}: sft-grid {w}" for w in words if w not in {**cli.COMMANDS, **cli.INTERNAL}
        ]
    for command in ALL:
        paths = [w for w in command.argv if re.match(r"^(tests|benchmarks|scripts|sweeps|conf)/[\w./-]+$", w)]
        wrong += [f"{command}: no {w}" for w in paths if not (REPO_ROOT / w).exists()]
    assert not wrong, wrong


def test_the_commands_checked_are_the_documented_ones():
    """What the checker reads: every page's shell blocks, the README's demo among them; a command outside a fenced
    block would escape the check, so none is indented as a code block; a shell block holds shell."""
    assert not [str(c) for c in ALL if c.argv[0] == "(not shell)"], "a shell block that is not shell: use ```text"
    assert len({c.where.split(":")[0] for c in CHECKED}) >= 10 and len(CHECKED) >= 40
    assert any(c.argv == ("sft-grid", "run", "-m", "model=tiny_llama,tiny_qwen3", "lr=2e-5") for c in CHECKED)
    loose = []
    for path in DOCS:
        fenced = {
            n for _, start, body in fenced_blocks(path.read_text()) for n in range(start - 1, start + len(body) + 1)
        }
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if n not in fenced and line.startswith("    ") and COMMAND_START.match(line.strip()):
                loose.append(f"{path.relative_to(REPO_ROOT)}:{n}: {line.strip()}")
    assert not loose, "put these in a fenced block, where they are checked:\n" + "\n".join(loose)


@pytest.mark.parametrize(
    "line, said",
    [
        ("sft-grid statsu smoke", "is not a command"),
        ("sft-grid status smoke --wach", "unrecognized arguments: --wach"),
        ("sft-grid run -m model=no_such_model", "does not compose"),
        ("sft-grid run -m lr=inf", "lr=inf"),
        ("sft-grid run -m model='glob(nothing_*)'", "matches no option"),
        ("sft-grid run -m 'lr=choice(1e-5'", "OverrideParseException"),
        ("sft-grid stage --repo", "expected one argument"),
        ("python -m sft_grid logs smoke", "the following arguments are required: CELL"),
        ("python -m sft_grid smoke", "is not a command"),
    ],
)
def test_the_checker_fails_on_what_is_wrong(tmp_path, hydra_loader, line, said):
    argv = shlex.split(line)
    got = (
        check_sft_grid(argv[1:], tmp_path, module=False)
        if argv[0] == "sft-grid"
        else (check_sft_grid(argv[3:], tmp_path, module=True))
    )
    assert said in got, got


# -- links ----------------------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text()
    fenced = {n for _, start, body in fenced_blocks(text) for n in range(start - 1, start + len(body) + 1)}
    return {
        slug(line.lstrip("#"))
        for n, line in enumerate(text.splitlines(), 1)
        if line.startswith("#") and n not in fenced
    }


def links(path: Path) -> list[str]:
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_link_resolves(path):
    broken = []
    for target in links(path):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{path.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_every_page_is_in_the_index_and_the_readme_leads_there():
    index = REPO_ROOT / "docs" / "index.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    assert not [p.name for p in PAGES if p != index and p.resolve() not in listed], "add each page to docs/index.md"
    assert "docs/index.md" in links(README)
    assert {t for t in links(README) if t.startswith("docs/")} >= {"docs/setup.md", "docs/commands.md"}


# -- the README is a front page --------------------------------------------------------------------------------


def test_the_readme_is_a_front_page_that_opens_with_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    _, _, first = next(fenced_blocks(text))
    assert [shlex.split(line, comments=True) for line in first] == [["make", "demo"], ["make", "test"]]
    assert text.index("make demo") > text.index("sft_grid runs grids")  # after the intro, before anything else
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text().split("stamp\n", 1)[1]  # what CI runs


def test_make_demo_runs_the_command_the_readme_says_it_runs():
    text = README.read_text()
    said = text.split("`make demo` runs the main command:", 1)[1]
    _, _, block = next(fenced_blocks(said))
    (readme_argv,) = [shlex.split(line, comments=True) for line in block]
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe
    make_argv = shlex.split(recipe.group(1).strip().splitlines()[-1])
    assert make_argv[:3] == ["$(PYTHON)", "-m", "sft_grid"]
    # `python -m sft_grid OVERRIDES` is `sft-grid run OVERRIDES`
    assert readme_argv[:2] == ["sft-grid", "run"] and make_argv[3:] == readme_argv[2:]


def test_no_file_says_a_command_the_old_way():
    """`python -m sft_grid.<command>` is gone (the job's own entry point, `python -m sft_grid.job`, stays); the
    environments' locks keep their first line, which their key hashes (conf/locks is not read here)."""
    roots = [*DOCS, *(PACKAGE_CONF).rglob("*.yaml"), *(PACKAGE_CONF / "sweep").glob("*.yaml")]
    roots += [REPO_ROOT / "Makefile", *(REPO_ROOT / "scripts").glob("*"), *(REPO_ROOT / ".ci").glob("*")]
    roots += [*(REPO_ROOT / "benchmarks").glob("*"), REPO_ROOT / "tests" / "README.md"]
    old = [
        f"{p.relative_to(REPO_ROOT)}: {m.group()}"
        for p in roots
        if p.is_file()
        for m in re.finditer(r"python3? -m sft_grid\.(\w+)\b(?!\.)", p.read_text())
        if m.group(1) in cli.COMMANDS or m.group(1) in cli.INTERNAL
    ]
    assert not old, old


def test_the_variables_a_command_names_are_expanded_as_the_shell_does():
    assert _expand("cluster.hf_cache=$WORK/hf_hub") == "cluster.hf_cache=/work/hf_hub"
    assert os.path.basename(_expand("${SCRATCH}/x")) == "x"
