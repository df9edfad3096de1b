"""What staging remembers between runs, in the cache: the last transfer rate, and whether each endpoint was seen to
continue a partial file or to start it again from zero (stdlib only).

Why the second: a login node that kills long processes lets a big file arrive over several runs only if a file cut
by the kill continues in the next run. That is not what a client version promises but what happens: the client
asks for the rest with a ``Range`` request (huggingface_hub 1.17, for ``blobs/<etag>.incomplete``), and a mirror or
a caching proxy may answer it with ``200`` and the whole file (olah does, and so do proxies that compress), upon
which the client starts the file from byte 0; other clients write each attempt to a file of its own and never ask.
So the transfer watches every file that was cut before (a partial download on disk, or a cut this cache recorded
when a run stopped inside the file: some clients delete their partial file as they stop) as it starts again: the
client either reported the earlier bytes as done (it continued) or started at zero (it restarted). The last
observation is kept per endpoint, with the client's version: one made with another client says nothing about this.

Until an endpoint was seen either way, staging tries (a run may stop inside a file) but promises nothing; once it
was seen to restart, a file that cannot finish within one run is not started at all, and its message says where to
stage it instead. Both files are hints: a lost or unreadable one only costs an observation.

    <cache>/.locks/sft_grid/transfer-rate.json   {"bytes_per_s": float, "at": time}
    <cache>/.locks/sft_grid/endpoints.json       {endpoint: {"resumes": bool, "why": str, "client": str, "at": time}}
    <cache>/.locks/sft_grid/cuts.json            {"<repo folder>/<etag>": bytes a stopped run had of that file}
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seen:
    """What an endpoint did the last time a partial file was on disk as its transfer started."""

    resumes: bool
    why: str  # what was seen, in words a message can quote
    at: float


def _folder(cache: Path | str) -> Path:
    return Path(cache) / ".locks" / "sft_grid"  # the client's cache scanner skips .locks


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, body: Any) -> None:
    """Best effort: a hint for the next run must not hide the error this run may be raising (a full disk)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # stagers of other repos read it meanwhile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep %s: %s", path, e)
        tmp.unlink(missing_ok=True)


def keep_rate(cache: Path | str, rate: float | None) -> None:
    if rate:
        _write(_folder(cache) / "transfer-rate.json", {"bytes_per_s": rate, "at": time.time()})


def last_rate(cache: Path | str) -> float | None:
    """The rate the last staging into this cache measured (bytes/s), as a first estimate for the next one."""
    raw = _read(_folder(cache) / "transfer-rate.json")
    try:
        return float(raw["bytes_per_s"])
    except (TypeError, KeyError, ValueError):
        return None


def _endpoints(cache: Path | str) -> Path:
    return _folder(cache) / "endpoints.json"


def seen(cache: Path | str, endpoint: str, client: str) -> Seen | None:
    """What ``endpoint`` did with a partial file, as seen with this ``client`` version; None when not seen yet."""
    raw = _read(_endpoints(cache))
    entry = raw.get(endpoint.rstrip("/")) if isinstance(raw, dict) else None
    try:
        if entry is None or entry["client"] != client:
            return None
        return Seen(bool(entry["resumes"]), str(entry["why"]), float(entry["at"]))
    except (TypeError, KeyError, ValueError):
        return None


def resumes(cache: Path | str, endpoint: str, client: str) -> bool:
    """Whether a cut file is taken to continue in the next run: as last seen, and yes until a restart was seen."""
    last = seen(cache, endpoint, client)
    return last.resumes if last is not None else True


def remember(cache: Path | str, endpoint: str, client: str, resumes: bool, why: str) -> None:
    raw = _read(_endpoints(cache))
    body = raw if isinstance(raw, dict) else {}
    before = body.get(endpoint.rstrip("/"))
    if isinstance(before, dict) and before.get("resumes") != resumes:
        log.info("%s %s a partial file now (%s)", endpoint, "continues" if resumes else "no longer continues", why)
    body[endpoint.rstrip("/")] = {"resumes": resumes, "why": why, "client": client, "at": time.time()}
    _write(_endpoints(cache), body)


def _cuts(cache: Path | str) -> Path:
    return _folder(cache) / "cuts.json"


def cut_at(cache: Path | str, blob: str) -> int:
    """How many bytes of ``blob`` (``<repo folder>/<etag>``) a run had when it stopped inside it; 0: none recorded."""
    raw = _read(_cuts(cache))
    try:
        return int(raw.get(blob, 0)) if isinstance(raw, dict) else 0
    except (TypeError, ValueError):
        return 0


def record_cut(cache: Path | str, blob: str, nbytes: int | None) -> None:
    """A run stopped inside ``blob`` with ``nbytes`` of it; None: forget it (finished, or its next start seen)."""
    raw = _read(_cuts(cache))
    body = raw if isinstance(raw, dict) else {}
    if nbytes is None and blob not in body:
        return
    if nbytes is None:
        body.pop(blob)
    else:
        body[blob] = nbytes
    _write(_cuts(cache), body)
