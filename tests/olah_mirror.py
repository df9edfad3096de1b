"""olah, a real Hugging Face mirror server, for tests: its own virtual environment, repos in its layout, a server.

Why: ``tests/hubserver.py`` is the project's own look-alike of the Hub; olah (https://github.com/vtuber-plan/olah,
installed from PyPI, never from this repo) is a second, independently written server the real
``huggingface_hub`` client can be pointed at with ``HF_ENDPOINT``. Run offline, it serves plain local git
repositories and never reaches out (its upstream is set to a closed loopback port besides).

Three parts, stdlib only (nothing from ``sft_grid``):

- ``make_olah_venv()`` builds ``$SFT_GRID_CACHE/venvs/olah-<version>`` (default ``~/.cache/sft_grid``) once:
  ``python -m venv`` then pip with olah pinned and every dependency pinned by ``OLAH_CONSTRAINTS``; 9-11 s
  from an empty pip cache. Safe to call from several processes at once (a file lock); a venv whose pins differ
  from these is rebuilt. ``python -m tests.olah_mirror build`` is the same from a Makefile.
- ``OlahMirror`` writes repos into olah's mirror layout, ``<root>/mirrors/{models|datasets}/{org}/{name}``: a
  plain git repo per Hub repo, one git commit per revision (``commit`` replaces the whole tree, as
  ``HubStore.commit`` does by default), branches and tags as git refs. A file can be stored the way the Hub's
  git does LFS (a pointer in git, the bytes under ``.git/lfs/objects``), which olah reads too.
- ``OlahServer`` starts ``olah-cli -c olah.toml`` on 127.0.0.1 on a free port, polls until it answers HTTP, and
  stops it. Repos can be added or moved while it runs: olah reads the git repos on every request.

Fixture: ``olah`` (module-scoped; load with ``pytest_plugins = ["tests.olah_mirror"]``) yields a running
``OlahServer``; tests in one module share it, so each should use repo names of its own. It skips the test,
saying why, only when the virtual environment cannot be built.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Self

try:
    from tests.hubstore import LFS_SUFFIXES
    from tests.ports import free_ports
except ImportError:  # run as a script: tests/ itself is on sys.path
    from hubstore import LFS_SUFFIXES  # type: ignore[no-redef, import-not-found]
    from ports import free_ports  # type: ignore[no-redef, import-not-found]

OLAH_VERSION = "0.5.4"
# What `pip install olah==0.5.4` resolved to on 2026-12 (Python 3.11), pinned so the server under test does not
# change under the tests. olah's own huggingface_hub (>=1.27) lives only in this venv, never in the client's.
OLAH_CONSTRAINTS = (
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "brotli==1.2.1",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "fastapi==0.165.0",
    "fastapi-utils==0.8.0",
    "filelock==4.3.1",
    "fsspec==2026.9.0",
    "gitdb==4.0.12",
    "GitPython==3.2.1",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore==1.0.9",
    "httpcore2==2.16.2",
    "httpx==0.28.1",
    "httpx2==2.16.2",
    "huggingface_hub==2.4.0",
    "idna==3.20",
    "Jinja2==3.1.6",
    "markdown-it-py==4.3.0",
    "MarkupSafe==3.0.4",
    "mdurl==0.1.2",
    "mypy_extensions==1.2.0",
    "opentelemetry-api==1.45.2",
    "packaging==26.4",
    "peewee==4.5.3",
    "portalocker==4.4.2",
    "psutil==5.9.8",
    "pydantic==2.14.4",
    "pydantic-settings==2.16.3",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "python-dotenv==1.2.4",
    "python-multipart==0.0.34",
    "pytz==2026.6",
    "PyYAML==6.0.4",
    "requests==2.34.2",
    "rich==15.0.0",
    "shortuuid==1.0.13",
    "smmap==5.0.3",
    "starlette==1.10.0",
    "tenacity==9.2.1",
    "toml==0.10.2",
    "tqdm==4.70.1",
    "truststore==0.10.5",
    "typing-inspect==0.9.0",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "urllib3==2.8.0",
    "uvicorn==0.54.0",
)
READY_FILE = ".olah_ready"  # written last, holding the pins: a venv without it (or with other pins) is rebuilt
KINDS = ("model", "dataset")
GIT_USER = ("sft_grid tests", "tests@sft-grid.invalid")


class OlahVenvError(RuntimeError):
    """olah's virtual environment could not be built (no registry, a pin gone, pip failed)."""


