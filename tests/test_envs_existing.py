"""A site's own environments (`cluster.backend_venvs.<backend>`, the harness's `cluster.backend_venvs.lm_eval`) are
checked before anything is queued or written, in a dry run too: the environment is there (a directory, or a conda
environment's name that conda's registries know), its python runs, and it has what the cell's jobs import. Each
refusal names the cell, the key, the value, what is wrong and the fix naming the environment; and the jobs run the
resolved environment's python (a conda name is never left for the job to find).

The environments here are real: virtualenvs made by `python -m venv` (no packages, milliseconds). Where one must have
the backend, a tiny local package named `llamafactory` (or `lm_eval`) is installed into it by a real `pip install`
of a local directory with a pyproject (its in-tree build backend writes the wheel: no network, no setuptools): a
STAND-IN for the real backend, importable and nothing more. The tests marked `backend` use the real managed
LLaMA-Factory environment (`sft-grid venv path llamafactory`) instead.

Conda itself cannot be installed from the package registries here: a conda environment is a real virtualenv with a
`conda-meta/history` file (what conda writes into every environment it makes), and named environments are registered
where conda registers and configures them: `~/.conda/environments.txt` under a HOME of the test's own, an
`envs_dirs` entry of a .condarc the test writes and names in $CONDARC, or $CONDA_PREFIX of an "active" one. No
variable or file of the machine's own conda is read (HOME, CONDARC and the CONDA_* variables are the test's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sft_grid.backends.launch import launch_script
from sft_grid.checks import mask, own_envs, venv_facts
from sft_grid.core.cellfiles import Check
from sft_grid.core.paths import cache_root
from sft_grid.planning import environments
from sft_grid.planning.environments import CONDA_VARIABLES, bin_dir, locate
from sft_grid.planning.evaluation import harness_venv, suites_of

from .conftest import run_sft
from .ports import free_port

pytestmark = pytest.mark.xdist_group("envs_existing")  # its tests share the module's environments
KEY = "cluster.backend_venvs.llamafactory"
PIN = "llamafactory==0.9.5"  # conf/backend/llamafactory.yaml's pin
# an in-tree PEP 517 backend: the wheel of a one-module package, written with the standard library
BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION = os.environ["STAND_IN_NAME"], os.environ["STAND_IN_VERSION"]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist = f"{NAME}-{VERSION}"
    files = {
        f"{NAME}/__init__.py": b'"""A stand-in for the real package, importable and nothing more."""\\n',
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: stand-in\\nRoot-Is-Purelib: true\\n"
        b"Tag: py3-none-any\\n",
    }
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    lines.append(f"{dist}.dist-info/RECORD,,")
    wheel = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist}.dist-info/RECORD", "\\n".join(lines) + "\\n")
    return wheel
'''


def make_venv(path: Path) -> Path:
    """A real, empty virtualenv (no pip: milliseconds)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def install_stand_in(venv: Path, name: str = "llamafactory", version: str = "0.0.0") -> None:
    """`pip install <local directory>` of a one-module package called `name` into the environment (this python's
    pip, run for the environment's python; offline): a stand-in for the real package."""
    source = venv.parent / f"{venv.name}-{name}-source"
    source.mkdir(exist_ok=True)
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = []
            build-backend = "stand_in_backend"
            backend-path = ["."]
            """
        )
    )
    (source / "stand_in_backend.py").write_text(BACKEND)
    env = {**os.environ, "STAND_IN_NAME": name, "STAND_IN_VERSION": version, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run(
        [*pip, "--no-index", "--no-deps", str(source)],
        check=True,
        env=env,
        capture_output=True,
    )


def as_conda(venv: Path) -> Path:
    """What makes a directory a conda environment to conda (conda/gateways/disk/test.py `is_conda_environment`)."""
    (venv / "conda-meta").mkdir(parents=True, exist_ok=True)
    (venv / "conda-meta" / "history").write_text("==> 2025-01-01 00:00:00 <==\n# cmd: conda create\n")
    return venv


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The module's environments (read only): `bare` has nothing, `lf` the stand-in `llamafactory`."""
    root = tmp_path_factory.mktemp("envs")
    bare = make_venv(root / "bare")
    lf = make_venv(root / "lf")
    install_stand_in(lf)
    return {"bare": bare, "lf": lf}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own (its ~/.conda, ~/.condarc), no conda variable and no `conda` on PATH; the cache
    root stays the machine's (the tiny assets, the managed environments), the checks' cache is the test's."""
    monkeypatch.setenv("SFT_GRID_CACHE", str(cache_root()))
    monkeypatch.setenv("SFT_GRID_PREFLIGHT_CACHE", str(tmp_path / "preflight"))
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in CONDA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if not (Path(d) / "conda").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    return home


