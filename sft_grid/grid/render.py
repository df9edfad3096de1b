"""A cell as the exact files of its directory (pure), and writing them so a directory is never half valid; what in
the runs tree is in the way of them (a file where a directory goes, a directory where a file goes) is found first.

A dry run writes these files and prints the plan; a real run writes the same files and executes the same plan,
so the two cannot drift. Files a person reads are built as data and dumped once; launch.sh is built from argv
lists with shell quoting (sft_grid/backends/launch.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import stat
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sft_grid.backends import get as backend_of
from sft_grid.backends import wandb, zero
from sft_grid.backends.launch import launch_script
from sft_grid.core import project
from sft_grid.core.cellfiles import Check, PreflightFile, dump_json
from sft_grid.core.layout import (
    CELL_FILE,
    ESTIMATE_FILE,
    LAUNCH_FILE,
    LEDGER_FILE,
    LOCK_FILE,
    POST_FILE,
    PREFLIGHT_FILE,
)
from sft_grid.core.overrides import rerun_line
from sft_grid.core.problems import GRID, Problem
from sft_grid.core.schema import fingerprint
from sft_grid.core.scores import EVAL_FILE
from sft_grid.core.submission import CellFiles
from sft_grid.planning.cells import Cell
from sft_grid.planning.environments import bin_dir
from sft_grid.planning.evaluation import BaseTarget, base_eval_file, cell_eval_file
from sft_grid.stages.post_training import post_file

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
RUN_SWITCHES = ("dry_run", "force", "rerun_failed", "stage_only", "check_only")


def dump_yaml(data: Any, header: str = "") -> str:
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


# A block mapping is its keys' blocks one after the other, and a grid's cells repeat most (key, value) pairs:
# each pair is dumped once (a scalar keyed by its type and value, which tells true, 1, 1.0 and "1" apart; anything
# else by its JSON).
_PAIRS: dict[tuple[Any, ...], str] = {}
_SCALARS = (str, int, float, bool, type(None))


# a string YAML writes as it is: a conservative alphabet (paths, names), and read back as a string
_PLAIN = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_./+=@,-]{0,400}")
# the tag YAML reads a plain scalar as (PyYAML's stubs leave the resolver untyped)
_resolve_tag: Callable[[type[yaml.Node], str, tuple[bool, bool]], str] = yaml.resolver.Resolver().resolve


def plain_string(value: str) -> bool:
    """Whether yaml.dump writes this string unquoted (then `key: value` is its dump, with no call to yaml)."""
    return (
        bool(_PLAIN.fullmatch(value)) and _resolve_tag(yaml.ScalarNode, value, (True, False)) == "tag:yaml.org,2002:str"
    )


def dump_mapping(data: Mapping[str, Any]) -> str:
    """yaml.dump of a mapping (block style, keys in order), built from cached per-key blocks."""
    parts = []
    for key, value in data.items():
        if type(value) is str and key.isidentifier() and plain_string(value):
            parts.append(f"{key}: {value}\n")  # what yaml.dump writes for it, without the cost (unique paths)
            continue
        pair = (key, type(value), value) if type(value) in _SCALARS else (key, json.dumps(value, default=str))
        text = _PAIRS.get(pair)
        if text is None:
            if len(_PAIRS) > 65536:
                _PAIRS.clear()
            text = _PAIRS[pair] = dump_yaml({key: value})
        parts.append(text)
    return "".join(parts) if parts else dump_yaml({})


# A grid's cells share their group sections, so each section (by value) is dumped once
_SECTIONS: dict[tuple[str, str], str] = {}


# the deprecated spellings of cluster keys, left out of cell.yaml unless a profile still uses them
_DEPRECATED = {"cluster": ("backend_envs", "need_envs")}


def _section(key: str, value: Any) -> str:
    text = _SECTIONS.get(cache_key := (key, fingerprint(value)))
    if text is None:
        shown = {k: v for k, v in value.items() if v or k not in _DEPRECATED.get(key, ())}
        if len(_SECTIONS) > 4096:
            _SECTIONS.clear()
        text = _SECTIONS[cache_key] = dump_yaml({key: shown})
    return text


def rerun_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that name this cell, without this invocation's run switches."""
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in RUN_SWITCHES]


def rerun_command(cell: Cell) -> str:
    return rerun_line(rerun_overrides(cell.overrides), [str(d) for d in project.user_dirs()])


def cell_header(cell: Cell) -> str:
    return (
        f"# sft_grid cell {cell.name} (identity {cell.key}) of grid {cell.spec.sweep_name!r}.\n"
        f"# The resolved config this cell was rendered from; jobs never re-read conf/.\n"
        f"# Rerun this cell: {rerun_command(cell)}\n"
    )


