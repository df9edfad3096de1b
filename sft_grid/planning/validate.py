"""Rules over every cell of a grid. Each rule yields problems; the grid fails once, with all of them.

Every problem names the cell, the dotted key, the value, the rule and how to fix it. Rules are pure (they read
only the composed cells): the schema's own rules (schema_rules.py: unknown keys, ranges, value sets, read from the
schema's fields), the Hub's (hub_rules.py: every id a cell stages from or uploads to, held to the client's own rule),
a site's (site_rules.py), and here the rules between keys (a global batch that divides, a mix that matches, a
template that fits its tokenizer, a layout that fits the GPUs, ...) and between cells (no two train one model or
write to one place).
A backend's rules about what it cannot train are the backend's own (`problems`), and checks
that need a tokenizer or data are in sft_grid/checks and report through the same Problem type.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sft_grid.core import project
from sft_grid.core.failures.classes import FailureClass
from sft_grid.core.failures.policy import Policy
from sft_grid.core.problems import Problem
from sft_grid.core.secrets import carries_secret, redact_url, secret_setting, shown_source
from sft_grid.core.templates import SUGGESTED, SUGGESTED_FOR_TOKENIZER, TEMPLATES, TOKENIZER_FAMILIES
from sft_grid.core.timefmt import parse_minutes
from sft_grid.planning import environments, gpus, resolvers, site_rules
from sft_grid.planning.axes import empty_mappings
from sft_grid.planning.cells import Cell
from sft_grid.planning.conf_files import option_data
from sft_grid.planning.evaluation import eval_suite, same_training
from sft_grid.planning.hub_rules import hub_ids, hub_upload, model_facts
from sft_grid.planning.readable import real_source
from sft_grid.planning.schema_rules import MISSING_TEXT, unknown_keys, values

Rule = Callable[[Cell], Iterator[Problem]]


def _problem(cell: Cell, key: str, value: object, rule: str, message: str, fix: str) -> Problem:
    return Problem(cell=cell.name, key=key, value=value, rule=rule, message=message, fix=fix)


def batch_divisible(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    per_step = s.micro_batch_size * cell.world_size
    if per_step < 1 or s.global_batch_size < 1:
        return  # a batch size or node count below 1 is a range problem, reported once by the schema's range rule
    if s.global_batch_size % per_step:
        yield _problem(
            cell,
            "global_batch_size",
            s.global_batch_size,
            "batch-divisible",
            f"not divisible by nodes x ranks_per_node x micro_batch_size = {cell.nodes} x {cell.ranks_per_node}"
            f" x {s.micro_batch_size} = {per_step}; gradient accumulation is derived from it, never set by hand",
            f"use a global_batch_size that is a multiple of {per_step}, or change nodes/micro_batch_size",
        )


def mix_matches(cell: Cell) -> Iterator[Problem]:
    mix, n = cell.spec.mix, len(cell.spec.dataset)
    if n == 0:
        yield _problem(
            cell,
            "dataset",
            [],
            "dataset-empty",
            "the cell trains on no dataset",
            "pick one: dataset=<name>, or a mix: dataset=[a,b]",
        )
        return
    if mix.strategy == "concat":
        if mix.probs is not None:
            yield _problem(
                cell,
                "mix.probs",
                mix.probs,
                "mix-probs",
                "probabilities are only used by interleave strategies",
                "drop mix.probs (mix.probs=null) or set mix.strategy=interleave_under",
            )
        return
    if mix.strategy not in ("interleave_under", "interleave_over"):
        return  # an unknown strategy is a choice problem (the schema's value rule)
    if mix.probs is None or len(mix.probs) != n:
        got = "none" if mix.probs is None else str(len(mix.probs))
        yield _problem(
            cell,
            "mix.probs",
            mix.probs,
            "mix-probs",
            f"{mix.strategy} needs one probability per dataset: {n} dataset(s) ({', '.join(cell.spec.dataset)}),"
            f" {got} given",
            f"give {n} probabilities in dataset order, e.g. mix.probs=[{','.join(['%.2g' % (1 / n)] * n)}]",
        )
    elif any(p <= 0 for p in mix.probs):
        zero = [f"{d} ({p:g})" for d, p in zip(cell.spec.dataset, mix.probs, strict=True) if p <= 0]
        yield _problem(
            cell,
            "mix.probs",
            mix.probs,
            "mix-probs",
            f"each probability must be above 0: {', '.join(zero)} would never be drawn",
            "drop that dataset from the mix (dataset=[...] without it), or give it a share above 0, e.g. mix.probs=["
            + ",".join(["%.2g" % (1 / n)] * n)
            + "]",
        )
    elif abs(sum(mix.probs) - 1.0) > 1e-6:
        total = sum(mix.probs)
        yield _problem(
            cell,
            "mix.probs",
            mix.probs,
            "mix-probs",
            f"probabilities must sum to 1 (they sum to {total:.6g})",
            "rescale them so they sum to 1: mix.probs=[" + ",".join(f"{p:g}" for p in _rescaled(mix.probs)) + "]",
        )


def _rescaled(probs: Sequence[float]) -> list[float]:
    """`probs` over their sum, to six places, the last taking what the others leave (so they sum to 1 as written)."""
    total = sum(probs)
    head = [round(p / total, 6) for p in probs[:-1]]
    return [*head, round(1 - sum(head), 6)]


def wall_time(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    try:
        limit = parse_minutes(s.cluster.max_time)
    except ValueError as exc:
        yield _problem(
            cell,
            "cluster.max_time",
            s.cluster.max_time,
            "time-format",
            str(exc),
            f"fix max_time in conf/cluster/{s.cluster.name}.yaml",
        )
        return
    try:
        asked = parse_minutes(s.time)
    except ValueError as exc:
        yield _problem(cell, "time", s.time, "time-format", str(exc), "write time as HH:MM:SS, e.g. time=04:00:00")
        return
    if asked > limit:
        yield _problem(
            cell,
            "time",
            s.time,
            "time-max",
            f"over cluster {s.cluster.name!r}'s maximum wall time {s.cluster.max_time}",
            f"ask for at most time={s.cluster.max_time}; a longer run resumes from its checkpoint when rerun",
        )


def template_fits_tokenizer(cell: Cell) -> Iterator[Problem]:
    model = cell.spec.model
    template = TEMPLATES.get(model.template)
    family = TOKENIZER_FAMILIES.get(model.tokenizer_family)
    if template is None or family is None:
        return  # an unknown template or family is a choice problem (the schema's value rule)
    if family != template.family:
        delphi = (
            " (Delphi checkpoints carry the Llama-3 tokenizer with think/tool tokens in its reserved slots;"
            " they train with the delphi template: Llama-3 turns plus those tokens)"
            if model.tokenizer_family == "delphi"
            else ""
        )
        yield _problem(
            cell,
            "model.template",
            model.template,
            "template-tokenizer",
            f"writes {template.family} tokens ({', '.join(template.special_tokens[:2])}, ...) but model"
            f" {model.name!r} has a"
            f" {model.tokenizer_family} tokenizer: every example would be split into pieces of those strings{delphi}",
            f"model.template={SUGGESTED_FOR_TOKENIZER.get(model.tokenizer_family, SUGGESTED[family])}",
        )


def visible_gpus() -> int | None:
    """The NVIDIA GPUs this process can use: its devices (/dev/nvidia<N>), as many as CUDA_VISIBLE_DEVICES lists
    where it is set (CUDA stops at the first entry that names none: "-1", ""); None where this machine's GPUs are
    not seen that way (an AMD GPU, /dev/kfd; WSL's, /dev/dxg): not counted, nothing refused."""
    if Path("/dev/kfd").exists() or Path("/dev/dxg").exists():
        return None
    devices = sum(1 for p in Path("/dev").glob("nvidia*") if p.name[6:].isdigit())
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return devices
    usable = 0
    for entry in listed.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break
        usable += 1
    return min(usable, devices)


def _gpus_seen() -> str:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "its /dev/nvidia<N> devices" + ("" if listed is None else f", CUDA_VISIBLE_DEVICES={listed!r}")


def resources(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    if s.cluster.executor == "local" and cell.nodes != 1:
        yield _problem(
            cell,
            "nodes",
            cell.nodes,
            "local-one-node",
            "the local executor runs a cell on this one machine",
            "nodes=1, or a Slurm cluster (cluster=<site>)",
        )
    wanted = s.cluster.gpus_per_node or 0
    here = visible_gpus() if s.cluster.executor == "local" and wanted and not s.dry_run else None
    if here is not None and here < wanted:  # a dry run still shows what a machine with the GPUs would run
        yield _problem(
            cell,
            "cluster.gpus_per_node",
            wanted,
            "local-gpus",
            f"cluster {s.cluster.name!r} trains each cell on this machine's GPUs, and this process sees {here} NVIDIA"
            f" GPU(s) ({_gpus_seen()}): torchrun would start {wanted} ranks, and those without a GPU fail at start",
            f"cluster.gpus_per_node={here}"
            + (" (the CPU)" if not here else "")
            + ", or dry_run=true to see what a machine with the GPUs runs, or a Slurm cluster (cluster=<site>)",
        )
    if s.max_steps <= 0 and s.epochs <= 0:
        yield _problem(
            cell,
            "epochs",
            s.epochs,
            "length",
            "neither epochs nor max_steps is positive",
            "set epochs (e.g. epochs=1) or max_steps (e.g. max_steps=100)",
        )


def staging_site(cell: Cell) -> Iterator[Problem]:
    """A staging job needs Slurm, and its wall time must be readable; a machine that cannot read the staged files
    cannot stage them itself."""
    c = cell.spec.cluster
    st = c.staging
    if st.where == "job" and c.executor != "slurm":
        yield _problem(
            cell,
            "cluster.staging.where",
            st.where,
            "staging-where",
            "a staging job is a Slurm job, and this cluster runs cells with the local executor",
            "cluster.staging.where=login (stage on this machine), or a Slurm cluster",
        )
    if st.where == "login" and not st.readable_here:
        yield _problem(
            cell,
            "cluster.staging.readable_here",
            st.readable_here,
            "staging-where",
            "the machine running the grid would stage into a cache it cannot read",
            "cluster.staging.where=job (a transfer job on a partition that mounts the cache), or readable_here=true",
        )
    try:
        parse_minutes(st.time)
    except ValueError as exc:
        yield _problem(
            cell,
            "cluster.staging.time",
            st.time,
            "time-format",
            str(exc),
            f"fix staging.time in conf/cluster/{c.name}.yaml, e.g. 04:00:00",
        )
    # $: path-shell-variable's; a dry run's placeholder (an unset per-user variable): site-variable's in a real run
    given = c.hf_cache if c.hf_cache and "$" not in c.hf_cache and not resolvers.is_placeholder(c.hf_cache) else None
    cache = os.path.expanduser(given) if given else None
    if cache is not None and not os.path.isabs(cache):
        yield _problem(
            cell,
            "cluster.hf_cache",
            c.hf_cache,
            "hf-cache",
            "a relative path: the jobs run in their own directories, where it would name another cache",
            "an absolute path (or one starting with ~), e.g. cluster.hf_cache=${oc.env:HOME}/hf_cache",
        )
    elif cache is not None and os.path.exists(cache) and not os.path.isdir(cache):
        yield _problem(
            cell,
            "cluster.hf_cache",
            c.hf_cache,
            "hf-cache",
            "exists and is not a directory",
            "name a directory for the Hugging Face cache (it is created when missing)",
        )


def inputs_named(cell: Cell) -> Iterator[Problem]:
    """A model must say where it comes from; a dataset is listed once per cell, each option under its own name."""
    model = cell.spec.model
    if not model.hub_id and not model.path:
        named = f"model {model.name!r}" if model.name != MISSING_TEXT else "the model"
        option = model.name if model.name != MISSING_TEXT else "<option>"
        yield _problem(
            cell,
            "model.hub_id",
            None,
            "model-source",
            f"{named} has neither a hub id nor a local path: the backend would have nothing to load",
            f"set hub_id: <org>/<name> or path: <directory> in conf/model/{option}.yaml"
            " (or model.hub_id=... on the command line)",
        )
    for line in cell.overrides:
        key, _, value = line.lstrip("+~").partition("=")
        names = [v.strip(" '\"") for v in value.strip("[]").split(",")] if key == "dataset" else []
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            yield _problem(
                cell,
                "dataset",
                value,
                "dataset-twice",
                f"lists {', '.join(twice)} more than once: the cell would train on it once, not twice",
                "list each dataset once (to weight a source more, use mix.strategy=interleave_* with mix.probs)",
            )
        # a dataset option is merged into the cell's `dataset` under the key its file gives it: an option copied by
        # hand that kept the original's key replaces that source (two options, one source trained, exit 0)
        for name in dict.fromkeys(n for n in names if n and n not in cell.spec.dataset):
            file = project.find_option("dataset", name)
            data = option_data(file) if file is not None else None  # unreadable: composition says why
            keyed = [str(k) for k in data] if isinstance(data, dict) else []
            if file is None or not keyed:
                continue
            with contextlib.suppress(ValueError):
                file = file.relative_to(project.runs_base())
            yield _problem(
                cell,
                "dataset",
                name,
                "dataset-option-key",
                f"{file} is keyed {', '.join(keyed)}: a dataset option is keyed by its file's name, and under"
                f" {keyed[0]!r} it "
                + (
                    f"replaces the settings of dataset {keyed[0]} (the cell would train one source, not both)"
                    if keyed[0] in names
                    else f"would be trained and reported as dataset {keyed[0]}, not {name}"
                ),
                f"rename its key {name}: write {name}: instead of {keyed[0]}: in {file}",
            )
    seen: dict[tuple[str, str], str] = {}
    for name, ds in cell.spec.dataset.items():
        data = (real_source(ds.source), ds.split)  # a link, or another spelling of the path, reads the same file
        first = seen.setdefault(data, name)
        if first != name:
            other = cell.spec.dataset[first].source
            named = "" if other == ds.source else f" (both read {data[0]})"
            yield _problem(
                cell,
                f"dataset.{name}.source",
                shown_source(ds.source),
                "dataset-twice",
                f"the same data as dataset {first!r}{named}: the cell would train on it twice",
                "list each dataset once (to weight a source more, use mix.strategy=interleave_* with mix.probs)",
            )


def venv_meets_needs(cell: Cell) -> Iterator[Problem]:
    s = cell.spec
    path, unmet = environments.select(s)
    if unmet:
        yield _problem(
            cell,
            f"cluster.need_venvs.{unmet}.{s.backend.name}",
            None,
            "venv-need",
            f"model {s.model.name!r} needs {environments.VENV_NEEDS[unmet]}, and cluster {s.cluster.name!r} names no"
            f" {s.backend.name} virtual environment that has it (its environment {path} is not declared to)",
            f"name one in conf/cluster/{s.cluster.name}.yaml: need_venvs: {{{unmet}: {{{s.backend.name}: <venv dir>}}}}"
            f" (or '+cluster.need_venvs.{unmet}={{{s.backend.name}:<venv dir>}}' on the command line)",
        )
    if cell.layout.deepspeed and path == environments.managed_for(s) and "deepspeed" not in s.backend.provides:
        # a site's own environment is the site's business; the managed one is known not to have DeepSpeed
        why = "needs: zero3" if "zero3" in s.model.needs else f"layout: {cell.layout.summary()}"
        yield _problem(
            cell,
            "backend",
            s.backend.name,
            "venv-deepspeed",
            f"model {s.model.name!r} trains with DeepSpeed {cell.layout.sharding.replace('zero', 'ZeRO-')} ({why}),"
            f" and the managed {s.backend.name} virtual environment {path} has no DeepSpeed",
            "backend=axolotl (its managed environment has DeepSpeed), or name a site environment with DeepSpeed:"
            f" cluster.backend_venvs.{s.backend.name}=<venv dir>",
        )


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def safe_names(cell: Cell) -> Iterator[Problem]:
    """Names end up in paths, job names, LLaMA-Factory's comma-separated dataset list and script comments:
    they are kept to a safe alphabet rather than quoted in each of those places, and start with a letter or a digit
    (`.` and `..` would be the runs root itself or its parent, a leading dot hides a folder, a leading - reads as an
    option). The fix is a name that passes: the given one cleaned where something of it is left, else a plain one."""
    s = cell.spec
    sweep = next((o.split("=", 1)[1] for o in cell.overrides if o.lstrip("+").startswith("sweep=")), "")
    named = [("sweep_name", s.sweep_name, sweep or "my_grid"), ("model.name", s.model.name, "my_model")]
    named += [(f"dataset.{name}", name, "my_data") for name in s.dataset]
    for key, name, plain in named:
        if _SAFE_NAME.match(name) or name == MISSING_TEXT:  # unset: the required rule's problem, not a second one
            continue
        why = (
            "is the runs root itself or its parent"
            if name in (".", "..")
            else "would be a hidden folder (a leading dot)"
            if name.startswith(".")
            else "would read as an option (a leading -)"
            if name.startswith("-")
            else "is empty"
            if not name
            else "may hold only letters, digits and . _ + - (no spaces, quotes, ; or commas)"
        )
        better = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).lstrip("._+-").strip("_")
        better = better if _SAFE_NAME.match(better) else plain
        yield _problem(
            cell,
            key,
            name,
            "safe-name",
            f"a name {why}; a name starts with a letter or a digit, then letters, digits and . _ + -",
            f"sweep_name={better}" if key == "sweep_name" else f"rename it, e.g. {better}",
        )


def failure_policy(cell: Cell) -> Iterator[Problem]:
    """Every class the grid's failure policy names exists, with an action and a whole budget."""
    for name, spec in cell.spec.failure_policy.items():
        try:
            Policy.from_mapping({name: spec})
        except (ValueError, TypeError, AttributeError) as exc:
            yield _problem(
                cell,
                f"failure_policy.{name}",
                spec,
                "failure-policy",
                str(exc).split(";")[0],
                f"classes: {', '.join(c.value for c in FailureClass)}; a value: stop, requeue:N,"
                " or {action: requeue, budget: N}",
            )


def notify_targets(cell: Cell) -> Iterator[Problem]:
    """A notification's command exists here, its webhook is an http(s) URL with no token in it (it would be
    written into cell.yaml), and the variable named for a webhook that has one is set."""
    n = cell.spec.notify
    if n.command and shutil.which(n.command[0]) is None:
        yield _problem(
            cell,
            "notify.command",
            n.command,
            "notify-command",
            f"{n.command[0]!r} is not a command here",
            "give an argv list whose first item is on PATH or an absolute path",
        )
    if n.webhook and not re.match(r"https?://[^/\s]+", n.webhook):
        yield _problem(
            cell,
            "notify.webhook",
            redact_url(n.webhook),
            "notify-webhook",
            "not an http(s) URL",
            "notify.webhook=https://host/path",
        )
    elif n.webhook and carries_secret(n.webhook):
        yield _problem(
            cell,
            "notify.webhook",
            redact_url(n.webhook),
            "notify-secret",
            "the URL carries a token (user info, a query or a token-like path), and cell.yaml would hold it",
            "export it in a variable and name that: notify.webhook_env=MY_WEBHOOK_URL",
        )
    if n.webhook_env and not os.environ.get(n.webhook_env):
        state = "is set but empty" if n.webhook_env in os.environ else "is not set"
        yield _problem(
            cell,
            "notify.webhook_env",
            n.webhook_env,
            "notify-webhook-env",
            f"names a variable that {state} here; the jobs read it from the environment they inherit",
            f"export {n.webhook_env}=<the webhook URL> before running the grid",
        )


# the settings a user writes freely and sft_grid writes into a cell's files as given (cell.yaml, launch.sh, the
# backend's config; a swept one into the cell's name too)
FREE_SETTINGS = ("cluster.env", "cluster.setup", "cluster.sbatch_extra", "extra", "vars")
# NAME=value in a setup line (`export HF_TOKEN=...`)
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def _settings(tree: object, key: str) -> Iterator[tuple[str, str, object]]:
    """(dotted key, the name the value is set under, value) for every leaf below `key`; a setup line's
    assignments under their own names."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _settings(v, f"{key}.{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _settings(v, f"{key}[{i}]")
    elif tree is not None:
        name = key.rsplit(".", 1)[-1].split("[", 1)[0]
        yield key, name, tree
        for var, value in _ASSIGNMENT.findall(str(tree)):
            yield key, var, value


def no_secrets(cell: Cell) -> Iterator[Problem]:
    """No token, password or API key in what is written into the cell's files (core/secrets.py says how one is
    told): the jobs read secrets from the environment they inherit, so none ever needs to be in a file."""
    for top in FREE_SETTINGS:
        head, _, rest = top.partition(".")
        tree = cell.config.get(head)
        tree = tree.get(rest) if rest and isinstance(tree, dict) else tree
        said: set[str] = set()
        for key, name, value in _settings(tree, top):
            if key in said or not secret_setting(name, value):
                continue
            said.add(key)
            var = name.upper() if top == "cluster.env" else "HF_TOKEN (WANDB_API_KEY for W&B)"
            yield _problem(
                cell,
                key,
                "***",
                "secret",
                f"holds a secret (a token, a password or an API key, under {name!r}), and it would be written in"
                " plain text into the cell's files (cell.yaml, launch.sh, the backend's config)",
                f"drop the override and export {var} in your shell before the run: local cells and Slurm jobs"
                " inherit its environment, and the Hub's and W&B's clients read their tokens from it",
            )


def _where_unusable(path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory sft_grid writes into, or None: the first of its ancestors that
    exists must be a directory this user may write into, and not on one of the kernel's file systems (/proc, /sys); a
    symlink loop or a file on the way is named."""
    loop = None
    for part in (path, *path.parents):
        try:
            st = os.stat(part)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                loop = part  # the link itself is the topmost part that loops
                continue
            if exc.errno == errno.ENOTDIR:
                continue  # a file further up: named when the walk reaches it
            if exc.errno == errno.ENAMETOOLONG:
                return f"a part of it is longer than the file system allows ({exc.strerror})"
            return f"{part} cannot be read: {exc.strerror}"
        if loop is not None:
            return f"{loop} is a symbolic link loop (it points, through links, back at itself)"
        if not stat.S_ISDIR(st.st_mode):
            return f"{part} is a file, not a directory" if part == path else f"{part} (a part of it) is a file"
        # os.access says yes to root anywhere on a writable mount, but the kernel's own file systems hold no
        # directory of a user's: mkdir under /proc fails (ENOENT), under /sys too (EPERM), and one under
        # /sys/fs/cgroup makes a cgroup. Their type is read from the mount table (Linux; elsewhere not checked).
        kernel = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "configfs"}
        kernel |= {"bpf", "pstore", "efivarfs", "mqueue", "fusectl", "binfmt_misc", "selinuxfs", "nsfs", "rpc_pipefs"}
        device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split()  # id parent major:minor root mountpoint options ... - fstype source options
                fstype = fields[fields.index("-") + 1]
                if fields[2] == device and fstype in kernel:
                    return f"{part} is on the kernel's {fstype} file system, not on a disk"
        if part != path and not os.access(part, os.W_OK | os.X_OK):
            return f"it cannot be created: {part} is not writable by this user"
        if part == path and not os.access(part, os.W_OK | os.X_OK):
            return "it is a directory this user cannot write into"
        return None
    return None


