"""Fake Slurm executables for unit tests of the grid's decisions: sbatch, sacct, squeue, scancel, scontrol, srun.

Each is this script (a wrapper first on PATH calls it with the command's name): it keeps a small job table in
$FAKE_SLURM/state.json, records every call (argv and, for sbatch, the script) in $FAKE_SLURM/calls.jsonl, and
answers in the formats sft_grid and submitit read. Jobs never run: a test sets their states (`set_state`) to what
the scenario needs. The real Slurm tests (tests/test_slurm*.py) run the same grid code against a real cluster.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

IN_FLIGHT = {"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "CONFIGURING", "COMPLETING"}
COMMANDS = ("sbatch", "sacct", "squeue", "scancel", "scontrol", "srun")


def _dir() -> Path:
    return Path(os.environ["FAKE_SLURM"])


@contextmanager
def state() -> Iterator[dict[str, Any]]:
    """The job table, locked, written back on exit."""
    path = _dir() / "state.json"
    with open(_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.is_file() else {"next": 100, "tasks": {}}
        yield data
        path.write_text(json.dumps(data, indent=1))


def record(argv: list[str], **extra: Any) -> None:
    with open(_dir() / "calls.jsonl", "a") as fh:
        fh.write(json.dumps({"argv": argv, **extra}) + "\n")


def sbatch(args: list[str]) -> int:
    script_path = Path(args[-1])
    script = script_path.read_text()
    record(["sbatch", *args], script=script)
    if os.environ.get("FAKE_SLURM_REFUSE"):
        print(f"sbatch: error: {os.environ['FAKE_SLURM_REFUSE']}", file=sys.stderr)
        return 1
    name = re.search(r"^#SBATCH --job-name=(\S+)", script, re.M)
    array = re.search(r"^#SBATCH --array=0-(\d+)", script, re.M)
    with state() as data:
        job_id = str(data["next"])
        data["next"] += 1
        ids = [f"{job_id}_{i}" for i in range(int(array.group(1)) + 1)] if array else [job_id]
        for task in ids:
            data["tasks"][task] = {"name": name.group(1) if name else "", "state": "PENDING", "reason": "None"}
    print(f"Submitted batch job {job_id}")
    return 0


def _option(args: list[str], flag: str) -> list[str]:
    for arg in args:
        if arg.startswith(flag + "="):
            return [v for v in arg.split("=", 1)[1].split(",") if v]
    return []


def sacct(args: list[str]) -> int:
    record(["sacct", *args])
    ids, names = set(_option(args, "--jobs")), set(_option(args, "--name"))
    with state() as data:
        for task, job in data["tasks"].items():
            if task in ids or task.split("_")[0] in ids or job["name"] in names:
                print(f"{task}|{job['name']}|{job['state']}|00:00:01|{job['reason']}")
    return 0


def squeue(args: list[str]) -> int:
    record(["squeue", *args])
    with state() as data:
        for task, job in data["tasks"].items():
            if job["state"] in IN_FLIGHT:
                print(f"{task}|{job['name']}|{job['state']}|0:01|{job['reason']}")
    return 0


def scancel(args: list[str]) -> int:
    record(["scancel", *args])
    with state() as data:
        for task, job in data["tasks"].items():
            if (task in args or task.split("_")[0] in args) and job["state"] in IN_FLIGHT:
                job["state"] = "CANCELLED"
    return 0


def scontrol(args: list[str]) -> int:
    record(["scontrol", *args])
    if args[:2] == ["show", "config"]:
        print(f"MaxArraySize            = {os.environ.get('FAKE_SLURM_MAX_ARRAY', '1001')}")
    return 0


def set_state(fake_dir: Path, job_id: str, new_state: str, reason: str = "None") -> None:
    """A test moves a job (an array task, or every task of an array or job) to a state."""
    os.environ["FAKE_SLURM"] = str(fake_dir)
    with state() as data:
        for task, job in data["tasks"].items():
            if task == job_id or task.split("_")[0] == job_id:
                job.update(state=new_state, reason=reason)


def install(bin_dir: Path) -> None:
    """Wrappers named after each command, first on PATH, that run this script."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        wrapper = bin_dir / command
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {command} "$@"\n')
        wrapper.chmod(0o755)


def calls(fake_dir: Path, command: str | None = None) -> list[dict[str, Any]]:
    path = fake_dir / "calls.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [c for c in found if command is None or c["argv"][0] == command]


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "srun":
        return 0
    return {"sbatch": sbatch, "sacct": sacct, "squeue": squeue, "scancel": scancel, "scontrol": scontrol}[command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
