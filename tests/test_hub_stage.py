"""Staging Hub repos into an HF cache, with the real huggingface_hub client against the loopback hub.

Each test states the behaviour a user relies on: what lands in the cache loads offline, a pinned sha keeps
giving the old files, a killed or cut transfer continues without fetching finished files again, staging
refuses early when the disk or the time limit cannot hold it, access problems name the repo and the fix, and
two grids staging one repo share the work. Whether a partial file continues after kill -9 (huggingface_hub 1.17
continues it with a Range request; other clients start it again) is asserted from what happened, and staging is
held to remember it for the endpoint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sft_grid.core.hubcache import read_listing
from sft_grid.stages.staging import (
    Budget,
    BudgetExceeded,
    GatedRepo,
    NotEnoughSpace,
    RepoNotFound,
    RevisionNotFound,
    TokenRequired,
    TransferFailed,
    UnexpectedAnswer,
    download,
    is_complete,
    last_rate,
    memory,
    plan,
    resolve,
    snapshot_path,
)
from sft_grid.stages.staging.client import client_version
from tests.hubserver import spawn
from tests.hubtools import (
    DATASET_NEEDED,
    MODEL_NEEDED,
    MiB,
    child_result,
    dataset_files,
    model_files,
    safetensors_header,
    stage_in_child,
    tiny_asset,
    venv_python,
    wait_for,
)

pytest_plugins = ["tests.hub_fixtures"]  # fixtures: hub, cache, hf_env


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _fetched_paths(hub, repo: str) -> list[str]:
    return [r["path"].split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests(f"/{repo}/resolve/", "GET")]


def test_model_is_staged_without_junk_and_loads_offline(hub, cache):
    files = model_files()
    sha = hub.store.commit("org/tiny", files)
    progress = []
    staged = download("org/tiny", "model", "main", cache, endpoint=hub.url, on_progress=progress.append)

    assert staged.complete and staged.sha == sha and not staged.offline
    assert staged.path == snapshot_path(cache, "org/tiny", "model", sha)
    assert {str(p.relative_to(staged.path)) for p in staged.path.rglob("*") if p.is_file()} == MODEL_NEEDED
    assert sorted(_fetched_paths(hub, "org/tiny")) == sorted(MODEL_NEEDED)  # junk never requested
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == sha
    assert progress[-1].done == progress[-1].total == sum(len(files[p]) for p in MODEL_NEEDED)
    assert progress[-1].files_done == len(MODEL_NEEDED)

    hub.stop()  # from here on, nothing can come from the network
    from huggingface_hub import hf_hub_download
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(hf_hub_download("org/tiny", "tokenizer.json", cache_dir=cache, local_files_only=True))
    assert tok.encode("hello world").ids == [3, 4]
    config = json.loads(
        Path(hf_hub_download("org/tiny", "config.json", cache_dir=cache, local_files_only=True)).read_text()
    )
    assert config["model_type"] == "llama"
    weights = staged.path / "model.safetensors"
    assert safetensors_header(weights)["w"]["dtype"] == "F32"
    assert _sha256(weights) == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert is_complete(cache, "org/tiny", "model", sha, checksums=True)


def test_dataset_is_staged_with_data_and_card_only(hub, cache):
    files = dataset_files()
    sha = hub.store.commit("org/chat", files, kind="dataset")
    staged = download("org/chat", "dataset", "main", cache, endpoint=hub.url)

    assert staged.complete and staged.path == cache / "datasets--org--chat" / "snapshots" / sha
    assert {str(p.relative_to(staged.path)) for p in staged.path.rglob("*") if p.is_file()} == DATASET_NEEDED
    rows = [json.loads(line) for line in (staged.path / "data/train.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and rows[0]["messages"][0] == {"role": "user", "content": "hello 0"}
    assert "data_files" in (staged.path / "README.md").read_text()


def test_allow_patterns_narrow_a_dataset_but_keep_its_card(hub, cache):
    hub.store.commit("org/chat", dataset_files(), kind="dataset")
    staged = download("org/chat", "dataset", "main", cache, endpoint=hub.url, allow=["data/*.jsonl"])
    assert set(staged.fetched) == {"README.md", "data/train.jsonl"}
    assert is_complete(cache, "org/chat", "dataset", staged.sha, allow=["data/*.jsonl"])
    assert not is_complete(cache, "org/chat", "dataset", staged.sha)  # the csv is still missing


def test_pinned_sha_keeps_old_files_and_needs_no_network(hub, cache):
    old = hub.store.commit("org/tiny", model_files(seed=1))
    first = download("org/tiny", "model", "main", cache, endpoint=hub.url)
    new = hub.store.commit("org/tiny", model_files(seed=2))  # main moves on
    assert first.sha == old != new

    before = len(hub.requests())
    again = download("org/tiny", "model", old, cache, endpoint=hub.url)
    assert again.offline and again.complete and len(hub.requests()) == before  # not one request
    assert json.loads((again.path / "config.json").read_text())["seed"] == 1

    latest = download("org/tiny", "model", "main", cache, endpoint=hub.url)
    assert latest.sha == new and json.loads((latest.path / "config.json").read_text())["seed"] == 2
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == new
    # The old snapshot is untouched, and the sha still stages from a fresh cache while the hub has it.
    assert json.loads((snapshot_path(cache, "org/tiny", "model", old) / "config.json").read_text())["seed"] == 1
    fresh = download("org/tiny", "model", old, cache.with_name("fresh"), endpoint=hub.url)
    assert fresh.complete and json.loads((fresh.path / "config.json").read_text())["seed"] == 1

    hub.store.delete_revision("org/tiny", old)
    assert download("org/tiny", "model", old, cache, endpoint=hub.url).offline  # staged here: still fine
    with pytest.raises(RevisionNotFound) as e:
        download("org/tiny", "model", old, cache.with_name("other"), endpoint=hub.url)
    assert old in str(e.value) and "not staged in" in str(e.value) and "org/tiny" in str(e.value)


def test_blobs_shared_with_another_commit_are_linked_not_fetched(hub, cache):
    files = model_files(weights_mib=1)
    hub.store.commit("org/tiny", files)
    download("org/tiny", "model", "main", cache, endpoint=hub.url)
    hub.clear_log()
    sha2 = hub.store.commit("org/tiny", {**files, "config.json": b'{"model_type": "llama", "v": 2}'})
    staged = download("org/tiny", "model", "main", cache, endpoint=hub.url)
    assert staged.sha == sha2 and staged.fetched == ("config.json",)
    assert _fetched_paths(hub, "org/tiny") == ["config.json"]
    assert is_complete(cache, "org/tiny", "model", sha2, checksums=True)


def _big_repo(hub, size_mib: int = 6) -> tuple[str, dict[str, bytes]]:
    files = {**model_files(weights_mib=size_mib)}
    return hub.store.commit("org/big", files), files


def _partial(cache: Path) -> int:
    return sum(p.stat().st_size for p in (cache / "models--org--big" / "blobs").glob("*.incomplete"))


def test_killed_stager_reruns_without_refetching_finished_files(hub, cache):
    sha, files = _big_repo(hub)
    others = sorted(MODEL_NEEDED - {"model.safetensors"})
    # 1 MiB/s: the kill below comes after 2 of the 6 MiB, with 4 s to spare before the file would be complete (the
    # test's poll can be starved for a while on a loaded 2-core machine)
    hub.throttle(1 * MiB, path="model.safetensors")
    child = stage_in_child(hub.url, cache, "org/big")
    try:
        # kill -9 once every other file is complete in the cache (they are small and unthrottled, but on a loaded
        # machine the client's threads may finish them late) and the weights are partly sent, at least 2 MiB of
        # them on disk
        snapshot = cache / "models--org--big" / "snapshots" / sha

        def partly_sent() -> bool:
            assert child.poll() is None, f"the stager ended early:\n{child.communicate()[1][-3000:]}"
            sent = [r["bytes_sent"] for r in hub.downloads("org/big", "model.safetensors", live=True)]
            return (
                any(n >= 2 * MiB for n in sent)
                and all((snapshot / p).is_file() for p in others)
                and (cache / "models--org--big" / "blobs").is_dir()
                and _partial(cache) >= 2 * MiB
            )

        wait_for(partly_sent, "the weights to be partly downloaded", 60, 0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    on_disk = _partial(cache)
    hub.clear_faults()
    staged = download("org/big", "model", "main", cache, endpoint=hub.url)

    assert staged.complete and staged.fetched == ("model.safetensors",)
    fetched = _fetched_paths(hub, "org/big")
    assert all(fetched.count(p) == 1 for p in MODEL_NEEDED - {"model.safetensors"})  # finished: never again
    assert fetched.count("model.safetensors") == 2
    first, rerun = hub.downloads("org/big", "model.safetensors")
    assert first["aborted"]
    seen = memory.seen(cache, hub.url, client_version())
    assert seen is not None and seen.resumes == (rerun["status"] == 206)  # what happened is what is remembered
    if rerun["status"] == 206:  # huggingface_hub 1.17: continues the partial file
        assert rerun["range"] == f"bytes={on_disk}-"
        assert rerun["bytes_sent"] == len(files["model.safetensors"]) - on_disk
    else:  # a client that writes each attempt to a file of its own starts over
        assert rerun["status"] == 200 and rerun["range"] is None
    assert is_complete(cache, "org/big", "model", sha, checksums=True)
    assert _sha256(staged.path / "model.safetensors") == hashlib.sha256(files["model.safetensors"]).hexdigest()


@pytest.mark.parametrize("times", [1, None], ids=["once", "every-response"])
def test_connection_cut_mid_file_is_resumed_in_the_same_run(hub, cache, times):
    sha, _files = _big_repo(hub)
    hub.drop_after(int(2.5 * MiB), path="model.safetensors", times=times)
    staged = download("org/big", "model", "main", cache, endpoint=hub.url)

    assert staged.complete and is_complete(cache, "org/big", "model", sha, checksums=True)
    gets = hub.downloads("org/big", "model.safetensors")
    assert gets[0]["aborted"] and gets[0]["bytes_sent"] == int(2.5 * MiB)
    starts = [int(g["range"].split("=")[1].rstrip("-")) for g in gets[1:]]
    assert all(g["status"] == 206 for g in gets[1:]) and starts == sorted(starts) and starts[0] > 0
    assert gets[-1]["aborted"] is False
    if times == 1:
        assert len(gets) == 2
    else:
        assert len(gets) >= 3 and all(g["aborted"] for g in gets[:-1])


@pytest.mark.filterwarnings("ignore:Not enough free disk space")  # the client's own warning, last case only
def test_not_enough_space_is_refused_before_any_transfer(hub, small_fs):
    mnt = small_fs
    hub.store.commit("org/small", model_files(weights_mib=0.5))
    assert download("org/small", "model", "main", mnt / "cache", endpoint=hub.url, reserve_bytes=0).complete
    hub.store.commit("org/big", model_files(weights_mib=6))
    with pytest.raises(NotEnoughSpace) as e:
        download("org/big", "model", "main", mnt / "cache", endpoint=hub.url, reserve_bytes=0)
    msg = str(e.value)
    assert "org/big" in msg and "6.29 MB" in msg and "free" in msg and "HF_HUB_CACHE" in msg
    assert hub.downloads("org/big", "model.safetensors") == []
    p = plan(resolve("org/big", endpoint=hub.url), mnt / "cache", reserve_bytes=0)
    assert not p.fits and p.free_bytes < 4 * MiB < p.bytes_to_fetch
    # Space taken by someone else after the check: the write fails, and the error says so.
    with pytest.raises(NotEnoughSpace, match=r"filled up while staging model\.safetensors"):
        download("org/big", "model", "main", mnt / "cache", endpoint=hub.url, reserve_bytes=-8 * MiB)


def test_missing_repo_and_revision(hub, cache):
    hub.store.commit("org/tiny", model_files())
    with pytest.raises(RepoNotFound, match=r"'org/nope'.*check the id"):
        download("org/nope", "model", "main", cache, endpoint=hub.url)
    with pytest.raises(RevisionNotFound, match=r"'v9'.*org/tiny"):
        resolve("org/tiny", "model", "v9", endpoint=hub.url)
    with pytest.raises(RepoNotFound):  # a model id asked for as a dataset
        resolve("org/tiny", "dataset", endpoint=hub.url)


def test_an_answer_that_is_not_json_is_one_error_with_its_url(hub, cache):
    """What no real server here does on its own: a 200 whose body is not JSON where the API promises it."""
    hub.store.commit("org/m", {"config.json": b"{}"}, "model")
    hub.fail(200, contains="/api/models/org/m/revision", close=False)
    with pytest.raises(UnexpectedAnswer) as e:
        download("org/m", cache=cache, endpoint=hub.url)
    assert f"{hub.url}/api/models/org/m/revision/main answered 200 with a body that is not JSON (text/plain" in str(
        e.value
    )
    assert "Fix: run the same command again" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "access, anonymous, other_token",
    [
        ({"token": "granted"}, (TokenRequired, "'org/closed'.*HF_TOKEN"), (RepoNotFound, "token")),
        (
            {"gated": True, "granted": ("granted",)},
            (GatedRepo, "gated and no token was given.*request access"),
            (GatedRepo, "not been granted"),
        ),
    ],
    ids=["private", "gated"],
)
def test_private_and_gated_repos_name_the_fix(hub, cache, access, anonymous, other_token):
    hub.store.create_repo("org/closed", **access)
    hub.store.commit("org/closed", model_files())
    with pytest.raises(anonymous[0], match=anonymous[1]):
        download("org/closed", "model", "main", cache, endpoint=hub.url)
    with pytest.raises(other_token[0], match=other_token[1]):
        resolve("org/closed", endpoint=hub.url, token="someone-else")
    assert download("org/closed", "model", "main", cache, endpoint=hub.url, token="granted").complete


def test_two_stagers_of_one_repo_fetch_each_file_once(hub, cache):
    """Another process stages the repo; this one starts meanwhile, waits for its lock, and finds all done."""
    sha, _ = _big_repo(hub, size_mib=3)
    hub.throttle(3 * MiB, path="model.safetensors")  # the other process holds the lock for about a second
    child = stage_in_child(hub.url, cache, "org/big")
    lock = cache / ".locks" / "sft_grid" / "models--org--big.lock"

    def other_is_transferring() -> bool:
        assert child.poll() is None, f"the other stager ended early:\n{child.communicate()[1][-3000:]}"
        return lock.is_file() and bool(hub.downloads("org/big", "model.safetensors", live=True))

    wait_for(other_is_transferring, "the other stager to hold the lock and transfer", 60, 0.01)
    mine = download("org/big", "model", "main", cache, endpoint=hub.url)
    theirs = child_result(child)

    assert mine.complete and theirs["complete"] and mine.sha == theirs["sha"] == sha
    assert mine.fetched == () and sorted(theirs["fetched"]) == sorted(MODEL_NEEDED)
    assert sorted(_fetched_paths(hub, "org/big")) == sorted(MODEL_NEEDED)  # each file once
    assert is_complete(cache, "org/big", "model", sha, checksums=True)
    assert not lock.exists()  # released by both


def test_budget_stops_cleanly_and_reruns_finish_the_file(hub, cache):
    sha, _ = _big_repo(hub, size_mib=4)
    download("org/big", "model", "main", cache, endpoint=hub.url, allow=["*.json", "*.jinja"])  # small ones first
    # ~4 s for the weights, a run may spend ~2.5 s: several runs, each transferring some, however slow the machine
    # is before its first byte (the loop's bound has room for a machine several times slower)
    hub.throttle(MiB, path="model.safetensors")
    runs = []
    while len(runs) < 40:
        before = _partial(cache)
        gets = len(hub.downloads("org/big", "model.safetensors"))
        try:
            staged = download(
                "org/big", "model", "main", cache, endpoint=hub.url, budget=Budget.from_now(3.0, margin_s=0.5)
            )
        except BudgetExceeded as e:  # a client that starts a cut file again (2.x): seen at the next start, and said
            seen = memory.seen(cache, hub.url, client_version())
            assert runs and seen is not None and not seen.resumes and "this client" in str(e)
            pytest.skip(f"this client starts a cut file again ({seen.why}): no progress within a file across runs")
        runs.append(staged)
        new = hub.downloads("org/big", "model.safetensors")[gets:]
        assert [g["range"] for g in new] in ([], [f"bytes={before}-" if before else None])  # continues the last
        if staged.complete:
            break
        assert "Rerun to continue" in staged.stopped and "partial files resume" in staged.stopped
        assert 0 < staged.remaining_bytes <= 4 * MiB + 4096 and _partial(cache) >= before
    assert runs[-1].complete and len(runs) >= 2
    assert is_complete(cache, "org/big", "model", sha, checksums=True)


def test_file_that_cannot_finish_within_a_run_is_reported_not_retried(hub, cache):
    """Where a cut file restarts from zero (a client that starts each attempt anew, or a server that ignores Range),
    reruns would loop forever on a login node that kills at 4 s."""
    _big_repo(hub, size_mib=12)
    hub.throttle(2 * MiB, path="model.safetensors")  # ~6 s for the file: longer than the run, with room to spare
    budget = Budget.from_now(4.0, margin_s=0.4)
    with pytest.raises(BudgetExceeded) as e:
        download("org/big", "model", "main", cache, endpoint=hub.url, budget=budget, resumable=False)
    msg = str(e.value)
    assert "model.safetensors" in msg and "12.6 MB" in msg and "transfer partition" in msg
    assert budget.left() > 0  # decided from the measured rate, before the limit
    rate = last_rate(cache)
    assert rate is not None and 1 * MiB < rate < 4 * MiB

    hub.clear_log()
    with pytest.raises(BudgetExceeded):  # the next run knows the rate: it does not even start the file
        download(
            "org/big",
            "model",
            "main",
            cache,
            endpoint=hub.url,
            budget=Budget.from_now(4.0, margin_s=0.4),
            resumable=False,
        )
    assert hub.downloads("org/big", "model.safetensors") == []


def test_corrupted_transfer_is_refetched_then_refused(hub, cache):
    sha, files = _big_repo(hub, size_mib=1)
    weights = hub.store.revision("org/big", sha).files["model.safetensors"]
    obj = hub.store.object_path("org/big", "model", weights.sha256)
    obj.write_bytes(b"\0" * obj.stat().st_size)  # the server now sends other bytes than the listing's sha256
    with pytest.raises(TransferFailed, match=r"model\.safetensors.*corrupted twice"):
        download("org/big", "model", "main", cache, endpoint=hub.url)
    assert len(hub.downloads("org/big", "model.safetensors")) == 2
    assert not (snapshot_path(cache, "org/big", "model", sha) / "model.safetensors").exists()  # nothing bad kept
    obj.write_bytes(files["model.safetensors"])
    assert download("org/big", "model", "main", cache, endpoint=hub.url).fetched == ("model.safetensors",)


def test_temporary_files_of_killed_newer_clients_are_cleaned(hub, cache):
    hub.store.commit("org/tiny", model_files())
    blobs = cache / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    old, fresh = blobs / f"{'a' * 64}.1a2b3c4d.incomplete", blobs / f"{'b' * 64}.5e6f7a8b.incomplete"
    for p in (old, fresh):
        p.write_bytes(b"x" * 1000)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    download("org/tiny", "model", "main", cache, endpoint=hub.url)
    assert not old.exists() and fresh.exists()  # a fresh one may belong to a running process


def test_listing_of_a_staged_sha_is_kept_in_the_cache(hub, cache):
    sha = hub.store.commit("org/tiny", model_files())
    download("org/tiny", "model", "main", cache, endpoint=hub.url)
    listed = {f.path for f in read_listing(cache, "org/tiny", "model", sha)}
    assert listed == set(model_files())  # every file of the commit, not only the staged ones
    from huggingface_hub import scan_cache_dir

    report = scan_cache_dir(cache)  # the client's own cache tools still read the cache cleanly
    assert not report.warnings and [r.repo_id for r in report.repos] == ["org/tiny"]


def test_progress_reports_rate_and_eta(hub, cache):
    _big_repo(hub, size_mib=6)
    hub.throttle(6 * MiB, path="model.safetensors")
    seen = []
    download("org/big", "model", "main", cache, endpoint=hub.url, on_progress=seen.append)
    mid = [p for p in seen if p.file == "model.safetensors" and p.rate_bps]
    assert mid, "no progress with a measured rate while the weights were coming"
    # the server sends at most 6 MiB/s: the rate measured is below that (with room for a burst), whatever the
    # machine's speed, and every such line has a time left
    assert all(0 < p.rate_bps < 12 * MiB and p.eta_s is not None for p in mid), [p.rate_bps for p in mid]
    assert all(a.done <= b.done for a, b in itertools.pairwise(seen))
    assert seen[-1].done == seen[-1].total


def _commit_tiny_assets(hub) -> tuple[dict[str, bytes], bytes]:
    model_dir = tiny_asset("models/tiny-llama3")
    model = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file()}
    rows = tiny_asset("data/tiny_messages.jsonl").read_bytes()
    hub.store.commit("org/tiny-llama3", model)
    hub.store.commit(
        "org/tiny-messages", {"data/train.jsonl": rows, "README.md": b"---\nlicense: mit\n---\n"}, kind="dataset"
    )
    return model, rows


def test_tiny_assets_stage_byte_for_byte(hub, cache):
    from tokenizers import Tokenizer

    model, rows = _commit_tiny_assets(hub)
    staged = download("org/tiny-llama3", "model", "main", cache, endpoint=hub.url)
    data = download("org/tiny-messages", "dataset", "main", cache, endpoint=hub.url)
    assert {p: (staged.path / p).read_bytes() for p in model} == model
    assert (data.path / "data/train.jsonl").read_bytes() == rows
    tok = Tokenizer.from_file(str(staged.path / "tokenizer.json"))
    assert tok.token_to_id("<|eot_id|>") is not None
    assert all("messages" in json.loads(line) for line in rows.decode().splitlines())


OFFLINE_LOAD = r"""
import json, sys
import datasets, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model_id, sha, data_dir = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(model_id)  # by repo id: resolved through refs/main in HF_HUB_CACHE
model = AutoModelForCausalLM.from_pretrained(model_id, revision=sha)
enc = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt")
ids = enc["input_ids"] if hasattr(enc, "keys") else enc
with torch.no_grad():
    logits = model(ids).logits
