"""Round 10, the commands a team uses around its grids (init, cp, import, post, cancel, stage, requeue) given odd but
plausible arguments: a .gitignore folder or a file above the repository's folder, an option's file name or its
name alone for cp, a positional after an option (cancel GRID --runs-root R CELL), a training YAML that names a key
twice, --params-b inf, a --name that is not snake case, a cell's file for post, --time-limit nan or 0, an empty
CELL_DIR. One small finished grid (the synthetic backend: seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sft_grid.cli.main import main
from sft_grid.core.layout import iter_cell_dirs

from .conftest import run_sft
from .test_bad_input_round9_commands import sft  # main(args) -> status, stdout, stderr; no traceback


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished grid of two cells under <tmp>/runs/default."""
    runs = tmp_path_factory.mktemp("r10") / "runs"
    run_sft("-m", "backend=synthetic", "cluster=local", "max_steps=3,4", f"runs_root={runs}", check=True, timeout=300)
    return runs / "default"


def test_init_refuses_a_gitignore_folder_and_a_file_above_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repo" / ".gitignore").mkdir(parents=True)  # init adds runs/ to it: a folder there cannot be
    rc, out, err = sft(capsys, "init", "repo")
    assert rc == 2 and not out, err
    assert f"{tmp_path}/repo/.gitignore is a folder, where a file goes; move it away" in err, err
    assert [p.name for p in (tmp_path / "repo").iterdir()] == [".gitignore"]  # no sft_grid.yaml, no conf/
    (tmp_path / "a_file").write_text("x\n")
    rc, out, err = sft(capsys, "init", "a_file/sub/repo")
    assert rc == 2 and f"({tmp_path}/a_file is a file, where a folder goes); nothing written: name a folder" in err, err
    assert not (tmp_path / "a_file").is_dir()


def test_cp_takes_an_options_file_name_and_names_the_option_a_bare_or_mistyped_word_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    to = str(tmp_path / "conf")
    rc, _, err = sft(capsys, "cp", "model/qwen3_8b.yaml", "--to", to)
    assert rc == 0 and (tmp_path / "conf" / "model" / "qwen3_8b.yaml").is_file(), err
    rc, _, err = sft(capsys, "cp", "qwen3_8b", "--to", to)
    assert rc == 2 and "'qwen3_8b' is not GROUP/OPTION (did you mean 'model/qwen3_8b'?)" in err, err
    # the groups named are those with options: conf/locks and conf/replay hold none
    assert "the groups: backend, cluster, dataset, eval, harness, model, sweep (" in err, err
    rc, _, err = sft(capsys, "cp", "models/tiny_llama", "--to", to)
    assert rc == 2 and "(did you mean 'model'?)" in err, err
    rc, _, err = sft(capsys, "cp", "model/tiny-llama", "--to", to)
    assert rc == 2 and "no shipped option model/tiny-llama (did you mean 'tiny_llama'?)" in err, err