def register(home: Path, *prefixes: Path) -> None:
    """Register environments as `conda create` does: a line each in ~/.conda/environments.txt."""
    (home / ".conda").mkdir(exist_ok=True)
    with open(home / ".conda" / "environments.txt", "a") as fh:
        fh.writelines(f"{p}\n" for p in prefixes)


def condarc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *envs_dirs: Path) -> None:
    """A .condarc with these envs_dirs, named by $CONDARC (conda's own way to point at one)."""
    rc = tmp_path / "condarc.yml"
    rc.write_text("envs_dirs:\n" + "".join(f"  - {d}\n" for d in envs_dirs))
    monkeypatch.setenv("CONDARC", str(rc))


def sft(tmp_path: Path, *overrides: str, dry: bool = True) -> subprocess.CompletedProcess[str]:
    """The real command line on one tiny cell, under the test's runs root."""
    args = ["-m", "model=tiny_llama", "max_steps=1", f"runs_root={tmp_path / 'runs'}", *overrides]
    return run_sft(*args, *(["dry_run=true"] if dry else []), timeout=300)


def refused(tmp_path: Path, proc: subprocess.CompletedProcess[str], key: str, value: str, *says: str) -> str:
    """Refused in one problem naming the cell, the key and the value, saying each of `says`; nothing written."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "nothing was submitted" in proc.stderr and "tiny_llama" in proc.stderr, proc.stderr
    line = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith(f"{key}={value!r}:")), "")
    assert line.endswith("[preflight-venv]"), proc.stderr
    fix = proc.stderr.split(line, 1)[1].splitlines()[1].strip()
    assert fix.startswith("fix: "), proc.stderr
    for text in says:
        assert text in f"{line}\n{fix}", f"{text!r} not in:\n{line}\n{fix}"
    assert not (tmp_path / "runs").exists(), "something was written"
    return f"{line}\n{fix}"


# ---- a directory that is not there, or not an environment ----------------------------------------------------


@pytest.mark.parametrize("wording", ["absolute", "home", "relative"])
def test_a_directory_that_does_not_exist_is_refused_in_the_dry_run(home, tmp_path, wording):
    value = {"absolute": str(tmp_path / "no-such-env"), "home": "~/no-such-env", "relative": "./no-such-env"}[wording]
    where = home / "no-such-env" if wording == "home" else tmp_path / "no-such-env"  # the relative one: from the cwd
    quoted = f"'{value}'" if wording == "home" else value  # Hydra's grammar: a value starting with ~ is quoted
    proc = run_sft(
        "-m", "model=tiny_llama", f"runs_root={tmp_path / 'runs'}", "dry_run=true", f"{KEY}={quoted}", cwd=tmp_path
    )
    said = refused(tmp_path, proc, KEY, value, f"no such directory {where}", f"python3.11 -m venv {where}")
    assert f"{where}/bin/python -m pip install {PIN}" in said and f"or point {KEY} at an environment" in said
    # the loss-mask check is not silently left for the job: no "deferred", no "not readable here"
    assert "deferred" not in proc.stdout and "not readable here" not in proc.stdout + proc.stderr


def test_a_missing_directory_is_refused_by_a_real_run_too_and_by_the_deprecated_key(home, tmp_path, envs):
    value = str(tmp_path / "gone")
    refused(tmp_path, sft(tmp_path, f"{KEY}={value}", dry=False), KEY, value, f"no such directory {value}")
    # the deprecated spelling is named as written; a near sibling is suggested
    near = str(envs["bare"].parent / "bares")
    key = "cluster.backend_envs.llamafactory"
    refused(tmp_path, sft(tmp_path, f"+{key}={near}"), key, near, "(did you mean 'bare'?)", f"or point {key} at")


def test_a_missing_environment_is_refused_before_any_hub_input_is_staged(home, tmp_path, monkeypatch):
    """A real run whose dataset is staged here from the Hub (the Hub stood in for by a closed loopback port): the
    environment the cell names is judged before any transfer starts, so its refusal is what the user reads, not the
    staging's failure hours later."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    value = str(tmp_path / "gone")
    proc = sft(tmp_path, f"{KEY}={value}", "dataset=tulu3", "cluster=local", dry=False)
    refused(tmp_path, proc, KEY, value, f"no such directory {value}")
    assert "staging" not in proc.stderr and "allenai/tulu-3-sft-mixture" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "shape, says, fix",
    [
        ("bin", "has no bin/python: it is an environment's bin/ itself", "point {key} at {venv}"),
        ("python", "is a python, not an environment's directory", "point {key} at {venv}"),
        ("plain", "has no bin/python: it is neither a virtualenv nor a conda environment", "python3.11 -m venv"),
        ("file", "is a file, not an environment's directory (one with bin/python)", "or point {key} at"),
        ("broken", "is a broken link (to /no/such/python3.11): the interpreter it", "-m venv --clear"),
        ("conda-no-python", "has no python (a conda environment without the python package)", "conda install -p"),
        ("dangling", "is a broken link (to /no/such/env): the environment it named was moved", "point it at"),
    ],
)
def test_what_is_not_an_environment_is_refused_saying_what_it_is(home, tmp_path, envs, make_cells, shape, says, fix):
    venv = envs["bare"]
    value = {"bin": venv / "bin", "python": venv / "bin" / "python", "plain": tmp_path}.get(shape)
    if shape == "file":
        value = tmp_path / "a-file"
        value.write_text("")
    elif shape == "broken":
        value = tmp_path / "moved"
        (value / "bin").mkdir(parents=True)
        (value / "bin" / "python").symlink_to("/no/such/python3.11")
    elif shape == "conda-no-python":
        value = as_conda(tmp_path / "cenv")
    elif shape == "dangling":
        value = tmp_path / "link"
        value.symlink_to("/no/such/env")
    (cell,) = make_cells(["model=tiny_llama", f"{KEY}={value}"])
    (problem,) = own_envs.check([cell])[0]
    assert (problem.key, problem.value, problem.rule) == (KEY, str(value), "preflight-venv")
    assert says in problem.message, problem.message
    assert fix.format(key=KEY, venv=venv) in problem.fix, problem.fix