_USABLE: dict[str, str | None] = {}


def paths_usable(cell: Cell) -> Iterator[Problem]:
    """The cell's directory can be made: the runs root is (or can become) a writable directory, and the sweep's
    and cell's names fit in a file name. Checked once per runs root."""
    s = cell.spec
    name_max = 255
    with contextlib.suppress(OSError, ValueError):
        existing = next(p for p in (cell.runs_root, *cell.runs_root.parents) if p.is_dir())
        name_max = os.pathconf(existing, "PC_NAME_MAX")
    for key, name in (("sweep_name", s.sweep_name), ("", cell.name)):
        if len(name.encode()) > name_max:
            yield _problem(
                cell,
                key,
                name if key else None,
                "name-too-long",
                f"{'the sweep name' if key else 'the cell directory name ' + name[:40] + '...'} has"
                f" {len(name.encode())} bytes, and a file name may have at most {name_max} here",
                "use a shorter sweep_name" if key else "shorten the swept values that name the cell (or its model)",
            )
            break
    given = cell.config.get("runs_root")
    key = "runs_root" if given is not None else "cluster.runs_root"
    given = given if given is not None else (cell.config.get("cluster") or {}).get("runs_root")
    if isinstance(given, str) and not given.strip():
        yield _problem(cell, key, given, "runs-root", *project.empty_runs(key))
        return
    root = str(cell.runs_root)
    if root not in _USABLE:
        _USABLE[root] = _where_unusable(cell.runs_root)
    why = _USABLE[root]
    if why:
        yield _problem(
            cell,
            "runs_root",
            root,
            "runs-root",
            f"the cells' directory cannot be made: {why}",
            "runs_root=<a directory you can write into> (or --runs-root / $SFT_GRID_RUNS), e.g. runs_root=./runs",
        )


