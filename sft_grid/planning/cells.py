"""Cells: a composed config made typed, with its identity, its name and the values derived from it.

Identity is a hash of what determines the trained model (backend, model, data and mix, training
hyperparameters including the global batch and seed), never of where or how it runs (cluster, nodes,
micro batch, time, paths, run switches). So the same cell reached from another cluster, another grid
invocation or a single-cell rerun lands in the same directory and is recognised as done.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sft_grid.core import project
from sft_grid.core.hubcache import Pin
from sft_grid.core.layout import iter_cell_dirs
from sft_grid.core.schema import CellConf, fingerprint, typed
from sft_grid.core.secrets import secret_setting
from sft_grid.core.tokenized import TokenizedData
from sft_grid.planning import resolvers
from sft_grid.planning.gpus import Layout, choose, shape_of, trainable_params

# Top-level keys that describe where and how a cell runs, not what it trains.
NOT_IDENTITY = frozenset(
    {
        "cluster",
        "runs_root",
        "sweep_name",
        "nodes",
        "time",
        "micro_batch_size",
        "dry_run",
        "force",
        "rerun_failed",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "report_to",
        "push_to_hub",
        "hub_model_id",
        "concurrency",
        "register_db",
        "register_command",
        "vars",
        "failure_policy",
        "watchdog",
        "notify",
        "eval",
        "cleanup_checkpoints",
        "stage_only",
        "check_only",
        "tokenize_once",
        "prune",  # how the grid steers itself, never what a cell trains
        "adaptive",
        "ship_dirty",
        "sites",  # where a cell runs is its record, not its identity
        "site_needs",
        "move_after",
        "layout",  # how a cell is spread over GPUs and kept in memory: the same training, at another cost
        "packing",  # added back below when on: an unpacked cell keeps the identity it had before packing existed
    }
)
# Keys of sub-configs that are about the machine, or describe the model rather than choose it (its size and shape,
# how it is stored, whether its id is confirmed): none changes what is trained.
_MODEL_NOT_IDENTITY = frozenset(
    {
        "path",
        "needs",
        "params_b",
        "params",
        "num_layers",
        "hidden_size",
        "num_heads",
        "num_kv_heads",
        "intermediate_size",
        "vocab_size",
        "weights_dtype",
        "confirmed",
        "compute_budget",
    }
)
# Keys of a dataset that describe it (its published counts, for the estimate) rather than choose what is trained
_DATASET_NOT_IDENTITY = frozenset({"rows", "tokens", "tokens_template"})
_BACKEND_IDENTITY = ("name",)
LOCAL_PREFIXES = ("/", "./", "../", "~")
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]+")
HASH_LEN = 8
# a cell's readable name at most (then "-" and its identity key): short enough for a Slurm job name and, with the
# key, a Hub repository's name (96 characters at most)
SLUG_LEN = 64
# one value's part of a slug at most, where the slug would be longer than SLUG_LEN (_fair)
PART_LEN = 32


_LAYOUTS: dict[tuple[Any, ...], Layout] = {}


def layout_for(spec: CellConf) -> Layout:
    """The cell's layout (planning/gpus.py), chosen once for each distinct set of what it reads."""
    key = (
        fingerprint(spec.model),
        fingerprint(spec.cluster),
        fingerprint(spec.layout),
        spec.backend.name,
        spec.micro_batch_size,
        spec.cutoff_len,
        spec.global_batch_size,
        spec.nodes,
        spec.packing,
        trainable_params(spec, shape_of(spec)),  # finetuning_type (and the adapter's rank) as the model counts it
    )
    hit = _LAYOUTS.get(key)
    if hit is None:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        hit = _LAYOUTS[key] = choose(spec)
    return hit


def is_local(source: str) -> bool:
    """A local path, as opposed to a hub id like ``org/name``."""
    return source.startswith(LOCAL_PREFIXES)