# ---- an environment whose python does not run, or lacks the backend -------------------------------------------


def test_a_virtualenv_without_the_backend_is_refused_naming_it_and_its_install_line(home, tmp_path, envs):
    bare = envs["bare"]
    python = bare / "bin" / "python"
    for value in (str(bare), f"{bare}/"):  # two wordings of one directory
        said = refused(
            tmp_path,
            sft(tmp_path, f"{KEY}={value}"),
            KEY,
            value,
            f"`llamafactory` is not importable in {bare} (its python {python})",
            f"install it there: {python} -m pip install {PIN}",
        )
        # never the loss-mask probe's guess at the cell's fields
        assert "template, tokenizer or dataset fields" not in said and "conda activate" not in said
    # a real run: refused the same, before anything is written
    refused(tmp_path, sft(tmp_path, f"{KEY}={bare}", dry=False), KEY, str(bare), "`llamafactory` is not importable")
    # axolotl's environment, by its own key and pin
    refused(
        tmp_path,
        sft(tmp_path, "backend=axolotl", f"cluster.backend_venvs.axolotl={bare}"),
        "cluster.backend_venvs.axolotl",
        str(bare),
        "`axolotl` is not importable in",
        f"{python} -m pip install axolotl==0.19.0",
    )


def test_the_harness_environment_is_checked_for_lm_eval(home, tmp_path, make_cells):
    """The harness's own environment (`cluster.backend_venvs.lm_eval`) of a cell that evaluates: refused without
    lm_eval, passed with the stand-in `lm_eval` installed; a cell that does not evaluate does not use it."""
    harness = make_venv(tmp_path / "harness")
    (cell, plain) = make_cells(
        ["model=tiny_llama", "eval=tiny", f"cluster.backend_venvs.lm_eval={harness}"],
        ["model=tiny_llama", "seed=2", f"cluster.backend_venvs.lm_eval={harness}"],
    )
    assert suites_of(cell) and harness_venv(cell, suites_of(cell)[0]) == (harness, True)
    assert own_envs.named(plain) == []
    (problem,) = own_envs.check([cell])[0]
    assert problem.key == "cluster.backend_venvs.lm_eval" and "`lm_eval` is not importable in" in problem.message
    assert f"{harness}/bin/python -m pip install lm-eval==0.4.13" in problem.fix
    install_stand_in(harness, "lm_eval", "0.4.13")
    assert own_envs.check([cell]) == ([], set())


