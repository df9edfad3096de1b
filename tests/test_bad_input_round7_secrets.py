"""Bad input, round 7: secrets. A secret is told by its class, not by a few examples: a key whose name says secret
(WANDB_KEY, MY_PASS, DB_PASSWORD), a token's own shape, a command line's login or --token/--password flag, a
?token=... in a URL. A cell that sets one is refused before anything is written, and neither the refusal nor any
other output shows it (a dataset source's URL is shown redacted). What only points at a secret (a path, a
*_PATH/*_FILE name, a $VAR the shell expands) is not one. The secrets here are made up."""

from __future__ import annotations

import pytest

from sft_grid.core.secrets import secret_setting, shown_source

from .conftest import run_sft

WANDB = "0123456789abcdef0123456789abcdef01234567"  # a W&B API key: 40 hex digits
HF_LIKE = "abc123def456ghi789"  # a token with no prefix, after --token
URL_TOKEN = "abc123def456ghi789jkl"
URL = f"https://example.com/data.jsonl?token={URL_TOKEN}"


def _refused(tmp_path, *args: str) -> str:
    """Run the grid command in an empty folder and return what it said, asserting that it failed, without a
    traceback, and wrote nothing (the dry run writes nothing for a refused cell)."""
    here = tmp_path / "here"
    here.mkdir()
    proc = run_sft(*args, "dry_run=true", f"runs_root={here / 'runs'}", cwd=here)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said
    assert "Traceback" not in said, said
    assert list(here.iterdir()) == [], said
    return said


# -- 1. the class of secrets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("WANDB_KEY", WANDB),  # "key" names a secret when the value looks generated
        ("MY_PASS", "Sup3rSecret"),
        ("DB_PASSWORD", "hunter2"),  # a password: any value of 4 characters or more
        ("DB_PASSWORD", "123456"),
        ("MYSQL_PWD", "p@ss!w0rd"),
        ("AWS_SECRET_ACCESS_KEY", "/K7MDENG/bPxRfiCYEXAMPLEKEYwJalrXUtnFEMI"),  # a / in it does not make it a path
        ("note", "AKIAIOSFODNN7EXAMPLE"),  # an AWS access key id, under any name
        ("note", "ASIAIOSFODNN7EXAMPLE"),
        ("note", "glpat-" + "x1Y2" * 5),
        ("note", "AIza" + "Sy" + "A1b2C3d4" * 4 + "e"),
        ("setup", f"wandb login {WANDB}"),
        ("setup", f"wandb login --relogin {WANDB}"),
        ("setup", f"huggingface-cli login --token {HF_LIKE}"),
        ("setup", f"curl --token={HF_LIKE} https://example.com"),
        ("setup", "mysql --password hunter2 -e 'select 1'"),
        ("setup", f"wget {URL}"),
        ("MIRROR", URL),  # a ?token=... in a URL
    ],
)
def test_a_secret_is_told_by_its_class(key, value):
    assert secret_setting(key, value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("HF_TOKEN_PATH", "/root/.cache/huggingface/token"),  # points at the secret: the last word says so
        ("KEY_PATH", "/etc/ssl/private/key.pem"),
        ("PASSWORD_FILE", "/run/secrets/db"),
        ("SSH_KEY_NAME", "id_ed25519_cluster1"),
        ("GOOGLE_APPLICATION_CREDENTIALS", "/home/me/keys/sa.json"),  # a path, under a name that says secret
        ("PWD", "/home/me/work"),
        ("PWD", "work/run1"),  # the shell's working directory, not a password
        ("response_key", "assistant_response"),  # "key" and a value that does not look generated
        ("hub_private_repo", "true"),
        ("num_key_value_heads", "8"),
        ("MY_PASS", "3"),
        ("DB_PASSWORD", "none"),
        ("setup", "wandb login"),
        ("setup", "wandb login --relogin"),
        ("setup", "wandb login --host=https://api.wandb.ai"),
        ("setup", "huggingface-cli login --token $HF_TOKEN"),  # the shell expands it when the job runs
        ("setup", 'huggingface-cli login --token "${HF_TOKEN}"'),
        ("setup", "docker login registry-1.docker.io"),  # a registry's host, not a token
        ("MIRROR", "https://example.com/data.jsonl?page=2&sort=name"),
        ("revision", WANDB),  # a commit is 40 hex digits too
    ],
)
def test_what_only_points_at_a_secret_is_not_one(key, value):
    assert not secret_setting(key, value)


def test_a_secret_in_a_setup_line_or_under_a_name_that_says_secret_is_refused_and_shown_nowhere(tmp_path):
    said = _refused(
        tmp_path,
        "model=tiny_llama",
        f"cluster.setup=['wandb login {WANDB}','huggingface-cli login --token {HF_LIKE}']",
        f"+cluster.env.WANDB_KEY={WANDB}",
        "+cluster.env.MY_PASS=Sup3rSecret",
        "+cluster.env.DB_PASSWORD=hunter2",
    )
    assert "5 problem(s) in 1 cell(s)" in said, said
    for key in ("cluster.setup[0]", "cluster.setup[1]", "cluster.env.WANDB_KEY", "cluster.env.MY_PASS"):
        assert f"{key}='***'" in said and "[secret]" in said, (key, said)
    for name in ("WANDB_KEY", "MY_PASS", "DB_PASSWORD"):
        assert f"export {name} in your shell before the run" in said, (name, said)
    for secret in (WANDB, HF_LIKE, "Sup3rSecret", "hunter2"):
        assert secret not in said, (secret, said)


def test_a_setting_that_points_at_a_secret_runs(tmp_path):
    runs = tmp_path / "runs"
    proc = run_sft(
        "model=tiny_llama",
        "+cluster.env.HF_TOKEN_PATH=/root/.cache/huggingface/token",
        "cluster.setup=['wandb login $WANDB_API_KEY']",
        "dry_run=true",
        f"runs_root={runs}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[secret]" not in proc.stdout + proc.stderr


# -- 2. a dataset source's URL is shown redacted ---------------------------------------------------------------------


def test_shown_source_redacts_a_url_only():
    assert shown_source(URL) == "https://example.com/data.jsonl?***"
    assert shown_source("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"


def test_a_refused_url_source_is_shown_without_its_token(tmp_path):
    said = _refused(tmp_path, "model=tiny_llama", f"dataset.tiny_messages.source='{URL}'")
    assert "dataset.tiny_messages.source='https://example.com/data.jsonl?***'" in said, said
    assert "[hub-repo-id]" in said, said
    assert URL_TOKEN not in said and URL_TOKEN[-9:] not in said, said  # nor a part of it in the cell's name


def test_show_names_an_unreadable_url_source_without_its_token(tmp_path):
    proc = run_sft("show", "model=tiny_llama", f"dataset.tiny_messages.source='{URL}'", cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said, said
    assert "https://example.com/data.jsonl?***" in said, said
    assert URL_TOKEN[-9:] not in said, said