@dataclass(frozen=True)
class Cell:
    """One grid cell: its typed config, as composed, plus what is derived from it."""

    spec: CellConf
    # the Hydra overrides that reproduce this cell (`python -m sft_grid <overrides>`)
    overrides: tuple[str, ...]
    # the resolved config as plain data: what cell.yaml holds
    config: Mapping[str, Any]
    key: str
    slug: str
    runs_root: Path
    # the evaluation suites of a cell into which a grid's `eval` axis merged the cells that differ only in their
    # suite (planning/evaluation.py); empty: the cell's own `eval`
    suites: tuple[Any, ...] = ()
    # the commits staging pinned its Hub model and datasets to (planning/inputs.py: what it then loads); never
    # part of its identity
    pins: tuple[Pin, ...] = ()
    # the tokenized dataset it shares with the cells whose data tokenizes the same (stages/tokenize.py); None: it
    # tokenizes in its own job
    tokenized: TokenizedData | None = None

    @property
    def name(self) -> str:
        return f"{self.slug}-{self.key}"

    @property
    def sweep_dir(self) -> Path:
        return self.runs_root / self.spec.sweep_name

    @property
    def ranks_per_node(self) -> int:
        return self.spec.cluster.gpus_per_node or 1

    @functools.cached_property
    def layout(self) -> Layout:
        """How the cell runs on its GPUs (planning/gpus.py): chosen once per distinct input, shared by its cells."""
        return layout_for(self.spec)

    @property
    def nodes(self) -> int:
        return self.layout.nodes

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def grad_accum(self) -> int:
        """Derived, never set by hand: global batch / (micro batch x data-parallel ranks)."""
        return self.spec.global_batch_size // max(1, self.spec.micro_batch_size * self.world_size)

    @property
    def datasets(self) -> list[str]:
        return list(self.spec.dataset)

    @property
    def resolved(self) -> Mapping[str, Any]:
        """The config with its layout as chosen (nodes, packing and every `auto` of `layout:`): what cell.yaml
        holds, so that the files say how the cell runs and the job, reading them, runs it that way."""
        lay = self.layout
        chosen = {
            "sharding": lay.sharding,
            "offload": lay.offload,
            "checkpointing": lay.checkpointing,
            "attention": lay.attention,
            "liger": lay.liger,
        }
        return {**self.config, "nodes": lay.nodes, "packing": lay.packing, "layout": chosen}