# -- the virtual environment ----------------------------------------------------------------------------------
def sft_grid_cache() -> Path:
    return Path(os.environ.get("SFT_GRID_CACHE") or Path.home() / ".cache" / "sft_grid")


def olah_venv_dir(version: str = OLAH_VERSION) -> Path:
    return sft_grid_cache() / "venvs" / f"olah-{version}"


def _pins(version: str) -> str:
    return "\n".join([f"olah=={version}", *OLAH_CONSTRAINTS]) + "\n"


def olah_cli(version: str = OLAH_VERSION) -> Path | None:
    """The venv's ``olah-cli`` when the venv is built with today's pins, else None (nothing is built)."""
    venv = olah_venv_dir(version)
    ready = venv / READY_FILE
    if ready.is_file() and ready.read_text() == _pins(version) and (venv / "bin" / "olah-cli").is_file():
        return venv / "bin" / "olah-cli"
    return None


def make_olah_venv(version: str = OLAH_VERSION, *, python: str = sys.executable, timeout: float = 900) -> Path:
    """Build olah's venv unless it is there; returns its ``olah-cli``. Raises ``OlahVenvError`` on failure."""
    cli = olah_cli(version)
    if cli is not None:
        return cli
    venv = olah_venv_dir(version)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".olah-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it, then reuse
        cli = olah_cli(version)
        if cli is not None:
            return cli
        shutil.rmtree(venv, ignore_errors=True)  # half-built or built with other pins
        t0 = time.monotonic()
        constraints = venv / "olah-constraints.txt"
        pip = [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-input",
            "--no-compile",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            f"olah=={version}",
        ]
        for cmd in ([python, "-m", "venv", str(venv)], pip):
            if cmd is pip:
                constraints.write_text(_pins(version))
            try:
                proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as e:
                shutil.rmtree(venv, ignore_errors=True)
                raise OlahVenvError(f"{' '.join(cmd[:4])} ...: {e}") from e
            if proc.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise OlahVenvError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{tail}")
        if not (venv / "bin" / "olah-cli").is_file():
            raise OlahVenvError(f"pip installed olah=={version} but {venv}/bin/olah-cli is missing")
        (venv / "build_seconds.txt").write_text(f"{time.monotonic() - t0:.1f}\n")
        (venv / READY_FILE).write_text(_pins(version))
        return venv / "bin" / "olah-cli"


# -- repositories in olah's mirror layout ---------------------------------------------------------------------
def _git_env() -> dict[str, str]:
    """git as these tests need it whatever the machine's configuration: no global or system config, no hooks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


def lfs_pointer(data: bytes) -> bytes:
    """The git-LFS pointer the Hub's git stores for a large file (olah recognises 120-150 byte pointers)."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
    ).encode()


