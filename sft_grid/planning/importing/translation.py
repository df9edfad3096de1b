"""One original being translated, the part both backends' configs share: what is consumed, what the sweep says
with where each value came from, the problems found, and the report. The steps run in one order (the model, the
datasets, the batch, the hyperparameters, the layout, reporting, the site, the rest), each taking the keys it reads;
a backend's own keys are read by its subclass (llamafactory_yaml.py, axolotl_yaml.py), and every key no step took
is sft_grid's to set or carried in `extra` (`rest`)."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sft_grid.core.problems import Problem
from sft_grid.core.schema import MIX_STRATEGIES, REPORT_TO, CellConf, field_shapes, typed
from sft_grid.core.secrets import secret_setting
from sft_grid.core.templates import TOKENIZER_FAMILIES
from sft_grid.planning.importing import option_files
from sft_grid.planning.importing.backend_keys import (
    DECIDED,
    DERIVED,
    FLOATS,
    INTS,
    same_value,
    train_defaults,
)
from sft_grid.planning.importing.old_launcher import LAUNCHER_ONLY
from sft_grid.planning.importing.option_files import params_from_name, tokenizer_family, where
from sft_grid.planning.importing.terms import TITLE, Option, Original, Refused, Request, Result


def number(value: Any, kind: type) -> Any:
    """A number given as text (`2e-5`) as the number; anything else as it is (the schema's check then says)."""
    if isinstance(value, str):
        try:
            return kind(float(value)) if kind is int and float(value).is_integer() else kind(value)
        except ValueError:
            return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def counts(*values: Any) -> bool:
    """Whole numbers of at least 1, each (what a batch is computed from; the schema says what is wrong with one)."""
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)


# a backend key that holds a secret -> the environment variable its tool reads instead
SECRET_VARS = {"hub_token": "HF_TOKEN", "hf_hub_token": "HF_TOKEN", "wandb_api_key": "WANDB_API_KEY"}