def test_a_positional_after_an_option_is_taken(grid: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse before Python 3.13 leaves CELL (or cp's NAME) over when an option comes between: it was refused
    with the top-level usage as an unrecognized argument."""
    rc, _, err = sft(capsys, "cp", "model/tiny_llama", "--to", str(tmp_path / "conf"), "my_llama")
    assert rc == 0 and (tmp_path / "conf" / "model" / "my_llama.yaml").is_file(), err
    rc, out, err = sft(capsys, "cancel", "default", "--runs-root", str(grid.parent), "no_such_cell")
    assert rc == 1 and f"no cell under {grid} has 'no_such_cell' in its name" in err, err
    rc, out, err = sft(capsys, "cancel", "default", "--runs-root", str(grid.parent), "max_steps3")
    assert rc == 0 and "0 cell(s) cancelled (none in flight" in out, err
    with pytest.raises(SystemExit):  # what is truly unknown is said with the command's own usage
        sft(capsys, "cancel", "default", "max_steps3", "--bogus")
    assert "usage: sft-grid cancel" in capsys.readouterr().err


LF = """\
model_name_or_path: Qwen/Qwen3-8B
template: qwen3
dataset: org/chats
learning_rate: 1.0e-5
learning_rate: 2.0e-5
"""


def test_import_refuses_a_key_named_twice_and_an_infinite_size_and_keeps_the_name_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup.yaml").write_text(LF)
    out_dir = str(tmp_path / "conf")
    rc, out, err = sft(capsys, "import", "dup.yaml", "--out", out_dir)
    assert rc == 2 and not out, err
    assert "dup.yaml:5:1: not valid YAML: found duplicate key learning_rate" in err, err
    assert "keep one of the two entries" in err and not (tmp_path / "conf").exists(), err
    (tmp_path / "new.yaml").write_text(LF.replace("learning_rate: 2.0e-5\n", "").replace("Qwen/", "acme/"))
    rc, out, err = sft(capsys, "import", "new.yaml", "--out", out_dir, "--params-b", "inf")
    assert rc == 2 and "--params-b inf: a size in billions, above 0" in err and not (tmp_path / "conf").exists(), err
    # --name as given (a name a cell takes), not made snake case; its file's .yaml read as the name's end
    (tmp_path / "ok.yaml").write_text(LF.replace("learning_rate: 2.0e-5\n", ""))
    rc, out, err = sft(capsys, "import", "ok.yaml", "--out", out_dir, "--name", "Qwen3-FFT.v2.yaml")
    assert rc == 0, err
    assert [p.name for p in (tmp_path / "conf" / "sweep").iterdir()] == ["Qwen3-FFT.v2.yaml"]
    assert "sweep_name: Qwen3-FFT.v2\n" in (tmp_path / "conf" / "sweep" / "Qwen3-FFT.v2.yaml").read_text()
    assert "+sweep=Qwen3-FFT.v2 dry_run=true" in out, out


def test_post_of_a_cells_file_names_the_cell(grid: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cell = sorted(iter_cell_dirs(grid))[0]
    rc, out, err = sft(capsys, "post", str(cell / "cell.yaml"))
    assert rc == 2 and not out, err
    assert f"{cell}/cell.yaml is a file; name a cell's directory or a grid (sft-grid post {cell})" in err, err


@pytest.mark.parametrize("limit", ["nan", "0", "inf", "-5"])
def test_stage_time_limit_that_is_no_limit_is_refused_before_the_cache_is_touched(
    limit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(SystemExit) as exit_:
        main(["stage", "--repo", "org/tiny", "--cache", str(cache), "--time-limit", limit])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--time-limit: {limit}: seconds above 0" in err, err
    assert not cache.exists()


def test_requeue_of_an_empty_cell_dir_is_said_as_empty(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = sft(capsys, "requeue", "")
    assert rc == 2 and "CELL_DIR is empty (an unset shell variable?); nothing done" in err, err


def test_a_bare_word_given_to_run_is_told_how_to_write_it() -> None:
    """`sft-grid run qwen3_8b` (or `stage tiny_lama`) ended in Hydra's "missing EQUAL at '<EOF>'" alone: the hint
    now names the group whose option the word is (or nearly is), or how an override is written; a flag's own value
    (`--config-name x`) is no bare word."""
    from sft_grid.planning.hydra_errors import malformed_override

    assert malformed_override(["qwen3_8b"]) == (
        "'qwen3_8b' is no override: run takes key=value, and qwen3_8b is an option of model: model=qwen3_8b"
    )
    assert malformed_override(["-m", "tiny_lama", "lr=1e-5"]) == (
        "'tiny_lama' is no override: run takes key=value; did you mean model=tiny_llama?"
    )
    assert "a key as lr=2e-5" in (malformed_override(["zzzqqq"]) or "")
    assert malformed_override(["--config-name", "config", "lr=1e-5"]) is None


def test_assets_path_with_force_is_said_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    """`sft-grid assets path --force` printed the path and rebuilt nothing, as if --force meant nothing."""
    assert main(["assets", "path", "--force"]) == 2
    err = capsys.readouterr().err
    assert "path builds nothing: sft-grid assets build --force" in err, err
