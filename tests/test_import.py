"""`sft-grid import`: an existing LLaMA-Factory or axolotl training YAML (or the old launcher's command line) becomes a
repository's model, dataset and sweep options, and the imported sweep's dry run renders the original key by key.

Each realistic original (tests/import_samples/, each with its source in a comment) is imported into a temporary
repository (a `git init` folder with conf/ groups), the sweep's dry run is run from there on Leonardo as a user runs
it, and the backend config the dry run rendered is read back from the cell's directory: every key of the original is
equal there, or is in the table of keys the import maps differently (each with why, and what the rendered config holds
instead, checked). The dry runs ask Slurm nothing real: tests/fakeslurm.py's commands are first on PATH (a dry run
asks the cluster's MaxArraySize, and a controller that does not answer costs seconds). Leonardo's per-user variables
name a stand-in site environment: a real virtualenv (no pip: milliseconds) holding an importable stand-in of each
package the grid's checks ask the environment for (the backend, FlashAttention, Liger, wandb), and nothing more. No
backend trains and none is imported.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sft_grid.backends import BACKENDS
from sft_grid.backends import extra as extra_keys
from sft_grid.core.paths import PACKAGE_CONF
from sft_grid.planning import importing
from sft_grid.planning.cells import plan_cell
from sft_grid.planning.compose import GridComposer

from . import fakeslurm
from .conftest import run_sft

pytestmark = pytest.mark.xdist_group("import")  # the module's fixtures import and dry-run each sample once

SAMPLES = Path(__file__).parent / "import_samples"
LF_SAMPLE = "lf_qwen3_8b_32k_zero3.yaml"
AX_SAMPLE = "axolotl_qwen3_4b_fft.yaml"
LAUNCH_SAMPLE = "launch_qwen3_8b.sh"
# a key no backend knows, added to a copy of each original: it must be carried in `extra` and reach the backend
UNKNOWN = {"my_team_callback": {"name": "loss_spike_alert", "window": 50}}
# a Hub token in the LLaMA-Factory original (its own key, ModelArguments.hf_hub_token): never carried into a file
SECRET = {"hf_hub_token": "hf_" + "Xq7" * 12}

# -- the LLaMA-Factory sample's keys that the rendered train_config.yaml holds differently, and why ---------------
LF_MAPPED_DIFFERENTLY = {
    # the sources are sft_grid's dataset options: magpie_pro is the shipped `magpie` (the same Hub id, column and
    # tags: reused), agent_traces a new option; the entries themselves are compared key by key below
    "dataset": "the names of sft_grid's dataset options: magpie,agent_traces",
    "dataset_dir": "the cell's own directory, where sft_grid renders dataset_info.json from the dataset options",
    "output_dir": "each cell trains into its own <runs_root>/<sweep>/<cell>/output",
    "run_name": "the cell's name",
    # the stage and offload are the original's (layout.sharding: zero3, layout.offload: none); the file is sft_grid's
    "deepspeed": "sft_grid's own ds_zero3.json in the cell's directory",
    "overwrite_output_dir": "not rendered: a rerun moves the old output aside (and transformers 5 rejects the key)",
    # the import pins packing: false; LLaMA-Factory's default is off, so sft_grid writes no key for it
    "packing": "not rendered: off is LLaMA-Factory's default",
    "hf_hub_token": "not carried: a secret (the Hub client reads HF_TOKEN from the jobs' environment)",
}
# -- the axolotl sample's keys that the rendered axolotl_config.yaml holds differently, and why --------------------
AX_MAPPED_DIFFERENTLY = {
    # one entry per dataset option, in the original's order, compared field by field below
    "datasets": "rebuilt from the dataset options (a local path made absolute; fields sft_grid adds)",
    "dataset_prepared_path": "the grid's shared tokenized dataset under runs_root/_tokenized (tokenize once)",
    "output_dir": "each cell trains into its own <runs_root>/<sweep>/<cell>/output",
    "deepspeed": "sft_grid's own ds_zero3.json in the cell's directory (stage 3 and no offload, as the original's)",
    # precision is the cluster's: Leonardo trains in bf16, which is what `auto` picks on its A100s
    "bf16": "auto -> true (the cluster's precision)",
    # the layout's fa2 in transformers' words
    "flash_attention": "not rendered: attn_implementation: flash_attention_2",
    # sft_grid's own plugins first (template integrity, output, the loss watchdog), the original's Liger plugin kept
    "plugins": "sft_grid's plugins and the original's",
    "wandb_project": "the grid's name (sweep_name): one W&B run a cell",
    "wandb_name": "the cell's name (null in the original: axolotl's own run name)",
    "resume_from_checkpoint": "not rendered (null in the original): auto_resume_from_checkpoints resumes",
}


# -- helpers ------------------------------------------------------------------------------------------------------


def same(rendered: Any, original: Any) -> bool:
    """Equal as the backend reads them: a number written as text (axolotl's `learning_rate: 1e-5`, which its
    pydantic casts) is that number, and 3 is 3.0; a boolean stays a boolean."""

    def norm(x: Any) -> Any:
        if isinstance(x, bool) or x is None:
            return ("bool", x)
        if isinstance(x, int | float):
            return float(x)
        if isinstance(x, str):
            try:
                return float(x)
            except ValueError:
                return x
        if isinstance(x, dict):
            return {k: norm(v) for k, v in x.items()}
        if isinstance(x, list):
            return [norm(v) for v in x]
        return x

    return bool(norm(rendered) == norm(original))


def holds(rendered: Any, original: Any) -> bool:
    """`same`, where a mapping of the original may be rendered with keys sft_grid adds (a dataset entry's tags)."""
    if isinstance(original, dict) and isinstance(rendered, dict):
        return all(k in rendered and holds(rendered[k], v) for k, v in original.items())
    return same(rendered, original)


def rendered_or_in_table(original: dict[str, Any], rendered: dict[str, Any], table: dict[str, str]) -> None:
    """Every key of the original is in the rendered config, equal, or in the table of keys rendered differently."""
    for key, value in original.items():
        if key not in table:
            assert key in rendered and same(rendered[key], value), (key, value, rendered.get(key))


def make_repo(path: Path) -> Path:
    """A user's experiment repository: a git folder with conf/ groups of its own (empty)."""
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for group in ("cluster", "model", "dataset", "sweep"):
        (path / "conf" / group).mkdir(parents=True)
    return path


def originals(path: Path) -> Path:
    """A copy of the samples, each YAML with the unknown key added (the import reads the copy)."""
    shutil.copytree(SAMPLES, path)
    for name in (LF_SAMPLE, AX_SAMPLE):
        with open(path / name, "a") as handle:
            handle.write(yaml.safe_dump({**UNKNOWN, **(SECRET if name == LF_SAMPLE else {})}, sort_keys=False))
    return path


def site(path: Path) -> dict[str, str]:
    """The environment a dry run on Leonardo gets: its per-user variables (a stand-in site environment for both
    backends) and the fake Slurm commands first on PATH."""
    from sft_grid.checks import venv_facts

    env_dir = path / "site_env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    purelib = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for module in {*venv_facts.MODULES, "llamafactory", "axolotl"}:
        package = Path(purelib) / module
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text('"""A stand-in: importable and nothing more."""\n')
    fakeslurm.install(path / "bin")
    (path / "fake_slurm").mkdir()
    return {
        "PATH": f"{path / 'bin'}:{__import__('os').environ['PATH']}",
        "FAKE_SLURM": str(path / "fake_slurm"),
        "SFT_GRID_LEONARDO_ACCOUNT": "acct",
        "SFT_GRID_LEONARDO_RUNS": str(path / "leonardo_runs"),
        "SFT_GRID_LEONARDO_ENV": str(env_dir),
    }


def sft_import(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_sft("import", *args, cwd=root)


def dry_run(root: Path, sweep: str, env: dict[str, str], *overrides: str, runs: str = "runs") -> Path:
    """The imported sweep's dry run, from the repository, as its header says; the one cell's directory."""
    proc = run_sft(
        "-m", f"+sweep={sweep}", "dry_run=true", f"runs_root={root / runs}", *overrides, cwd=root, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (cell,) = [p for p in (root / runs / sweep).iterdir() if (p / "cell.yaml").is_file()]
    return cell


def tree(conf: Path) -> dict[str, bytes]:
    return {str(p.relative_to(conf)): p.read_bytes() for p in sorted(conf.rglob("*")) if p.is_file()}


def said(proc: subprocess.CompletedProcess[str], label: str) -> str:
    """The text of one kind of the report (`carried in extra`, `set by sft_grid`, ...), its wrapped lines joined."""
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {label}: "))
    out = [lines[start].strip()]
    for line in lines[start + 1 :]:
        if not line.startswith("      "):
            break
        out.append(line.strip())
    return " ".join(out)


class Imported:
    """One original imported into a repository and dry-run there: what each side says."""

    def __init__(self, root: Path, source: Path, proc: subprocess.CompletedProcess[str], sweep: str, cell: Path):
        self.root, self.source, self.proc, self.sweep_name, self.cell = root, source, proc, sweep, cell
        self.original = yaml.safe_load(source.read_text())
        self.sweep = yaml.safe_load((root / "conf" / "sweep" / f"{sweep}.yaml").read_text())

    def rendered(self, name: str) -> Any:
        text = (self.cell / name).read_text()
        return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def lf(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Imported:
    base = tmp_path_factory.mktemp("lf")
    copies, root = originals(base / "originals"), make_repo(base / "repo")
    proc = sft_import(root, str(copies / LF_SAMPLE), "--cluster", "leonardo", "--nodes", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = "lf_qwen3_8b_32k_zero3"
    return Imported(root, copies / LF_SAMPLE, proc, sweep, dry_run(root, sweep, env))


@pytest.fixture(scope="module")
def ax(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Imported:
    base = tmp_path_factory.mktemp("ax")
    copies, root = originals(base / "originals"), make_repo(base / "repo")
    proc = sft_import(root, str(copies / AX_SAMPLE), "--cluster", "leonardo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = "axolotl_qwen3_4b_fft"
    # Leonardo names no axolotl environment of its own (the import says so): the site's, for this dry run
    cell = dry_run(root, sweep, env, f"cluster.backend_venvs.axolotl={env['SFT_GRID_LEONARDO_ENV']}")
    return Imported(root, copies / AX_SAMPLE, proc, sweep, cell)


# -- LLaMA-Factory ----------------------------------------------------------------------------------------------


def test_every_key_of_the_llamafactory_config_is_rendered_or_in_the_table(lf):
    rendered, cell = lf.rendered("train_config.yaml"), lf.cell
    rendered_or_in_table(lf.original, rendered, LF_MAPPED_DIFFERENTLY)
    # what the backend's train_defaults say already is set by sft_grid, never carried in extra (the cell's identity)
    assert {"stage", "do_train"}.isdisjoint(lf.sweep["extra"])
    assert "stage (sft: the backend's train_defaults" in said(lf.proc, "set by sft_grid")
    # what the table says each of its keys is rendered as
    assert rendered["dataset"] == "magpie,agent_traces"
    assert rendered["dataset_dir"] == str(cell)
    assert rendered["output_dir"] == str(cell / "output")
    assert rendered["run_name"] == cell.name
    assert rendered["deepspeed"] == str(cell / "ds_zero3.json")
    zero = lf.rendered("ds_zero3.json")["zero_optimization"]
    original_zero = json.loads((lf.source.parent / lf.original["deepspeed"]).read_text())["zero_optimization"]
    assert zero["stage"] == original_zero["stage"] == 3
    assert "offload_optimizer" not in zero and "offload_param" not in zero and "offload_param" not in original_zero
    assert "overwrite_output_dir" not in rendered
    assert "packing" not in rendered and "neat_packing" not in rendered and lf.original["packing"] is False
    # the accumulation comes out as the original's: 96 = 1 a GPU x 12 x (2 nodes x 4 GPUs)
    assert lf.sweep["global_batch_size"] == 96 and lf.sweep["nodes"] == 2


def test_a_token_in_the_original_is_not_carried_into_any_file(lf):
    """The sweep file is meant for git, the rendered files for anyone who can read the runs folder: the original's
    Hub token goes to neither, and the import says where it should live instead."""
    token = SECRET["hf_hub_token"]
    assert "hf_hub_token" not in lf.sweep.get("extra", {})
    assert "hf_hub_token (a secret: export HF_TOKEN where you run sft-grid" in said(lf.proc, "not carried")
    written = [p for top in (lf.root / "conf", lf.cell) for p in top.rglob("*") if p.is_file()]
    assert written and not [p for p in written if token in p.read_text(errors="replace")]
    assert token not in lf.proc.stdout + lf.proc.stderr


def test_each_llamafactory_dataset_entry_is_rendered_key_by_key(lf):
    """dataset_info.json: each original entry against the rendered entry of its option, in the original's order."""
    info_in = json.loads((lf.source.parent / lf.original["dataset_dir"] / "dataset_info.json").read_text())
    info_out = lf.rendered("dataset_info.json")
    names = lf.original["dataset"].split(",")
    options = lf.rendered("train_config.yaml")["dataset"].split(",")
    assert len(names) == len(options) == 2
    for name, option in zip(names, options, strict=True):
        entry, out = info_in[name], info_out[option]
        for key, value in entry.items():
            if key == "file_name":  # a file of the dataset_dir, named by its absolute path
                assert out["file_name"] == str((lf.source.parent / lf.original["dataset_dir"] / value).resolve())
            else:  # its tags are LLaMA-Factory's defaults where the entry names none (observation, function)
                assert holds(out[key], value), (name, key, value, out.get(key))


def test_the_shipped_options_are_reused_and_said(lf):
    """Qwen/Qwen3-8B is the shipped qwen3_8b and the Magpie source the shipped magpie: no file for either."""
    assert "model Qwen/Qwen3-8B is the shipped option qwen3_8b: reused, no file written" in lf.proc.stdout
    assert "is the shipped option magpie: reused" in lf.proc.stdout
    assert tree(lf.root / "conf").keys() == {"dataset/agent_traces.yaml", f"sweep/{lf.sweep_name}.yaml"}
    assert lf.sweep["defaults"] == [
        {"override /cluster": "leonardo"},
        {"override /backend": "llamafactory"},
        {"override /model": "qwen3_8b"},
        {"override /dataset": ["magpie", "agent_traces"]},
    ]
    # what it assumed for the global batch, and what sft_grid sets itself, each with why
    assert "world size 8 = 2 node(s) x 4 GPU(s)" in said(lf.proc, "assumed")
    decided = said(lf.proc, "set by sft_grid")
    for key in ("output_dir", "overwrite_output_dir", "run_name", "optim", "bf16"):
        assert f"{key} (" in decided, key


def test_unknown_keys_go_to_extra_and_reach_the_rendered_config(lf, ax):
    for imported, config in ((lf, "train_config.yaml"), (ax, "axolotl_config.yaml")):
        extra = imported.sweep["extra"]
        assert extra["my_team_callback"] == UNKNOWN["my_team_callback"]
        assert "my_team_callback" in said(imported.proc, "carried in extra")
        rendered = imported.rendered(config)
        for key, value in extra.items():  # every carried key, as the original has it
            assert same(rendered[key], value) and same(imported.original[key], value), key
    assert {"include_mfu", "ddp_timeout", "save_only_model"} <= lf.sweep["extra"].keys()
    assert {"wandb_entity", "special_tokens", "gradient_checkpointing_kwargs"} <= ax.sweep["extra"].keys()


def test_the_original_layout_is_pinned_where_sft_grid_would_choose_another(lf, env):
    """sft_grid packs GPU cells and picks the sharding and checkpointing that fit; the original trained unpacked with
    ZeRO-3 and checkpointing, so the import pins those. Unpinned, the same sweep renders another layout."""
    assert lf.sweep["packing"] is False
    assert lf.sweep["layout"] == {
        "sharding": "zero3",
        "offload": "none",
        "attention": "fa2",
        "checkpointing": True,
        "liger": True,
    }
    unpinned = ["packing=null", "layout.sharding=auto", "layout.offload=auto", "layout.checkpointing=null"]
    cell = dry_run(lf.root, lf.sweep_name, env, *unpinned, runs="runs_unpinned")
    chosen = yaml.safe_load((cell / "train_config.yaml").read_text())
    assert chosen["packing"] is True and chosen["neat_packing"] is True  # what sft_grid would choose: packed
    assert not lf.original["packing"]


# -- axolotl ----------------------------------------------------------------------------------------------------


def test_every_key_of_the_axolotl_config_is_rendered_or_in_the_table(ax):
    rendered, cell = ax.rendered("axolotl_config.yaml"), ax.cell
    rendered_or_in_table(ax.original, rendered, AX_MAPPED_DIFFERENTLY)
    assert {"trust_remote_code", "val_set_size"}.isdisjoint(ax.sweep["extra"])  # axolotl's train_defaults say them
    assert rendered["dataset_prepared_path"].startswith(str(ax.root / "runs" / "_tokenized"))
    assert rendered["output_dir"] == str(cell / "output")
    assert rendered["deepspeed"] == str(cell / "ds_zero3.json")
    zero = ax.rendered("ds_zero3.json")["zero_optimization"]
    assert zero["stage"] == 3 and "offload_optimizer" not in zero and "offload_param" not in zero
    assert ax.original["bf16"] == "auto" and rendered["bf16"] is True
    assert ax.original["flash_attention"] is True and rendered["attn_implementation"] == "flash_attention_2"
    assert set(ax.original["plugins"]) < set(rendered["plugins"])
    assert rendered["wandb_project"] == ax.sweep_name and rendered["use_wandb"] is True
    assert rendered["wandb_name"] == cell.name and ax.original["wandb_name"] is None
    assert "resume_from_checkpoint" not in rendered and rendered["auto_resume_from_checkpoints"] is True
    # the global batch: 2 a GPU x 4 accumulation x the 4 GPUs of one Leonardo node (said as assumed)
    assert ax.sweep["global_batch_size"] == 32 and "nodes" not in ax.sweep
    assert "global batch 32 = 2 a device x 4 accumulation x 4" in said(ax.proc, "assumed")


def test_each_axolotl_dataset_entry_is_rendered_field_by_field(ax):
    rendered = ax.rendered("axolotl_config.yaml")["datasets"]
    assert len(rendered) == len(ax.original["datasets"]) == 2
    for entry, out in zip(ax.original["datasets"], rendered, strict=True):
        for key, value in entry.items():
            if key == "path" and value.startswith("./"):  # a local file, named by its absolute path
                assert out["path"] == str((ax.source.parent / value).resolve())
            else:
                assert holds(out[key], value), (key, value, out.get(key))


def test_a_new_model_option_says_what_it_read_from_the_name(ax):
    """Qwen3-4B-Base has no shipped option: a new one, its size read from its name and said so, its tokenizer and
    template from the original."""
    model = yaml.safe_load((ax.root / "conf" / "model" / "qwen3_4b_base.yaml").read_text())
    assert model == {
        "name": "qwen3_4b_base",
        "hub_id": "Qwen/Qwen3-4B-Base",
        "path": None,
        "params_b": 4.0,
        "tokenizer_family": "qwen3",
        "template": "qwen3",
        "needs": [],
    }
    text = (ax.root / "conf" / "model" / "qwen3_4b_base.yaml").read_text()
    assert "params_b 4.0 is read from the name" in text
    assert "note: cluster leonardo names no axolotl environment" in ax.proc.stdout
    assert all(len(line) <= 120 for f in (ax.root / "conf").rglob("*.yaml") for line in f.read_text().splitlines())


# -- the old launcher -------------------------------------------------------------------------------------------


def test_the_old_launchers_command_line_imports_with_its_flags_over_its_yaml(tmp_path, env):
    copies, root = originals(tmp_path / "originals"), make_repo(tmp_path / "repo")
    proc = sft_import(root, str(copies / LAUNCH_SAMPLE), "--cluster", "leonardo")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = yaml.safe_load((root / "conf" / "sweep" / "qwen3_8b_agent_sft.yaml").read_text())
    # --job_name names the sweep; --num_nodes is pinned; --global_batch_size and --learning_rate win over the YAML's
    assert sweep["sweep_name"] == "qwen3_8b_agent_sft" and sweep["nodes"] == 2
    assert sweep["global_batch_size"] == 64 and sweep["lr"] == 2.0e-5 and sweep["time"] == "23:59:00"
    decided = said(proc, "set by sft_grid")
    assert "--max_restarts (a cell that hits its time limit is requeued" in decided
    assert "--internet_node (" in decided and "gradient_accumulation_steps (derived from global_batch_size" in decided
    assert "the old launcher wrote its --seed default (42) over the YAML's seed 1234" in said(proc, "assumed")
    cell = dry_run(root, "qwen3_8b_agent_sft", env)
    rendered = yaml.safe_load((cell / "train_config.yaml").read_text())
    assert rendered["learning_rate"] == 2.0e-5 and rendered["gradient_accumulation_steps"] == 64 // (2 * 4 * 1)
    assert rendered["dataset"] == "magpie,agent_traces" and rendered["include_mfu"] is True

    # the same command line given after --, with its paths absolute: the same sweep
    again = make_repo(tmp_path / "again")
    argv = ["python", "-m", "hpc.launch", "--job_name", "qwen3_8b_agent_sft"]
    argv += ["--train_config_path", str(copies / LF_SAMPLE), "--time_limit", "23:59:00", "--num_nodes", "2"]
    argv += ["--gpus_per_node", "4", "--dataset_dir", "lf_data", "--dataset", "magpie_pro,agent_traces"]
    argv += ["--learning_rate", "2.0e-5", "--global_batch_size", "64", "--max_restarts", "2", "--internet_node"]
    proc = sft_import(again, "--cluster", "leonardo", "--", *argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert yaml.safe_load((again / "conf" / "sweep" / "qwen3_8b_agent_sft.yaml").read_text()) == sweep


# -- refusals ---------------------------------------------------------------------------------------------------


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Refused in one line on stderr, nothing on stdout, no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("sft-grid import: ") and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_a_second_import_without_force_refuses_and_writes_nothing(tmp_path):
    copies, root = originals(tmp_path / "originals"), make_repo(tmp_path / "repo")
    assert sft_import(root, str(copies / AX_SAMPLE), "--cluster", "leonardo").returncode == 0
    before = tree(root / "conf")
    refused(
        sft_import(root, str(copies / AX_SAMPLE), "--cluster", "leonardo"),
        "conf/sweep/axolotl_qwen3_4b_fft.yaml",
        "already there; nothing written (--force overwrites",
    )
    assert tree(root / "conf") == before
    # another wording: a new sweep name, but a dataset option of the same name that names another source
    (root / "conf" / "dataset" / "finetome_100k.yaml").write_text("finetome_100k:\n  source: someone/else\n")
    before = tree(root / "conf")
    refused(
        sft_import(root, str(copies / AX_SAMPLE), "--name", "second", "--cluster", "leonardo"),
        "conf/dataset/finetome_100k.yaml already there",
    )
    assert tree(root / "conf") == before
    # --force writes them
    forced = sft_import(root, str(copies / AX_SAMPLE), "--name", "second", "--cluster", "leonardo", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "mlabonne/FineTome-100k" in (root / "conf" / "dataset" / "finetome_100k.yaml").read_text()


# (file, its text or None for no file, what the refusal says): two wordings of each kind of bad input
BAD: dict[str, list[tuple[str, str | None, str]]] = {
    "missing": [("missing.yaml", None, "missing.yaml: no such file"), ("gone/train.yml", None, "no such file")],
    "not YAML": [
        ("broken.yaml", "model_name_or_path: [Qwen/Qwen3-8B\ncutoff_len: 4096\n", "not YAML"),
        ("tabs.yaml", "model_name_or_path: Qwen/Qwen3-8B\n\tcutoff_len: 4096\n", "not YAML"),
    ],
    "neither backend's": [
        ("compose.yaml", "services:\n  web:\n    image: nginx\n", "neither a LLaMA-Factory config"),
        ("hf.yaml", "model: gpt2\nepochs: 3\nbatch_size: 8\n", "neither a LLaMA-Factory config"),
    ],
    "not a training config": [
        ("list.yaml", "- model_name_or_path: Qwen/Qwen3-8B\n", "and this file holds a list: name the training YAML"),
        ("train.sh", "torchrun train.py --lr 2e-5\n", "this file holds plain text: name the training YAML"),
        ("dpo.yaml", "model_name_or_path: Qwen/Qwen3-8B\nstage: dpo\ntemplate: qwen3\n", "stage: dpo"),
    ],
    "a dataset it cannot find": [
        (
            "lf.yaml",
            "model_name_or_path: Qwen/Qwen3-8B\nstage: sft\ntemplate: qwen3\ndataset: my_ds\n",
            "dataset my_ds: no dataset_dir is given to look it up in, and not a Hub id (org/name): give the",
        ),
    ],
}


@pytest.mark.parametrize(
    "file, text, words",
    [case for cases in BAD.values() for case in cases],
    ids=[f"{kind}-{i}" for kind, cases in BAD.items() for i in range(len(cases))],
)
def test_bad_input_is_refused_in_one_line_with_nothing_written(tmp_path, file, text, words):
    root = make_repo(tmp_path / "repo")
    if text is not None:
        (root / file).write_text(text)
    refused(sft_import(root, file), words)
    assert tree(root / "conf") == {}


@pytest.mark.parametrize(
    "out, words",
    [("a_file", "is a file, not a config folder"), (str(PACKAGE_CONF), "the config folder sft_grid ships")],
    ids=["a file", "the shipped configs"],
)
def test_a_config_folder_that_makes_no_sense_is_refused(tmp_path, out, words):
    root = make_repo(tmp_path / "repo")
    (root / "a_file").write_text("")
    copies = originals(tmp_path / "originals")
    refused(sft_import(root, str(copies / AX_SAMPLE), "--out", out), words)
    assert tree(root / "conf") == {}


def test_sft_grids_own_checkout_is_not_taken_for_a_teams_repository(tmp_path):
    """Run in sft_grid's checkout without --out, ./conf would make the tool's checkout look like a team's repository."""
    from sft_grid.core.paths import REPO_ROOT

    assert not (REPO_ROOT / "conf").exists()
    try:
        refused(sft_import(REPO_ROOT, str(originals(tmp_path / "originals") / AX_SAMPLE)), "sft_grid's own checkout")
    finally:
        assert not (REPO_ROOT / "conf").exists()


def test_outside_a_repository_it_writes_to_out_or_conf_here(tmp_path):
    """No sft_grid.yaml and no conf/ above: --out DIR, else ./conf; the next line names the folder for the run."""
    copies, here = originals(tmp_path / "originals"), tmp_path / "plain"
    (here / ".git").mkdir(parents=True)  # a repository's root stops the search for a project
    proc = sft_import(here, str(copies / AX_SAMPLE), "--out", "team_conf")
    assert proc.returncode == 0, proc.stderr
    assert (here / "team_conf" / "sweep" / "axolotl_qwen3_4b_fft.yaml").is_file()
    assert "next: SFT_GRID_CONF=team_conf sft-grid run -m +sweep=axolotl_qwen3_4b_fft dry_run=true" in proc.stdout


# -- what the import never carries --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_no_key_the_renderer_derives_is_ever_carried_in_extra(make_cells, backend):
    """backends/extra.py refuses an `extra` key the renderer writes itself: every key the renderer writes for any
    value of a modelled key (its own probe) is one the import maps or says sft_grid sets (never carried in extra),
    besides the backend's train_defaults, which extra may override."""
    (cell,) = make_cells([f"backend={backend}", "model=tiny_llama"])
    ever, _ = extra_keys._probe(BACKENDS[backend], cell)
    defaults = set(cell.spec.backend.train_defaults)
    kind = importing.LF if backend == "llamafactory" else importing.AX
    assert ever - defaults <= importing.DERIVED[kind], sorted(ever - defaults - importing.DERIVED[kind])


# -- the translation's parts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, kind",
    [
        ({"model_name_or_path": "x/y", "dataset": "a"}, importing.LF),
        ({"base_model": "x/y", "datasets": []}, importing.AX),
        ({"cutoff_len": 8, "stage": "sft", "template": "qwen3"}, importing.LF),
        ({"sequence_len": 8, "micro_batch_size": 1}, importing.AX),
        ({"model": "gpt2", "epochs": 3}, None),
        ({"model_name_or_path": "x/y", "base_model": "x/y"}, None),
    ],
)
def test_which_backends_config_it_is(config, kind):
    assert importing.detect(config) == kind


def test_the_launchers_flags_read_as_its_argparse_read_them():
    argv = ["--num-nodes", "2", "--dataset=a,b", "--internet_node", "--packing", "false", "--dataset", "c"]
    argv += ["--learning_rate", "1e-5", "--bf16"]
    assert importing.launcher_flags(argv) == {
        "num_nodes": 2,
        "dataset": "c",  # given twice: the last one, as argparse kept it
        "internet_node": True,
        "packing": False,
        "learning_rate": 1e-5,
        "bf16": True,
    }
    text = "#!/bin/bash\n# python -m hpc.launch --old\nX=1 python -m hpc.launch \\\n  --job_type sft \\\n  --a 1\n"
    assert importing.launcher_argv(text) == ["--job_type", "sft", "--a", "1"]
    assert importing.launcher_argv("model_name_or_path: x\n") is None


@pytest.mark.parametrize(
    "name, size",
    [("Qwen3-8B", 8.0), ("Qwen3-0.6B", 0.6), ("Qwen3-30B-A3B", 30.0), ("delphi-3e18-447Mparams-1.2Btokens", 0.447)],
)
def test_a_models_size_from_its_name(name, size):
    assert importing.params_from_name(name) == size


def shipped(group: str) -> dict[str, importing.Option]:
    """The shipped options of a group, as the command hands them to the translation (a dataset: its entry)."""
    found = {}
    for path in sorted((PACKAGE_CONF / group).glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        found[path.stem] = importing.Option(path.stem, path, data[path.stem] if group == "dataset" else data, True)
    return found


def translated(tmp_path: Path, text: str, **request: Any) -> importing.Result:
    source = tmp_path / "original.yaml"
    source.write_text(text)
    return importing.translate(
        importing.Request(source, models=shipped("model"), datasets=shipped("dataset"), cwd=tmp_path, **request)
    )


def sweep_of(result: importing.Result) -> dict[str, Any]:
    return dict(yaml.safe_load(result.files[f"sweep/{result.name}.yaml"]))


LF_MINIMAL = "model_name_or_path: Qwen/Qwen3-8B\ntemplate: qwen3\ndataset: allenai/tulu-3-sft-mixture\n"
AX_MINIMAL = (
    "base_model: Qwen/Qwen3-8B\nchat_template: qwen3\n"
    "datasets: [{path: allenai/tulu-3-sft-mixture, type: chat_template}]\n"
)


def cell_keys(conf: Path, runs: Path, monkeypatch: pytest.MonkeyPatch, *grids: list[str]) -> list[str]:
    """Each grid's one cell's identity key, composed as `sft-grid run` composes it, with `conf` searched first."""
    monkeypatch.setenv("SFT_GRID_CONF", str(conf))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(PACKAGE_CONF), version_base=None):
            loader: Any = GlobalHydra.instance().config_loader()  # Hydra's ConfigLoaderImpl, typed as its interface
            composer = GridComposer(loader, "config")
            composed, errors = composer.compose_all([[*grid, f"runs_root={runs}"] for grid in grids])
    finally:
        GlobalHydra.instance().clear()
    assert not errors, [e.message for e in errors]
    return [plan_cell(c.overrides, c.config).key for c in composed]


@pytest.mark.parametrize(
    "original, defaults",
    [(LF_MINIMAL, {"stage": "sft", "do_train": True}), (AX_MINIMAL, {"trust_remote_code": False, "val_set_size": 0})],
    ids=["llamafactory", "axolotl"],
)
def test_a_key_the_backends_train_defaults_say_leaves_the_cells_identity_alone(
    tmp_path, monkeypatch, original, defaults
):
    """`stage: sft` says what every rendered config of the backend holds already (its train_defaults): the import
    says sft_grid sets it, and does not carry it in `extra`, where it would make the imported cell another cell."""
    conf = tmp_path / "conf"
    for name, text in (("without", original), ("with", original + yaml.safe_dump(defaults))):
        result = translated(tmp_path, text, name=name)
        assert defaults.keys().isdisjoint(sweep_of(result).get("extra", {}))
        assert defaults.keys() <= {key for key, _ in result.decided} or name == "without"
        for rel, body in result.files.items():
            (conf / rel).parent.mkdir(parents=True, exist_ok=True)
            (conf / rel).write_text(body)
    # the same keys carried in extra instead: another cell, for nothing
    carried = ["+sweep=with", *(f"++extra.{key}={json.dumps(value)}" for key, value in defaults.items())]
    keys = cell_keys(conf, tmp_path / "runs", monkeypatch, ["+sweep=without"], ["+sweep=with"], carried)
    assert keys[0] == keys[1] != keys[2]


def test_a_deepspeed_file_not_found_here_is_read_from_its_name(tmp_path):
    result = translated(tmp_path, LF_MINIMAL + "deepspeed: examples/deepspeed/ds_z3_offload_config.json\n")
    assert sweep_of(result)["layout"]["sharding"] == "zero3" and sweep_of(result)["layout"]["offload"] == "all"
    assert any("not readable here: ZeRO stage 3 and offload all from its name" in a for a in result.assumed)


def test_absent_keys_are_the_backends_defaults_and_the_world_size_is_said(tmp_path):
    """LLaMA-Factory trains 3 epochs at 5e-5, linear, LoRA, checkpointing on and unpacked when a key is left out; no
    deepspeed is plain data parallel; the Hub dataset is the shipped tulu3 (same source, column and tags)."""
    result = translated(tmp_path, LF_MINIMAL, gpus_per_node=8)
    sweep = sweep_of(result)
    assert (sweep["epochs"], sweep["lr"], sweep["scheduler"], sweep["finetuning_type"]) == (3.0, 5e-5, "linear", "lora")
    assert sweep["layout"]["checkpointing"] is True and sweep["packing"] is False
    assert sweep["layout"]["sharding"] == "none" and sweep["micro_batch_size"] == 8
    assert sweep["global_batch_size"] == 64 and "nodes" not in sweep  # 8 a device x 1 x (1 node x 8 GPUs)
    assert result.datasets == ["tulu3"] and result.model == "qwen3_8b" and list(result.files) == ["sweep/original.yaml"]


def test_the_shipped_model_under_another_template_is_a_new_option_with_its_facts(tmp_path):
    result = translated(tmp_path, LF_MINIMAL.replace("template: qwen3", "template: qwen3_nothink"))
    model = yaml.safe_load(result.files["model/qwen3_8b_qwen3_nothink.yaml"])
    ours = yaml.safe_load((PACKAGE_CONF / "model" / "qwen3_8b.yaml").read_text())
    assert model == {**ours, "name": "qwen3_8b_qwen3_nothink", "template": "qwen3_nothink"}


def test_the_launchers_mix_and_schema_flags_become_the_mix_and_the_datasets_tags(tmp_path):
    (tmp_path / "base.yaml").write_text(LF_MINIMAL)
    argv = ("--train_config_path", str(tmp_path / "base.yaml"), "--dataset", "org/a,org/b")
    argv += ("--mix_strategy", "interleave_under", "--interleave_probs", "0.9,0.1", "--messages", "conversation")
    argv += ("--role_tag", "role", "--content_tag", "content", "--user_tag", "user", "--assistant_tag", "assistant")
    result = importing.translate(importing.Request(None, argv=argv, cwd=tmp_path))
    assert sweep_of(result)["mix"] == {"strategy": "interleave_under", "probs": [0.9, 0.1]}
    entry = yaml.safe_load(result.files["dataset/org_a.yaml"])["org_a"]
    assert entry["messages"] == "conversation" and entry["tags"]["role_tag"] == "role"


@pytest.mark.parametrize(
    "text, words",
    [
        (LF_MINIMAL + "template_x: 1\nlr_scheduler_type: cosine_with_min_lr\n", "sft_grid's scheduler is one of"),
        (LF_MINIMAL.replace("template: qwen3", "template: mistral"), "template: mistral: sft_grid knows"),
        ("base_model: Qwen/Qwen3-8B\ndatasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n", "type alpaca"),
        ("base_model: Qwen/Qwen3-8B\nadapter: qlora\nload_in_4bit: true\ndatasets: []\n", "adapter: qlora"),
        ("base_model: Qwen/Qwen3-8B\nfsdp: [full_shard]\ndatasets: []\n", "never FSDP"),
    ],
)
def test_what_sft_grid_cannot_train_as_the_original_is_refused(tmp_path, text, words):
    with pytest.raises(importing.Refused, match=words):
        translated(tmp_path, text)