def packed(config: Mapping[str, Any]) -> bool:
    """Whether a cell packs its examples: as it says, else (null) on GPU clusters and off on CPU-only ones."""
    packing = config.get("packing")
    if packing is None:
        return bool((config.get("cluster") or {}).get("gpus_per_node"))
    return bool(packing)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a cell config that determines the trained model."""
    ident = {k: v for k, v in config.items() if k not in NOT_IDENTITY and k not in ("model", "dataset", "backend")}
    model = config["model"]
    ident["model"] = {k: v for k, v in model.items() if k not in _MODEL_NOT_IDENTITY}
    if ident["model"].get("revision") is None:
        ident["model"].pop("revision", None)  # unpinned: the key it had before revisions could be pinned
    if not model.get("hub_id") and model.get("path"):
        # a local checkpoint has no hub id: its directory name stands for it, not the machine's path
        ident["model"]["path"] = Path(str(model["path"])).name
    if packed(config):
        ident["packing"] = True  # several examples a sequence: other batches, another trained model
    ident["backend"] = {k: config["backend"][k] for k in _BACKEND_IDENTITY}
    ident["dataset"] = [
        [
            name,
            {
                **{k: v for k, v in ds.items() if k not in _DATASET_NOT_IDENTITY},
                "source": Path(ds["source"]).name if is_local(ds["source"]) else ds["source"],
            },
        ]
        for name, ds in config["dataset"].items()
    ]
    return ident


def identity_key(config: Mapping[str, Any]) -> str:
    blob = json.dumps(identity(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def slugify(text: str, limit: int = SLUG_LEN) -> str:
    """The one slug function: safe in paths, Slurm job names and hub ids."""
    slug = _SLUG_UNSAFE.sub("-", text).strip("-.")
    return slug[:limit].rstrip("-.") or "cell"


def slug_for(overrides: Sequence[str], config: Mapping[str, Any]) -> str:
    """A readable name from the values this cell sets; the model name when it sets none."""
    parts: list[str] = []
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        top = key.split(".", 1)[0]
        if secret_setting(key.rsplit(".", 1)[-1], value.strip("'\"")):
            continue  # a token is never part of a name (validation refuses the cell: rule secret)
        if top == "vars" and value:  # a row of a sweep file's table (a model) names itself
            parts.append(value.strip("'\""))
            continue
        if top in NOT_IDENTITY or top == "sweep" or not value:
            continue
        value = value.strip("[]'\"").replace(",", "+")
        parts.append(value if key in ("model", "dataset", "backend") else f"{key.rsplit('.', 1)[-1]}{value}")
    return slugify("_".join(_fit([_SLUG_UNSAFE.sub("-", p) for p in parts], SLUG_LEN)) or str(config["model"]["name"]))


def _fit(parts: Sequence[str], limit: int) -> list[str]:
    """The parts, joined by one character each, in `limit`: each long one cut to PART_LEN (`_fair`), then the last
    parts that still do not fit dropped whole. Never a part cut at its end: `examples200` cut to `examples20` would
    name another value of its axis (the cell's key tells cells apart; its cell.yaml has every value)."""
    out = _fair(parts, limit)
    while len(out) > 1 and sum(map(len, out)) + len(out) - 1 > limit:
        out.pop()
    return out


def _fair(parts: Sequence[str], limit: int) -> list[str]:
    """The parts, each longer than PART_LEN cut to it where they do not fit `limit` together (joined by one
    character each), keeping its head and its tail: so one long value (a local checkpoint's path, a list of
    datasets) cannot push the values after it, often the swept one (lr2e-5), out of the name. Parts of a usual
    length are left whole, and the slug is cut at its end as before."""
    if sum(map(len, parts)) + max(0, len(parts) - 1) <= limit:
        return list(parts)
    return [p if len(p) <= PART_LEN else _cut(p, PART_LEN) for p in parts]


def _cut(part: str, width: int) -> str:
    """`part` in `width` characters: its head and its tail joined by "-" (the tail is where a path or a list
    differs most often)."""
    tail = (width - 1) // 2
    head = width - 1 - tail
    return f"{part[:head].rstrip('-._+=')}-{part[-tail:].lstrip('-._+=')}"


def hub_id_for(template: str, config: Mapping[str, Any], key: str, slug: str) -> str:
    """A cell's hub repository from a pattern: {key} (the identity hash), {name} (slug-key), {model} and
    {data} (the dataset names joined by '-'). So each cell of a grid gets its own repository, derived from
    what it trains, and a rerun of the same cell uploads to the same one."""
    fields = {
        "key": key,
        "name": f"{slug}-{key}",
        "model": str(config["model"]["name"]),
        "data": "-".join(config.get("dataset") or ()),
    }
    try:
        return template.format_map(fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"hub_model_id {template!r}: unknown placeholder {exc}; use {{key}}, {{name}}, {{model}} or {{data}}"
        ) from None


def _absolute(value: str, base: Path) -> str:
    """A local path as the jobs must read it: `~` expanded, and a relative one taken from `base` (a job runs in its
    cell's directory, where `./models/tiny` names nothing)."""
    path = os.path.expanduser(value)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


def _keeps_as_written(value: object) -> bool:
    """A path left as written: not a string, empty, a dry run's placeholder (`<VAR>`), or a shell variable (`$HOME`,
    refused by the rule path-shell-variable with the value as the user wrote it)."""
    return not isinstance(value, str) or not value.strip() or resolvers.is_placeholder(value) or "$" in value


def local_paths(config: Mapping[str, Any], base: Path) -> Mapping[str, Any]:
    """The config with its local model directory and local dataset files absolute: `~` expanded and a relative path
    taken from `base` (the team repository's root, else the working directory, as a relative runs_root is), so that
    every folder of the repository plans the same cell and its job finds them. A cell's identity names a local
    input by its file name only (`identity`), so it does not change."""
    model = config.get("model")
    out = dict(config)
    if isinstance(model, Mapping) and not _keeps_as_written(model.get("path")):
        out["model"] = {**model, "path": _absolute(str(model["path"]), base)}
    datasets = config.get("dataset")
    if isinstance(datasets, Mapping):
        sources = {}
        for name, ds in datasets.items():
            source = ds.get("source") if isinstance(ds, Mapping) else None
            local = not _keeps_as_written(source) and is_local(str(source)) and not str(source).startswith("/")
            sources[name] = {**ds, "source": _absolute(str(source), base)} if local else ds
        out["dataset"] = sources
    return out


def plan_cell(overrides: Sequence[str], config: Mapping[str, Any], cwd: Path | None = None) -> Cell:
    config = local_paths(config, cwd or project.runs_base())
    key, slug = identity_key(config), slug_for(overrides, config)
    hub = config.get("hub_model_id")
    if hub and "{" in hub:
        with contextlib.suppress(ValueError):  # left as written: validate reports the pattern (rule hub-id)
            config = {**config, "hub_model_id": hub_id_for(hub, config, key, slug)}
    spec = typed(CellConf, config)
    given = config.get("runs_root") or config["cluster"]["runs_root"]
    # a runs folder read from an unset per-user variable: a dry run renders under the local runs/ (a real run is
    # refused, planning/site_rules.py)
    root = Path(os.path.expanduser("runs" if resolvers.is_placeholder(given) else given))
    if not root.is_absolute():
        root = (cwd or project.runs_base()) / root  # the team's repository's root, wherever in it we run
    return Cell(
        spec=spec,
        overrides=tuple(overrides),
        config=config,
        key=key,
        slug=slug,
        runs_root=root,
    )


def dirs_of(cells: Sequence[Cell]) -> list[Path]:
    """Each cell's directory: an existing one with the same identity, else <runs_root>/<sweep>/<name>."""
    existing: dict[Path, dict[str, Path]] = {}
    dirs = []
    for cell in cells:
        sweep_dir = cell.sweep_dir
        if sweep_dir not in existing:
            existing[sweep_dir] = {p.name.rsplit("-", 1)[-1]: p for p in iter_cell_dirs(sweep_dir)}
        dirs.append(existing[sweep_dir].get(cell.key, sweep_dir / cell.name))
    return dirs
