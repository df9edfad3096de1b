"""Bad input a new user types is refused before anything is written, naming the cell, the key, the value and the
fix: a misspelled key added with `+`, every out-of-range number and every value outside a key's fixed set (the
whole schema, read from its metadata), a model with no source, a local dataset that is not data, a dataset
listed twice, an axis that sweeps nothing, an override Hydra's grammar refuses.

The second round, by class, each input read as what it is: a config file that is not YAML (file, line,
column, one line); paths that cannot hold the cells (too long, a file, a symlink loop); a model directory that
cannot load (no config, config not JSON, no weights, a missing shard, a vocabulary smaller than its tokenizer);
a data file whose split, encoding or line is wrong; numbers that are not finite or a zero wall time; two cells
writing to one place; an `extra` key sft_grid derives; an integration the backend's environment lacks; a variable
set but empty. Each is refused with nothing written."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sft_grid.checks.preflight import preflight
from sft_grid.core import schema
from sft_grid.core.schema import Range
from sft_grid.planning.validate import validate

from .conftest import run_sft


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, f"not one {rule} problem in {[p.render() for p in problems]}"
    return found[0]


@pytest.mark.parametrize(
    "override, key, close",
    [
        ("+lrr=1e-5", "lrr", "lr"),
        ("+mix.stratgy=interleave_under", "mix.stratgy", "strategy"),
        ("+model.templte=llama3", "model.templte", "template"),
        ("+cluster.partitoin=gpu", "cluster.partitoin", "partition"),
        ("+dataset.tiny_messages.sourc=x", "dataset.tiny_messages.sourc", "source"),
    ],
)
def test_a_misspelled_key_added_with_plus_is_refused(make_cells, override, key, close):
    (cell,) = make_cells([override])
    p = only(validate([cell]), "unknown-key")
    assert p.key == key and p.cell == cell.name and f"did you mean {close!r}" in p.fix


@pytest.mark.parametrize(
    "override, rule, says",
    [
        ("+failure_policy.node_faliure=requeue:2", "failure-policy", "unknown failure class 'node_faliure'"),
        ("+failure_policy.gpu_oom=requeue:x", "failure-policy", "budget of gpu_oom must be a whole number"),
        ("+failure_policy.gpu_oom=retry", "failure-policy", "neither requeue nor stop"),
        ("notify.webhook=https://hooks.example.com/services/T0/B0/abcdefgh12345678XYZ", "notify-secret", "token"),
        ("notify.webhook=hooks.example.com", "notify-webhook", "not an http(s) URL"),
        ("notify.webhook_env=SFT_GRID_UNSET_VARIABLE_X", "notify-webhook-env", "not set here"),
        ("notify.command=[no-such-command-here]", "notify-command", "not a command here"),
    ],
)
def test_bad_failure_policies_and_notification_targets_are_refused(make_cells, override, rule, says):
    (cell,) = make_cells([override])
    p = only(validate([cell]), rule)
    assert says in p.message and p.fix and p.cell == cell.name
    assert "abcdefgh12345678XYZ" not in p.render()  # a token is never shown, not even in the error


def test_keys_of_their_own_go_under_the_mappings(make_cells):
    (cell,) = make_cells(["+extra.ddp_timeout=7200", "+extra.a.b=1", "+cluster.env.FOO=bar", "+vars.row=1"])
    assert [p for p in validate([cell]) if p.rule == "unknown-key"] == []


def schema_fields(cls: type = schema.CellConf, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """Every field of the cell schema with a range or a value set, by its dotted key."""
    for f in dataclasses.fields(cls):
        nested = {
            (schema.CellConf, "cluster"): schema.ClusterConf,
            (schema.CellConf, "model"): schema.ModelConf,
            (schema.CellConf, "mix"): schema.MixConf,
            (schema.CellConf, "watchdog"): schema.WatchdogConf,
            (schema.ClusterConf, "staging"): schema.StagingConf,
        }.get((cls, f.name))
        if nested is not None:
            yield from schema_fields(nested, f"{prefix}{f.name}.")
        elif "range" in f.metadata or "choices" in f.metadata:
            yield f"{prefix}{f.name}", f


def outside(rng: Range) -> Any:
    if rng.lo != -math.inf:
        return rng.lo if rng.lo_open else rng.lo - 1
    return rng.hi if rng.hi_open else rng.hi + 1


RANGED = [(key, f) for key, f in schema_fields() if "range" in f.metadata]
CHOSEN = [(key, f) for key, f in schema_fields() if "choices" in f.metadata]


def test_the_schema_gives_ranges_and_value_sets_to_what_backends_would_refuse():
    ranged, chosen = {k for k, _ in RANGED}, {k for k, _ in CHOSEN}
    assert {
        "lr",
        "epochs",
        "max_steps",
        "global_batch_size",
        "micro_batch_size",
        "cutoff_len",
        "seed",
        "warmup_ratio",
        "weight_decay",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "save_steps",
        "save_total_limit",
        "logging_steps",
        "nodes",
        "concurrency",
        "cluster.gpus_per_node",
        "cluster.cpus_per_node",
        "cluster.mem_gb",
        "cluster.max_requeues",
        "cluster.max_parallel",
        "model.params_b",
        "cluster.staging.time_limit_s",
    } <= ranged
    assert {
        "scheduler",
        "finetuning_type",
        "report_to",
        "cluster.executor",
        "cluster.launcher",
        "cluster.precision",
        "cluster.cpu_arch",
        "cluster.gpu_directive",
        "model.template",
        "model.tokenizer_family",
        "model.needs",
        "mix.strategy",
        "cluster.staging.where",
    } <= chosen


@pytest.mark.parametrize("key, field", RANGED, ids=[k for k, _ in RANGED])
def test_every_number_out_of_its_range_is_refused(make_cells, key, field):
    rng = field.metadata["range"]
    value = outside(rng)
    if field.type in ("int", "Optional[int]"):
        value = int(value)
    (cell,) = make_cells([f"{key}={value}"])
    p = only(validate([cell]), "range")
    assert p.key == key and p.value == value and rng.text() in p.message and key in p.fix


@pytest.mark.parametrize("given, meant", [("2e5", "2e-05"), ("3e3", "0.003"), ("1.5", None), ("40", None)])
def test_a_learning_rate_above_1_is_refused_and_a_lost_exponent_minus_is_named(make_cells, given, meant):
    """Above 1 no optimizer trains (AdamW's first step moves each weight by about lr); 2e5 is 2e-5 mistyped."""
    (cell,) = make_cells([f"lr={given}"])
    p = only(validate([cell]), "range")
    assert p.key == "lr" and p.value == float(given) and "<= 1" in p.message
    if meant is None:  # 40 was not typed with an exponent: no guess
        assert "did you mean" not in p.fix, p.fix
    else:
        assert f"did you mean {meant}?" in p.fix, p.fix
    assert not validate(make_cells(["lr=1"]))  # 1 itself is allowed


@pytest.mark.parametrize("key, field", CHOSEN, ids=[k for k, _ in CHOSEN])
def test_every_value_outside_its_set_is_refused_with_the_set(make_cells, key, field):
    value = "no_such_value"
    (cell,) = make_cells([f"{key}=[{value}]" if key in ("model.needs", "cluster.kernels") else f"{key}={value}"])
    p = only(validate([cell]), "choice")
    assert p.key == key and p.value == value
    assert all(v in p.fix for v in field.metadata["choices"])


def test_a_model_with_no_source_is_refused(make_cells):
    (cell,) = make_cells(["model.path=null", "model.hub_id=null"])
    p = only(validate([cell]), "model-source")
    assert p.key == "model.hub_id" and "conf/model/tiny_llama.yaml" in p.fix


def test_the_same_dataset_twice_is_refused(make_cells):
    (cell,) = make_cells(["dataset=[tiny_messages,tiny_messages]"])
    assert "tiny_messages" in only(validate([cell]), "dataset-twice").message
    (copy,) = make_cells(
        [
            "dataset=[magpie,tiny_messages]",
            "dataset.tiny_messages.source=Magpie-Align/Magpie-Llama-3.3-Pro-500K-Filtered",
        ]
    )
    assert only(validate([copy]), "dataset-twice").key == "dataset.tiny_messages.source"


@pytest.mark.parametrize(
    "content, name",
    [
        ("just some text\n", "notes.txt"),
        ('{"a": 1}\n["not", "a", "row"]\n', "rows.jsonl"),
        ("[1, 2, 3]", "numbers.json"),
    ],
)
def test_a_local_dataset_that_is_not_data_is_refused_here_not_deferred(make_cells, tmp_path, content, name):
    data = tmp_path / name
    data.write_text(content)
    (cell,) = make_cells(["model=qwen3_8b", f"dataset.tiny_messages.source={data}"])
    result = preflight([cell])
    p = only(result.problems, "preflight-assistant_turns")
    assert p.key == "dataset.tiny_messages" and p.value == str(data)
    assert not any(c.kind == "assistant_turns" for c in result.deferred.get(cell.name, []))


@pytest.mark.parametrize(
    "axis, shown", [("model=glob(nothing_matches*)", "glob(nothing_matches*)"), ("seed=range(5,5)", "range(5,5)")]
)
def test_an_axis_that_sweeps_nothing_is_named(tmp_path, axis, shown):
    proc = run_sft("-m", axis, "lr=1e-5,2e-5", "dry_run=true", f"runs_root={tmp_path}")
    assert proc.returncode == 1 and "axis-empty" in proc.stderr and shown in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("bad", ["model=[tiny_llama,", "lr==3"])
def test_a_malformed_override_is_named(tmp_path, bad):
    proc = run_sft("-m", bad, "dry_run=true", f"runs_root={tmp_path}")
    assert proc.returncode != 0 and f"the override {bad!r} is malformed" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "overrides, key, value, fix",
    [
        (["cluster.staging.where=job"], "cluster.staging.where", "job", "cluster.staging.where=login"),
        (
            ["cluster=slurm_local", "cluster.staging.readable_here=false"],
            "cluster.staging.readable_here",
            False,
            "cluster.staging.where=job",
        ),
        (["cluster=slurm_local", "cluster.staging.time=soon"], "cluster.staging.time", "soon", "04:00:00"),
    ],
    ids=["job-on-local-executor", "unreadable-cache-staged-here", "bad-wall-time"],
)
def test_a_staging_site_that_cannot_work_is_refused(make_cells, overrides, key, value, fix):
    (cell,) = make_cells(overrides)
    p = [p for p in validate([cell]) if p.key == key]
    assert len(p) == 1 and p[0].value == value and fix in p[0].fix and p[0].cell == cell.name, [q.render() for q in p]


