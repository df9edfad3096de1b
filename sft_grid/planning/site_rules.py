"""Rules over what a cell asks of its site, before anything is written or queued: the per-user variables its
cluster profile reads, the sbatch options it adds (`cluster.sbatch_extra`), and the names it gives Slurm.

- A per-user variable (`${user_env:SFT_GRID_LEONARDO_ACCOUNT}`) that is unset reads as a placeholder
  (planning/resolvers.py): a dry run renders with it and says what a real run needs; a real run is refused here,
  once per variable over the grid (the same problem in many cells is told once: core/problems.py).
- `sbatch_extra` is handed to sbatch as `--<key>=<value>` (submitit's additional parameters). A key sbatch does not
  know would be refused by sbatch itself, after the cells' files are written; a key sft_grid sets from its own keys
  (time, nodes, partition, account, GPUs...) would be overridden or, worse, escape sft_grid's own checks (a
  `time` past the cluster's `max_time`). Both are refused here, naming the key to use.
- An account, partition or QoS with surrounding spaces (a copy-paste) is written into `#SBATCH --account=` as is
  and refused by Slurm as an unknown account.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from sft_grid.core.problems import Problem
from sft_grid.core.timefmt import parse_minutes
from sft_grid.planning import resolvers
from sft_grid.planning.cells import Cell

# sbatch's long options (Slurm 23.02-24.11 man page, `sbatch --help`), without the leading dashes; submitit writes
# an additional parameter `a_b` as `--a-b`
SBATCH_OPTIONS = frozenset(
    [
        "account",
        "acctg-freq",
        "array",
        "batch",
        "bb",
        "bbf",
        "begin",
        "chdir",
        "cluster-constraint",
        "clusters",
        "comment",
        "constraint",
        "container",
        "container-id",
        "contiguous",
        "core-spec",
        "cores-per-socket",
        "cpu-freq",
        "cpus-per-gpu",
        "cpus-per-task",
        "deadline",
        "delay-boot",
        "dependency",
        "distribution",
        "error",
        "exclude",
        "exclusive",
        "export",
        "export-file",
        "extra",
        "extra-node-info",
        "get-user-env",
        "gid",
        "gpu-bind",
        "gpu-freq",
        "gpus",
        "gpus-per-node",
        "gpus-per-socket",
        "gpus-per-task",
        "gres",
        "gres-flags",
        "hint",
        "hold",
        "ignore-pbs",
        "input",
        "job-name",
        "kill-on-invalid-dep",
        "licenses",
        "mail-type",
        "mail-user",
        "mcs-label",
        "mem",
        "mem-bind",
        "mem-per-cpu",
        "mem-per-gpu",
        "mincpus",
        "network",
        "nice",
        "no-kill",
        "no-requeue",
        "nodefile",
        "nodelist",
        "nodes",
        "ntasks",
        "ntasks-per-core",
        "ntasks-per-gpu",
        "ntasks-per-node",
        "ntasks-per-socket",
        "open-mode",
        "output",
        "overcommit",
        "oversubscribe",
        "parsable",
        "partition",
        "power",
        "prefer",
        "priority",
        "profile",
        "propagate",
        "qos",
        "quiet",
        "reboot",
        "requeue",
        "reservation",
        "segment",
        "signal",
        "sockets-per-node",
        "spread-job",
        "switches",
        "test-only",
        "thread-spec",
        "threads-per-core",
        "time",
        "time-min",
        "tmp",
        "tres-bind",
        "tres-per-task",
        "uid",
        "use-min-nodes",
        "verbose",
        "wait",
        "wait-all-nodes",
        "wckey",
        "wrap",
    ]
)
# sbatch options sft_grid writes from a cell's own keys: given in sbatch_extra they would be overridden, or escape
# the checks of those keys -> the key to set instead
OWN = {
    "time": "time (checked against cluster.max_time)",
    "t": "time (checked against cluster.max_time)",
    "nodes": "nodes",
    "N": "nodes",
    "partition": "cluster.partition",
    "p": "cluster.partition",
    "account": "cluster.account",
    "A": "cluster.account",
    "qos": "cluster.qos",
    "cpus-per-task": "cluster.cpus_per_node",
    "ntasks-per-node": "the launcher (sft_grid runs one task per node)",
    "job-name": "sweep_name (each job is named from it)",
    "output": "nothing: sft_grid keeps each job's log in the cell's logs/",
    "error": "nothing: sft_grid keeps each job's log in the cell's logs/",
    "array": "nothing: sft_grid builds the arrays",
    "dependency": "nothing: sft_grid sets each job's dependencies",
    "chdir": "nothing: each job runs in its cell's directory",
    "signal": "nothing: sft_grid asks for USR2 before the limit to checkpoint and requeue",
}
# sbatch options sft_grid writes only when the cluster's own key is set: given in sbatch_extra as well, one of the
# two would be lost; alone, sbatch_extra's is the job's (a test's --mem=300M, finer than mem_gb's gigabytes)
OWN_WHEN_SET = {"mem": "mem_gb", "exclude": "exclude", "constraint": "constraint"}
# the GPU request: sft_grid writes it unless the cluster's gpu_directive is none (a typed request such as
# --gres=gpu:b200:4 is then the profile's own sbatch_extra)
GPU_OPTIONS = ("gres", "gpus-per-node", "gpus")
# a Slurm account, partition or QoS name (a comma-separated list of partitions included); what cuts one short
SLURM_NAME = re.compile(r"[\w.,:@+-]+")
SLURM_NAME_CUT = re.compile(r"[^\w.,:@+-]")


def _problem(cell: Cell, key: str, value: object, rule: str, message: str, fix: str) -> Problem:
    return Problem(cell=cell.name, key=key, value=value, rule=rule, message=message, fix=fix)


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _walk(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{prefix}.{i}")
    else:
        yield prefix, node


def site_variables(cell: Cell) -> Iterator[Problem]:
    """A real run of a cell whose config still holds a placeholder for an unset per-user variable."""
    if cell.spec.dry_run:
        return
    for key, value in _walk(cell.config):
        if key == "cluster.runs_root" and cell.config.get("runs_root"):
            continue  # the grid's own runs_root wins over the profile's
        var = resolvers.placeholder_var(value)
        if var is None:
            continue
        what, example = resolvers.kind_of(var)
        yield _problem(
            cell,
            key,
            value,
            "site-variable",
            f"environment variable {var} is not set: cluster {cell.spec.cluster.name}'s profile reads it ({what})",
            f"export {var}={example} (a dry run renders without it, with this placeholder)",
        )


def _wait_problem(text: str) -> str | None:
    """Why a wait (move_after) is not one, or None. Not Slurm's bare minutes: a wait is read as HH:MM:SS (3600 meant
    as seconds would wait 60 hours), each part below 60; and not a zero wait (every queued cell moved at once)."""
    if text.strip().isdigit():
        minutes = int(text)
        return (
            f"a bare number, which would be read as {minutes} minutes ({minutes // 60:02d}:{minutes % 60:02d}:00),"
            " not seconds"
        )
    try:
        parse_minutes(text)
    except ValueError as exc:  # a zero wait is no wait (not Slurm's "no limit", which parse_minutes' words are about)
        return (
            "a zero wait: every queued cell would be moved at once, as soon as it is queued"
            if "zero" in str(exc)
            else str(exc)
        )
    parts = [int(p) for p in text.strip().rpartition("-")[2].split(":")]
    if any(p >= 60 for p in parts[1:]):
        return f"{text!r} has minutes or seconds of 60 or more: HH:MM:SS counts each below 60"
    return None


def _sbatch_value(cell: Cell, raw: object, value: object) -> Problem | None:
    """An sbatch_extra value that is not one line of text or a number: a list or mapping (Slurm writes a list as
    `a,b`), null or false (written as `--key=None`/`--key=False`), or text across lines (the line after would be a
    shell line of the job script)."""
    option = str(raw).replace("_", "-")
    if isinstance(value, list | tuple | Mapping):
        items = value.items() if isinstance(value, Mapping) else [(None, v) for v in value]
        written = ",".join(str(v) if k is None else f"{k}={v}" for k, v in items)
        return _problem(
            cell,
            f"cluster.sbatch_extra.{raw}",
            value,
            "sbatch-extra-value",
            f"is a {'mapping' if isinstance(value, Mapping) else 'list'}: sbatch takes one value a line,"
            f" --{option}=VALUE",
            (
                f"a scalar; a list as Slurm writes it, one string: +cluster.sbatch_extra.{raw}={written or 'a,b'}"
                f" (in YAML {raw}: {written or 'a,b'})"
            )
            if not isinstance(value, Mapping)
            else f"a scalar: {raw}: VALUE, one option a key (sbatch_extra is not nested)",
        )
    if value is None or value is False:
        return _problem(
            cell,
            f"cluster.sbatch_extra.{raw}",
            value,
            "sbatch-extra-value",
            f"would be written as --{option}={value}, which sbatch reads as a value",
            f"to leave --{option} unset, drop the key: ~cluster.sbatch_extra.{raw} (true writes a bare --{option})",
        )
    if isinstance(value, str) and any(ch in value for ch in "\r\n\0"):
        return _problem(
            cell,
            f"cluster.sbatch_extra.{raw}",
            value,
            "sbatch-extra-value",
            "spans lines: the sbatch script holds each option on one line, and the rest would run as a command",
            f"one line: {raw}: {' '.join(value.split())}",
        )
    return None


def sbatch_extra(cell: Cell) -> Iterator[Problem]:
    c = cell.spec.cluster
    for raw in c.sbatch_extra:
        option = str(raw).replace("_", "-")
        key = f"cluster.sbatch_extra.{raw}"
        value = c.sbatch_extra[raw]
        wrong = _sbatch_value(cell, raw, value)
        if wrong is not None:
            yield wrong
        both = option in OWN_WHEN_SET and getattr(c, OWN_WHEN_SET[option]) not in (None, "", 0)
        gpus = option in GPU_OPTIONS and c.gpu_directive != "none" and bool(c.gpus_per_node)
        if option in OWN or str(raw) in OWN or both or gpus:
            own = (
                OWN.get(option)
                or OWN.get(str(raw))
                or ("cluster.gpus_per_node, or cluster.gpu_directive=none with this option" if gpus else "")
                or f"cluster.{OWN_WHEN_SET[option]} alone"
            )
            yield _problem(
                cell,
                key,
                value,
                "sbatch-extra",
                f"sft_grid writes --{option} itself from the cell's keys: given here it would be overridden, or"
                " escape their checks",
                f"set {own}, and drop sbatch_extra.{raw}",
            )
        elif option not in SBATCH_OPTIONS:
            close = difflib.get_close_matches(option, sorted(SBATCH_OPTIONS), n=1)
            yield _problem(
                cell,
                key,
                value,
                "sbatch-extra",
                f"sbatch has no option --{option}: sbatch would refuse the job after the cells are written",
                (f"did you mean {close[0].replace('-', '_')}? " if close else "")
                + "sbatch_extra takes sbatch's long options without dashes (man sbatch), e.g. reservation, licenses",
            )


def slurm_names(cell: Cell) -> Iterator[Problem]:
    c = cell.spec.cluster
    for name in ("account", "partition", "qos"):
        value = getattr(c, name)
        if not isinstance(value, str) or resolvers.is_placeholder(value):
            continue
        if value != value.strip():
            yield _problem(
                cell,
                f"cluster.{name}",
                value,
                "slurm-name",
                f"the {name} has spaces around it: sbatch would get --{name}={value!r} and refuse it",
                f"cluster.{name}={value.strip()}",
            )
        elif value and not SLURM_NAME.fullmatch(value):
            several = " (several partitions: comma-separated, debug,gpu)" if name == "partition" else ""
            yield _problem(
                cell,
                f"cluster.{name}",
                value,
                "slurm-name",
                f"a Slurm {name} name has no spaces, ; or quotes: sbatch would get --{name}={value!r} and refuse it",
                f"the {name}'s name as `sinfo`/`sacctmgr show assoc` lists it{several},"
                f" e.g. cluster.{name}={SLURM_NAME_CUT.split(value)[0] or 'debug'}",
            )


def spread(cell: Cell) -> Iterator[Problem]:
    """The settings of a grid across sites: the sites named once each, a move delay Slurm could read, and the
    needs of a cell checked against its own cluster when no list of sites gives it a choice."""
    s = cell.spec
    twice = sorted({n for n in s.sites if s.sites.count(n) > 1})
    if twice:
        yield _problem(
            cell,
            "sites",
            list(s.sites),
            "sites-twice",
            f"names {', '.join(twice)} more than once: a site is one place to put a cell, listed once",
            f"sites=[{','.join(dict.fromkeys(s.sites))}]",
        )
    if s.move_after is not None:
        why = _wait_problem(str(s.move_after))
        if why:
            yield _problem(
                cell,
                "move_after",
                s.move_after,
                "time-format",
                why,
                "write it as HH:MM:SS, e.g. move_after=02:00:00 (unset: cells move only off a site that is down)",
            )
    needs, c = s.site_needs, s.cluster
    # the needs set (the schema's fields: the object also caches its fingerprint, core/schema.fingerprint)
    asked = {f.name: getattr(needs, f.name) for f in dataclasses.fields(needs)}
    asked = {k: v for k, v in asked.items() if v not in (None, False)}
    if not s.sites and asked:
        unmet = []
        if needs.cpu_arch and needs.cpu_arch != c.cpu_arch:
            unmet.append(f"cpu_arch {needs.cpu_arch} (it has {c.cpu_arch})")
        if needs.gpu_type and not str(c.gpu_type or "").startswith(needs.gpu_type):
            unmet.append(f"gpu_type {needs.gpu_type} (it has {c.gpu_type})")
        if needs.gpu_mem_gb and (c.gpu_mem_gb or 0) < needs.gpu_mem_gb:
            unmet.append(f"gpu_mem_gb {needs.gpu_mem_gb} (it has {c.gpu_mem_gb})")
        if needs.internet and not c.internet_on_compute:
            unmet.append("internet on compute nodes (it has none)")
        if unmet:
            yield _problem(
                cell,
                "site_needs",
                asked,
                "site-needs",
                f"site_needs choose among sites=[...], and this grid names none: the cell would run on cluster"
                f" {c.name}, which lacks {'; '.join(unmet)}",
                "name the sites that may take it (sites=[a,b]), or a cluster that meets the needs (cluster=...)",
            )


def remote_and_staging(cell: Cell) -> Iterator[Problem]:
    c = cell.spec.cluster
    if c.remote.host and not str(c.remote.python or "").strip():
        yield _problem(
            cell,
            "cluster.remote.python",
            c.remote.python,
            "remote-python",
            "is empty: the site's python runs sft_grid there, and an empty one would read as the site not answering",
            "cluster.remote.python=python3.11 (or the path of an environment's bin/python on the site)",
        )
    st = c.staging
    if st.where == "job" and not st.partition and not c.internet_on_compute and c.executor == "slurm":
        yield _problem(
            cell,
            "cluster.staging.partition",
            st.partition,
            "staging-site",
            f"staging.where is job and no staging.partition is named: the staging job would run on {c.name}'s"
            " compute partition, whose nodes have no internet (internet_on_compute: false), and reach no Hub",
            "name a partition whose nodes reach the Hub (cluster.staging.partition=<transfer partition>), or stage"
            " from the login node (cluster.staging.where=login)",
        )


RULES = (site_variables, sbatch_extra, slurm_names, spread, remote_and_staging)
