"""Fixtures for the Hub staging tests, loaded with ``pytest_plugins = ["tests.hub_fixtures"]``.

The client environment never points at the real Hub: ``HF_ENDPOINT`` is the loopback server, the cache and
HF_HOME are per test, and no token of the machine's user can leak into a request.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hubserver import HubServer


@pytest.fixture
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A client environment of its own: tmp HF_HOME and HF_HUB_CACHE, no token, no Xet, no telemetry."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    env = {
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import huggingface_hub.constants as c  # read at import time by the client: patch what it reads per call

    monkeypatch.setattr(c, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    return env


@pytest.fixture
def hub(tmp_path: Path, hf_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root and mount rights needed; the test is skipped without them), unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True, capture_output=True, timeout=30
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a small tmpfs here (needs root and mount rights): {e}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True, timeout=30)
