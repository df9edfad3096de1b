"""Bad input a new user types is refused before anything is written, naming the cell, the key, the value and the
fix: a misspelled key added with `+`, every out-of-range number and every value outside a key's fixed set (the
whole schema, read from its metadata), a model with no source, a local dataset that is not data, a dataset
listed twice, an axis that sweeps nothing, an override Hydra's grammar refuses."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
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
    (cell,) = make_cells(["+extra.packing=true", "+extra.a.b=1", "+cluster.env.FOO=bar", "+vars.row=1"])
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


@pytest.mark.parametrize("key, field", CHOSEN, ids=[k for k, _ in CHOSEN])
def test_every_value_outside_its_set_is_refused_with_the_set(make_cells, key, field):
    value = "no_such_value"
    (cell,) = make_cells([f"{key}=[{value}]" if key == "model.needs" else f"{key}={value}"])
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
        (["sft_grid.requeue", "{tmp}"], "is not a cell's directory (it has no cell.yaml)", 2),
        (["sft_grid.cancel", "nope", "--runs-root", "{tmp}"], "no cells under {tmp}/nope", 1),
        (
            ["sft_grid.stage", "--repo", "org/x--y", "--cache", "{tmp}/cache"],
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
