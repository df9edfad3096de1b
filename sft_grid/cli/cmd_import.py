"""sft-grid import FILE: an existing LLaMA-Factory or axolotl training YAML, or a command line of the team's old
launcher, as this repository's model, dataset and sweep options (sft_grid/planning/importing/ translates).

    sft-grid import qwen3_8b_32k.yaml --cluster leonardo --nodes 2   # conf/sweep/qwen3_8b_32k.yaml, + options
    sft-grid import fft.yaml --name qwen3_fft                          # the sweep's name (default: the file's)
    sft-grid import launch_qwen3.sh                                    # a script running python -m hpc.launch
    sft-grid import -- python -m hpc.launch --train_config_path x.yaml --num_nodes 2   # the command line itself

It writes into the repository's config folder (sft_grid.yaml's `conf:`, or its `conf/`; `--out DIR` names another,
and outside a repository the default is ./conf): `model/<name>.yaml` unless an option (shipped or yours) already
names the model's hub id, `dataset/<name>.yaml` for each source no option names yet, and `sweep/<name>.yaml`. It
prints where every key of the original went: mapped to sft_grid's keys, carried in the sweep's `extra:` (backend
keys passed through as they are), set by sft_grid (with why), or not carried (with why), and what it assumed (the
world size behind the global batch). Bad input (every problem of the original at once, its values held to the
schema's rules as `sft-grid run` holds them; an empty argument), or a file it would overwrite without --force, is
refused before anything is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

import yaml

from sft_grid.core import project
from sft_grid.core.paths import PACKAGE_CONF, REPO_ROOT
from sft_grid.core.templates import TOKENIZER_FAMILIES
from sft_grid.planning.importing import Option, Refused, Request, Result, translate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from sft_grid.cli.options import whole

    parser.add_argument(
        "source",
        nargs="+",
        metavar="FILE",
        help="the training YAML (LLaMA-Factory or axolotl) or a script with the old launcher's command line; or,"
        " after --, that command line itself",
    )
    parser.add_argument(
        "--name", metavar="NAME", help="the sweep's name (default: the file's, or the launcher's --job_name)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="the config folder to write into (default: the repository's, else ./conf)"
    )
    parser.add_argument(
        "--cluster", metavar="NAME", help="the cluster option the sweep selects (e.g. leonardo): its GPUs per node"
    )
    parser.add_argument(
        "--nodes", type=whole(1), metavar="N", help="the nodes the original trained on (pinned in the sweep)"
    )
    parser.add_argument(
        "--gpus-per-node", type=whole(1), metavar="N", help="its GPUs per node (default: the cluster's)"
    )
    parser.add_argument(
        "--params-b", type=float, metavar="B", help="a new model's size in billions, where its name gives none"
    )
    parser.add_argument(
        "--tokenizer-family", choices=sorted(TOKENIZER_FAMILIES), help="a new model's tokenizer, where unclear"
    )
    parser.add_argument("--force", action="store_true", help="overwrite the options an earlier import wrote")


def run(args: argparse.Namespace) -> int:
    try:
        _refuse_empty(args)
        conf = _conf_dir(args.out)
        request = _request(args, conf)
        result = translate(request)
        _check_targets(result, conf, args.force)
    except Refused as exc:
        print(f"sft-grid import: {exc}", file=sys.stderr)
        return 2
    for rel, text in result.files.items():
        path = conf / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(report(result, conf, request.source or Path("the command line")))
    if args.cluster:
        envs = _options("cluster", conf)[args.cluster].data.get("backend_venvs") or {}
        if not envs.get(result.kind):
            note = (
                f"note: cluster {args.cluster} names no {result.kind} environment: its cells train in the managed one"
                f" unless you give yours (cluster.backend_venvs.{result.kind}=<its directory>)"
            )
            print("\n".join(textwrap.wrap(note, width=118, subsequent_indent="      ")))
    return 0


def _refuse_empty(args: argparse.Namespace) -> None:
    """An empty argument (an unset shell variable: `sft-grid import "$CONFIG"`) is refused, not read as a default:
    an empty FILE would be this folder, an empty --out or --name the default one, an empty --cluster none."""
    if len(args.source) == 1 and not args.source[0].strip():
        raise Refused(
            "FILE is empty (an unset shell variable?): name the training YAML to import, e.g. sft-grid import"
            " lf_configs/qwen3_8b.yaml"
        )
    for flag, value in (("--out", args.out), ("--name", args.name), ("--cluster", args.cluster)):
        if value is not None and not value.strip():
            raise Refused(f"{flag} is empty (an unset shell variable?): give its value, or drop {flag} for the default")
    if args.name is not None:
        from sft_grid.cli.cmd_cp import name_problem

        args.name = args.name.removesuffix(".yaml")  # the sweep's file named: its name, as cp takes it
        wrong = name_problem(args.name)
        if wrong:
            raise Refused(f"--name {wrong}; nothing written")


def _conf_dir(out: str | None) -> Path:
    """The config folder to write into: --out, else the repository's, else ./conf; refused where that cannot be (a
    file, sft_grid's own configs or checkout, a folder this user cannot write into)."""
    if out:
        conf = Path(out).expanduser().resolve()
    else:
        found = project.find()
        here = Path.cwd().resolve()
        if (
            found is None
            and (here == REPO_ROOT or REPO_ROOT in here.parents)
            and PACKAGE_CONF.parent.parent == REPO_ROOT
        ):
            raise Refused(
                f"{here} is sft_grid's own checkout, not a team's repository: run it in yours (sft-grid init makes"
                " one), or give --out DIR"
            )
        conf = found.conf if found is not None else (here / "conf").resolve()
    if conf == PACKAGE_CONF or PACKAGE_CONF in conf.parents:
        raise Refused(f"{conf} is the config folder sft_grid ships; give your repository's (--out DIR)")
    existing = next((p for p in (conf, *conf.parents) if p.exists()), None)
    if conf.exists() and not conf.is_dir():
        raise Refused(f"{conf} is a file, not a config folder; give a folder (--out DIR)")
    if existing is not None and existing.is_dir() and not _writable(existing):
        raise Refused(f"{conf} cannot be written here ({existing} is not writable); give another (--out DIR)")
    if existing is not None and not existing.is_dir():
        raise Refused(f"{conf} cannot be made: {existing} is a file; give another folder (--out DIR)")
    return conf


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _options(group: str, conf: Path) -> dict[str, Option]:
    """Every option of a group, first found first (the config folder written into, the team's, the shipped ones),
    with its data: what the import reuses when it says the same."""
    found: dict[str, Option] = {}
    for folder in [conf, *project.search_dirs()]:
        for path in sorted((folder / group).glob("*.yaml")):
            if path.stem in found:
                continue
            try:
                data = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            if group == "dataset":
                data = data.get(path.stem) if isinstance(data, dict) else None
            if isinstance(data, dict):
                found[path.stem] = Option(path.stem, path, data, shipped=folder == PACKAGE_CONF)
    return found