@pytest.mark.parametrize(
    "argv, says, rc",
    [
        (["sft_grid.job", "{tmp}/missing"], "{tmp}/missing is not a directory", 2),
        (["sft_grid.job", "{tmp}"], "is not a cell's directory (it has no cell.yaml)", 2),
        (["sft_grid", "requeue", "{tmp}"], "is not a cell's directory (it has no cell.yaml)", 2),
        (["sft_grid", "cancel", "nope", "--runs-root", "{tmp}"], "no cells under {tmp}/nope", 1),
        (
            ["sft_grid", "stage", "--repo", "org/x--y", "--cache", "{tmp}/cache"],
            "'org/x--y' is not a Hub repository id",
            1,
        ),
    ],
)
def test_the_other_commands_refuse_what_is_not_there_in_one_line(tmp_path, argv, says, rc):
    """What a user types wrong at a cell command (a path that is no cell, a grid that has no cells, a Hub id the
    client refuses) is one line naming it, never a traceback, and nothing is written."""
    import subprocess
    import sys

    before = sorted(tmp_path.rglob("*"))
    proc = subprocess.run(
        [sys.executable, "-m", *(a.format(tmp=tmp_path) for a in argv)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == rc and says.format(tmp=tmp_path) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and sorted(tmp_path.rglob("*")) == before


# -- round 2: every file read as what it is ---------------------------------------------------------


def tree(root: Path) -> list[tuple[str, int]]:
    """What is under root (names and sizes): a refused run leaves it as it was."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def refused_cleanly(proc: subprocess.CompletedProcess[str], *says: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr
    for text in says:
        assert text in proc.stderr, proc.stderr
    return proc.stderr


BROKEN_YAML = {
    "syntax": ("sweep_name: x\nlr: [1e-5, 2e-5\nseed: 3\n", ":3:5: not valid YAML: expected ',' or ']'", "syntax"),
    "tab": ("sweep_name: x\nhydra:\n\tsweeper: {}\n", ":3:1: not valid YAML: found character '\\t'", "not tabs"),
    "duplicate": (
        "sweep_name: x\nlr: 1e-5\nseed: 1\nlr: 2e-5\n",
        ":4:1: not valid YAML: found duplicate key lr",
        "keep",
    ),
    # saved as latin-1 (or UTF-16, whose byte-order mark is 0xff 0xfe): Hydra reads YAML as UTF-8
    "latin-1": (
        "# @package _global_\nsweep_name: caf\xe9\n".encode("latin-1"),
        ": not valid YAML: line 2 is not UTF-8 (byte 0xe9 at byte 35)",
        "save it as UTF-8",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_YAML))
def test_a_sweep_file_that_is_not_yaml_is_one_line_with_its_file_line_and_column(tmp_path, kind):
    text, says, fix = BROKEN_YAML[kind]
    (tmp_path / "conf" / "sweep").mkdir(parents=True)
    (tmp_path / "conf" / "sweep" / "broken.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    runs = tmp_path / "runs"
    before = tree(tmp_path)
    proc = run_sft("--config-dir", str(tmp_path / "conf"), "-m", "+sweep=broken", "dry_run=true", f"runs_root={runs}")
    err = refused_cleanly(proc, f"{tmp_path / 'conf' / 'sweep' / 'broken.yaml'}{says}", fix)
    assert len(err.strip().splitlines()) == 1 and tree(tmp_path) == before


@pytest.mark.parametrize(
    "text, says",
    [
        (
            "name: my_model\npath: /models/x\nparams_b: 1.0\nname: other\n",
            ":4:1: not valid YAML: found duplicate key name",
        ),
        ("name: my_model\nhub_id: 'org/x\nparams_b: 1.0\n", "(while scanning a quoted scalar at line 2, column 9)"),
        (b"\xff\xfen\x00a\x00m\x00e\x00", ": not valid YAML: line 1 is not UTF-8 (byte 0xff at byte 0)"),
    ],
    ids=["duplicated-key", "unclosed-quote", "utf-16"],
)
def test_a_conf_group_file_that_is_not_yaml_is_one_line_too(tmp_path, text, says):
    """A group option (here a model file) is read by Hydra the same way as a sweep file, once per grid and in the
    grid composer (the second cell of a grid is composed there): both name the file by its line."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    mine = tmp_path / "conf" / "model" / "mine.yaml"
    mine.write_bytes(text if isinstance(text, bytes) else text.encode())
    runs = tmp_path / "runs"
    for models in ("mine", "qwen3_8b,mine"):
        proc = run_sft(
            "--config-dir", str(tmp_path / "conf"), "-m", f"model={models}", "dry_run=true", f"runs_root={runs}"
        )
        refused_cleanly(proc, str(mine), says)
    assert not runs.exists()


def test_paths_that_cannot_hold_the_cells_are_named(make_cells, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    cases = {
        str(a_file): f"{a_file} is a file, not a directory",
        str(a_file / "runs"): f"{a_file} (a part of it) is a file",
        str(loop / "runs"): f"{loop} is a symbolic link loop",
    }
    before = tree(tmp_path)
    for root, says in cases.items():
        (cell,) = make_cells(["model=qwen3_8b", f"runs_root={root}"])
        p = only(validate([cell]), "runs-root")
        assert p.key == "runs_root" and p.value == root and says in p.message and "runs_root=" in p.fix
    (cell,) = make_cells(["model=qwen3_8b", f"sweep_name={'s' * 300}"])
    p = only(validate([cell]), "name-too-long")
    assert p.key == "sweep_name" and "300 bytes" in p.message and "at most 255" in p.message
    assert tree(tmp_path) == before


def test_a_sweep_name_too_long_and_a_runs_root_that_is_a_file_stop_the_command_in_one_line(tmp_path):
    a_file = tmp_path / "runs"
    a_file.write_text("not a directory")
    proc = run_sft(
        "-m", "model=qwen3_8b", "lr=1e-5,2e-5", "dry_run=true", f"runs_root={a_file}", f"sweep_name={'n' * 256}"
    )
    refused_cleanly(proc, "[name-too-long]", "[runs-root]", "is a file, not a directory")
    assert a_file.read_text() == "not a directory" and sorted(tmp_path.iterdir()) == [a_file]


# model directories, built by hand (no backend): each cell's loss-mask probe waits for a venv not on this machine
NO_VENV = "cluster.backend_venvs.llamafactory=/nonexistent/venv"


def tokenizer_json(n: int) -> dict[str, Any]:
    """A word-level tokenizer.json of n ids (the `tokenizers` library's own format), two of them added tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(n - 2)}, unk_token="w0"))
    tok.add_special_tokens(["<|added_a|>", "<|added_b|>"])
    return dict(json.loads(tok.to_str()))


def model_dir(
    root: Path, config: Any = None, weights: tuple[str, ...] = ("model.safetensors",), vocab: int = 32
) -> Path:
    root.mkdir(parents=True)
    if config is not None:
        (root / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for w in weights:
        (root / w).write_bytes(b"\0" * 8)
    (root / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab)))
    return root


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32}
SHARDS = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}


@pytest.mark.parametrize(
    "build, says",
    [
        (lambda d: model_dir(d), "no config.json in"),
        (
            lambda d: model_dir(d, '{"model_type": llama}'),
            "the model's config cannot be read: {d}/config.json is not JSON",
        ),
        (lambda d: model_dir(d, [1, 2]), "config.json is not a JSON object"),
        (lambda d: model_dir(d, LLAMA, weights=()), "no weights (model.safetensors, pytorch_model.bin"),
        (
            lambda d: (
                model_dir(d, LLAMA, weights=("model-00001-of-00002.safetensors",)),
                (d / "model.safetensors.index.json").write_text(json.dumps(SHARDS)),
            ),
            "model.safetensors.index.json names 2 shard(s) and 1 are missing: model-00002-of-00002.safetensors",
        ),
        (
            lambda d: model_dir(d, {**LLAMA, "vocab_size": 30}, vocab=34),
            "vocab_size is 30, and the tokenizer has ids up to 33",
        ),
    ],
    ids=["no-config", "config-not-json", "config-not-object", "no-weights", "missing-shard", "vocab-too-small"],
)
def test_a_model_directory_that_cannot_load_is_refused_as_the_model(make_cells, tmp_path, build, says):
    d = tmp_path / "model"
    build(d)
    (cell,) = make_cells(["model=tiny_llama", f"model.path={d}", NO_VENV])
    before = tree(tmp_path)
    result = preflight([cell])
    p = only(result.problems, "preflight-model")
    assert p.key == "model.path" and p.value == str(d) and says.format(d=d) in p.message and p.fix
    # the model is the cause, never the data: no dataset problem is reported for it
    assert not [q for q in result.problems if q.key.startswith("dataset")]
    assert tree(tmp_path) == before


def test_a_sound_model_directory_passes(make_cells, tmp_path):
    d = model_dir(tmp_path / "model", LLAMA, vocab=32)
    (cell,) = make_cells(["model=tiny_llama", f"model.path={d}", NO_VENV])
    assert [p for p in preflight([cell]).problems if p.rule == "preflight-model"] == []


def data_file(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


ROW = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'


@pytest.mark.parametrize(
    "name, content, split, says, fix",
    [
        ("one.jsonl", ROW * 3, "test", "split 'test' asked of one file", "split=train"),
        (
            "snap/data/train.jsonl",
            ROW,
            "validation",
            "no file of split 'validation' in {d} (splits its files name: train)",
            "split=train",
        ),
        (
            "latin1.jsonl",
            ROW + '{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'.encode("latin-1"),
            "train",
            "line 2 of {f} is not UTF-8 text (byte 0xe9",
            "UTF-8",
        ),
        ("bad.jsonl", ROW * 2 + b'{"messages": [}\n' + ROW, "train", "line 3 of {f} is not JSON", "fix that line"),
        (
            "rows.json",
            b'[{"messages": []},\n {"messages": [] ]',
            "train",
            "{f} is not JSON: Expecting ',' delimiter at line 2, column 18",
            "fix that line",
        ),
    ],
    ids=["split-of-one-file", "split-not-in-snapshot", "not-utf8", "bad-json-line", "bad-json-file"],
)
def test_a_data_file_is_read_as_what_it_is(make_cells, tmp_path, name, content, split, says, fix):
    f = data_file(tmp_path, name, content)
    source = tmp_path / "snap" if name.startswith("snap/") else f
    (cell,) = make_cells(
        ["model=qwen3_8b", f"dataset.tiny_messages.source={source}", f"dataset.tiny_messages.split={split}"]
    )
    before = tree(tmp_path)
    p = only(preflight([cell]).problems, "preflight-assistant_turns")
    assert p.key == "dataset.tiny_messages" and says.format(f=f, d=source) in p.message and fix in p.fix, p.render()
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "override, key, says",
    [
        ("lr=inf", "lr", "must be a finite number > 0"),
        ("lr=nan", "lr", "must be a finite number > 0"),
        ("max_grad_norm=inf", "max_grad_norm", "must be a finite number >= 0"),
        ("+mix.probs=[nan,0.5]", "mix.probs", "holds nan: not a number"),
    ],
)
def test_numbers_are_finite(make_cells, override, key, says):
    overrides = [override, "dataset=[tiny_messages,tiny_sharegpt]", "mix.strategy=interleave_under"]
    (cell,) = make_cells(overrides if key == "mix.probs" else [override])
    found = [p for p in validate([cell]) if p.key == key]
    assert len(found) == 1 and says in found[0].message and key in found[0].fix, [p.render() for p in found]


@pytest.mark.parametrize("value", ["00:00:00", "0", "0:0", "0-00:00:00"])
def test_a_zero_wall_time_is_not_no_limit(make_cells, value):
    (cell,) = make_cells([f"time='{value}'"])
    p = only(validate([cell]), "time-format")
    assert p.key == "time" and "Slurm reads as no time limit" in p.message and "time=04:00:00" in p.fix


def test_two_cells_never_upload_to_one_hub_repository(make_cells):
    a, b = make_cells(
        ["model=qwen3_8b", "lr=1e-5", "push_to_hub=true", "hub_model_id=org/my-model"],
        ["model=qwen3_8b", "lr=2e-5", "push_to_hub=true", "hub_model_id=Org/My-Model"],
    )
    p = only(validate([a, b]), "output-shared")
    assert p.cell == b.name and p.key == "hub_model_id" and a.name in p.message and "{key}" in p.fix
    # a placeholder that differs per cell: each its own repository
    c, d = make_cells(
        *[["model=qwen3_8b", f"lr={lr}", "push_to_hub=true", "hub_model_id='org/{model}-{key}'"] for lr in (1e-5, 2e-5)]
    )
    assert c.spec.hub_model_id != d.spec.hub_model_id and not [p for p in validate([c, d]) if p.rule == "output-shared"]


@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
@pytest.mark.parametrize(
    "key, value, instead",
    [
        ("gradient_accumulation_steps", 4, "global_batch_size"),
        ("max_steps", 3, "max_steps"),
        ("warmup_ratio", 0.1, "warmup_ratio"),
        ("output_dir", "/elsewhere", None),
    ],
)
def test_an_extra_key_sft_grid_derives_is_refused_with_the_modelled_key(make_cells, backend, key, value, instead):
    from sft_grid.grid.flow import plan_cells
    from sft_grid.planning.compose import Composed

    (cell,) = make_cells([f"backend={backend}", "model=qwen3_8b", f"+extra.{key}={value}", "+extra.ddp_timeout=7200"])
    _, problems = plan_cells([Composed(cell.overrides, dict(cell.config))], [])
    p = only(problems, "extra-derived")  # ddp_timeout is the backend's own key: passed through
    assert p.key == f"extra.{key}" and p.value == value and f"drop extra.{key}" in p.fix
    assert (f"set {instead}" in p.fix or f"/ {instead}" in p.fix) if instead else "sft_grid derives itself" in p.message


def fake_venv(root: Path) -> Path:
    """A virtual environment directory whose python is this one (which has neither wandb nor tensorboard)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / ".sft_grid_ready").write_text("")
    return root


@pytest.mark.parametrize("integration", ["wandb", "tensorboard"])
def test_report_to_an_integration_the_backend_environment_lacks(make_cells, tmp_path, monkeypatch, integration):
    import importlib.util

    assert importlib.util.find_spec(integration) is None  # this python, the fake environment's, lacks it
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    venv = fake_venv(tmp_path / "venv")
    (cell,) = make_cells(["model=qwen3_8b", f"report_to={integration}", f"cluster.backend_venvs.llamafactory={venv}"])
    p = only(preflight([cell]).problems, "preflight-integration")
    assert p.key == "report_to" and f"needs the {integration} package" in p.message and str(venv) in p.message
    assert f"{venv}/bin/pip install {integration}" in p.fix and "report_to=none" in p.fix


def test_an_empty_variable_is_named_empty_not_unset(tmp_path):
    runs = tmp_path / "runs"
    proc = run_sft("-m", "model=tiny_llama", "dry_run=true", f"runs_root={runs}", env={"SFT_GRID_CACHE": ""})
    refused_cleanly(proc, "environment variable SFT_GRID_CACHE is empty", "unset SFT_GRID_CACHE")
    assert "build" not in proc.stderr and not runs.exists()  # never "missing assets, build them"
    proc = run_sft(
        "-m",
        "cluster=leonardo",
        "model=qwen3_8b",
        "dry_run=true",
        f"runs_root={runs}",
        env={
            "SFT_GRID_LEONARDO_ACCOUNT": "",
            "SFT_GRID_LEONARDO_RUNS": str(runs),
            "SFT_GRID_LEONARDO_ENV": str(tmp_path),
        },
    )
    refused_cleanly(proc, "SFT_GRID_LEONARDO_ACCOUNT is empty", "fix: export SFT_GRID_LEONARDO_ACCOUNT=")
    assert not runs.exists()


def test_a_webhook_variable_set_but_empty_is_called_empty(make_cells, monkeypatch):
    monkeypatch.setenv("SFT_GRID_HOOK_EMPTY", "")
    (cell,) = make_cells(["notify.webhook_env=SFT_GRID_HOOK_EMPTY"])
    assert "is set but empty here" in only(validate([cell]), "notify-webhook-env").message
    monkeypatch.delenv("SFT_GRID_HOOK_EMPTY")
    assert "is not set here" in only(validate([cell]), "notify-webhook-env").message


@pytest.mark.backend
def test_a_real_run_on_an_unknown_gpu_type_says_once_what_it_cannot_estimate(tiny_assets, tmp_path):
    """The dry run's estimates warn; a real run (queued on a fake Slurm) says the same, once for the grid, and
    queues the cells: it is not an error."""
    from . import fakeslurm

    fakeslurm.install(tmp_path / "bin")
    (tmp_path / "fake").mkdir()
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_SLURM": str(tmp_path / "fake")}
    grid = ["cluster=slurm_local", "cluster.gpus_per_node=1", "model=tiny_llama", "max_steps=2", "lr=1e-3,2e-3"]
    proc = run_sft("-m", *grid, "cluster.gpu_type=Z9000", f"runs_root={tmp_path / 'runs'}", env=env, check=True)
    line = (
        "no GPU-hours or wall-time estimate for 2 cell(s), so no check that they finish within `time`: cluster"
        " 'slurm_local' names no known gpu_type (it says 'Z9000'); set cluster.gpu_type (one of A100,"
    )
    assert proc.stdout.count(line) == 1 and "queued 2 cell(s)" in proc.stdout, proc.stdout
    assert len(fakeslurm.calls(tmp_path / "fake", "sbatch")) >= 1
    # a known type: no such line
    known = run_sft("-m", *grid, "cluster.gpu_type=H100", f"runs_root={tmp_path / 'runs2'}", env=env, check=True)
    assert "no GPU-hours or wall-time estimate" not in known.stdout


@pytest.mark.parametrize("axis", ["lr=interval(1e-5,1e-4)", "seed=tag(a,interval(0,10))"])
def test_a_continuous_interval_is_refused_in_one_line_with_the_values_to_list_instead(tmp_path, axis):
    """Hydra's grammar has interval() for the sampling sweepers; a grid cannot enumerate it (it used to end in
    Hydra's raw 'BasicSweeper does not support sweep type' traceback)."""
    proc = run_sft("-m", axis, "dry_run=true", f"runs_root={tmp_path}")
    assert proc.returncode == 1 and "axis-continuous" in proc.stderr and "Traceback" not in proc.stderr
    key = axis.split("=", 1)[0]
    assert f"fix: list the values: {key}=" in proc.stderr and not any(tmp_path.iterdir())