# $NAME or ${NAME}: a shell variable, left in a value as written (OmegaConf's own ${...} are resolved by now)
SHELL_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def path_settings(config: dict[str, Any]) -> Iterator[tuple[str, object]]:
    """(dotted key, value) of each setting that names a local path: the runs root, the Hugging Face cache, the
    model's directory, each dataset's source, each backend's environment."""

    def mapping(value: object) -> dict[str, Any]:
        return value if isinstance(value, dict) else {}

    cluster = mapping(config.get("cluster"))
    yield "runs_root", config.get("runs_root")
    yield "cluster.runs_root", cluster.get("runs_root")
    yield "cluster.hf_cache", cluster.get("hf_cache")
    yield "model.path", mapping(config.get("model")).get("path")
    for name, ds in mapping(config.get("dataset")).items():
        yield f"dataset.{name}.source", mapping(ds).get("source")
    for backend, venv in mapping(cluster.get("backend_venvs")).items():
        yield f"cluster.backend_venvs.{backend}", venv
    for need, venvs in mapping(cluster.get("need_venvs")).items():
        for backend, venv in mapping(venvs).items():
            yield f"cluster.need_venvs.{need}.{backend}", venv
    yield "eval.include_path", mapping(config.get("eval")).get("include_path")


def no_shell_variables(cell: Cell) -> Iterator[Problem]:
    """A path setting that holds a shell variable (`$SCRATCH/sft_runs`, `$HOME/models/tiny`): no shell reads a
    config, so it would name a folder called `$SCRATCH` under the working directory. The config's own resolver
    reads the environment (planning/resolvers.py), and names a variable that is not set."""
    for key, value in path_settings(dict(cell.config)):
        found = SHELL_VARIABLE.search(value) if isinstance(value, str) and "://" not in value else None
        if found is None or not isinstance(value, str):
            continue
        var = found.group(1) or found.group(2)
        fixed = SHELL_VARIABLE.sub(lambda m: "${user_env:" + (m.group(1) or m.group(2)) + "}", value)
        yield _problem(
            cell,
            key,
            value,
            "path-shell-variable",
            f"holds the shell variable ${var}, and no shell reads a config: it would name a folder called"
            f" {found.group(0)!r}, not ${var}'s value",
            f"read it with the config's resolver: '{key}={fixed}' on the command line (in single quotes), or"
            f" {key.rsplit('.', 1)[-1]}: {fixed} in the config file",
        )


