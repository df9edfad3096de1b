"""An `extra` key the backend's own config parser does not take is refused before anything is queued: LLaMA-Factory's
argument parser would refuse the whole config as the job starts, on the GPU node. The keys are read from the
parser's classes in the backend's real environment (the managed LLaMA-Factory one here; axolotl's in
tests/test_axolotl.py), and that parser itself is the oracle: it refuses what the check refuses and takes what the
check passes."""

from __future__ import annotations

import subprocess

from .conftest import run_sft

# a typo of a key LLaMA-Factory knows, and a key it knows that sft_grid does not model
TYPO, KNOWN = "warmup_ratioo", "ddp_timeout"

# LLaMA-Factory's own training parser (llamafactory.hparams.get_train_args parses with it) on a config holding both
ORACLE = f"""
from transformers import HfArgumentParser
from llamafactory.hparams.parser import _TRAIN_ARGS
try:
    HfArgumentParser(_TRAIN_ARGS).parse_dict(
        {{"{TYPO}": 0.1, "{KNOWN}": 1800, "model_name_or_path": "m", "output_dir": "out"}}, allow_extra_keys=False
    )
except ValueError as exc:
    print(exc)
"""


def test_an_extra_key_llamafactorys_parser_refuses_is_refused_with_the_key_it_meant(tmp_path):
    from sft_grid.stages.venv_build import build

    runs = tmp_path / "runs"
    proc = run_sft(
        "-m", f"+extra.{TYPO}=0.1", f"+extra.{KNOWN}=1800", "lr=1e-5,2e-5", "dry_run=true", f"runs_root={runs}"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 problem(s) in 2 cell(s)" in out, out
    assert f"extra.{TYPO}=" in out and "[preflight-backend_key]" in out
    assert "Some keys are not used by the HfArgumentParser" in out and "did you mean warmup_ratio?" in out
    assert f"extra.{KNOWN}=" not in out  # a key the parser takes passes
    assert not runs.exists() or not [p for p in runs.rglob("*") if p.is_file()]  # nothing written
    said = subprocess.run(
        [str(build("llamafactory") / "bin" / "python"), "-c", ORACLE], capture_output=True, text=True, timeout=300
    )
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == f"Some keys are not used by the HfArgumentParser: ['{TYPO}']", said.stdout


# LLaMA-Factory's parser on a value of the wrong kind: it builds its dataclasses from the values as given, and
# TrainingArguments turns ddp_timeout into a timedelta as it is built
VALUE_ORACLE = """
import sys
from transformers import HfArgumentParser
from llamafactory.hparams.parser import _TRAIN_ARGS
for value in (1800, "1800s"):
    try:
        HfArgumentParser(_TRAIN_ARGS).parse_dict({"ddp_timeout": value, "model_name_or_path": "m", "output_dir": "out"})
        print("parsed", repr(value))
    except Exception as exc:
        print("refused", repr(value), type(exc).__name__)
"""


def test_an_extra_value_of_the_wrong_kind_is_refused_as_the_parser_would(tmp_path):
    """The kind each key takes is read from the same classes (an int, a float, a bool, a Literal's values); a value
    of another kind is refused before anything is queued, where LLaMA-Factory's parser would fail as the job starts
    (the oracle below), and a value of its kind passes."""
    from sft_grid.stages.venv_build import build

    bad = run_sft(
        "-m", "+extra.ddp_timeout=1800s", "+extra.init_special_tokens=noise", "dry_run=true", f"runs_root={tmp_path}"
    )
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1 and "Traceback" not in out, out
    assert "extra.ddp_timeout='1800s': llamafactory's config takes a whole number for ddp_timeout" in out, out
    assert "extra.init_special_tokens='noise': llamafactory's config takes one of noise_init, desc_init" in out, out
    good = run_sft(
        "-m",
        "+extra.ddp_timeout=1800",
        "+extra.init_special_tokens=noise_init",
        "dry_run=true",
        f"runs_root={tmp_path}",
    )
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    said = subprocess.run(
        [str(build("llamafactory") / "bin" / "python"), "-c", VALUE_ORACLE], capture_output=True, text=True, timeout=300
    )
    assert said.stdout.splitlines() == ["parsed 1800", "refused '1800s' TypeError"], said.stdout + said.stderr