def cell_yaml(cell: Cell) -> str:
    """cell.yaml: the resolved config (its layout as chosen), its shared group sections dumped once per grid."""
    parts = [cell_header(cell)]
    scalars: dict[str, Any] = {}
    for key, value in cell.resolved.items():
        if isinstance(value, dict) and value:
            if scalars:
                parts.append(dump_mapping(scalars))
                scalars = {}
            parts.append(_section(key, value))
        else:
            scalars[key] = value
    if scalars:
        parts.append(dump_mapping(scalars))
    return "".join(parts)


def render(cell: Cell, cell_dir: Path, deferred: Sequence[Check]) -> CellFiles:
    s = cell.spec
    files: dict[str, str] = {}
    structured = {**backend_of(s.backend.name).files(cell, cell_dir), **zero.files(cell), **wandb.files(cell)}
    for rel, data in structured.items():
        if isinstance(data, str):  # a text file, as it is (a chat template)
            files[rel] = data
        else:
            files[rel] = dump_json(data) if rel.endswith(".json") else dump_mapping(data)
    venv_bin = bin_dir(s)
    files[LAUNCH_FILE] = launch_script(cell, cell_dir, venv_bin)
    files[POST_FILE] = post_file(cell).dumps()
    evaluation = cell_eval_file(cell, cell_dir)
    if evaluation is not None:  # no file means nothing to evaluate
        files[EVAL_FILE] = evaluation.dumps()
    if deferred:  # no file means nothing deferred
        files[PREFLIGHT_FILE] = PreflightFile(tuple(deferred), str(venv_bin / "python"), dict(s.cluster.env)).dumps()
    files[CELL_FILE] = cell_yaml(cell)
    return CellFiles(cell_dir, files)


def render_eval(cell: Cell, cell_dir: Path) -> CellFiles:
    """A cell's eval.json alone: a skipped cell whose checkpoints are scored (its other files stay as they are)."""
    evaluation = cell_eval_file(cell, cell_dir)
    return CellFiles(cell_dir, {EVAL_FILE: evaluation.dumps()} if evaluation is not None else {})


def render_base(target: BaseTarget) -> CellFiles:
    """A base model's directory: its eval.json (its ledger and scores come later)."""
    return CellFiles(target.dir, {EVAL_FILE: base_eval_file(target).dumps()})


# -- what is in the way of a cell's files ---------------------------------------------------------------------

# the files of a cell directory the grid reads or writes before its job runs, whatever the backend: the rest of what
# a cell writes (the backend's config, ...) is only named by its rendering, and checked by `in_the_way` then
CELL_FILES = (CELL_FILE, LAUNCH_FILE, POST_FILE, PREFLIGHT_FILE, EVAL_FILE, ESTIMATE_FILE, LEDGER_FILE)


def _not_files(directory: Path, names: Collection[str]) -> list[tuple[str, str]]:
    """(name, what it is) of each of `names` in `directory` that is there but not a file: a directory (or a link to
    one) where a file is replaced fails halfway through a cell's files, and one where its ledger is read fails the
    reading. One listing of the directory, none when it does not exist."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        return [
            (entry.name, "a directory" if entry.is_dir() else "not a regular file")
            for entry in entries
            if entry.name in names and not entry.is_file()
        ]
    return []


def _file_problem(cell: str, path: Path, what: str, belongs: str) -> Problem:
    return Problem(
        cell=cell,
        key="",
        value=str(path),
        rule="runs-tree",
        message=f"{path} is {what}, where {belongs} goes",
        fix=f"move it away or remove it (rm -r {shlex.quote(str(path))}), or use another sweep_name or runs_root",
    )


def runs_tree(cells: Sequence[Cell], dirs: Sequence[Path]) -> list[Problem]:
    """What in the runs tree is in the way of a grid, before anything is read from it or written into it: a sweep
    directory or a cell directory that is a file, the grid's lock or a cell's own file (CELL_FILES) that is a
    directory. A stat per sweep directory and a listing per existing cell directory."""
    problems: list[Problem] = []
    blocked: set[Path] = set()
    for sweep_dir in sorted({c.sweep_dir for c in cells}):
        try:
            st = os.stat(sweep_dir)
        except OSError:
            continue  # not there yet (made with the grid's lock), or under a file: the runs root's rule names it
        if not stat.S_ISDIR(st.st_mode):
            blocked.add(sweep_dir)
            problems.append(_file_problem(GRID, sweep_dir, "a file", "the grid's directory (runs_root/sweep_name)"))
            continue
        for name, what in _not_files(sweep_dir, (LOCK_FILE,)):
            problems.append(_file_problem(GRID, sweep_dir / name, what, "the grid's lock file"))
    for cell, cell_dir in zip(cells, dirs, strict=True):
        if cell_dir.parent in blocked:
            continue
        try:
            st = os.stat(cell_dir)
        except OSError:
            continue  # a new cell
        if not stat.S_ISDIR(st.st_mode):
            problems.append(_file_problem(cell.name, cell_dir, "a file", "the cell's directory"))
            continue
        for name, what in _not_files(cell_dir, CELL_FILES):
            problems.append(_file_problem(cell.name, cell_dir / name, what, f"the cell's {name}"))
    return problems


def in_the_way(rendered: Sequence[CellFiles]) -> list[Problem]:
    """`runs_tree`'s rule for every file a plan writes (the backend's too), before the first is written: a listing
    of each existing directory it writes into."""
    problems: list[Problem] = []
    for files in rendered:
        names = {rel.split("/", 1)[0] for rel in files.files}
        for name, what in _not_files(files.dir, names):
            path = files.dir / name
            problems.append(_file_problem(files.dir.name, path, what, f"the cell's {name}"))
    return problems


def _write_file(path: str, content: str | bytes, executable: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755 if executable else 0o644)
    try:
        os.write(fd, content if isinstance(content, bytes) else content.encode())
    finally:
        os.close(fd)


def umask() -> int | None:
    """This process's umask, read without setting it (os.umask would, for every thread): Linux's
    /proc/self/status; None where it cannot be read."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