@pytest.mark.parametrize(
    "script, says",
    [
        (
            "#!/bin/sh\necho 'python: error while loading shared libraries: libpython3.11.so.1.0: cannot open shared"
            " object file' >&2\nexit 127\n",
            "python: error while loading shared libraries: libpython3.11.so",
        ),
        ("#!/no/such/interpreter\n", "No such file or directory"),
    ],
    ids=["needs-a-module", "bad-interpreter"],
)
def test_a_python_that_does_not_run_here_is_refused_with_what_it_said(home, tmp_path, script, says):
    """A python that needs what the cluster's setup lines load (a module's libpython) fails as it starts; one whose
    interpreter is gone cannot even start."""
    venv = tmp_path / "needs-a-module"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(script)
    python.chmod(0o755)
    said = refused(
        tmp_path,
        sft(tmp_path, f"{KEY}={venv}"),
        KEY,
        str(venv),
        f"its python {python} does not run here: {says}",
        "run the grid from a shell that has loaded them",
    )
    assert "module load" in said


@pytest.mark.parametrize("shape", ["bin", "plain"])
def test_a_directory_without_a_python_is_refused_by_the_command_line(home, tmp_path, envs, shape):
    value = envs["bare"] / "bin" if shape == "bin" else tmp_path / "just-a-directory"
    value.mkdir(exist_ok=True)
    says = "it is an environment's bin/ itself" if shape == "bin" else "it is neither a virtualenv nor a conda"
    refused(tmp_path, sft(tmp_path, f"{KEY}={value}"), KEY, str(value), f"{value} has no bin/python: {says}")


def test_installing_the_backend_as_the_fix_says_is_seen_at_once(home, tmp_path, make_cells):
    """The environment's answers are cached, keyed by its site-packages: the install the refusal names is seen by
    the next command without clearing any cache (the stand-in package, installed by pip)."""
    venv = make_venv(tmp_path / "later")
    (cell,) = make_cells(["model=tiny_llama", f"{KEY}={venv}"])
    (problem,) = own_envs.check([cell])[0]
    assert f"install it there: {venv}/bin/python -m pip install {PIN}" in problem.fix
    answers = tmp_path / "preflight" / "venv_facts"
    assert own_envs.check([cell])[0] == [problem] and len(list(answers.glob("*.json"))) == 1  # asked once, cached
    install_stand_in(venv)
    assert own_envs.check([cell]) == ([], set()) and len(list(answers.glob("*.json"))) == 2  # asked again


# ---- conda environments: by directory, by name ----------------------------------------------------------------