class OlahMirror:
    """Git repos under ``<root>/mirrors``, one per Hub repo, as olah's ``mirrors-path`` expects them."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._last_ts = 0

    def repo_dir(self, repo_id: str, kind: str = "model") -> Path:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        return self.root / f"{kind}s" / repo_id

    def _git(self, repo: Path, *args: str, input: str | None = None, env: Mapping[str, str] | None = None) -> str:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args],
            input=input,
            check=False,
            capture_output=True,
            text=True,
            env={**_git_env(), **(env or {})},
            timeout=60,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} in {repo} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def _ensure_repo(self, repo_id: str, kind: str) -> Path:
        d = self.repo_dir(repo_id, kind)
        if not (d / ".git").is_dir():
            d.mkdir(parents=True, exist_ok=True)
            self._git(d, "init", "--quiet", "--initial-branch=main")
            self._git(d, "config", "user.name", GIT_USER[0])  # this repo only, as olah's GitPython reads it
            self._git(d, "config", "user.email", GIT_USER[1])
            self._git(d, "config", "commit.gpgsign", "false")
        return d

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        kind: str = "model",
        *,
        lfs: bool | Collection[str] = False,
        message: str = "initial commit",
    ) -> str:
        """A repo whose ``main`` holds exactly ``files``; returns the commit sha (fails if the repo exists)."""
        if (self.repo_dir(repo_id, kind) / ".git").exists():
            raise FileExistsError(f"{kind} repo {repo_id} already exists under {self.root}")
        return self.commit(repo_id, files, kind, lfs=lfs, message=message)

    def commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        kind: str = "model",
        *,
        branch: str = "main",
        lfs: bool | Collection[str] = False,
        message: str = "commit",
    ) -> str:
        """A new commit whose tree is exactly ``files``, on top of ``branch`` (created if new); moves ``branch``
        to it and returns its sha. ``lfs``: True stores files as the Hub's default .gitattributes would (by suffix,
        or 64 KiB and over) as LFS pointers plus objects; a collection names the paths stored so."""
        d = self._ensure_repo(repo_id, kind)
        with tempfile.TemporaryDirectory(prefix="olah-blobs-") as tmp:
            paths = []
            for i, (path, data) in enumerate(sorted(files.items())):
                as_lfs = (
                    (path in lfs)
                    if not isinstance(lfs, bool)
                    else (lfs and (len(data) >= 64 * 1024 or path.endswith(LFS_SUFFIXES)))
                )
                blob = data
                if as_lfs:
                    sha256 = hashlib.sha256(data).hexdigest()
                    obj = d / ".git" / "lfs" / "objects" / sha256[:2] / sha256[2:4] / sha256
                    obj.parent.mkdir(parents=True, exist_ok=True)
                    obj.write_bytes(data)
                    blob = lfs_pointer(data)
                p = Path(tmp) / str(i)
                p.write_bytes(blob)
                paths.append(str(p))
            oids = (
                self._git(
                    d, "hash-object", "-w", "--no-filters", "--stdin-paths", input="\n".join(paths) + "\n"
                ).split()
                if paths
                else []
            )
            index_lines = [f"100644 {oid}\t{path}" for oid, path in zip(oids, sorted(files), strict=True)]
            index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            if index_lines:
                self._git(d, "update-index", "--add", "--index-info", input="\n".join(index_lines) + "\n", env=index)
            tree = self._git(d, "write-tree", env=index)
        parent = self.ref(repo_id, f"refs/heads/{branch}", kind)
        # Strictly increasing commit times: two commits of the same tree in one second still get their own shas.
        self._last_ts = max(int(time.time()), self._last_ts + 1)
        date = {f"GIT_{who}_DATE": f"{self._last_ts} +0000" for who in ("AUTHOR", "COMMITTER")}
        sha = self._git(d, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message, env=date)
        self._git(d, "update-ref", f"refs/heads/{branch}", sha, *([parent] if parent else []))
        return sha

    def ref(self, repo_id: str, name: str, kind: str = "model") -> str | None:
        """The sha a branch or tag names, or None."""
        d = self.repo_dir(repo_id, kind)
        if not (d / ".git").is_dir():
            return None
        proc = subprocess.run(
            ["git", "-C", str(d), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
            check=False,
            capture_output=True,
            text=True,
            env=_git_env(),
            timeout=60,
        )
        return proc.stdout.strip() if proc.returncode == 0 else None

    def set_ref(self, repo_id: str, branch: str, sha: str, kind: str = "model") -> None:
        """Point a branch at an existing commit (``main`` moved back, as a revert on the Hub)."""
        self._git(self.repo_dir(repo_id, kind), "update-ref", f"refs/heads/{branch}", sha)

    def tag(self, repo_id: str, name: str, rev: str = "main", kind: str = "model") -> str:
        d = self.repo_dir(repo_id, kind)
        self._git(d, "tag", "--force", name, rev)
        return self._git(d, "rev-parse", f"{name}^{{commit}}")


# -- the server ------------------------------------------------------------------------------------------------
class OlahServer:
    """``with OlahServer(tmp) as olah: olah.add_repo("org/m", {...}); HF_ENDPOINT=olah.url``."""

    def __init__(self, root: Path | str, *, version: str = OLAH_VERSION, cli: Path | None = None) -> None:
        self.root = Path(root)
        self.version = version
        self.cli = cli
        self.mirror = OlahMirror(self.root / "mirrors")
        self.url = ""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.root / "olah.out"

    # repos: what the mirror does, reachable from the server object
    def add_repo(self, repo_id: str, files: Mapping[str, bytes], kind: str = "model", **kw: object) -> str:
        return self.mirror.add_repo(repo_id, files, kind, **kw)  # type: ignore[arg-type]

    def commit(self, repo_id: str, files: Mapping[str, bytes], kind: str = "model", **kw: object) -> str:
        return self.mirror.commit(repo_id, files, kind, **kw)  # type: ignore[arg-type]

    def tag(self, repo_id: str, name: str, rev: str = "main", kind: str = "model") -> str:
        return self.mirror.tag(repo_id, name, rev, kind)

    def set_ref(self, repo_id: str, branch: str, sha: str, kind: str = "model") -> None:
        self.mirror.set_ref(repo_id, branch, sha, kind)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _config(self, port: int, closed: int) -> Path:
        """olah on ``port``; its upstream (the Hub's netlocs) ``closed``, a loopback port nothing listens on, so even
        a stray upstream call stays on loopback."""
        cfg = self.root / "olah.toml"
        cfg.write_text(
            "[basic]\n"
            f'host = "127.0.0.1"\nport = {port}\n'
            f'repos-path = "{self.root / "repos"}"\n'
            f'mirrors-path = ["{self.mirror.root}"]\n'
            f'mirror-scheme = "http"\nmirror-netloc = "127.0.0.1:{port}"\nmirror-lfs-netloc = "127.0.0.1:{port}"\n'
            f'hf-scheme = "http"\nhf-netloc = "127.0.0.1:{closed}"\n'
            f'hf-lfs-netloc = "127.0.0.1:{closed}"\n'
            "\n[accessibility]\noffline = true\n"
        )
        return cfg

    def start(self, timeout: float = 60.0) -> None:
        cli = self.cli or make_olah_venv(self.version)
        self.root.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update(
            HF_HUB_OFFLINE="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONUNBUFFERED="1",
            NO_PROXY="*",
            HF_HOME=str(self.root / "hf-home"),
        )
        for _attempt in range(5):  # the port is free when picked; another process may take it before olah binds
            port, closed = free_ports(2)
            cfg = self._config(port, closed)
            with open(self.log_path, "ab") as out:
                self.proc = subprocess.Popen(
                    [str(cli), "-c", str(cfg), "--log-path", str(self.root / "logs")],
                    cwd=self.root,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.port, self.url = port, f"http://127.0.0.1:{port}"
            if self._wait_ready(timeout):
                return
            lost_port = b"address already in use" in self.log_path.read_bytes().lower()
            self.stop()
            if not lost_port:
                break
        raise RuntimeError(
            f"olah {self.version} did not start on {self.url} within {timeout:.0f}s; "
            f"its output:\n{self.output()[-3000:]}"
        )

    def _wait_ready(self, timeout: float) -> bool:
        """Poll until olah answers any HTTP request (uvicorn listens only after the app started)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/api/models/_olah_/_ready_", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # an HTTP answer, whatever its status: the server is up
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        return False

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


# -- pytest ------------------------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # the Makefile step needs only make_olah_venv
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture(scope="module")
    def olah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OlahServer]:
        """A running olah (offline, serving ``olah.mirror``'s git repos); skipped only if its venv can't be built."""
        try:
            cli = make_olah_venv()
        except OlahVenvError as e:
            pytest.skip(f"olah {OLAH_VERSION}'s virtual environment could not be built under {olah_venv_dir()}: {e}")
        with OlahServer(tmp_path_factory.mktemp("olah"), cli=cli) as server:
            yield server


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="olah's virtual environment for the mirror tests.")
    p.add_argument("action", choices=["build", "path"], help="build: build it unless there; path: print where")
    args = p.parse_args(argv)
    if args.action == "path":
        print(olah_venv_dir())
        return 0
    t0 = time.monotonic()
    try:
        cli = make_olah_venv()
    except OlahVenvError as e:
        print(f"olah venv: {e}", file=sys.stderr)
        return 1
    print(f"olah {OLAH_VERSION}: {cli} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
