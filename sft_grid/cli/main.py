"""`sft-grid`: one console script, a subcommand per command.

    sft-grid run -m model=tiny_llama,tiny_qwen3 lr=2e-5     # run a grid (the Hydra app)
    sft-grid status GRID [--watch]                          # every cell's state, job, progress, post, eval
    sft-grid logs GRID CELL [-f]                             # a cell's training log, followed as it grows
    sft-grid --help                                          # every command, one line each

`python -m sft_grid ...` is the same program (`module_main`): a command's name first runs that command; anything
else is the Hydra app's arguments, as after `sft-grid run`. A bare first word that names no command is refused with
the commands' names, never handed to Hydra as an override.

Each command lives in sft_grid/cli/cmd_<name>.py and gives `add_arguments(parser)` and `run(args) -> exit status`
(or `main(argv)` where it takes another program's arguments as they are: `run`, `stage` with a grid's overrides).
Only the command that runs is imported: `sft-grid --help` lists them all from the table below, so it starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import ParamSpec

# name -> (module, what it does in one line); the order is the help's
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sft_grid.cli.app", "run a grid: Hydra's overrides, -m for a grid (python -m sft_grid OVERRIDES too)"),
    "status": ("sft_grid.cli.cmd_status", "each cell's state, job, progress, post, eval and class; --watch: live"),
    "logs": ("sft_grid.cli.cmd_logs", "a cell's training, evaluation or post-stage log; -f follows it as it grows"),
    "cancel": ("sft_grid.cli.cmd_cancel", "stop a grid's queued and running cells, or some of them"),
    "results": ("sft_grid.cli.cmd_results", "the grid's cells x values and scores: table, csv, json, markdown"),
    "report": ("sft_grid.cli.cmd_report", "the grid report: one self-contained HTML page and its data"),
    "show": ("sft_grid.cli.cmd_show", "what a cell trains on, token by token, as its backend renders it"),
    "check": ("sft_grid.cli.cmd_check", "resolve a grid's Hub models and datasets on the site's Hub: one table"),
    "stage": ("sft_grid.cli.cmd_stage", "stage a grid's Hub models and datasets ahead of time"),
    "post": ("sft_grid.cli.cmd_post", "run a cell's pending or failed post-training stages (the upload)"),
    "venv": ("sft_grid.cli.cmd_venv", "build, lock or locate the backends' virtual environments"),
    "assets": ("sft_grid.cli.cmd_assets", "build or locate the tiny local models and datasets"),
    "init": ("sft_grid.cli.cmd_init", "lay out an experiment repository: conf/ groups, sweeps, a .gitignore for runs"),
    "cp": ("sft_grid.cli.cmd_cp", "copy a shipped option (model/qwen3_8b, cluster/leonardo, ...) into yours to edit"),
    "import": ("sft_grid.cli.cmd_import", "turn a LLaMA-Factory or axolotl training YAML into model, dataset, sweep"),
    "release": ("sft_grid.cli.cmd_release", "let a gone site of a spread grid go: its queued cells placed elsewhere"),
    "completion": ("sft_grid.cli.main", 'bash completion: eval "$(sft-grid completion bash)"'),
}
# run by jobs, not people: not in the help
INTERNAL: dict[str, tuple[str, str]] = {
    "requeue": ("sft_grid.cli.cmd_requeue", "submit a cell again when its failure's policy requeues it"),
}
DESCRIPTION = "sft_grid: declarative grids of supervised fine-tuning experiments, on Slurm or on this machine."


def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, max_help_position=16, width=100)  # a command and its line on one line


def _module(name: str) -> ModuleType:
    return importlib.import_module({**COMMANDS, **INTERNAL}[name][0])


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    from sft_grid import __version__

    epilog = "`sft-grid COMMAND --help` says more; python -m sft_grid COMMAND is the same."
    parser = argparse.ArgumentParser(
        prog="sft-grid", description=DESCRIPTION, formatter_class=_formatter, epilog=epilog
    )
    parser.add_argument("--version", action="version", version=f"sft_grid {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (_, line) in [*COMMANDS.items(), *INTERNAL.items()]:
        p = sub.add_parser(
            name, help=line if name in COMMANDS else argparse.SUPPRESS, description=line, formatter_class=_formatter
        )
        if name == chosen:
            module = _module(name)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    # the internal command's choice is hidden from the list argparse prints
    sub._choices_actions = [a for a in sub._choices_actions if a.help != argparse.SUPPRESS]
    return parser


def not_a_command(word: str) -> str:
    """Why a first word that is not a command's name is refused (empty for an option, or a command)."""
    if word in COMMANDS or word in INTERNAL or word.startswith("-"):
        return ""
    if "=" in word or word.startswith(("+", "~")):
        return f"sft-grid: {word!r} is a Hydra override, not a command: overrides go after run (sft-grid run {word})"
    import difflib

    from sft_grid.core import project

    close = difflib.get_close_matches(word, COMMANDS, n=1)
    try:
        sweep = project.find_option("sweep", word)
    except project.ProjectError:
        sweep = None
    return (
        f"sft-grid: {word!r} is not a command"
        + (f" (did you mean {close[0]}?)" if close else "")
        + (f" (sweep/{word}.yaml is a grid: sft-grid run -m +sweep={word})" if sweep else "")
        + f"; the commands: {', '.join(COMMANDS)} (sft-grid --help says what each does); a grid's overrides are"
        " key=value (sft-grid run -m model=tiny_llama,tiny_qwen3)"
    )