class Translation(ABC):
    """One original being translated: what is consumed, what the sweep says, and the report."""

    model_key: ClassVar[str]  # the key that names the model
    revision_key: ClassVar[str]  # ... and its revision
    micro_key: ClassVar[str]  # the per-device batch
    micro_default: ClassVar[int]  # ... where the original leaves it out
    scalar_keys: ClassVar[dict[str, tuple[str, Any]]]  # the hyperparameters (backend_keys.py)
    packing_key: ClassVar[str]

    def __init__(self, request: Request, original: Original) -> None:
        self.req, self.orig, self.kind = request, original, original.kind
        self.config = original.config
        self.done: set[str] = set()
        self.sweep: dict[str, Any] = {}
        self.comments: dict[str, str] = {}
        self.sources: dict[str, str] = {}  # a sweep key -> the original's key (or flag) its value came from
        self.problems: list[str] = []
        # --name as given (the caller checked it: a name a cell takes); the file's or the job's, made one
        name = request.name or option_files.snake(original.job_name or original.file_stem)
        self.result = Result(self.kind, original.what, name)

    # -- helpers --

    def find(self, value: str) -> tuple[Path | None, list[Path]]:
        """A path the original names, as its backend would find it, and where it was looked for: an absolute one as
        it is; a relative one from the original's folder (the launcher's script's too), then from here."""
        path = Path(value).expanduser()
        if path.is_absolute():
            tried = [path]
        else:
            folders = [self.orig.base, *([self.orig.script.parent] if self.orig.script else []), self.req.cwd]
            tried = list(dict.fromkeys(folder / path for folder in folders))
        return next((p.resolve() for p in tried if p.exists()), None), tried

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        """A mapping the original gives (a dataset's tags, columns, roles); anything else is a problem, said."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{where}: {value!r}: a mapping")
            return {}
        return dict(value)

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def take(self, key: str) -> Any:
        """The original's value of a key, marked as consumed (None: absent, or null)."""
        self.done.add(key)
        return self.config.get(key)

    def set(self, key: str, value: Any, note: str, source: str | None = None) -> None:
        """A sweep key (dotted for a section: layout.sharding), with where it came from (`source`: the original's
        key or flag, where the value is the original's: what a problem with it names)."""
        target = self.sweep
        *parents, last = key.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[last] = value
        self.comments[key] = note
        if source is not None:
            self.sources[key] = source

    def get(self, key: str) -> Any:
        """The sweep's value of a (dotted) key."""
        value: Any = self.sweep
        for part in key.split("."):
            value = value[part]
        return value

    def decide(self, key: str, why: str | None = None) -> None:
        self.done.add(key)
        self.result.decided.append((key, why or DECIDED.get(key, "sft_grid writes it for every cell itself")))

    def drop(self, key: str, why: str) -> None:
        self.done.add(key)
        self.result.not_carried.append((key, why))

    def mapped(self, key: str, to: str) -> None:
        self.result.mapped.append(f"{key} -> {to}")

    # -- the parts --

    def run(self) -> Result:
        self.refuse_other_training()
        self.model()
        self.datasets()
        self.batch()
        self.scalars()
        self.layout()
        self.report_to()
        self.hub()
        self.site()
        self.rest()
        self.check_schema()
        if len(self.problems) == 1:
            raise Refused(f"cannot import, nothing written: {self.problems[0]}")
        if self.problems:
            said = "".join(f"\n  - {p}" for p in self.problems)
            raise Refused(f"cannot import, nothing written: {len(self.problems)} problems{said}")
        text = option_files.sweep_text(self.result, self.sweep, self.comments, self.req.cluster)
        self.result.files[f"sweep/{self.result.name}.yaml"] = text
        return self.result

    def check_schema(self) -> None:
        """Every value the sweep carries, held to the rules `sft-grid run` holds it to, each problem said with the
        original's key: its type, as Hydra merges the sweep onto the schema (OmegaConf), then its range or value set
        (planning/schema_rules.py, read from the schema's fields). A value no other step refused is checked here."""
        from sft_grid.planning import schema_rules  # it reads planning/hydra_errors.py, which imports Hydra
        from sft_grid.planning.hydra_errors import type_words

        cfg = OmegaConf.structured(CellConf)
        sections = {name: held for name, how, held, _ in field_shapes(CellConf) if how == "dataclass"}
        wrong_type: set[str] = set()
        for key in self.comments:
            top = key.split(".")[0]
            if top in sections and OmegaConf.is_missing(cfg, top):  # cluster: a section no sweep key gives
                cfg[top] = OmegaConf.structured(sections[top])
            value = self.get(key)
            try:
                OmegaConf.update(cfg, key, value, merge=True)
            except OmegaConfBaseException as exc:
                wrong_type.add(key)
                kind = type_words(str(exc)) or "another type"
                self.schema_problem(key, value, f"takes {kind}", f"set {{source}} to {kind.split(' (')[0]}")
        data = OmegaConf.to_container(cfg, throw_on_missing=False)
        assert isinstance(data, dict)
        spec = typed(CellConf, {str(k): v for k, v in data.items() if v != "???"})
        for problem in schema_rules.values("import", spec):
            if problem.key in self.comments and problem.key not in wrong_type:
                self.schema_problem(problem.key, self.get(problem.key), *self.schema_words(problem))

    @staticmethod
    def schema_words(problem: Problem) -> tuple[str, str]:
        """What the schema's rule says of a value, and its fix, in words about the original's key ({source})."""
        if problem.rule == "choice":
            return f"is {problem.fix.removeprefix('use ')}", "set {source} to one of them"
        fix = problem.fix.replace(f"set {problem.key} ", "set {source} ", 1)
        return problem.message, fix

    def schema_problem(self, key: str, value: Any, what: str, fix: str) -> None:
        source = self.sources.get(key, key)
        shown = self.config.get(source, value) if source in self.config else value
        if source in self.orig.flags:  # the old launcher's command line gave it
            source = f"--{source}"
        self.problems.append(
            f"{source}: {option_files.flow(shown)}: sft_grid's {key} {what}; fix: {fix.replace('{source}', source)}"
        )

    @abstractmethod
    def refuse_other_training(self) -> None:
        """`Refused` for an original that trains something other than SFT (a preference stage, RL)."""

    @abstractmethod
    def template(self, model: str) -> str | None:
        """sft_grid's template for the original's, or None with the problem said."""

    @abstractmethod
    def dataset_entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each source the original trains on, with its label and its entry as a DatasetConf's keys."""

    def dataset_stem(self, label: str) -> str:
        """What a new dataset option is named after: the source's label."""
        return label

    @abstractmethod
    def attention(self) -> None:
        """layout.attention from the original's attention kernel, where it names one."""

    @abstractmethod
    def checkpointing(self) -> None:
        """layout.checkpointing, pinned: the original's, else the backend's default."""

    @abstractmethod
    def liger(self) -> None:
        """layout.liger, pinned: on where the original turns Liger's kernels on."""

    @abstractmethod
    def report_to(self) -> None:
        """report_to (and the trainer's own push) from the original's reporting keys."""

    # -- the model --

    def model(self) -> None:
        key = self.model_key
        model = self.take(key)
        if not isinstance(model, str) or not model.strip():
            self.problems.append(f"{key}: the model is not named")
            return
        template = self.template(model)
        if template is None:
            return
        revision = self.take(self.revision_key)
        found, tried = self.find(model)
        local = model.startswith(("/", "./", "../", "~")) or (found is not None and found.is_dir())
        path = str(found or tried[0].resolve()) if local else None
        option = option_files.same_model(self.req.models, model, path, template, revision)
        if option is not None:
            self.result.model = option.name
            self.result.reused.append(f"model {model} is {where(option)} {option.name}: reused, no file written")
            self.mapped(key, f"model={option.name}")
            return
        like = None if local else option_files.similar_model(self.req.models, model)
        self.new_model(model, path, template, revision, like)

    def new_model(self, model: str, path: str | None, template: str, revision: Any, like: Option | None) -> None:
        key = self.model_key
        name = option_files.model_name(model, template, like, self.req.models, self.result.name)
        data: dict[str, Any] = {"name": name, "hub_id": None if path else model, "path": path}
        if revision is not None:
            data["revision"] = str(revision)
        notes: list[str] = []
        if like is not None:
            # the same checkpoint under another template: its facts are the option's
            data.update(option_files.model_facts(like))
            notes.append(f"the facts of {like.name} ({like.path.name}), with the original's template {template}")
        else:
            size = self.req.params_b or params_from_name(Path(model).name)
            family = self.req.tokenizer_family or tokenizer_family(model, template)
            if size is None:
                self.problems.append(f"{key}: {model}: its name gives no size; give it (--params-b 8.2)")
            if family is None:
                known = ", ".join(TOKENIZER_FAMILIES)
                self.problems.append(
                    f"{key}: {model}: which tokenizer it carries is not clear ({known}): give it (--tokenizer-family)"
                )
            data.update({"params_b": size, "tokenizer_family": family})
            if self.req.params_b is None:
                notes.append(f"params_b {size} is read from the name: check it against the model card")
            notes.append(
                "its shape (num_layers, hidden_size, num_heads, num_kv_heads, intermediate_size, vocab_size) from"
                " the model's config.json lets sft_grid model its GPU memory"
            )
        data["template"] = template
        data.setdefault("needs", [])
        self.result.model = name
        self.mapped(key, f"model={name}")
        self.result.files[f"model/{name}.yaml"] = option_files.model_text(name, model, data, notes, self.orig.what)

    # -- the datasets --

    def datasets(self) -> None:
        before = len(self.problems)
        entries = list(self.dataset_entries())
        if not entries and len(self.problems) == before:  # none named (a source that is not one is said already)
            self.problems.append("no dataset: the original names none (dataset: or datasets:)")
        self.result.datasets = [self.dataset_option(label, entry) for label, entry in entries]
        self.mix(len(self.result.datasets))

    def dataset_option(self, label: str, entry: dict[str, Any]) -> str:
        """The option for one source: an existing one that says the same (reused), else a new file."""
        option = option_files.same_dataset(self.req.datasets, entry)
        if option is not None:
            self.result.reused.append(f"dataset {label} ({entry['source']}) is {where(option)} {option.name}: reused")
            return option.name
        files = self.result.files
        name = option_files.dataset_name(self.dataset_stem(label), self.req.datasets, files, self.result.name)
        files[f"dataset/{name}.yaml"] = option_files.dataset_text(name, entry, self.orig.what)
        return name

    def mix(self, count: int) -> None:
        strategy = self.take("mix_strategy")
        probs = self.take("interleave_probs")
        if strategy in (None, "concat"):
            if strategy is not None:
                self.mapped("mix_strategy", "mix.strategy (concat, the default)")
            return
        if strategy not in MIX_STRATEGIES:
            self.problems.append(f"mix_strategy: {strategy}: sft_grid mixes by {', '.join(MIX_STRATEGIES)}")
            return
        given = probs.split(",") if isinstance(probs, str) else probs if isinstance(probs, list) else [probs]
        values = [number(p.strip() if isinstance(p, str) else p, float) for p in given if p is not None]
        if len(values) != count:
            self.problems.append(f"interleave_probs: {probs}: one probability per dataset ({count})")
        self.set("mix.strategy", strategy, "mix_strategy", "mix_strategy")
        self.set("mix.probs", values, "interleave_probs", "interleave_probs")
        self.mapped("mix_strategy, interleave_probs", "mix.strategy, mix.probs")

    # -- the batch --

    def batch(self) -> None:
        """The global batch: the original's (the launcher's global_batch_size), else per device x accumulation x
        the world size, whose parts are the original's, the caller's, or one node of one GPU, as the report says."""
        micro_key = self.micro_key
        micro = number(self.take(micro_key), int)
        if micro is None:
            micro = self.micro_default
            self.result.assumed.append(f"{micro_key} not set: {TITLE[self.kind]}'s default, {micro}")
        said_accum = self.config.get("gradient_accumulation_steps") is not None
        accum = number(self.take("gradient_accumulation_steps"), int)
        accum = 1 if accum is None else accum
        gbs = number(self.config.get("global_batch_size"), int)
        self.done.add("global_batch_size")
        nodes = self.orig.nodes or self.req.nodes
        if nodes is not None:
            said = "--num_nodes" if self.orig.nodes else "--nodes"
            self.set("nodes", nodes, f"{said}: pinned, so the accumulation comes out as the original's", said)
        self.set("micro_batch_size", micro, micro_key, micro_key)
        self.mapped(micro_key, "micro_batch_size")
        if gbs is not None:
            self.set("global_batch_size", gbs, "global_batch_size (the old launcher's key)", "global_batch_size")
        elif not counts(accum):  # no schema key holds it: sft_grid derives the accumulation
            self.problems.append(
                f"gradient_accumulation_steps: {option_files.flow(accum)}: a whole number of at least 1; fix: set"
                " gradient_accumulation_steps to one (1: no accumulation)"
            )
        if not counts(micro, accum if gbs is None else 1, gbs if gbs is not None else 1):
            return  # the batch cannot be computed: the schema's check (check_schema) says what is wrong with a part
        gpus, gpus_said = self.gpus_per_node()
        world = (nodes or 1) * gpus
        world_said = f"{nodes or 1} node(s){'' if nodes else ' (assumed)'} x {gpus} GPU(s) ({gpus_said})"
        if gbs is not None:
            self.mapped("global_batch_size", "global_batch_size")
            if said_accum:
                self.decide(
                    "gradient_accumulation_steps",
                    "derived from global_batch_size / (micro batch x world size), as the old launcher derived it",
                )
            return
        gbs = micro * accum * world
        self.set(
            "global_batch_size",
            gbs,
            f"{micro_key} {micro} x gradient_accumulation_steps {accum} x world size {world}",
        )
        self.mapped("gradient_accumulation_steps", "global_batch_size (sft_grid derives the accumulation)")
        self.result.assumed.append(
            f"world size {world} = {world_said}: global batch {gbs} = {micro} a device x {accum} accumulation"
            f" x {world}" + ("" if nodes else "; sft_grid chooses the nodes, and the accumulation follows")
        )

    def gpus_per_node(self) -> tuple[int, str]:
        if self.orig.gpus_per_node:
            return self.orig.gpus_per_node, "--gpus_per_node"
        if self.req.gpus_per_node:
            return self.req.gpus_per_node, "--gpus-per-node"
        if self.req.cluster and self.req.cluster_gpus is not None:
            return max(1, self.req.cluster_gpus), f"cluster {self.req.cluster}"
        return 1, "assumed: no --cluster or --gpus-per-node given"

    # -- the hyperparameters --

    def scalars(self) -> None:
        for key, (cell_key, default) in self.scalar_keys.items():
            value = self.take(key)
            if value is None:
                if default is None:
                    if cell_key in ("lr", "cutoff_len", "logging_steps", "save_steps"):
                        self.result.assumed.append(f"{key} not set: sft_grid's default {cell_key}")
                    continue
                value = default
                note = f"{key} not set: {TITLE[self.kind]}'s default"
            else:
                note = key
                self.mapped(key, cell_key)
            if cell_key in FLOATS:
                value = number(value, float)
            elif cell_key in INTS:
                value = number(value, int)
            if cell_key == "max_steps" and isinstance(value, int) and value <= 0:
                continue
            # its type, range or value set: the schema's check (check_schema), as `sft-grid run` would
            self.set(cell_key, value, note, key if note == key else None)

    # -- the layout: the original's choices pinned, an absent key pinned to the backend's default --

    def layout(self) -> None:
        self.deepspeed()
        self.attention()
        self.checkpointing()
        self.packing()
        self.liger()

    def deepspeed(self) -> None:
        value = self.take("deepspeed")
        if not value:
            if self.orig.launched:
                # the old launcher ran a config without deepspeed as FSDP through accelerate
                self.result.assumed.append("no deepspeed: the old launcher ran FSDP; sft_grid chooses a ZeRO sharding")
                return
            self.set("layout.sharding", "none", "no deepspeed: plain data parallel, pinned")
            self.set("layout.offload", "none", "no deepspeed: nothing offloaded")
            self.result.assumed.append("no deepspeed: the original trained plain data parallel (layout.sharding=none)")
            return
        stage, offload, how = self.zero(str(value))
        sharding = {0: "none", 1: "zero2", 2: "zero2", 3: "zero3"}.get(stage, "zero3")
        if stage == 1:
            self.result.assumed.append("ZeRO-1 is not one of sft_grid's shardings: the nearest, zero2")
        self.set("layout.sharding", sharding, f"deepspeed: {Path(str(value)).name}: ZeRO stage {stage} ({how})")
        self.set("layout.offload", offload, "its offload_optimizer / offload_param")
        self.mapped("deepspeed", f"layout.sharding={sharding}, layout.offload={offload}")
        self.result.decided.append(
            ("deepspeed (the file)", f"sft_grid writes the cell's own ds_{sharding}.json (stage and offload kept)")
        )

    def zero(self, value: str) -> tuple[int, str, str]:
        """(ZeRO stage, the offload, how it was read) of a DeepSpeed JSON: read where it is found, else from its
        name."""
        path = Path(value)
        _, tried = self.find(value)
        for p in tried:
            if not p.is_file():
                continue
            try:
                data = json.loads(p.read_text())
                zero = data.get("zero_optimization") or {}
                stage = int(zero.get("stage", 0))
            except (OSError, ValueError, TypeError, AttributeError):
                break
            param = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
            optim = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
            offload = "all" if param else "optimizer" if optim else "none"
            if param and not optim:
                self.result.assumed.append("the parameters offloaded without the optimizer: sft_grid offloads both")
            return stage, offload, "read from the file"
        low = path.name.lower()
        match = re.search(r"(?:zero|z|stage)[_-]?([0-3])", low)
        stage = int(match.group(1)) if match else 3
        offload = "none"
        if "offload" in low:
            offload = "optimizer" if "optim" in low else "all"
        self.result.assumed.append(
            f"deepspeed {value} is not readable here: ZeRO stage {stage} and offload {offload} from its name"
        )
        return stage, offload, "from its name"

    def packing(self) -> None:
        key = self.packing_key
        value = self.take(key)
        on = bool(value)
        self.set("packing", on, key if value is not None else f"{key} not set: {TITLE[self.kind]} does not pack")
        if value is not None:
            self.mapped(key, f"packing={str(on).lower()}")

    # -- reporting, the Hub, the site, precision --

    def report(self, value: Any) -> str:
        """The one reporter sft_grid's report_to names for the original's (a list, or text with commas)."""
        values = value if isinstance(value, list) else [v.strip() for v in str(value).split(",")]
        known = [v for v in values if v in REPORT_TO and v != "none"]
        if len(known) > 1 or (values and not known and values != ["none"]):
            self.result.assumed.append(f"report_to {value}: sft_grid reports to one of {', '.join(REPORT_TO)}")
        return known[0] if known else "none"

    def hub(self) -> None:
        hub = self.take("hub_model_id")
        if hub is not None:
            self.set("hub_model_id", str(hub), "hub_model_id: the cell's upload stage pushes there", "hub_model_id")
            self.mapped("hub_model_id", "hub_model_id (the upload stage's repository)")

    def site(self) -> None:
        if self.orig.launched:
            seed = self.config.get("seed")
            if seed is not None and "seed" not in self.orig.flags:
                self.result.assumed.append(
                    f"the old launcher wrote its --seed default (42) over the YAML's seed {seed}; the import keeps"
                    f" {seed} (seed: 42 in the sweep trains as the launcher did)"
                )
        if self.orig.time:
            self.set("time", self.orig.time, "--time_limit", "--time_limit")
            self.mapped("--time_limit", "time")
        for key, value in self.orig.launcher.items():
            if key == "reservation":
                self.set("cluster.sbatch_extra.reservation", value, "--reservation", "--reservation")
                self.mapped("--reservation", "cluster.sbatch_extra.reservation")
            else:
                self.result.decided.append((f"--{key}", LAUNCHER_ONLY[key]))
        if self.orig.gpus_per_node and self.req.cluster_gpus not in (None, self.orig.gpus_per_node):
            self.set("cluster.gpus_per_node", self.orig.gpus_per_node, "--gpus_per_node", "--gpus_per_node")
        if self.orig.job_name:
            self.mapped("--job_name", f"sweep_name={self.result.name}")
        for key in ("bf16", "fp16", "bfloat16", "tf32"):
            if key in self.config:
                self.done.add(key)
                self.result.decided.append((key, DECIDED[key]))

    def rest(self) -> None:
        """Every key not read above: sft_grid's own (said why), or carried in extra as it is. A key that says what
        the backend's train_defaults say is sft_grid's too: every rendered config holds it already, and in `extra`
        it would make the cell another cell (extra is part of its identity) for nothing."""
        derived = DERIVED[self.kind]
        defaults = train_defaults(self.kind, self.req.cwd)
        extra: dict[str, Any] = {}
        for key, value in self.config.items():
            if key in self.done:
                continue
            if secret_setting(key, value):  # a sweep file is committed to git: a token never goes in it
                var = SECRET_VARS.get(key.lower())
                told = f"export {var}" if var else "export it as its tool's variable (HF_TOKEN, WANDB_API_KEY)"
                self.drop(key, f"a secret: {told} where you run sft-grid; the jobs inherit it")
            elif key in derived or key in DECIDED:
                self.decide(key)
            elif key in defaults and same_value(defaults[key], value):
                said = option_files.flow(value)
                self.decide(key, f"{said}: the backend's train_defaults, written for every {TITLE[self.kind]} cell")
            else:
                extra[key] = value
        if extra:
            self.sweep["extra"] = extra
            self.result.extra = list(extra)