# GPUs before Hopper (gpu_type as the cluster names them, A100-64GB counting as A100): FlashAttention-3 has no kernel
AMPERE = ("A100", "A40", "A10", "A30", "A6000", "V100")


def gpu_fit(cell: Cell) -> Iterator[Problem]:
    """A cell whose predicted peak memory per GPU exceeds the GPU's (planning/gpus.py: the cheapest layout that
    fits was looked for; this is the one that needs least), and kernels the site does not have."""
    s, lay = cell.spec, cell.layout
    c = s.cluster
    if lay.attention in ("fa2", "fa3") and "flash_attn" not in c.kernels:
        yield _problem(
            cell,
            "layout.attention",
            lay.attention,
            "kernel-missing",
            f"FlashAttention is not among cluster {c.name!r}'s kernels {list(c.kernels)}: the backend would fail"
            " to import flash_attn at the first step",
            f"layout.attention=sdpa, or install flash-attn in the site's environment and add flash_attn to"
            f" conf/cluster/{c.name}.yaml kernels",
        )
    if lay.attention == "fa3" and (c.gpu_type or "").upper().startswith(AMPERE):
        yield _problem(
            cell,
            "layout.attention",
            "fa3",
            "kernel-gpu",
            f"FlashAttention-3 runs on Hopper GPUs only (H100, H200, GH200), and cluster {c.name!r}'s are"
            f" {c.gpu_type}: its kernel would fail at the first step",
            "layout.attention=fa2 (or drop it: FlashAttention 2 where the site has it, else sdpa)",
        )
    if lay.liger and "liger_kernel" not in c.kernels:
        yield _problem(
            cell,
            "layout.liger",
            True,
            "kernel-missing",
            f"liger-kernel is not among cluster {c.name!r}'s kernels {list(c.kernels)}"
            + (" (it needs a GPU: Triton)" if not c.gpus_per_node else ""),
            f"drop layout.liger, or install liger-kernel in the site's environment and add liger_kernel to"
            f" conf/cluster/{c.name}.yaml kernels",
        )
    if lay.fits or lay.memory is None or not lay.gpu_mem_gb:
        return
    fixed = ", ".join(f"{k}={v}" for k, v in lay.fixed)
    key, value = lay.fixed[0] if lay.fixed else ("model", s.model.name)
    yield _problem(
        cell,
        key,
        value,
        "gpu-memory",
        f"does not fit on {c.name}'s {c.gpu_mem_gb} GiB GPUs{f' ({c.gpu_type})' if c.gpu_type else ''}"
        + (f" as set ({fixed})" if fixed else " in any layout sft_grid can choose")
        + f": {lay.summary()} needs {lay.memory.text()} per GPU, more than the {gpus.USABLE:.0%} of it a layout may"
        f" use (backend {s.backend.name}, cutoff_len {s.cutoff_len}, micro_batch_size {s.micro_batch_size})",
        "; or ".join(gpus.fixes(s, lay)),
    )