P = ParamSpec("P")


def _said(entry: Callable[P, int]) -> Callable[P, int]:
    """An entry point whose operating-system errors end in one line, not a traceback: a path that cannot be made,
    read or written (a name longer than the file system takes, a file where a directory goes, no permission) is
    the user's to fix, and the line names it. Output cut short by its reader (`sft-grid --help | head`) ends quietly:
    the reader chose to stop."""

    @functools.wraps(entry)
    def said(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return entry(*args, **kwargs)
        except BrokenPipeError:
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
            return 0
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            too_long = exc.errno == errno.ENAMETOOLONG
            why = " (a name in it is longer than the file system takes, 255 bytes)" if too_long else ""
            print(f"sft-grid: {exc.strerror or exc}{why}{where}", file=sys.stderr)
            return 1

    return said


@_said
def module_main(argv: Sequence[str] | None = None) -> int:
    """`python -m sft_grid ...`: a command (`python -m sft_grid status GRID` is `sft-grid status GRID`), or else the
    Hydra app's arguments (`python -m sft_grid -m model=a,b` is `sft-grid run -m model=a,b`)."""
    from sft_grid.sites import call

    args = call.take(sys.argv[1:] if argv is None else argv)  # a site's own invocation: what it is asked
    sys.argv = [sys.argv[0], *args]
    if args and (args[0] in COMMANDS or args[0] in INTERNAL):
        return main(args)
    if args and not args[0].startswith(("-", "+", "~")) and "=" not in args[0]:
        print(not_a_command(args[0]), file=sys.stderr)  # a bare word is never handed to Hydra as an override
        return 2
    from sft_grid.cli.app import hydra_app

    hydra_app()
    return 0


@_said
def main(argv: Sequence[str] | None = None) -> int:
    from sft_grid.sites import call

    args = call.take(sys.argv[1:] if argv is None else argv)  # a site's own invocation: what it is asked
    from sft_grid.core import project

    try:
        project.find()  # a project file that cannot be used is said once, before any command reads it
    except project.ProjectError as exc:
        print(f"sft-grid: {exc}", file=sys.stderr)
        return 2
    if args and not_a_command(args[0]):
        print(not_a_command(args[0]), file=sys.stderr)
        return 2
    chosen = args[0] if args and args[0] in {**COMMANDS, **INTERNAL} else None
    if chosen is not None and chosen != "completion" and hasattr(_module(chosen), "main"):
        return int(_module(chosen).main(args[1:]) or 0)  # a command that reads its arguments as they are
    parser = _parser(chosen)
    parsed, rest = parser.parse_known_args(args)
    if rest and chosen is not None:  # a positional after an option (cancel GRID --runs-root R CELL), which argparse
        # before Python 3.13 leaves over: the command's own parser takes them intermixed (or names what it cannot)
        (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parsed = sub.choices[chosen].parse_intermixed_args(args[1:], argparse.Namespace(command=chosen))
    if parsed.command is None:
        parser.print_help()
        return 2
    empty = empty_argument(parsed)
    if empty:
        print(f"sft-grid {parsed.command}: {empty}", file=sys.stderr)
        return 2
    if getattr(parsed, "grid", None) and hasattr(parsed, "runs_root"):  # a remote grid answers there
        from sft_grid.cli.options import grid_dir
        from sft_grid.sites import remote

        here = grid_dir(parsed.grid, parsed.runs_root)
        try:
            placed = remote.read_record(here) if parsed.command in remote.FORWARDED else None
        except (ValueError, LookupError, TypeError, OSError):  # a damaged record: said in one line, the grid read here
            print(f"sft-grid: {_record_damage(here / remote.RECORD)}", file=sys.stderr)
            return _run(parsed)
        if placed and len(placed) > 1:  # a grid across remote sites: each site asked, the answers merged
            from sft_grid.cli import across

            return across.forward(parsed.command, args[1:], parsed.grid, here, placed)
        forwarded = remote.forward(parsed.command, args[1:], parsed.grid, here)
        if forwarded is not None:
            return forwarded
    return _run(parsed)


# a command's arguments that name a grid, a cell or a site -> what to give instead
NAMED = {
    "grid": "name the grid (its sweep_name) or its directory",
    "target": "name a grid (its sweep_name), a grid's directory or a cell's",
    "cell": "name a cell (or a part of its name)",
    "site": "name the site (a name of the grid's sites=[...])",
    "runs_root": "name the folder that holds the grids, or leave --runs-root out for the default",
}


def empty_argument(parsed: argparse.Namespace) -> str:
    """An empty GRID, CELL, --site or --runs-root (an unset shell variable: `sft-grid status "$GRID"`), which would
    read as the runs root itself, a part of every cell's name or the working folder; "" when none is empty."""
    for dest, fix in NAMED.items():
        value = getattr(parsed, dest, None)
        if isinstance(value, str) and not value.strip():
            what = f"--{dest.replace('_', '-')}" if dest in ("site", "runs_root") else dest.upper()
            return f"{what} is empty (an unset shell variable?); nothing done: {fix}"
    return ""


def _run(parsed: argparse.Namespace) -> int:
    """The command; a damaged file it stops on (core/cellfiles.DamagedFile, which names the file and where) is said
    in one line, exit status 1: the commands that read a grid read around such files, those that act on one stop."""
    from sft_grid.core.cellfiles import DamagedFile

    try:
        return int(parsed.run(parsed) or 0)
    except DamagedFile as exc:
        where = f"{exc.path}: {exc.damage.what}" if exc.path is not None else str(exc)
        print(f"sft-grid {parsed.command}: stopped on a damaged file: {where}", file=sys.stderr)
        return 1


def _record_damage(path: Path) -> str:
    """What is wrong with a grid's site record (sites/remote.py), and what is done instead, in one line."""
    from sft_grid.core.cellfiles import json_damage

    found = json_damage(path, str(path))
    what = found.text() if found is not None else f"{path}: not a site record (a site or a cell of another kind)"
    return f"{what}; the grid's site record is damaged, so the grid is read here, on this machine"


# -- completion ---------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=["bash"], help="the shell (bash; zsh reads it with bashcompinit)")


def run(args: argparse.Namespace) -> int:
    print(completion_script())
    return 0


def completion_script() -> str:
    """bash completion of the commands and each command's options, read from the parsers themselves."""
    lines = [
        '# sft-grid\'s bash completion: eval "$(sft-grid completion bash)"',
        "_sft_grid() {",
        '    local cur=${COMP_WORDS[COMP_CWORD]} opts=""',
        '    if [ "$COMP_CWORD" -eq 1 ]; then opts="' + " ".join(COMMANDS) + ' --help --version"; else',
        "    case ${COMP_WORDS[1]} in",
    ]
    for name in COMMANDS:
        module = _module(name)
        if not hasattr(module, "add_arguments"):
            continue
        p = argparse.ArgumentParser()
        module.add_arguments(p)
        options = sorted({s for a in p._actions for s in a.option_strings})
        choices = sorted({str(c) for a in p._actions if not a.option_strings and a.choices for c in a.choices})
        lines.append(f'        {name}) opts="{" ".join(options + choices)}";;')
    lines += [
        "    esac; fi",
        '    COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "}",
        "complete -o default -F _sft_grid sft-grid",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
