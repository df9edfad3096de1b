"""The command line of `sft-grid run`, read before Hydra composes anything: what Hydra would crash on (with a
traceback), quietly misread, or take out of sft_grid's hands. Each is a Problem of the grid, with the fix.

- A config group (`model`, `cluster`, ...) removed where every cell needs one (`~model`), given no option's name
  (`model=null`: Hydra's "Config group override must be a string or a list"), or given a list where it takes one
  option (`model=[a,b]` is one cell, the options merged, the last one's values winning: it trains b alone). The
  group's options come with it.
- Hydra's own switches. sft_grid's launcher and sweeper compose and validate the whole grid before anything is
  queued, and write only under runs_root. Another launcher runs each cell as it composes it (cell 1 queued before
  cell 2's error is seen); another sweeper, or Hydra's own output folders (`hydra.output_subdir`, `hydra.run.dir`,
  `hydra.sweep.dir`), write the composed config, secrets included, where the user did not ask. Hydra's other keys
  (`hydra.sweeper.params.*`, `hydra.verbose`, `hydra.searchpath`, `hydra.job.*`) stay the user's.
- Several sweep files at once (`+sweep=a,b`): they merge into one grid that drops each file's own axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, is_dataclass

from sft_grid.core import project, schema
from sft_grid.core.problems import GRID, Problem
from sft_grid.planning.hydra_errors import options, schema_type

# Hydra's groups the project fixes (conf/config.yaml's defaults) -> the option it needs
OWN_GROUPS = {"hydra/launcher": "sft_grid", "hydra/sweeper": "sft_grid", "hydra/job_logging": "stdout"}
# Hydra's output folders: sft_grid writes only under runs_root
OUTPUT_KEYS = ("hydra.output_subdir", "hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
# Hydra's own command-line flags (hydra/_internal/utils.get_args_parser), not a misspelt override
HYDRA_FLAGS = frozenset(
    [
        *("--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--resolve", "--package", "-p", "--run", "-r"),
        *("--multirun", "-m", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn"),
        *("--config-dir", "-cd", "--experimental-rerun", "--info", "-i"),
    ]
)


def required_groups() -> list[str]:
    """The config groups a cell cannot do without (the schema has no default for them): cluster, backend, model."""
    return [f.name for f in fields(schema.CellConf) if f.default == "???" and f.name in project.GROUPS]


def single_choice_groups() -> list[str]:
    """The config groups a cell takes exactly one option of (its section is one mapping): cluster, backend, model,
    eval. `dataset` takes a list on purpose (several make a mix)."""
    return [f.name for f in fields(schema.CellConf) if f.name in project.GROUPS and is_dataclass(schema_type(f.name))]


def _options_text(group: str) -> str:
    found = options(group)
    return ", ".join(found) if found else f"the files of conf/{group}/"


def problems(argv: Sequence[str]) -> list[Problem]:
    """The overrides of `sft-grid run ARGV` (or a sweep file's axes, written as overrides) that the module's
    docstring names, each a Problem of the grid."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    parser = OverridesParser.create()
    required, single = required_groups(), single_choice_groups()
    found: list[Problem] = []

    def problem(key: str, value: str, rule: str, message: str, fix: str) -> None:
        found.append(Problem(cell=GRID, key=key, value=value, rule=rule, message=message, fix=fix))

    for arg in argv:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue  # a flag (-m, --cfg) or its value
        try:
            ov = parser.parse_override(arg)
        except Exception:
            continue  # Hydra's grammar refuses it: told by Hydra, with hydra_errors.malformed_override's hint
        key = group = ov.key_or_group
        written = arg.split("=", 1)[1] if "=" in arg else arg
        if key == "sweep" and ov.package is None and (ov.is_sweep_override() or "," in written):
            names = [n.strip() for n in written.split(",")] if "(" not in written else []
            runs = "; ".join(f"sft-grid run -m +sweep={n}" for n in names if n) or "sft-grid run -m +sweep=<name>"
            problem(
                "+sweep",
                written,
                "one-sweep",
                "names several sweep files: one grid is one sweep file, and several at once would merge into one grid"
                " that drops each file's own axes",
                f"run each on its own: {runs}",
            )
            continue
        if ov.package is None and group in project.GROUPS:
            if ov.is_delete():
                if group in required:
                    problem(
                        group,
                        arg,
                        "group-required",
                        f"{group} is a config group every cell needs one option of: it cannot be removed",
                        f"choose one of its options instead, {group}=<option>: {_options_text(group)}",
                    )
                continue
            value = ov.value()
            choices = value.list if isinstance(value, ChoiceSweep) else [] if ov.is_sweep_override() else [value]
            named = next((c for c in choices if not isinstance(c, str | list)), "")
            if named != "":
                shown = "null" if named is None else repr(named)
                extra = {
                    "dataset": " (several make a mix: dataset=[a,b])",
                    "eval": " (eval=none runs no evaluation)",
                }.get(group, "")
                problem(
                    group,
                    written,
                    "group-option",
                    f"{group} is a config group: it takes the name of one of its options, not {shown}",
                    f"{group}=<option>{extra}, one of: {_options_text(group)}",
                )
                continue
            listed = next((c for c in choices if isinstance(c, list)), None)
            if listed is not None and group in single:
                names = [str(x) for x in listed]
                problem(
                    group,
                    written,
                    "group-one",
                    f"{group} takes one option: a list of them is merged into one cell, the last one's values winning"
                    + (f" (it would train {names[-1]} alone)" if group == "model" and names else ""),
                    f"sweep them with -m {group}={','.join(names) or '<a>,<b>'} (one cell each), or pick one:"
                    f" {group}={names[0] if names else '<option>'}",
                )
            continue
        own = OWN_GROUPS.get(key) or OWN_GROUPS.get(key.replace(".", "/").rsplit("/_target_", 1)[0])
        if own:
            switch = key.replace(".", "/").rsplit("/_target_", 1)[0]
            problem(
                key,
                written,
                "hydra-own",
                f"sft_grid needs its own {switch} ({own}): "
                + (
                    "Hydra's other job logging writes a log file of its own, outside runs_root"
                    if switch == "hydra/job_logging"
                    else "it composes and checks the whole grid before anything is queued; another would queue each"
                    " cell as it is composed, before the grid is checked, and write Hydra's own files"
                ),
                f"drop {arg} (the run's switches are the cell's keys: dry_run=true, force=true, runs_root=DIR)",
            )
        elif key in OUTPUT_KEYS or any(key.startswith(k + ".") for k in OUTPUT_KEYS):
            folder = written if key.endswith(".dir") and written not in ("", "null") else "<folder>"
            problem(
                key,
                written,
                "hydra-output",
                "sft_grid writes a grid only under its runs_root (each cell in its own folder), and Hydra's own output"
                " folders would hold the composed config, secrets included",
                f"drop {arg}; to put the grid elsewhere: runs_root={folder}",
            )
    return found


def flag_hint(argv: Sequence[str]) -> str | None:
    """A `--flag` that Hydra does not know but that names a cell's key (`--dry-run`): the override to write."""
    keys = {f.name: f for f in fields(schema.CellConf)}
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--") or flag in HYDRA_FLAGS:
            continue
        key = flag[2:].replace("-", "_")
        if key in keys:
            said = value if eq else "true" if keys[key].type in (bool, "bool") else "<value>"
            return f"{flag} is no option of sft-grid run: a cell's keys are overrides, key=value: use {key}={said}"
    return None
