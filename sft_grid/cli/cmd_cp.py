"""sft-grid cp GROUP/OPTION [NAME]: copy a shipped option into the team's repository to edit (torchtune's `tune cp`).

    sft-grid cp cluster/leonardo              # conf/cluster/leonardo.yaml: the same name, so it wins over the shipped
    sft-grid cp model/qwen3_8b qwen3_8b_long  # conf/model/qwen3_8b_long.yaml: a new option beside the shipped one

The copy goes to the config folder of the repository the command runs in (sft_grid.yaml's `conf:`, or its
`conf/`; `--to DIR` names another), and never over a file that is there. A copy under a new name is renamed
inside too where the file names itself: a model's or a cluster's `name:` (a model's is part of each cell's
identity), a dataset's key, a sweep's `sweep_name`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from sft_grid.core import project
from sft_grid.core.paths import PACKAGE_CONF


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "option", metavar="GROUP/OPTION", help="a shipped option, e.g. model/qwen3_8b, cluster/leonardo"
    )
    parser.add_argument("name", nargs="?", help="the copy's name (default: the same, which then wins)")
    parser.add_argument("--to", metavar="DIR", help="the config folder to copy into (default: the repository's)")
    parser.add_argument(
        "--force", action="store_true", help="copy under the name of another shipped option, which the copy then hides"
    )


OPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name_problem(name: str) -> str | None:
    """Why a name cannot be an option's (its file is <name>.yaml, and a cell's name is made of it), or None."""
    if OPTION_NAME.fullmatch(name):
        return None
    return (
        f"{name!r} is not an option name: a letter or a digit first (not . .. or a leading dot or -, which a cell's"
        " name refuses), then letters, digits, _ . -"
    )


def renamed(text: str, group: str, old: str, new: str) -> str:
    """The option's text under its new name: a model's `name:`, a dataset's top-level key."""
    if old == new:
        return text
    if group in ("model", "cluster"):
        return re.sub(rf"^name:\s*{re.escape(old)}\s*$", f"name: {new}", text, count=1, flags=re.M)
    if group == "dataset":
        return re.sub(rf"^{re.escape(old)}:", f"{new}:", text, count=1, flags=re.M)
    if group == "sweep":
        return re.sub(rf"^sweep_name:\s*{re.escape(old)}\s*$", f"sweep_name: {new}", text, count=1, flags=re.M)
    return text


def run(args: argparse.Namespace) -> int:
    # an unset shell variable (`sft-grid cp model/x "$NAME"`) would copy under the option's own name, or into here
    for what, value, fix in (
        ("GROUP/OPTION", args.option, "name a shipped option, e.g. model/qwen3_8b"),
        ("NAME", args.name, "name the copy, or give no NAME to keep the option's"),
        ("--to", args.to, "name the config folder, or drop --to for the repository's"),
    ):
        if value is not None and not value.strip():
            print(f"sft-grid cp: {what} is empty (an unset shell variable?); nothing copied: {fix}", file=sys.stderr)
            return 2
    from sft_grid.planning.hydra_errors import did_you_mean

    group, _, option = args.option.strip("/").partition("/")
    option = option.removesuffix(".yaml")  # the option's file named (model/qwen3_8b.yaml): the option
    # the groups with options to copy (conf/locks and conf/replay hold a backend's pins and a table, not options)
    shipped = sorted(p.name for p in PACKAGE_CONF.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
    if group not in shipped or not option:  # a mistyped group, or an option's name alone (qwen3_8b: model/qwen3_8b)
        holders = [f"{g}/{group.removesuffix('.yaml')}" for g in shipped if not option]
        holders = [h for h in holders if (PACKAGE_CONF / f"{h}.yaml").is_file()]
        hint = f" (did you mean {holders[0]!r}?)" if holders else did_you_mean(group, set(shipped) - {group})
        print(
            f"sft-grid cp: {args.option!r} is not GROUP/OPTION{hint}; the groups: {', '.join(shipped)} (e.g. sft-grid"
            " cp model/qwen3_8b)",
            file=sys.stderr,
        )
        return 2
    source = PACKAGE_CONF / group / f"{option}.yaml"
    if not source.is_file():
        names = sorted(p.stem for p in (PACKAGE_CONF / group).glob("*.yaml"))
        print(
            f"sft-grid cp: no shipped option {group}/{option}{did_you_mean(option, names)}; the shipped {group}"
            f" options: {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    name = args.name or option
    if name.endswith(".yaml"):
        name = name[: -len(".yaml")]  # the option's name; the file is <name>.yaml
    wrong = name_problem(name)
    if wrong:
        print(f"sft-grid cp: {wrong}", file=sys.stderr)
        return 2
    if name != option and (PACKAGE_CONF / group / f"{name}.yaml").is_file() and not args.force:
        print(
            f"sft-grid cp: {group}/{name} is a shipped option too: the copy of {option} would hide it ({group}={name}"
            f" would then be {option}'s copy); nothing copied: name the copy otherwise (sft-grid cp {group}/{option}"
            f" my_{name}), or add --force to hide the shipped {name}",
            file=sys.stderr,
        )
        return 2
    if args.to:
        conf = Path(args.to).expanduser().resolve()
    else:
        found = project.find()
        if found is None:
            print(
                "sft-grid cp: not in an experiment repository (no sft_grid.yaml or conf/ here or above);"
                " run sft-grid init first, or give --to DIR",
                file=sys.stderr,
            )
            return 2
        conf = found.conf
    target = conf / group / f"{name}.yaml"
    if target.exists():
        print(
            f"sft-grid cp: {target} is already there; nothing copied (edit it, or remove it to copy afresh)",
            file=sys.stderr,
        )
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(renamed(source.read_text(), group, option, name))
    what = "wins over the shipped one of the same name" if name == option else f"use it as {group}={name}"
    print(f"copied {group}/{option} to {target} ({what})")
    return 0