def _unchanged(path: str, data: bytes, mode: int, group: int, mask: int | None) -> bool:
    """Whether the file is already what replacing it would make: a regular file of this content, owned by this
    process's user and the group a new file gets, with a new file's mode and no other link. Then a re-invocation
    over an existing grid leaves it as it is (reading a small file costs a tenth of creating and renaming one)."""
    if mask is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_size != len(data)
            or st.st_nlink != 1
            or st.st_uid != os.geteuid()
            or st.st_gid != group
            or stat.S_IMODE(st.st_mode) != mode & ~mask
        ):
            return False
        chunks = []
        while chunk := os.read(fd, len(data) + 1):
            chunks.append(chunk)
        return b"".join(chunks) == data
    finally:
        os.close(fd)


def write(rendered: CellFiles, mask: int | None = -1) -> bool:
    """Write a cell's files so that a cell directory is never half valid; returns whether it is new.

    A new cell is written into a scratch directory beside it and renamed into place whole. An existing
    cell gets each file replaced atomically, cell.yaml last, except a file that is already exactly what would
    replace it (`mask`: the process's umask, -1 to read it; None: replace every file). Its ledger starts when it
    is submitted. (Plain os calls on str paths: a large dry run writes thousands of small files.)
    """
    final = str(rendered.dir)
    if not os.path.exists(final):  # (the grid creates the sweep directory before writing its cells)
        head, name = os.path.split(final)
        scratch = os.path.join(head, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            os.mkdir(scratch)
        except FileNotFoundError:  # a base model's, under <sweep>/_base/ (not one stat of the sweep per cell)
            os.makedirs(head, exist_ok=True)
            os.mkdir(scratch)
        for rel, text in rendered.files.items():
            _write_file(os.path.join(scratch, rel), text, rel == LAUNCH_FILE)
        try:
            os.rename(scratch, final)
            return True
        except OSError:  # another invocation created it meanwhile: fall through to replacing files
            shutil.rmtree(scratch, ignore_errors=True)
    mask = umask() if mask == -1 else mask
    group = -1
    try:
        directory = os.stat(final)
    except OSError:
        mask = None
    else:  # the group a new file gets: the directory's where it is setgid, else the process's
        group = directory.st_gid if directory.st_mode & stat.S_ISGID else os.getegid()
    for rel in sorted(rendered.files, key=lambda r: r == CELL_FILE):
        target = os.path.join(final, rel)
        executable = rel == LAUNCH_FILE
        text = rendered.files[rel]
        data = text if isinstance(text, bytes) else text.encode()
        if _unchanged(target, data, 0o755 if executable else 0o644, group, mask):
            continue
        tmp = os.path.join(final, f".{rel}.{os.getpid()}.tmp")
        _write_file(tmp, rendered.files[rel], executable)
        os.replace(tmp, target)
    for stale in (PREFLIGHT_FILE, EVAL_FILE):
        # checks deferred by an earlier rendering (another cluster, a missing venv), or the suites it evaluated, must
        # not outlive it (a cell's eval.json says what this invocation asks; the scores already computed stay)
        if stale not in rendered.files and CELL_FILE in rendered.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(final, stale))
    return False


def write_all(rendered: Sequence[CellFiles]) -> None:
    """Write cell directories; a few threads, since small-file syscalls dominate a large dry run."""
    from concurrent.futures import ThreadPoolExecutor

    mask = umask()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda files: write(files, mask), rendered))
