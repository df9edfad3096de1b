"""sft-grid init [DIR]: lay out a team's experiment repository, where its own configs live beside its other work.

    sft-grid init                 # here: sft_grid.yaml, conf/{cluster,model,dataset,sweep}/, .gitignore
    sft-grid init my-experiments  # a new folder

What it writes, and nothing it finds already there is overwritten:

    sft_grid.yaml          the project file: marks the repository's root, names its config folder (conf: conf)
    conf/cluster/ model/ dataset/ sweep/    the team's options, searched before the shipped ones
    conf/sweep/example.yaml                 a first grid: two tiny models, trained for a few steps on this machine
    .gitignore             runs/ (where the grids' cells go) stays out of git

`sft-grid cp <group>/<option>` then copies a shipped option in to edit (docs/your-repository.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sft_grid.core.project import GROUPS, PROJECT_FILE

PROJECT_TEXT = """\
# sft_grid's project file: this folder is an experiment repository. sft-grid, run anywhere under it, searches
# conf/ (below) before the configs sft_grid ships, and puts the grids' cells under runs/ here.
conf: conf
"""
EXAMPLE_SWEEP = """\
# @package _global_
# example: a first grid of this repository - two tiny models (built locally by `sft-grid assets build`) x two
# learning rates, a few steps each on this machine's CPU with LLaMA-Factory.
#   sft-grid run -m +sweep=example dry_run=true     # what it would run: the check table, the plan
#   sft-grid run -m +sweep=example                  # train it (sft-grid venv build llamafactory; assets build)
# Copy a shipped model, dataset or cluster in to edit it (sft-grid cp model/qwen3_8b) and name it here.
defaults:
  - override /cluster: local
  - override /model: tiny_llama
  - override /dataset: tiny_messages
sweep_name: example
max_steps: 4
global_batch_size: 4
micro_batch_size: 2
cutoff_len: 256
save_total_limit: 1
hydra:
  sweeper:
    params:
      model: tiny_llama,tiny_qwen3
      lr: 1e-3,5e-4
"""
IGNORED = ["runs/"]
# the groups a team usually keeps (backend, eval and harness are sft_grid's own; cp copies them in when wanted)
LAID_OUT = ("cluster", "model", "dataset", "sweep")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", nargs="?", default=".", help="the repository's folder (default: here)")


def plan(root: Path) -> dict[Path, str]:
    """path -> text of what init writes (files that exist are kept, never overwritten)."""
    out = {root / PROJECT_FILE: PROJECT_TEXT, root / "conf" / "sweep" / "example.yaml": EXAMPLE_SWEEP}
    for group in LAID_OUT:
        if group != "sweep":
            out[root / "conf" / group / ".gitkeep"] = ""
    return out


def run(args: argparse.Namespace) -> int:
    assert set(LAID_OUT) <= set(GROUPS)
    if not args.dir.strip():
        # an unset shell variable (`sft-grid init "$REPO"`) would set up whatever folder this is
        print(
            "sft-grid init: DIR is empty (an unset shell variable?); nothing written: name the repository's folder,"
            " or give no DIR to set up the current one",
            file=sys.stderr,
        )
        return 2
    root = Path(args.dir).expanduser().resolve()
    if root.exists() and not root.is_dir():
        print(f"sft-grid init: {root} is a file, not a folder; name a folder", file=sys.stderr)
        return 2
    if (root / PROJECT_FILE).is_file():
        print(f"sft-grid init: {root} is already an experiment repository ({PROJECT_FILE}); nothing written")
        return 0
    enclosing = next((p for p in root.parents if (p / PROJECT_FILE).is_file()), None)
    if enclosing is not None:
        # a repository inside another: sft-grid run there would read the inner one alone, the outer's configs unseen
        print(
            f"sft-grid init: {root} is inside the experiment repository at {enclosing} ({enclosing / PROJECT_FILE});"
            " nothing written: its configs go in its own conf/ (sft-grid cp <group>/<option> from there), or name"
            " a folder outside it for a new repository",
            file=sys.stderr,
        )
        return 2
    planned = plan(root)
    # what is in the way, before anything is written (a rerun after a half-written init would find sft_grid.yaml
    # and stop): a file where a folder goes (the repository's own folder's parents too), a folder where a file goes
    # (.gitignore, which is read and added to, among them)
    above = next((p for p in reversed(root.parents) if p.exists() and not p.is_dir()), None)
    if above is not None:
        print(
            f"sft-grid init: {root}: Not a directory ({above} is a file, where a folder goes); nothing written: name"
            " a folder",
            file=sys.stderr,
        )
        return 2
    for path in [*planned, root / ".gitignore"]:
        folders = [root / p for p in reversed(path.relative_to(root).parents)]
        blocked = [(f, "a file, where a folder goes") for f in folders if f.is_file()]
        blocked += [(path, "a folder, where a file goes")] if path.is_dir() else []
        if blocked:
            where, what = blocked[0]
            print(f"sft-grid init: {where} is {what}; move it away, then run sft-grid init again", file=sys.stderr)
            return 2
    written, kept = [], []
    for path, text in planned.items():
        if path.exists():
            kept.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    ignore = root / ".gitignore"
    lines = ignore.read_text().splitlines() if ignore.is_file() else []
    missing = [p for p in IGNORED if p not in lines and p.rstrip("/") not in lines and "/" + p not in lines]
    if missing:
        ignore.write_text("".join(f"{line}\n" for line in [*lines, *missing]))
        written.append(ignore)
    print(f"experiment repository at {root}:")
    for path in written:
        print(f"  wrote {path.relative_to(root)}")
    for path in kept:
        print(f"  kept  {path.relative_to(root)} (already there)")
    print("next:")
    print("  sft-grid run -m +sweep=example dry_run=true    # the example grid, rendered and checked, nothing run")
    print("  sft-grid cp model/qwen3_8b                     # a shipped option, copied in to edit")
    print("  sft-grid run --help                            # the options, yours and the shipped ones")
    return 0
