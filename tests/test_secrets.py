"""No secret in a file: a token, a password or an API key given in a setting that sft_grid writes into a cell's
files (cluster.env, cluster.setup, extra, vars) is refused before anything is written, and is shown nowhere, the
cell's name included. The tokens here are made up, in the shapes the real ones have."""

from __future__ import annotations

import pytest

from sft_grid.core.secrets import secret_setting

from .conftest import run_sft

HF = "hf_" + "Zt4" * 12  # a Hugging Face user token: hf_ and 34 letters and digits
WANDB = "7c1f" * 10  # a W&B API key: 40 hex digits
PASSWORD = "s3cr3t-Pa55w0rd"


@pytest.mark.parametrize(
    "key, value",
    [
        ("HF_TOKEN", HF),
        ("hub_token", HF),
        ("note", f"made with {HF}"),  # a token's own shape, whatever the key
        ("WANDB_API_KEY", WANDB),
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("GITHUB_PAT", "ghp_" + "a1B2" * 9),
        ("HF_ENDPOINT", f"https://bob:{PASSWORD}@mirror.example.org"),
    ],
)
def test_a_secret_is_told_by_its_shape_its_key_or_a_password_in_a_url(key, value):
    assert secret_setting(key, value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("TOKENIZERS_PARALLELISM", "false"),  # a word of the key, not a part of one
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"),  # a switch about tokens, not one
        ("pad_token", "<|reserved_special_token_0|>"),  # a token of the vocabulary
        ("revision", WANDB),  # a commit is 40 hex digits too: only a key naming a secret makes them one
        ("HF_ENDPOINT", "https://mirror.example.org/a_long_path_segment_of_the_mirror"),
        ("task", "ask-me-anything-about-the-long-context-suite"),  # "sk-" inside a word is not a key's prefix
        ("lr", "2e-5"),
    ],
)
def test_settings_that_only_look_near_a_secret_pass(key, value):
    assert not secret_setting(key, value)


def test_every_secret_of_a_grid_is_refused_before_anything_is_written_and_shown_nowhere(tmp_path):
    runs = tmp_path / "runs"
    proc = run_sft(
        "-m",
        # read from the environment: still written as its value
        "+cluster.env.HF_TOKEN=${oc.env:SFT_TEST_HUB_TOKEN}",
        f"+cluster.env.HF_ENDPOINT=https://bob:{PASSWORD}@mirror.example.org",
        f"cluster.setup=['export WANDB_API_KEY={WANDB}']",
        f"+extra.hub_token={HF}",
        f"+vars.token={HF}",
        "lr=1e-5,2e-5",
        "dry_run=true",
        f"runs_root={runs}",
        env={"SFT_TEST_HUB_TOKEN": HF},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "10 problem(s) in 2 cell(s)" in out, out
    for key in ("cluster.env.HF_TOKEN", "cluster.env.HF_ENDPOINT", "cluster.setup[0]", "extra.hub_token", "vars.token"):
        assert f"{key}='***'" in out, (key, out)
    assert "[secret]" in out and "export HF_TOKEN in your shell before the run" in out
    assert "lr1e-05-" in out and "lr2e-05-" in out  # each cell named by what it sweeps, no token in its name
    for secret in (HF, WANDB, PASSWORD):
        assert secret not in out
    assert not runs.exists()