@pytest.mark.parametrize("wording", ["sft311", "conda:sft311"])
def test_a_conda_name_no_registry_knows_is_refused_listing_the_names_they_know(
    home, tmp_path, envs, monkeypatch, wording
):
    other = as_conda(make_venv(tmp_path / "elsewhere" / "train2"))
    register(home, other)
    condarc(tmp_path, monkeypatch, tmp_path / "team-envs")
    as_conda(make_venv(tmp_path / "team-envs" / "sft310"))
    said = refused(
        tmp_path,
        sft(tmp_path, f"{KEY}={wording}"),
        KEY,
        wording,
        "no conda environment named 'sft311' here (did you mean 'sft310'?): conda's registries",
        f"{tmp_path / 'team-envs'}, ~/.conda/envs, ~/.conda/environments.txt) know sft310, train2",
        f"conda create -n sft311 python=3.11 && conda activate sft311 && pip install {PIN}",
    )
    assert "or give an environment's directory" in said


def test_a_conda_environment_is_found_by_name_where_conda_registers_it_and_the_job_runs_its_python(
    home, tmp_path, monkeypatch, make_cells
):
    """By ~/.conda/environments.txt, by a .condarc's envs_dirs, by ~/.conda/envs, by the active installation's
    root ($CONDA_PREFIX's envs/): each resolves to the environment's directory, and launch.sh puts that bin/ first on
    PATH (never the bare name); the dry run checks the environment it resolved."""
    registered = as_conda(make_venv(tmp_path / "anywhere" / "sft311"))
    register(home, registered)
    condarc(tmp_path, monkeypatch, tmp_path / "team-envs")
    configured = as_conda(make_venv(tmp_path / "team-envs" / "team"))
    mine = as_conda(make_venv(home / ".conda" / "envs" / "mine"))
    root = as_conda(tmp_path / "miniconda3")
    active = as_conda(make_venv(root / "envs" / "active"))
    monkeypatch.setenv("CONDA_PREFIX", str(active))
    expected = {"sft311": registered, "conda:team": configured, "mine": mine, "active": active, "base": root}
    for value, prefix in expected.items():
        assert locate(value).path == prefix, value
        (cell,) = make_cells(["model=tiny_llama", f"{KEY}={value}"])
        assert bin_dir(cell.spec) == prefix / "bin"
        script = launch_script(cell, tmp_path / "cell", bin_dir(cell.spec))
        assert f"export PATH={prefix}/bin:" in script and f"PATH={value}" not in script
    # a named environment without the backend is refused as what it is, with conda's way to install it too
    said = refused(
        tmp_path,
        sft(tmp_path, f"{KEY}=sft311"),
        KEY,
        "sft311",
        f"`llamafactory` is not importable in the conda environment 'sft311' ({registered})",
        f"install it there: {registered}/bin/python -m pip install {PIN}",
        f"(or: conda activate sft311 && pip install {PIN})",
    )
    # a conda environment given by its directory (a prefix): the same check, conda's install line by prefix
    said = refused(tmp_path, sft(tmp_path, f"{KEY}={configured}"), KEY, str(configured), f"conda activate {configured}")
    assert "conda environment 'team'" not in said


def test_the_harness_and_a_need_environment_resolve_by_name_too(home, tmp_path, make_cells):
    evalenv = as_conda(make_venv(home / ".conda" / "envs" / "evalenv"))
    newtf = as_conda(make_venv(home / ".conda" / "envs" / "newtf"))
    (cell, qwen) = make_cells(
        ["model=tiny_llama", "eval=tiny", "cluster.backend_venvs.lm_eval=evalenv"],
        ["model=qwen3_5_9b", "+cluster.need_venvs.transformers_ge_5_3={llamafactory:newtf}"],
    )
    assert harness_venv(cell, suites_of(cell)[0]) == (evalenv, True)
    assert environments.site_venvs(cell.spec.cluster)["lm_eval"] == str(evalenv)
    assert bin_dir(qwen.spec) == newtf / "bin"
    (problem,) = own_envs.check([qwen])[0]  # the need's environment is the one checked: it lacks llamafactory
    assert problem.key == "cluster.need_venvs.transformers_ge_5_3.llamafactory" and problem.value == "newtf"