def offload_sharded(cell: Cell) -> Iterator[Problem]:
    """A CPU offload is DeepSpeed's (planning/gpus.py OFFLOADS_UNDER): set where the layout trains without DeepSpeed,
    or the parameters' under ZeRO-2, it would be dropped while the dry run and the memory model count it."""
    s, lay = cell.spec, cell.layout
    under = gpus.OFFLOADS_UNDER.get(lay.offload)
    if under is None or lay.sharding in under:
        return
    own = s.layout.offload != "auto"  # else the model's needs: [zero3_offload] asked for it
    asked = f"layout.offload={lay.offload}" if own else f"model {s.model.name!r} (needs: [zero3_offload])"
    if not s.cluster.gpus_per_node:
        message = f"{asked} offloads to the CPU, and cluster {s.cluster.name!r} trains on the CPU: nothing to offload"
        fix = "layout.offload=none (or drop it)"
    elif lay.sharding == "none":
        message = (
            f"{asked} is DeepSpeed's CPU offload, and layout.sharding=none trains without DeepSpeed: the offload would"
            " be dropped, the optimizer states kept on the GPU"
        )
        fix = f"layout.sharding={' or layout.sharding='.join(under)} (or drop layout.sharding), or layout.offload=none"
    else:
        message = (
            f"{asked} offloads the parameters too, which DeepSpeed does under ZeRO-3 only (offload_param): under"
            " ZeRO-2 they would stay on the GPU"
        )
        fix = "layout.sharding=zero3 (or drop layout.sharding), or layout.offload=optimizer"
    key, value = ("layout.offload", lay.offload) if own else ("layout.sharding", lay.sharding)
    yield _problem(cell, key, value, "layout-offload", message, fix)


