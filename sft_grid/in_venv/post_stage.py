"""The post-training stages that need the backend's packages (standalone: runs in the backend env).

    python post_stage.py consolidate <zero checkpoint dir> <out dir>
    python post_stage.py fetch <base model: dir or hub id> <file name> <dest dir>
    python post_stage.py upload <folder> <repo id> <commit message> [<ignore pattern> ...]

sft_grid/stages/post_training.py runs these with the cell's backend python (DeepSpeed, huggingface_hub and
transformers are installed there, never in the orchestrator). Each prints one JSON line: {"ok": true, ...} or
{"ok": false, "error": "<exception type>: <message>"}, and exits 0 or 1, so the orchestrator can record a
reason that names the cause instead of a traceback. Credentials come from the environment only
(HF_TOKEN or the user's `hf auth login`), never from an argument.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any


def consolidate(ckpt_dir: str, out_dir: str) -> dict[str, Any]:
    """ZeRO shards (global_stepN/, named by the `latest` file) -> safetensors weights in out_dir."""
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    convert_zero_checkpoint_to_fp32_state_dict(ckpt_dir, out_dir, safe_serialization=True)
    written = sorted(
        f
        for f in os.listdir(out_dir)
        if f.startswith("model") and f.endswith((".safetensors", ".safetensors.index.json"))
    )
    return {"files": written}


def fetch(base: str, name: str, dest: str) -> dict[str, Any]:
    """One file of the base model: from its directory, or from the hub (its cache when offline)."""
    if os.path.isdir(base):
        source = os.path.join(base, name)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{name} is not in the base model directory {base}")
    else:
        from huggingface_hub import hf_hub_download

        source = hf_hub_download(repo_id=base, filename=name)
    shutil.copyfile(source, os.path.join(dest, name))
    return {"source": source}


def upload(folder: str, repo_id: str, message: str, *ignore: str) -> dict[str, Any]:
    """Upload, then verify: every file the upload sent is in the commit, with its size (else an error, so the
    stage fails and the cleanup after it never runs)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    api.create_repo(repo_id, repo_type="model", exist_ok=True)
    commit = api.upload_folder(
        folder_path=folder,
        repo_id=repo_id,
        repo_type="model",
        commit_message=message,
        ignore_patterns=list(ignore) or None,
    )
    oid = getattr(commit, "oid", None) or str(commit)
    local = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            local[os.path.relpath(path, folder).replace(os.sep, "/")] = os.path.getsize(path)
    sent = set(filter_repo_objects(list(local), ignore_patterns=list(ignore) or None))
    remote = {f.path: getattr(f, "size", None) for f in api.list_repo_tree(repo_id, revision=oid, recursive=True)}
    wrong = sorted(p for p in sent if remote.get(p) != local[p])
    if wrong:
        raise RuntimeError(
            f"uploaded to {repo_id} at {oid}, but {len(wrong)} file(s) are missing there or differ in"
            f" size: {', '.join(wrong[:5])}"
        )
    # the Hub the client talks to (HF_ENDPOINT where a site or a test sets one)
    return {"url": f"{api.endpoint}/{repo_id}", "commit": oid, "verified": len(sent)}


def main(argv: list[str]) -> int:
    kind, *args = argv
    try:
        stages: dict[str, Callable[..., dict[str, Any]]] = {
            "consolidate": consolidate,
            "fetch": fetch,
            "upload": upload,
        }
        result = stages[kind](*args)
    except Exception as exc:  # reported as data: the orchestrator writes it into the cell's ledger
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"}))
        return 1
    print(json.dumps({"ok": True, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