def test_conda_env_list_is_asked_last_where_a_conda_is_on_path(home, tmp_path, monkeypatch):
    """An installation none of conda's files or variables here name: `conda env list --json` knows it (a script
    on PATH answers as conda does, with its JSON: a stand-in for conda's own command)."""
    prefix = as_conda(make_venv(tmp_path / "opt" / "conda" / "envs" / "hidden"))
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "conda").write_text(f'#!/bin/sh\necho \'{{"envs": ["{prefix}"]}}\'\n')
    (fake / "conda").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert locate("hidden").path == prefix
    missing = locate("nowhere")
    assert missing.path is None and "hidden" in missing.known and "conda env list" in missing.searched


def test_a_remote_sites_environments_are_left_to_the_grid_command_run_there(home, tmp_path, make_cells):
    (cell,) = make_cells(["model=tiny_llama", "cluster.remote.host=site", f"{KEY}=/only/on/the/site"])
    assert own_envs.named(cell) == [] and own_envs.check([cell]) == ([], set())


def test_a_probe_that_cannot_import_the_backend_names_the_environment_not_the_cells_fields(tmp_path):
    """The loss-mask probe's failure to import a module of the backend is the environment's, with its install line;
    any other failure is still about the cell's fields."""
    check = Check(mask.KIND, "dataset.d", "data.jsonl", backend="llamafactory", python=f"{tmp_path}/v/bin/python")
    missing = mask.verdict_of(mask.Probed(check, result={"error": "ModuleNotFoundError: No module named 'torch'"}))
    assert "install it there" in missing.fix and f"{tmp_path}/v/bin/python -m pip install torch" in missing.fix
    assert f"point {KEY} at an environment" in missing.fix and "template" not in missing.fix
    other = mask.verdict_of(mask.Probed(check, result={"error": "KeyError: 'messages'"}))
    assert "template, tokenizer or dataset fields" in other.fix


# ---- the real backend -----------------------------------------------------------------------------------------


@pytest.mark.backend
def test_the_real_backend_environment_by_conda_name_passes_and_trains(home, tmp_path, monkeypatch, tiny_assets):
    """The managed LLaMA-Factory environment (`sft-grid venv path llamafactory`), named as a conda environment in an
    envs_dirs of $CONDARC (a link to it there): the dry run passes the environment and the loss-mask check (run in
    it), launch.sh runs its resolved python, and a real run trains the cell in it."""
    managed = environments.VenvSpec.load("llamafactory").path
    found = venv_facts.answer(str(managed / "bin" / "python"))
    assert isinstance(found, dict) and found["modules"]["llamafactory"], found
    condarc(tmp_path, monkeypatch, tmp_path / "envs")
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "sft311").symlink_to(managed)
    dry = sft(tmp_path, f"{KEY}=sft311")
    assert dry.returncode == 0, dry.stderr
    (launch,) = (tmp_path / "runs").rglob("launch.sh")
    assert f"export PATH={tmp_path / 'envs' / 'sft311' / 'bin'}:" in launch.read_text()
    real = sft(tmp_path, f"{KEY}=sft311", "global_batch_size=2", "micro_batch_size=2", dry=False)
    assert real.returncode == 0 and "completed" in real.stdout, real.stdout + real.stderr


@pytest.mark.backend
def test_the_stand_in_passes_the_environment_check_and_the_probe_names_what_it_lacks(home, tmp_path, envs, tiny_assets):
    """The stand-in `llamafactory` is importable (the environment check passes); LLaMA-Factory's own preprocessing,
    run in it by the loss-mask probe, is not there: refused with the environment's install line, not the cell's
    fields."""
    proc = sft(tmp_path, f"{KEY}={envs['lf']}")
    assert proc.returncode == 1 and "[preflight-venv]" not in proc.stderr, proc.stderr
    assert "[preflight-loss_mask]" in proc.stderr and "No module named 'llamafactory." in proc.stderr, proc.stderr
    assert f"install it there ({envs['lf']}/bin/python -m pip install llamafactory" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()