ds = datasets.load_dataset(data_dir, split="train")  # datasets offline: by snapshot path, not by repo id
print(json.dumps({"vocab": logits.shape[-1], "rows": len(ds), "first_role": ds[0]["messages"][0]["role"]}))
"""


@pytest.mark.backend
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_backend_env_loads_staged_repos_offline(hub, cache, tmp_path, backend):
    python = venv_python(backend)
    _commit_tiny_assets(hub)
    model = download("org/tiny-llama3", "model", "main", cache, endpoint=hub.url)
    data = download("org/tiny-messages", "dataset", "main", cache, endpoint=hub.url)
    hub.stop()  # nothing may come from the network
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
    }
    proc = subprocess.run(
        [str(python), "-c", OFFLINE_LOAD, "org/tiny-llama3", model.sha, str(data.path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    config = json.loads((model.path / "config.json").read_text())
    assert out == {"vocab": config["vocab_size"], "rows": 60, "first_role": "system"}


UPLOAD = r"""
import json, sys
import huggingface_hub
from huggingface_hub import HfApi
repo_id, folder = sys.argv[1:3]
api = HfApi()  # HF_ENDPOINT and HF_TOKEN from the environment, as a job's upload stage has them
out = {"version": huggingface_hub.__version__}
for kind in ("model", "dataset"):
    api.create_repo(repo_id, repo_type=kind, exist_ok=True)
    api.create_repo(repo_id, repo_type=kind, exist_ok=True)  # a rerun of the stage: 409, accepted
    out[kind] = api.upload_folder(repo_id=repo_id, folder_path=folder, repo_type=kind).oid
