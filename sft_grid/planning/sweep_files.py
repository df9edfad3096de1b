"""Sweep files as Hydra would misread them, told before Hydra composes anything.

A sweep file (conf/sweep/NAME.yaml, named by `+sweep=NAME`) is a mapping of a cell's keys under the header
`# @package _global_`, with the grid's axes under `hydra.sweeper.params`, each axis one string of values separated
by commas. Hydra reads a file that breaks one of these quietly as something else: without the header its keys go
under `sweep.` (and Hydra says only that `sweep` is no key of a cell), an axis written as a YAML list is one value
that cannot be converted, an axis that names no key is reported per cell with no value; and without `-m` a sweep's
axes are ignored altogether, one cell composed from its first corner. `problems` and `unswept` say each of these
with the file, the key, the value and the fix.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from sft_grid.core import project, schema
from sft_grid.core.problems import GRID, Problem
from sft_grid.planning import command_line
from sft_grid.planning.hydra_errors import did_you_mean

SWEEP_HEADER = "# @package _global_"
# the keys of the sweeper's config, hydra_plugins/sft_grid_plugins SftGridSweeperConf (a layer above this one; a test
# holds the two the same): an axis goes under params
SWEEPER_KEYS = ("_target_", "max_batch_size", "params")


def problems(argv: Sequence[str]) -> list[Problem]:
    """The sweep files the command line names (`+sweep=NAME`) that Hydra would misread, read before Hydra composes:
    a file without its `# @package _global_` header (Hydra puts its keys under `sweep.`, and says only that `sweep` is
    no key of a cell), an empty file or one that is not a mapping, and axes (`hydra.sweeper.params`) that are not a
    mapping of `key: a,b` strings or that name no key of a cell (Hydra's own errors name none of the file, the axis
    or its value). A file that is not YAML is left to conf_files.py's one line."""
    import yaml
    from hydra.plugins.config_source import ConfigSource
    from omegaconf._utils import get_yaml_loader

    names = [
        name.strip()
        for word in argv
        if "=" in word and word.lstrip("+~").split("=", 1)[0] == "sweep"
        for name in word.split("=", 1)[1].split(",")
    ]
    found: list[Problem] = defaults_cycles(argv)
    for name in dict.fromkeys(names):
        path = project.find_option("sweep", name) if name and "(" not in name else None
        if path is None:
            continue  # no such option: Hydra names it, with the options there are
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # Hydra cannot read it either: conf_files.py's one line names the byte
        try:
            # OmegaConf's loader, as Hydra reads the file (it refuses a duplicated key, told by conf_files.py); the
            # plain one for what is shown, the values as the user wrote them (1e-3, not 0.001)
            yaml.load(text, Loader=get_yaml_loader())
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue

        def problem(key: str, value: object, message: str, fix: str, path: Path = path) -> None:
            found.append(
                Problem(cell=GRID, key=key, value=value, rule="sweep-file", message=f"{path}: {message}", fix=fix)
            )

        try:
            package = ConfigSource._get_header_dict(text).get("package")
        except ValueError:
            package = None
        if data is None:
            problem(
                "+sweep",
                name,
                "the sweep file is empty (or only comments): a sweep is a mapping of a cell's keys",
                f"write its first line {SWEEP_HEADER}, then sweep_name: {name} and the grid's axes under"
                " hydra.sweeper.params (sft-grid cp sweep/smoke copies a shipped one to start from)",
            )
            continue
        if not isinstance(data, dict):
            problem(
                "+sweep",
                name,
                f"the sweep file is a YAML {'list' if isinstance(data, list) else type(data).__name__}, not a"
                " mapping of a cell's keys",
                f"write it as keys and values (sweep_name: {name}, max_steps: 4, ...), no '- ' items at the top",
            )
            continue
        if package != "_global_":
            where = (
                f"its header names the package {package!r}"
                if package
                else f"it does not start with {SWEEP_HEADER} (above every other line, comments included)"
            )
            problem(
                "+sweep",
                name,
                f"{where}, so Hydra would put its keys under `sweep.`, which is no key of a cell",
                f"make {SWEEP_HEADER} the file's first line",
            )
            continue
        # the file's own Hydra settings, held to the command line's rules (a sweep file is its command line written
        # down): `override hydra/launcher: basic` in its defaults, hydra.run.dir or hydra.output_subdir in its hydra:
        for switch in _hydra_settings(data):
            for wrong in command_line.problems([switch]):
                problem(wrong.key, wrong.value, wrong.message, wrong.fix)
        sweeper = ((data.get("hydra") or {}) if isinstance(data.get("hydra"), dict) else {}).get("sweeper")
        params = sweeper.get("params") if isinstance(sweeper, dict) else None
        known = list(SWEEPER_KEYS)
        cell_keys = [f.name for f in fields(schema.CellConf)]
        given: dict[Any, Any] = sweeper if isinstance(sweeper, dict) else {}
        for other, held in [(k, v) for k, v in given.items() if str(k) not in known]:
            close = did_you_mean(str(other), ["params"])
            problem(
                f"hydra.sweeper.{other}",
                held,
                f"{other!r} is no key of the sweeper{close}: the grid's axes go under hydra.sweeper.params",
                f"rename {other}: to params:"
                if close
                else f"indent the axis under params: (hydra: sweeper: params: {other}: {held})"
                if str(other).lstrip("+~").split(".", 1)[0] in cell_keys
                else f"the sweeper's keys are {', '.join(known)}; the axes go under params:",
            )
        if params is None:
            continue
        if not isinstance(params, dict):
            problem(
                "hydra.sweeper.params",
                params,
                "the grid's axes are a mapping of key to values, not a YAML "
                + ("list" if isinstance(params, list) else type(params).__name__),
                "write one axis a line under params:, without '- ' before it, its values separated by commas"
                " (model: tiny_llama,tiny_qwen3 on one line, lr: 1e-3,5e-4 on the next)",
            )
            continue
        keys = [f.name for f in fields(schema.CellConf)]
        for axis, values in params.items():
            key = f"hydra.sweeper.params.{axis}"
            if values in (None, "") and str(axis).lstrip("+~") not in project.GROUPS:  # a group's: command_line's
                problem(
                    key,
                    values,
                    f"the axis {axis!r} has no values",
                    f"give it its values separated by commas ({axis}: a,b, one cell per value), or remove the line",
                )
                continue
            if isinstance(values, list):
                listed = ",".join(str(v) for v in values)
                problem(
                    key,
                    values,
                    "an axis is one string of values separated by commas, not a YAML list",
                    f"{axis}: {listed} (one cell per value); a list that is one cell's value is quoted:"
                    f" {axis}: '[{listed}]'",
                )
                continue
            if isinstance(values, dict):
                flow = ", ".join(f"{k}: {v}" for k, v in values.items())
                problem(
                    key,
                    values,
                    "an axis is one string of values separated by commas, not a YAML mapping",
                    f"list the values, {axis}: a,b (one cell per value); a mapping that is one cell's value is"
                    f" quoted: {axis}: '{{{flow}}}'",
                )
                continue
            top = str(axis).split(".", 1)[0]
            if not str(axis).startswith(("+", "~", "hydra")) and top not in keys:
                problem(
                    key,
                    values,
                    f"the axis {axis!r} names no key of a cell",
                    f"name a key of a cell{did_you_mean(top, keys)}; the keys: {', '.join(keys)}",
                )
                continue
            # a config group's axis, read as the command line's (a group set to null, or a list for one option)
            for wrong in command_line.problems([f"{axis}={'null' if values is None else values}"]):
                problem(key, values, wrong.message, wrong.fix)
    return found


