"""The signs of each failure class in a cell's logs: one table of regular expressions, kept apart from the
rules that weigh them (sft_grid/core/failures.py) so that a new message is one line here.

Design:
- A sign is (class name, tier, pattern). Patterns are searched anywhere in a line, so a prefix added by a
  launcher (`[rank3]:`, `0: `, a timestamp) does not hide a sign.
- The tier says how much a sign decides. Lower tiers win; within a tier the earliest line wins, because
  the first failure observed is the cause and what follows is its echo (ranks timing out on a collective
  after one rank ran out of GPU memory, a launcher re-raising its child's error).
      0  the loss watchdog's own line: the run stopped itself on purpose
      1  root causes: GPU/host out of memory, GPU hardware, disk full, the Hub on an offline node
      2  the scheduler's end: node failure, preemption, time limit, a user's cancel
      3  communication: collective timeouts and rendezvous failures (often the echo of a tier 1 cause)
      4  a NaN/inf loss in the trainer's log (decided by the LAST logged loss, see failures.py)
      5  any other exception: the backend failing on its config or data
- WRAPPERS are exception lines that only carry a child's failure (torchrun's ChildFailedError, a
  CalledProcessError, submitit's FailedJobError, sft_grid's own CellFailed): they never decide a class
  by themselves, though a sign inside their message still counts.
- Attempt markers split a log into the attempts of a requeued cell (see failures.split_attempts).
Class names are FailureClass values; failures.py checks at import that every one here exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WATCHDOG, ROOT, SCHEDULER, COMM, LOSS, EXCEPTION = range(6)


@dataclass(frozen=True)
class Sign:
    klass: str
    tier: int
    pattern: re.Pattern[str]


def _sign(klass: str, tier: int, regex: str) -> Sign:
    return Sign(klass, tier, re.compile(regex, re.IGNORECASE))


SIGNS: tuple[Sign, ...] = (
    # the loss watchdog (sft_grid/in_venv/loss_watchdog.py) prints exactly one such line when it stops a run
    _sign("nan_loss", WATCHDOG, r"sft_grid watchdog: nan_loss\b"),
    _sign("diverged", WATCHDOG, r"sft_grid watchdog: diverged\b"),
    # GPU memory (PyTorch >= 2.5 raises torch.OutOfMemoryError, older torch.cuda.OutOfMemoryError; NCCL and
    # raw CUDA calls report it as a CUDA failure)
    _sign("gpu_oom", ROOT, r"\b(CUDA|HIP) out of memory\b"),
    _sign("gpu_oom", ROOT, r"\bOutOfMemoryError\b"),
    _sign("gpu_oom", ROOT, r"CUDA error: out of memory|Cuda failure '?out of memory"),
    _sign("gpu_oom", ROOT, r"CUBLAS_STATUS_ALLOC_FAILED"),
    # host memory: the cgroup OOM killer as slurmstepd (new and old wording) and srun report it
    _sign("host_oom", ROOT, r"Detected \d+ oom[-_]kill event"),
    # jobacct_gather's OverMemoryKill (no cgroup): the step is cancelled, the job FAILED, this is the only trace
    _sign("host_oom", ROOT, r"exceeded memory limit \(\d+ > \d+\), being killed|Exceeded (job|step) memory limit"),
    _sign("host_oom", ROOT, r"srun: error: \S+: task \d+: Out Of Memory"),
    _sign("host_oom", ROOT, r"^\s*(\[rank\d+\]:\s*)?MemoryError\b"),
    _sign("host_oom", ROOT, r"Cannot allocate memory \(errno 12\)|\[Errno 12\] Cannot allocate memory"),
    # GPU hardware: driver Xid events, ECC, lost devices, faults the kernel reports for the device
    _sign("gpu_hardware", ROOT, r"\bXid\b[^\n]{0,40}\d"),
    _sign("gpu_hardware", ROOT, r"uncorrectable ECC error|ECC error encountered|uncorrectable NVLink error"),
    _sign("gpu_hardware", ROOT, r"an illegal memory access was encountered"),
    _sign("gpu_hardware", ROOT, r"unspecified launch failure"),
    _sign("gpu_hardware", ROOT, r"GPU has fallen off the bus|GPU is lost|No CUDA GPUs are available"),
    _sign("gpu_hardware", ROOT, r"CUDA-capable device\(s\) is/are busy or unavailable"),
    # disk: ENOSPC and EDQUOT, and torch.save's symptoms of a short write
    # torch.save's stream on a full disk (measured: a tmpfs filled by checkpoints); the rest of the traceback
    # is often lost, since the log cannot grow either
    _sign("disk_full", ROOT, r"RuntimeError: basic_ios::clear: iostream error"),
    _sign("disk_full", ROOT, r"\[Errno 28\]|No space left on device|StorageFull"),
    _sign("disk_full", ROOT, r"\[Errno 122\]|Disk quota exceeded|\bEDQUOT\b"),
    _sign("disk_full", ROOT, r"PytorchStreamWriter failed writing file"),
    _sign("disk_full", ROOT, r"Not enough disk space\. Needed"),  # datasets, before preparing a cache
    _sign("disk_full", ROOT, r"inline_container\.cc.*unexpected pos"),
    # the Hub from a node without internet (huggingface_hub, transformers and datasets wordings)
    _sign("offline_hub", ROOT, r"\bOfflineModeIsEnabled\b|offline mode is enabled"),
    _sign("offline_hub", ROOT, r"We couldn't connect to 'https?://huggingface\.co'"),
    _sign("offline_hub", ROOT, r"\bLocalEntryNotFoundError\b|outgoing traffic has been disabled"),
    _sign("offline_hub", ROOT, r"Couldn't reach '[^']+' on the Hub"),
    _sign("offline_hub", ROOT, r"host='?(huggingface\.co|hf\.co|cdn-lfs[\w.-]*\.hf\.co)'?.*"
                               r"(Max retries exceeded|Failed to establish|Name or service not known)"),
    # the scheduler's end, as slurmstepd, srun and submitit write it in the job's own log
    _sign("time_limit", SCHEDULER, r"CANCELLED AT \S+ DUE TO TIME LIMIT"),
    _sign("time_limit", SCHEDULER, r"Job not requeued because: timed-out too many times"),
    _sign("time_limit", SCHEDULER, r"this job is timed-out\b"),
    _sign("preempted", SCHEDULER, r"CANCELLED AT \S+ DUE TO PREEMPTION"),
    _sign("preempted", SCHEDULER, r"this job is preempted\b"),
    _sign("node_failure", SCHEDULER, r"CANCELLED AT \S+ DUE TO NODE FAIL"),
    _sign("node_failure", SCHEDULER, r"srun: error: Node failure on \S+"),
    _sign("node_failure", SCHEDULER, r"Prolog error on node|launch failed requeued held"),
    # a plain "*** JOB 12 ON n1 CANCELLED AT <time> ***" (no DUE TO ...) is a scancel; a STEP's is not (srun ends a
    # step that way when one of its tasks failed: --kill-on-bad-exit, measured on the local cluster)
    _sign("cancelled", SCHEDULER, r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+( by \S+)? \*\*\*"),
    # collectives that never completed (NCCL's watchdog, gloo, the heartbeat monitor)
    _sign("collective_timeout", COMM, r"Watchdog caught collective operation timeout"),
    _sign("collective_timeout", COMM, r"\bWorkNCCL\(.*\) ran for \d+ milliseconds before timing out"),
    _sign("collective_timeout", COMM, r"Heartbeat monitor timed out"),
    _sign("collective_timeout", COMM, r"Some NCCL operations have failed or timed out"),
    _sign("collective_timeout", COMM, r"gloo.*Timed out waiting \d+ms for (recv|send) operation"),
    _sign("collective_timeout", COMM, r"remote process exited or there was a network error|ncclRemoteError"),
    # gloo (CPU) in torch 2.13: its pair's read failed because a peer rank crashed, hung or left
    _sign("collective_timeout", COMM, r"This is typically caused by a remote worker (crashing|hanging)"),
    _sign("collective_timeout", COMM, r"gloo/transport/tcp/pair\.cc:\d+\].*(Connection (closed|reset) by peer|Read error)"),
    # rendezvous and ports: torchrun/c10d stores, accelerate's port, EADDRINUSE
    _sign("rendezvous", COMM, r"\bEADDRINUSE\b|Address already in use"),
    _sign("rendezvous", COMM, r"\bRendezvous\w*(Error|Timeout)\b|RendezvousClosedError"),
    _sign("rendezvous", COMM, r"\bDistStoreError\b|\bDistNetworkError\b"),
    _sign("rendezvous", COMM, r"The (client|server) socket has failed to (connect|listen|bind)"),
    _sign("rendezvous", COMM, r"retrieving ncclUniqueId .* via c10d key-value store"),
    _sign("rendezvous", COMM, r"Timed out after \d+ seconds waiting for clients"),
    _sign("rendezvous", COMM, r"on port `?\d+`?, but another process is utilizing it"),  # accelerate
    # DeepSpeed's fp16 loss scaler gives up once gradients overflow at every scale: the loss is gone
    _sign("nan_loss", LOSS, r"Current loss scale already at minimum"),
    # CUDA device-side asserts are almost always data (a label or token id outside the vocabulary)
    _sign("backend_error", EXCEPTION, r"device-side assert triggered"),
)

# Exception lines: `Type: message` (also `Type` alone), possibly after a rank or srun label.
EXCEPTION_LINE = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*|\d+:\s*)?(?P<type>[A-Za-z_][\w.]*(?:Error|Exception))(?::\s.*|:?\s*$)")

# Python's words between the exceptions of one chain (raise ... from ..., or an error while handling one).
CHAINED = re.compile(r"The above exception was the direct cause of the following exception|"
                     r"During handling of the above exception, another exception occurred")

# Exceptions that only re-raise a child's failure: never the cause themselves.
WRAPPERS = re.compile(
    r"ChildFailedError|CalledProcessError|FailedJobError|UncompletedJobError|CellFailed|SignalException"
    r"|torch\.distributed\.elastic|subprocess\.|\bSystemExit\b|KeyboardInterrupt")

# A logged loss, in Python dict (HF Trainer's print) or JSON (trainer_log.jsonl) spelling; the key is
# exactly "loss" (not train_loss, eval_loss).
LOSS_VALUE = re.compile(r"""['"]loss['"]\s*:\s*['"]?(?P<value>[-+]?[\w.]+)""")

# Lines that start a new attempt of the cell (sft_grid's runner marker; submitit starting a job) and lines
# that end one (a requeue). A requeued cell's log holds every attempt, oldest first.
ATTEMPT_START = re.compile(r"^=== sft_grid: |submitit INFO \(.*\) - Starting with JobEnvironment")
ATTEMPT_END = re.compile(r"Requeued job \S+ \(\d+ remaining timeouts\)|DUE TO JOB REQUEUE")

# With no sign at all, the first line like these is the best evidence left (a crash, a kill, an exit).
UNKNOWN_HINT = re.compile(r"Segmentation fault|Bus error|\bAborted\b|core dumped|\bKilled\b|Signal \d+ \(SIG\w+\)"
                          r"|[Ee]xit(ed with exit)? code [1-9]|exitcode\s*:\s*-?[1-9]|\berror\b", re.IGNORECASE)

# Where a line names the node it is about.
NODE_FAILED = re.compile(r"Node failure on (?P<node>[\w.-]+)")
NODE_IN_LINE = (
    NODE_FAILED,
    re.compile(r"srun: error: (?P<node>[\w.-]+): task \d+"),
    re.compile(r"(?P<node>[\w.-]+) kernel: (\[[\d. ]+\] )?NVRM: Xid"),
    re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?P<node>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\]"),  # NCCL's host:pid:tid [dev]
    re.compile(r"Prolog error on node (?P<node>[\w.-]+)"),
)
# torchrun's failure summary names the host of the first failed rank
ROOT_CAUSE_HOST = re.compile(r"^\s*host\s*:\s*(?P<node>[\w.-]+)\s*$")