def needs_zero3(cell: Cell) -> Iterator[Problem]:
    """A model whose config says `needs: [zero3]` trains under ZeRO-3 only (the chooser never picks less for it); a
    layout.sharding set lighter would win over that floor and train what its config says cannot."""
    s = cell.spec
    if "zero3" not in s.model.needs or s.layout.sharding not in ("none", "zero2"):
        return
    yield _problem(
        cell,
        "layout.sharding",
        s.layout.sharding,
        "layout-needs",
        f"model {s.model.name!r} needs zero3 (its conf/model/{s.model.name}.yaml: needs: [zero3]), and"
        f" layout.sharding={s.layout.sharding} would train it without: its states would not be sharded as it needs",
        "layout.sharding=zero3 (or drop layout.sharding: the model's floor is chosen)",
    )


RULES: tuple[Rule, ...] = (
    no_shell_variables,
    paths_usable,
    safe_names,
    inputs_named,
    hub_ids,
    model_facts,
    staging_site,
    batch_divisible,
    mix_matches,
    wall_time,
    template_fits_tokenizer,
    resources,
    hub_upload,
    venv_meets_needs,
    gpu_fit,
    offload_sharded,
    needs_zero3,
    failure_policy,
    notify_targets,
    no_secrets,
    eval_suite,
    empty_mappings,
    *site_rules.RULES,
)