def _hydra_settings(data: Mapping[str, Any]) -> list[str]:
    """A sweep file's settings of Hydra itself, as overrides: each `override hydra/<group>: <option>` of its defaults
    (`hydra/launcher=basic`), and each value of its `hydra:` block but the grid's axes (`hydra.run.dir=/x`)."""
    found: list[str] = []
    defaults = data.get("defaults")
    for entry in defaults if isinstance(defaults, list) else []:
        for written, option in entry.items() if isinstance(entry, dict) else []:
            group = str(written).removeprefix("override").strip().lstrip("/")
            if group.startswith("hydra/"):
                found.append(f"{group}={option}")

    def walk(node: object, prefix: str) -> None:
        if prefix == "hydra.sweeper.params":
            return
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}")
        else:
            found.append(f"{prefix}={'null' if node is None else node}")

    if isinstance(data.get("hydra"), dict):
        walk(data["hydra"], "hydra")
    return found


def _defaults_of(group: str, name: str) -> tuple[Path | None, list[tuple[str, str]]]:
    """The option's file and the (group, option) of each entry of its defaults list: `- other` is an option of the
    file's own group, `- model: x` of the group below it (`- /model: x`, `- /model/x`: from the top)."""
    from sft_grid.planning.conf_files import option_data

    path = project.find_option(group, name)
    data = option_data(path) if path else None  # unreadable: told by conf_files.py's one line
    entries = data.get("defaults") if isinstance(data, dict) else None
    found: list[tuple[str, str]] = []
    for entry in entries if isinstance(entries, list) else []:
        pairs = entry.items() if isinstance(entry, dict) else [(None, entry)] if isinstance(entry, str) else []
        for sub, option in pairs:
            if not isinstance(option, str) or option in ("_self_", "???") or str(sub or "").startswith("override"):
                continue
            word = f"{sub}/{option}" if sub else option
            where = word[1:] if word.startswith("/") else f"{group}/{word}"
            inside, _, opt = where.rpartition("/")
            if inside:
                found.append((inside, opt.split("@", 1)[0]))
    return path, found