def _request(args: argparse.Namespace, conf: Path) -> Request:
    words = list(args.source)
    argv: tuple[str, ...] = ()
    source: Path | None = None
    if len(words) == 1:
        source = Path(words[0]).expanduser()
    elif "hpc.launch" in words or "hpc/launch.py" in words:
        at = words.index("hpc.launch") if "hpc.launch" in words else words.index("hpc/launch.py")
        argv = tuple(words[at + 1 :])
    else:
        raise Refused(
            f"one FILE, or the old launcher's command line after -- (python -m hpc.launch ...); got {' '.join(words)}"
        )
    for flag, value in (("--nodes", args.nodes), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            raise Refused(f"{flag} {value}: a count of at least 1")
    if args.params_b is not None and not 0 < args.params_b < float("inf"):  # nan and inf are no size
        raise Refused(f"--params-b {args.params_b}: a size in billions, above 0 (e.g. --params-b 8.2)")
    cluster_gpus = None
    if args.cluster:
        clusters = _options("cluster", conf)
        if args.cluster not in clusters:
            names = ", ".join(sorted(clusters)) or "none"
            raise Refused(f"--cluster {args.cluster}: no such cluster option; the options: {names}")
        gpus = clusters[args.cluster].data.get("gpus_per_node", 0)
        cluster_gpus = gpus if isinstance(gpus, int) else None
    return Request(
        source=source,
        argv=argv,
        name=args.name,
        cluster=args.cluster,
        cluster_gpus=cluster_gpus,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        params_b=args.params_b,
        tokenizer_family=args.tokenizer_family,
        models=_options("model", conf),
        datasets=_options("dataset", conf),
        cwd=Path.cwd(),
    )


def _check_targets(result: Result, conf: Path, force: bool) -> None:
    """Nothing is overwritten without --force: every file that is there already is named, and nothing is written."""
    there = [conf / rel for rel in result.files if (conf / rel).exists()]
    if there and not force:
        shown = ", ".join(_shown(p) for p in there)
        raise Refused(f"{shown} already there; nothing written (--force overwrites, or --name another)")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _wrapped(label: str, items: list[str]) -> list[str]:
    text = f"  {label}: " + "; ".join(items)
    return textwrap.wrap(text, width=118, subsequent_indent="      ", break_on_hyphens=False)


def report(result: Result, conf: Path, source: Path) -> str:
    """What the import did and where each key went, a line (or a wrapped paragraph) a kind."""
    lines = [f"imported {source} ({result.what}) into {_shown(conf)}:"]
    lines += [f"  {line}" for line in result.reused]
    lines += [f"  wrote {_shown(conf / rel)}" for rel in result.files]
    for label, items in (
        ("assumed", result.assumed),
        ("mapped", result.mapped),
        ("carried in extra", result.extra),
        ("set by sft_grid", [f"{k} ({why})" for k, why in result.decided]),
        ("not carried", [f"{k} ({why})" for k, why in result.not_carried]),
    ):
        if items:
            lines += _wrapped(label, list(items))
    found = project.find()
    run = f"sft-grid run -m +sweep={result.name} dry_run=true"
    if found is None or found.conf != conf:
        run = f"SFT_GRID_CONF={_shown(conf)} {run}"
    lines.append(f"next: {run}   # render it, check it, run nothing")
    return "\n".join(lines)
