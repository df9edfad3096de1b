"""An existing training config as sft_grid's options: `sft-grid import FILE` (sft_grid/cli/cmd_import.py prints).

A team arrives with LLaMA-Factory or axolotl YAMLs, or with command lines of its old launcher (`python -m
hpc.launch --train_config_path X.yaml --num_nodes 2 ...`: OpenThoughts-Agent's hpc/launch.py). `translate` reads
one and says what it amounts to in sft_grid's terms: a model option (or the option that already names its hub id),
a dataset option per source (or the option that already names it), and a sweep file with the hyperparameters, the
layout the original chose and everything else. Every key of the original lands in exactly one place, and the
report says which:

- mapped: a key sft_grid models (learning_rate -> lr), written to the sweep, the model or a dataset option;
- carried in `extra`: a backend key sft_grid does not model, passed to the backend as it is (never one the
  backend's renderer derives itself: backends/extra.py refuses those, and backend_keys.py's DERIVED tables list
  them);
- set by sft_grid: a key sft_grid decides for every cell (output_dir, run_name, the DeepSpeed file, ...), with why,
  and a key that says what the backend's `train_defaults` say already (`stage: sft`), which in `extra` would be
  part of the cell's identity for nothing;
- not carried: what no option of sft_grid can say (a dataset's tools column, axolotl's LoRA rank), with why.

Where sft_grid would choose a value itself (the sharding, offload, checkpointing, packing, Liger) and the original
chose one, the original's choice is pinned (`layout.sharding: zero3`), and an absent key is pinned to the backend's
own default (LLaMA-Factory checkpoints by default, neither backend packs), so the imported cell trains as the
original did. The global batch is per-device batch x accumulation x the world size; the world size is the
original's where it says one (the launcher's --num_nodes/--gpus_per_node), else what the caller gives (--nodes,
--gpus-per-node, the cluster's GPUs per node), else one node of one GPU, and the report says which.

Pure: it reads the original and the files it names (the launcher's base YAML, dataset_info.json, the DeepSpeed
JSON) and the backend's option, and returns the files to write as text; it writes and prints nothing. Input it
cannot take raises `Refused` before anything is written, with every problem of the original at once: each value the
sweep carries is held to the schema's rules, as `sft-grid run` holds a cell (translation.py `check_schema`).

- `terms`: the request, the original, the result and the refusal;
- `original`: a training YAML read, and which backend wrote it;
- `old_launcher`: the old launcher's command line, its flags over its base YAML;
- `translation`: the steps both backends share (the model, the batch, the hyperparameters, DeepSpeed, the site,
  and the rest: set by sft_grid or carried in `extra`);
- `llamafactory_yaml`, `axolotl_yaml`: each backend's own keys (its template, its datasets, its layout keys);
- `backend_keys`: where each backend key goes (derived by the renderer, decided, modelled, the backend's defaults);
- `option_files`: the options reused or written (an existing model or dataset option that says the same), as text.
"""

from __future__ import annotations

from sft_grid.planning.importing.axolotl_yaml import AxolotlYaml
from sft_grid.planning.importing.backend_keys import DERIVED
from sft_grid.planning.importing.llamafactory_yaml import LlamaFactoryYaml
from sft_grid.planning.importing.old_launcher import from_launcher, launcher_argv, launcher_flags
from sft_grid.planning.importing.option_files import params_from_name, tokenizer_family
from sft_grid.planning.importing.original import detect, from_yaml, read_text
from sft_grid.planning.importing.terms import AX, LF, Option, Original, Refused, Request, Result
from sft_grid.planning.importing.translation import Translation

__all__ = [
    "AX",
    "DERIVED",
    "LF",
    "Option",
    "Original",
    "Refused",
    "Request",
    "Result",
    "detect",
    "launcher_argv",
    "launcher_flags",
    "params_from_name",
    "read",
    "tokenizer_family",
    "translate",
]

TRANSLATIONS: dict[str, type[Translation]] = {LF: LlamaFactoryYaml, AX: AxolotlYaml}


def read(request: Request) -> Original:
    """The original, as one backend config; `Refused` for a file that is missing, not YAML, or neither backend's."""
    if request.argv:
        return from_launcher(list(request.argv), request.cwd, None)
    path = request.source
    if path is None:
        raise Refused("nothing to import: give a YAML file, or the old launcher's command line after --")
    text = read_text(path)
    argv = launcher_argv(text)
    if argv is not None:
        return from_launcher(argv, path.parent, path)
    return from_yaml(path, text)


def translate(request: Request) -> Result:
    """The original as sft_grid's options and the report of where each key went; `Refused` (every problem at
    once) for input it cannot take."""
    original = read(request)
    return TRANSLATIONS[original.kind](request, original).run()