def defaults_cycles(argv: Sequence[str]) -> list[Problem]:
    """A defaults list that comes back to a file it started from (s_cyc names s_cyc2, which names s_cyc; a file that
    names itself), for each option the command line picks: Hydra follows it until Python's recursion limit and
    prints thousands of lines of trace. Told before Hydra composes, with the cycle and the file to change."""
    found: list[Problem] = []
    start = [
        (word.lstrip("+~").split("=", 1)[0], option.strip())
        for word in argv
        if "=" in word and not word.startswith("-") and word.lstrip("+~").split("=", 1)[0] in project.GROUPS
        for option in word.split("=", 1)[1].split(",")
    ]
    told: set[frozenset[tuple[str, str]]] = set()

    def walk(node: tuple[str, str], trail: list[tuple[str, str]]) -> None:
        if node in trail:
            cycle = [*trail[trail.index(node) :], node]
            if frozenset(cycle) in told:
                return
            told.add(frozenset(cycle))
            from sft_grid.planning.conf_files import _shown

            file = project.find_option(*cycle[-2])
            last = _shown(str(file)) if file else f"conf/{cycle[-2][0]}/{cycle[-2][1]}.yaml"
            names = " -> ".join(f"{g}/{o}" for g, o in cycle)
            found.append(
                Problem(
                    cell=GRID,
                    key="defaults",
                    value=names,
                    rule="defaults-cycle",
                    message=f"the defaults lists go round in a circle ({names}): Hydra would follow them forever",
                    fix=f"remove {cycle[-1][1]} from the defaults of {last}"
                    " (a file's defaults may name other files, never one that leads back to it)",
                )
            )
            return
        if len(trail) > 50:
            return
        _, entries = _defaults_of(*node)
        for entry in entries:
            walk(entry, [*trail, node])

    for group, option in dict.fromkeys(start):
        if option and not any(c in option for c in "()[]{}*$"):
            walk((group, option), [])
    return found


def unswept(overrides: Sequence[str], axes: Mapping[str, Any]) -> Problem | None:
    """Without -m Hydra composes one cell and ignores a sweep file's axes (`hydra.sweeper.params`): the user asked for
    the grid and would get its first corner alone. Refused unless every axis is set to one value on the command line,
    as a cell's own rerun line sets them (core/overrides.py), so that rerun still composes its one cell."""
    given = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    unset = [str(key) for key in axes if str(key).lstrip("+~") not in given]
    if not unset:
        return None
    sweep = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("sweep=")), "")
    again = " ".join(map(shlex.quote, overrides))
    # an axis's first value, where the axis lists them (a glob() or range() names no value to copy)
    one = " ".join(
        f"{k}=<one value of {axes[k]}>" if "(" in str(axes[k]) else f"{k}={str(axes[k]).split(',', 1)[0].strip()}"
        for k in unset
    )
    return Problem(
        cell=GRID,
        key="hydra.sweeper.params",
        value=", ".join(f"{k}: {axes[k]}" for k in unset),
        rule="sweep-without-m",
        message=f"the sweep {sweep!r} sweeps {', '.join(unset)}, and without -m only one cell is composed and these"
        " axes are ignored",
        fix=f"add -m to run its grid (sft-grid run -m {again}), or set each axis to one value for one cell ({one})",
    )