def duplicate_identities(cells: Sequence[Cell]) -> list[Problem]:
    seen: dict[tuple[str, str], Cell] = {}
    problems = []
    for cell in cells:
        first = seen.setdefault((cell.spec.sweep_name, cell.key), cell)
        # cells that differ only in their evaluation suite (an `eval=a,b` axis) are one cell, evaluated twice
        if first is not cell and not same_training(first, cell):
            problems.append(
                Problem(
                    cell=cell.name,
                    key="",
                    value=None,
                    rule="identity-unique",
                    message=f"trains the same model as cell {first.name} ({' '.join(first.overrides)}): they differ"
                    " only in"
                    " where or how they run (nodes, micro batch, time, cluster), which is not part of a cell's"
                    " identity",
                    fix="sweep over a training value instead, or drop the duplicate axis",
                )
            )
    return problems


def shared_model_names(cells: Sequence[Cell]) -> list[Problem]:
    """No two model options of a grid under one name: a model's name labels its cells (`{model}` in a Hub id) and
    their rows in `results` and the report's fits, so two checkpoints under one name would read as one model (an
    option copied by hand that kept its `name:`). One option whose source is swept (`model.hub_id=a,b`) is the
    user's own choice, and its cells' names tell them apart."""
    problems = []
    seen: dict[str, Cell] = {}
    for cell in cells:
        m = cell.spec.model
        first = seen.setdefault(m.name, cell)
        other = first.spec.model
        if first is cell or (m.hub_id, m.path) == (other.hub_id, other.path):
            continue

        def chosen(c: Cell) -> str | None:
            return next((o.split("=", 1)[1] for o in c.overrides if o.lstrip("+").startswith("model=")), None)

        def option(c: Cell) -> str:
            return f"model={chosen(c)}" if chosen(c) else "its model"

        if chosen(cell) == chosen(first):
            continue  # one option, its source swept (model.hub_id=a,b): the override names each cell apart
        source = m.hub_id or m.path
        own = f"name: {chosen(cell)} in conf/model/{chosen(cell)}.yaml" if chosen(cell) else "name: <its own>"
        problems.append(
            Problem(
                cell=cell.name,
                key="model.name",
                value=m.name,
                rule="model-name-shared",
                message=f"names another model ({source}, {option(cell)}) than cell {first.name}'s"
                f" ({other.hub_id or other.path}, {option(first)}): the two would read as one model in the cells'"
                " names, the results and the fits",
                fix=f"give each model option its own name ({own}), or model.name=<a name> beside {option(cell)}",
            )
        )
    return problems