print(json.dumps(out))
"""


@pytest.mark.backend
@pytest.mark.parametrize("backend", ["llamafactory", "axolotl"])
def test_upload_folder_from_backend_env(tmp_path, hf_env, backend):
    """The upload stage of a cell (``HfApi.create_repo`` + ``upload_folder``) with the env's own client, into a
    hub running as its own process (as a Slurm job would reach it), then read back and staged again."""
    python = venv_python(backend)
    folder = tmp_path / "output"
    (folder / "sub").mkdir(parents=True)
    files = {
        "README.md": b"---\nlicense: mit\n---\n# trained\n",
        "sub/trainer_state.json": b'{"step": 4}',
        **{k: v for k, v in model_files(weights_mib=0.5).items() if k in MODEL_NEEDED - {"README.md"}},
    }
    for p, data in files.items():
        (folder / p).write_bytes(data)
    remote = spawn(tmp_path / "hub")
    try:
        env = {**os.environ, "HF_ENDPOINT": remote.url, "HF_TOKEN": "dummy", "HF_HUB_DISABLE_XET": "1"}
        proc = subprocess.run(
            [str(python), "-c", UPLOAD, f"org/{backend}-run", str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        for kind in ("model", "dataset"):
            rev = remote.store.revision(f"org/{backend}-run", "main", kind)
            assert rev.sha == out[kind] and set(rev.files) == set(files)
            assert all(remote.store.read(f"org/{backend}-run", rev.sha, p, kind) == b for p, b in files.items())
        staged = download(f"org/{backend}-run", "model", "main", tmp_path / "cache", endpoint=remote.url)
        assert {p: (staged.path / p).read_bytes() for p in files} == files
    finally:
        remote.stop()


def test_xet_is_off_even_when_the_client_was_imported_first(monkeypatch):
    """huggingface_hub reads HF_HUB_DISABLE_XET once, at its import: staging turns Xet off in the imported module
    too (Xet never continues a cut file), whatever imported the client before (another test, a library)."""
    import huggingface_hub.constants as hc

    from sft_grid.stages.staging.client import hf_client

    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_DISABLE_XET", False)  # as if imported before staging set the variable
    hf_client()
    assert hc.HF_HUB_DISABLE_XET is True