def shared_outputs(cells: Sequence[Cell]) -> list[Problem]:
    """No two cells of a grid write to one place: one cell directory (its output/), or, after its placeholders are
    filled in, one Hub repository (ids are case-insensitive on the Hub): each would overwrite the other."""
    problems = []
    dirs: dict[str, Cell] = {}
    repos: dict[str, Cell] = {}
    for cell in cells:
        first = dirs.setdefault(str(cell.sweep_dir / cell.name), cell)
        if first is not cell and first.key != cell.key:
            problems.append(
                Problem(
                    cell=cell.name,
                    key="sweep_name",
                    value=cell.spec.sweep_name,
                    rule="output-shared",
                    message=f"writes its output to the same directory as cell {first.name}"
                    f" ({' '.join(first.overrides)})",
                    fix="give the grid's cells their own directories (a distinct sweep_name or runs_root)",
                )
            )
        hub = cell.spec.hub_model_id
        if not (cell.spec.push_to_hub and hub) or "{" in hub:
            continue  # no upload, or a pattern sft_grid could not fill (rule hub-id)
        first = repos.setdefault(hub.lower(), cell)
        if first is not cell and first.key != cell.key:  # one identity twice: rule identity-unique
            problems.append(
                Problem(
                    cell=cell.name,
                    key="hub_model_id",
                    value=hub,
                    rule="output-shared",
                    message=f"uploads to the same Hub repository as cell {first.name} ({' '.join(first.overrides)}):"
                    " each upload would overwrite the other's model",
                    fix="put a placeholder that differs per cell in it: hub_model_id=<org>/{model}-sft-{key} ({key} is"
                    " the cell's identity hash; {name}, {model} and {data} are filled in too)",
                )
            )
    return problems


def validate(cells: Sequence[Cell], backend_rules: Callable[[Cell], Iterable[Problem]] = lambda c: ()) -> list[Problem]:
    """Every problem of every cell: the schema's rules, the rules above, the backend's own (`backend_rules`,
    given by the caller, which knows the backends), and the grid's (no two cells train the same model)."""
    problems: list[Problem] = []
    for cell in cells:
        problems += unknown_keys(cell.name, cell.config)
        problems += values(cell.name, cell.spec)
        # (the rules below leave a value the schema's rules refuse to them: one problem, one fix)
        problems += [p for rule in RULES for p in rule(cell)]
        problems += backend_rules(cell)
    return problems + duplicate_identities(cells) + shared_model_names(cells) + shared_outputs(cells)
