"""The signs of each failure class in a cell's logs: one table of regular expressions, kept apart from the rules
that weigh them (classify.py), so that a new wording is one line here.

Design:
- A sign is (class, tier, pattern[, rank][, running]). Patterns are searched anywhere in a line, so a prefix a
  launcher adds (`[rank3]:`, `[default0]:`, `0: `, a timestamp, a host) does not hide a sign.
- A sign is a family's wording across the versions people run, not one log's text: each comment says which
  tool writes it and since when, where the wording changed.
- The tier says how much a sign decides. Lower tiers win; within a tier a sign on a message line beats one on
  a quoted source line, then the lower rank wins (the scheduler's own record before a launcher's echo of it),
  then the earliest line (the first failure observed is the cause, later ones its echo):
      0  the loss watchdog's own line: the run stopped itself on purpose
      1  root causes: GPU/host/shared memory exhausted, GPU hardware, disk full, the Hub out of reach, an input the grid
         builds before the cell not there when it started
      2  the scheduler's end: node failure, preemption, time limit, a user's cancel
      3  communication: collective failures and rendezvous failures (often the echo of a tier 1 cause); then
         (rank 3) a launcher saying a process died of SIGKILL that nothing above explains: the kernel's memory
         kill (host_oom). Below a failed collective on purpose: a rank killed from outside (a person, a health
         check) leaves its peers' collectives failing, a transient fault to requeue (test_triage_faults)
      4  the loss: NaN/inf, a loss scaler at its floor (the last logged loss decides, see classify.py), a
         trainer's own guard stopping on a loss it calls not finite
      5  named failures of the run itself: the backend refusing its config or data (backend_error, only on
         such positive evidence) and software faults no rule pins on the user or the machine (unknown)
- `running`: a network sign that means a rendezvous while the process group is being set up, and a failed
  collective once it runs (NCCL's refused connections and system errors happen in both).
- Hardware vs software: only the device or the driver saying so (Xid, ECC, a GPU off the bus or unusable at
  start-up) is hardware. An illegal memory access, a launch failure or CUDA's "unknown error" with no such sign
  is a software fault until proven otherwise: `unknown`, and no node is excluded.
- WRAPPERS are exception lines that only carry a child's failure (torchrun's ChildFailedError, a
  CalledProcessError, submitit's FailedJobError, sft_grid's own CellFailed, mp.spawn's): they never decide a
  class by themselves, though a sign inside their message still counts.
- Another tool's label decides nothing unless the scheduler's record agrees: submitit's "this job is
  preempted" is its guess from a signal's timing (80% of the time limit), so it is no sign (slurmstepd's DUE TO
  PREEMPTION is). The timing itself is: a signal many minutes before the time limit cannot be the limit's
  warning (SUBMITIT_TIMING, weighed in classify.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sft_grid.core.failures.classes import FailureClass as F

WATCHDOG, ROOT, SCHEDULER, COMM, LOSS, EXCEPTION = range(6)


@dataclass(frozen=True)
class Sign:
    klass: F
    tier: int
    pattern: re.Pattern[str]
    rank: int = 0  # within a tier: lower first (a stronger wording of the same event)
    running: F | None = None  # the class once the process group runs (see the module's docstring)
    # the sign says nothing when an earlier line of the attempt matches this (it is that line's consequence)
    unless_after: re.Pattern[str] | None = None


def _sign(klass: F, tier: int, regex: str, rank: int = 0, running: F | None = None, unless_after: str = "") -> Sign:
    return Sign(
        klass,
        tier,
        re.compile(regex, re.IGNORECASE),
        rank,
        running,
        re.compile(unless_after, re.IGNORECASE) if unless_after else None,
    )


SIGNS: tuple[Sign, ...] = (
    # the loss watchdog (sft_grid/in_venv/loss_watchdog.py) prints exactly one such line when it stops a run
    _sign(F.NAN_LOSS, WATCHDOG, r"sft_grid watchdog: nan_loss\b"),
    _sign(F.DIVERGED, WATCHDOG, r"sft_grid watchdog: diverged\b"),
    # -- GPU memory: torch >= 2.5 raises torch.OutOfMemoryError, 1.13-2.4 torch.cuda.OutOfMemoryError, older a
    # RuntimeError ("CUDA out of memory. Tried to allocate"); NCCL and raw CUDA calls report it as a CUDA failure
    _sign(F.GPU_OOM, ROOT, r"\b(CUDA|HIP) out of memory\b"),
    _sign(F.GPU_OOM, ROOT, r"\bOutOfMemoryError\b"),
    _sign(F.GPU_OOM, ROOT, r"CUDA error: out of memory|Cuda failure '?out of memory|cudaErrorMemoryAllocation"),
    _sign(F.GPU_OOM, ROOT, r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"),
    # -- host memory. Slurm's cgroup OOM killer as slurmstepd writes it (<= 21.08 "oom-kill event(s) in step X
    # cgroup", >= 22.05 "oom_kill event(s) in StepId=X") and srun ("task 0:", "tasks 1-3:")
    _sign(F.HOST_OOM, ROOT, r"Detected \d+ oom[-_]kill event"),
    _sign(F.HOST_OOM, ROOT, r"srun: error: \S+: tasks? [\d,-]+: Out Of Memory"),
    # jobacct_gather's OverMemoryKill (no cgroup): the step is cancelled, the job FAILED, this is the only trace
    _sign(F.HOST_OOM, ROOT, r"exceeded memory limit \(\d+ > \d+\), being killed|Exceeded (job|step) memory limit"),
    # the kernel's own OOM killer (dmesg, syslog, an epilog's copy): "Out of memory: Kill process N (x) score
    # or sacrifice child" (<= 5.0), "Out of memory: Killed process N (x)" (>= 5.1), the memory cgroup's variants,
    # and the old second line; the report's first lines name the allocator, not the victim (a weaker rank)
    _sign(F.HOST_OOM, ROOT, r"(Memory cgroup )?Out of memory( \(oom_kill_allocating_task\))?: Kill(ed)? process \d+"),
    _sign(F.HOST_OOM, ROOT, r"\bKilled process \d+ \(.*\) total-vm"),
    _sign(F.HOST_OOM, ROOT, r"\binvoked oom-killer\b|\boom-kill:constraint=|\boom_reaper: reaped process", rank=1),
    # Python and C++ allocations that failed
    _sign(F.HOST_OOM, ROOT, r"^\s*(\[\w+\]:\s*|\d+:\s*)?MemoryError\b|\bstd::bad_alloc\b"),
    _sign(F.HOST_OOM, ROOT, r"Cannot allocate memory \(errno 12\)|\[Errno 12\] Cannot allocate memory"),
    _sign(F.HOST_OOM, ROOT, r"DefaultCPUAllocator: (can't allocate memory|not enough memory)"),
    # Kubernetes: the kubelet evicting a pod for memory, a container's OOMKilled reason
    _sign(F.HOST_OOM, ROOT, r"The node was low on resource: memory|\bOOMKilled\b"),
    # -- GPU hardware: the driver's Xid events (kernel log), ECC (torch 1.x THC "cuda runtime error (39)",
    # torch 2.x "CUDA error: uncorrectable ECC error encountered", CUDA_ERROR_ECC_UNCORRECTABLE from TF/JAX), a
    # GPU off the bus or lost, and a device that is unusable at start-up (THC "error=46", torch 2.x "is/are busy")
    _sign(F.GPU_HARDWARE, ROOT, r"\bXid\b[^\n]{0,40}\d"),
    _sign(
        F.GPU_HARDWARE,
        ROOT,
        r"uncorrectable ECC error|ECC error encountered|ECC_UNCORRECTABLE|"
        r"cudaErrorECCUncorrectable|uncorrectable NVLink error",
    ),
    _sign(F.GPU_HARDWARE, ROOT, r"fallen off the bus|GPU is lost|No CUDA GPUs are available|RmInitAdapter failed"),
    _sign(
        F.GPU_HARDWARE,
        ROOT,
        r"CUDA-capable device\(s\) is/are busy or unavailable|"
        r"all CUDA-capable devices are busy or unavailable|cudaErrorDevicesUnavailable",
    ),
    # CUDA that cannot even initialise on the node (the driver's state or version: torch's "CUDA unknown error -
    # this may be due to an incorrectly set up environment", "Unexpected error from cudaGetDeviceCount()", the CUDA
    # samples' "cudaGetDeviceCount returned 999"): a node's fault at start-up, unlike a kernel's fault mid-run
    _sign(
        F.GPU_HARDWARE,
        ROOT,
        r"CUDA unknown error - this may be due to an incorrectly set up environment|"
        r"Unexpected error from cudaGetDeviceCount\(\)|cudaGetDeviceCount returned \d+",
    ),
    # -- shared memory (/dev/shm), which the data loader's workers hand their batches through, as torch words its end:
    # the worker's own SIGBUS handler (0.4-2.x "ERROR: Unexpected bus error encountered in worker. This might be
    # caused by insufficient shared memory (shm)."), the main process's account of it (1.x-2.x "... is killed by
    # signal: Bus error. It is possible that dataloader's workers are out of shared memory"; older torch names the
    # signal alone, which says nothing of shm: see `unknown` below), and a tensor's /torch_ file that cannot be
    # written (0.4 "unable to write to file </torch_N_M> at .../THAllocator.c:383", 1.x without errno, 2.x with
    # "No space left on device (28)", 2.x's MapAllocator "unable to allocate shared memory(shm) for file </torch_").
    # Before the disk's signs: that ENOSPC is /dev/shm's, which freeing disk space does not help
    _sign(
        F.SHM_FULL,
        ROOT,
        r"Unexpected bus error encountered in worker|dataloader's workers are out of shared memory|"
        r"unable to (write to|allocate shared memory\(shm\) for) file </torch_",
    ),
    # -- disk: ENOSPC and EDQUOT as Python, Rust (safetensors) and Windows say them, and the symptoms of a short
    # write: torch.save's zip writer (1.6+: "unexpected pos", 1.10+: "PytorchStreamWriter failed writing"), its
    # stream (measured: a tmpfs filled by checkpoints; the rest of the traceback is often lost, since the log
    # cannot grow either), and old torch's legacy writer ("write(): fd N failed with Input/output error")
    _sign(F.DISK_FULL, ROOT, r"\[Errno 28\]|No space left on device|StorageFull|\bENOSPC\b"),
    _sign(F.DISK_FULL, ROOT, r"\[Errno 122\]|Disk quota exceeded|\bEDQUOT\b"),
    _sign(F.DISK_FULL, ROOT, r"There is not enough space on the disk|No usable temporary directory found"),
    _sign(F.DISK_FULL, ROOT, r"RuntimeError: basic_ios::clear: iostream error"),
    _sign(F.DISK_FULL, ROOT, r"PytorchStreamWriter failed writing|inline_container\.cc.*unexpected pos"),
    _sign(F.DISK_FULL, ROOT, r"\bwrite\(\): fd \d+ failed with|write error: wrote \d+ blocks instead of \d+"),
    # datasets checks free space before it prepares a cache; huggingface_hub before a download
    _sign(F.DISK_FULL, ROOT, r"Not enough disk space\. Needed|Not enough free disk space to download"),
    # -- the Hub out of reach: huggingface_hub (OfflineModeIsEnabled, LocalEntryNotFoundError in
    # utils._errors (0.x) and errors (0.2x, 1.x), both wordings), transformers (2.x-4.2x "Connection error,
    # and we cannot find the requested files in the cached path", 4.2x+ "We couldn't connect to '<endpoint>'",
    # with or without a trailing slash, any HF_ENDPOINT), datasets (1.x "Couldn't reach https://...", 2.x-4.x
    # "Couldn't reach '<id>' on the Hub (<error>)", "... the Hugging Face Hub for dataset"), and the HTTP
    # client's own error naming a Hub host
    _sign(F.OFFLINE_HUB, ROOT, r"\bOfflineModeIsEnabled\b|offline mode is enabled"),
    _sign(F.OFFLINE_HUB, ROOT, r"We couldn[’']t connect to [‘'][^’']+[’'] to load"),
    _sign(F.OFFLINE_HUB, ROOT, r"Connection error, and we cannot find the requested files in the cached path"),
    _sign(F.OFFLINE_HUB, ROOT, r"Couldn[’']t reach server at '[^']+' to download"),
    _sign(
        F.OFFLINE_HUB,
        ROOT,
        r"\bLocalEntryNotFoundError\b|outgoing traffic has been disabled|"
        r"We have no connection or you passed local_files_only",
    ),
    _sign(F.OFFLINE_HUB, ROOT, r"Couldn[’']t reach ([‘'][^’']+[’'] on the Hub|the Hugging Face Hub|https?://)"),
    _sign(
        F.OFFLINE_HUB,
        ROOT,
        r"host='?(huggingface\.co|hf\.co|[\w-]+\.hf\.co|hf-mirror\.com)'?.*"
        r"(Max retries exceeded|Failed to establish|Name or service not known|timed out"
        r"|Temporary failure in name resolution|Network is unreachable)",
    ),
    # transformers' "Can't load tokenizer/config for '<id>'" (every 4.x): none of the files it names could be
    # fetched or found in the cache. For a Hub id that is the Hub out of reach; for a local path (./x, /x, a
    # backslash) it is a directory that lacks them, which no sign decides
    _sign(
        F.OFFLINE_HUB,
        ROOT,
        r"Can[’']t load (the )?(tokenizer|config(uration)?|feature extractor|image processor"
        r"|processor|weights|model) (of |for )[‘'](?![./~])[\w.-]+(/[\w.-]+)?[’']",
    ),
    _sign(F.OFFLINE_HUB, ROOT, r"We assumed '(?![./~])[\w.-]+(/[\w.-]+)?' was a path, a model identifier, or url"),
    # -- an input the grid builds before the cell, not there when the cell's job started: sft_grid's own check at the
    # job's first step (checks/preflight.py, in the runner's CellFailed "preflight: ...") of its tokenized dataset,
    # its model's prepared copy, a staged Hub repository. The grid's order of jobs, not the config or the data
    _sign(
        F.MISSING_INPUT,
        ROOT,
        r"\bis not (built|there|staged in \S+) yet; (it is built|the prep runs|staging runs) before the cell\b",
    ),
    # -- the scheduler's end, as slurmstepd, srun/salloc and submitit write it in the job's own log (Slurm 20-24);
    # slurmstepd's line is the scheduler's own record, srun's a launcher's echo of it (rank 1)
    _sign(F.TIME_LIMIT, SCHEDULER, r"CANCELLED AT \S+ DUE TO TIME LIMIT"),
    # submitit giving up after a time limit: "timed-out too many times" (its requeue budget spent), "timed-out and
    # not checkpointable" (1.1+, raised as UncompletedJobError)
    _sign(F.TIME_LIMIT, SCHEDULER, r"Job not requeued because: timed-out\b", rank=1),
    _sign(F.TIME_LIMIT, SCHEDULER, r"this job is timed-out\b", rank=1),
    _sign(F.PREEMPTED, SCHEDULER, r"CANCELLED AT \S+ DUE TO PREEMPTION"),
    _sign(F.NODE_FAILURE, SCHEDULER, r"CANCELLED AT \S+ DUE TO NODE FAIL"),
    _sign(F.NODE_FAILURE, SCHEDULER, r"STEPD TERMINATED ON \S+ AT \S+ DUE TO JOB NOT ENDING WITH SIGNALS"),
    _sign(F.NODE_FAILURE, SCHEDULER, r"\b(srun|salloc|sbatch)(: error)?: Node failure on \S+", rank=1),
    _sign(F.NODE_FAILURE, SCHEDULER, r"Prolog (error|failure) on node|launch failed requeued held", rank=1),
    _sign(F.NODE_FAILURE, SCHEDULER, r"Task launch for \S+ failed on node \S+", rank=1),
    # srun/salloc on nodes that never booted (power-saved or cloud nodes past ResumeTimeout), after or without its
    # "Node failure on" line
    _sign(
        F.NODE_FAILURE,
        SCHEDULER,
        r"\b(srun|salloc|sbatch)(: error)?: "
        r"(Nodes \S+ are still not ready|Something is wrong with the boot of the nodes)",
        rank=1,
    ),
    # other launchers losing a node: Ray's GCS (0.x "monitor", 1.x+ "detector" missed its heartbeats; 2.5x task
    # errors), Open MPI's ORTE losing its daemon on a node
    _sign(
        F.NODE_FAILURE,
        SCHEDULER,
        r"has been marked dead because the (monitor|detector) has missed too many heartbeats|"
        r"Task failed because the node it was running on is dead|"
        r"ORTE has lost communication with (its|a remote) daemon",
        rank=1,
    ),
    # Slurm's warning signal before the time limit (submitit asks for --signal=USR2@90): submitit may call it
    # "preempted" (its guess from the timing), but only the scheduler's record says preemption, which outranks it
    _sign(F.TIME_LIMIT, SCHEDULER, r"Caught signal (SIG)?USR2\b", rank=2),
    # Lightning's SLURM plugin, warned the same way (--signal=SIGUSR1@90), before it requeues the job itself
    _sign(F.TIME_LIMIT, SCHEDULER, r"Handling auto-requeue signal: \d+", rank=2),
    # a plain "*** JOB 12 ON n1 CANCELLED AT <time> ***" (no DUE TO ...) is a scancel (Slurm <= 17 wrote no ON n1);
    # so is a STEP's, unless srun first said a task failed: then srun ended the step itself (--kill-on-bad-exit,
    # measured on the local cluster), and the task's failure is what to explain
    _sign(F.CANCELLED, SCHEDULER, r"\*\*\* JOB \S+ (ON \S+ )?CANCELLED AT \S+( by \S+)? \*\*\*"),
    _sign(
        F.CANCELLED,
        SCHEDULER,
        r"\*\*\* STEP \S+ (ON \S+ )?CANCELLED AT \S+( by \S+)? \*\*\*",
        rank=1,
        unless_after=r"srun: error: \S+: tasks? [\d,-]+: (?!Out Of Memory)|Exited with exit code [1-9]",
    ),
    # -- collectives that never completed or lost a peer mid-run: NCCL's watchdog (torch 1.x "[E
    # ProcessGroupNCCL.cpp:N] [Rank r] Watchdog caught collective operation timeout", 2.x with [rankN]:, PG ids,
    # terminate/what()), the heartbeat monitor (2.3+), NCCL's remote error (2.12+) and InfiniBand completions
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Watchdog caught collective operation timeout"),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"\bWorkNCCL\(.*\) ran for \d+ milliseconds before timing out"),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Heartbeat monitor timed out|ProcessGroupNCCL's watchdog got stuck for \d+"),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Some NCCL operations have failed or timed out"),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"remote process exited or there was a network error|\bncclRemoteError\b"),
    # NCCL's socket to a peer failing on an open connection (a peer gone mid-run: 2.12+ "Net : Call to recv from X
    # failed : Broken pipe", "socketProgressOpt: Call to recv from X failed : Connection reset by peer")
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Call to (recv|send) (from|to) \S+ failed"),
    # NCCL's own warning of the InfiniBand fault comes before torch's error that carries it (a weaker rank)
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"NET/IB ?: Got completion (from peer \S+ )?with (status|error)", rank=1),
    # gloo (CPU): a pair's read or write failed because a peer crashed, hung or left, or gloo closed the pair on
    # its own timeout (transport tcp, and uv on Windows/macOS; torch 1.x and 2.x paths)
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Timed out waiting \d+ms for (recv|send) operation"),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"This is typically caused by a remote worker (crashing|hanging)"),
    _sign(
        F.COLLECTIVE_TIMEOUT,
        COMM,
        r"gloo/transport/\w+/\w+\.cc:\d+\].*(Connection (closed|reset) by peer|"
        r"Read error|Write error|Timed out|timeout)",
    ),
    _sign(F.COLLECTIVE_TIMEOUT, COMM, r"Application timeout caused pair closure"),
    # -- a launcher's word that a process died of SIGKILL: with no scheduler line (a time limit, a cancel) and no
    # failed collective to explain it, that is the kernel's OOM killer (the usual sender; Slurm's own kills come
    # with its lines, which outrank this). torchrun (1.9+ "failed (exitcode: -9)", its summary "exitcode : -9",
    # 2.x "Signal 9 (SIGKILL) received by PID"), DeepSpeed's launcher ("exits with return code = -9"), subprocess
    # and mp.spawn, a DataLoader worker, MPICH ("EXIT CODE: 9"), an IDE ("exit code 137 (interrupted by signal 9:
    # SIGKILL)") and the shell's job report ("Killed" alone on its line or after a progress bar, "line N: PID
    # Killed cmd", a Chinese locale's)
    _sign(
        F.HOST_OOM,
        COMM,
        r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\) received by PID|exits with return code = -9\b|"
        r"died with <Signals\.SIGKILL: 9>|terminated with signal SIGKILL|is killed by signal: Killed\b|"
        r"\bEXIT CODE: 9\s*$|exit (code|status) 137\b|\(interrupted by signal 9: SIGKILL\)",
        rank=3,
    ),
    _sign(
        F.HOST_OOM,
        COMM,
        r"(^|[\]*>\s])(?-i:Killed)\**\s*$|\bline \d+:\s+\d+ (?-i:Killed)\s|(^|\s)已杀死\s*$",
        rank=3,
    ),
    # -- rendezvous and ports: torchrun/c10d stores and their client sockets (torch 1.x "connect() timed out",
    # "Socket Timeout"; 2.x "The client socket has timed out after Ns while trying to connect to (host, port)",
    # DistStoreError "wait timeout after Nms, keys"), the store-based barrier (1.8-2.x), the elastic agent's
    # rendezvous errors (printed as JSON by its error handler too), accelerate's port, EADDRINUSE
    _sign(F.RENDEZVOUS, COMM, r"\bEADDRINUSE\b|Address already in use"),
    _sign(F.RENDEZVOUS, COMM, r"\bRendezvous\w*(Error|Timeout)\b|RendezvousClosedError"),
    _sign(F.RENDEZVOUS, COMM, r"\bDistStoreError\b|\bDistNetworkError\b"),
    _sign(F.RENDEZVOUS, COMM, r"The (client|server) socket has (failed to (connect|listen|bind)|timed out)"),
    _sign(F.RENDEZVOUS, COMM, r"\bconnect\(\) timed out\. Original timeout was|wait timeout after \d+ms, keys"),
    _sign(F.RENDEZVOUS, COMM, r"(RuntimeError|StoreError|got error): Socket Timeout"),
    # (torch 2.0-2.1 spelt it "retreiving")
    _sign(F.RENDEZVOUS, COMM, r"retr(ie|ei)ving ncclUniqueId .* via c10d key-value store"),
    _sign(F.RENDEZVOUS, COMM, r"Timed out initializing process group in store based barrier"),
    _sign(F.RENDEZVOUS, COMM, r"Timed out after \d+ seconds waiting for (clients|workers)"),
    # the TCPStore client in torch 2.x's C++ wording: a connect that keeps failing (2.3+ "TCP client failed to
    # connect/validate to host"), and the store's server gone under a client waiting on a key (2.4+ "recvValue
    # failed on SocketImpl(...)", "sendBytes failed on SocketImpl(...): Broken pipe")
    _sign(F.RENDEZVOUS, COMM, r"TCP client failed to connect/validate to host"),
    _sign(
        F.RENDEZVOUS,
        COMM,
        r"TCPStore\.cpp:\d+\].*\b(recvValue\w*|recvBytes|sendBytes) failed on SocketImpl",
        running=F.COLLECTIVE_TIMEOUT,
    ),
    _sign(F.RENDEZVOUS, COMM, r"on port `?\d+`?, but another process is utilizing it"),  # accelerate
    # NCCL's own sockets: a refused or dropped connection to a peer (2.4-2.10 "Connect to X failed : Connection
    # refused", "Call to connect returned ..., retrying"; 2.12+ "socketStartConnect: Connect to X failed",
    # "Net : Connection closed by remote peer") and its system errors (torch "unhandled system error",
    # ncclSystemError): a node or the network, not the user's
    _sign(
        F.RENDEZVOUS,
        COMM,
        r"NCCL WARN .*\bConnect to \S+ failed|Call to connect returned \w+|socketStartConnect",
        running=F.COLLECTIVE_TIMEOUT,
    ),
    _sign(
        F.RENDEZVOUS,
        COMM,
        r"NCCL WARN .*(Connection (closed by remote peer|refused|reset by peer)|Bootstrap)",
        running=F.COLLECTIVE_TIMEOUT,
    ),
    _sign(F.RENDEZVOUS, COMM, r"unhandled system error|\bncclSystemError\b", running=F.COLLECTIVE_TIMEOUT),
    # -- the loss: DeepSpeed's fp16 scaler gives up once gradients overflow at every scale (0.3+: "Current loss
    # scale already at minimum"), fairseq's at its own floor; a scaler pushed to its floor is in classify.py
    _sign(F.NAN_LOSS, LOSS, r"Current loss scale already at minimum|Minimum loss scale reached"),
    # trainers stopping on a NaN loss themselves: TensorFlow's NanTensorHook (1.x "Model diverged with loss = NaN",
    # NanLossDuringTrainingError), scripts' own asserts and raises in the same words, timm/DETR's "Loss is nan,
    # stopping training", scikit-neuralnetwork's "Training diverged and returned NaN"
    _sign(
        F.NAN_LOSS,
        LOSS,
        r"diverged with loss = NaN|\bNanLossDuringTrainingError\b|\bNaN loss during training|"
        r"\bLoss is (nan|inf)\b|Training diverged and returned NaN",
    ),
    # a trainer's guard saying the loss is not finite without a number: the loss as subject ("Loss became infinite
    # or NaN at iteration=N", detectron2's FloatingPointError and its forks' "loss become ..."; "Loss is not finite",
    # "Loss in not finite. Terminate training."), or qualified and then stopped or found (Keras' TerminateOnNaN
    # "Batch N: Invalid loss, terminating training", "non-finite loss, ending training", AllenNLP's and OLMo's
    # "nan loss encountered"). A guard that skips the step and goes on ("... Skip this training step.") is no end
    _sign(
        F.NAN_LOSS,
        LOSS,
        r"(\bloss(es)? (((is|in|are|was) )|((has |have )?bec[oa]mes? ))(not finite|non-?finite|infinite)\b|"
        r"\b(non-?finite|not finite|invalid|nan|inf) loss\b.{0,30}\b((terminat|end|stop|abort|halt)\w* (the )?"
        r"training|encountered|detected)\b)(?!.*\bskip)",
    ),
    # Megatron-Core's own checks of the loss and the gradient norm (before its rerun state machine an AssertionError
    # "Rank N: found NaN in local grad norm in backward pass before data-parallel communication collective"; then
    # "Rank N, node X, device N, iteration N: Unexpected result nan (message='found NaN|Inf in local grad norm for
    # bucket #0 ...')", the message sometimes on a line of its own, and the loss's "found NaN/Inf in local forward
    # loss calculation")
    _sign(
        F.NAN_LOSS,
        LOSS,
        r"\bfound (NaN|Inf) in local (grad norm|forward loss)|\bUnexpected result (nan|-?inf)\b",
    ),
    # -- the backend refusing its config or data: positive evidence only (an unmatched exception is `unknown`).
    # Argument parsing (argparse; transformers' HfArgumentParser, 4.x-5.x wordings), config validation
    # (pydantic v1/v2, DeepSpeed's config, Megatron's arguments against a checkpoint), the model it names
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"\S: error: (unrecognized arguments:|argument \S+|the following arguments "
        r"are required:|too few arguments)",
    ),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"Some (specified arguments|keys) are not used by the HfArgumentParser"),
    # transformers' TrainingArguments refusing a combination (4.x-5.x __post_init__), with or without its frame
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"--load_best_model_at_end requires|requires the saving steps to be a round "
        r"multiple of the evaluation steps",
    ),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"ValidationError: \d+ validation errors? for \w+"),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"\bDeepSpeedConfigError\b|Check batch related parameters\. train_batch_size"),
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"class input value .* and checkpoint ?value .* do not match|"
        r"value from checkpoint \(.*\) is not equal to the input argument value",
    ),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"is not a local folder and is not a valid model identifier"),
    # LLaMA-Factory (and LLaMA-Efficient-Tuning, llmtuner) on its dataset_info and template
    _sign(F.BACKEND_ERROR, EXCEPTION, r"Undefined dataset \S+ in \S+|Cannot open \S*dataset_info\S* due to"),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"Template \S+ does not exist|Cannot find valid samples"),
    # datasets (1.x-4.x) failing on the data: generation and cast errors, files that are not there, parse errors
    _sign(F.BACKEND_ERROR, EXCEPTION, r"DatasetGeneration(Cast)?Error|An error occurred while generating the dataset"),
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"\bCastError\b|Couldn[’']t cast\b|\bSchemaInferenceError\b|"
        r"\bNonMatchingSplitsSizesError\b",
    ),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"\bDataFilesNotFoundError\b|\bEmptyDatasetError\b|No \(supported\) data files"),
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"FileNotFoundError: Unable to find '|Couldn[’']t find (a dataset script|"
        r"any data file) at|BuilderConfig \S+ not found",
    ),
    _sign(F.BACKEND_ERROR, EXCEPTION, r"\bArrowInvalid\b|\bArrowTypeError\b"),
    # a YAML file that does not parse (PyYAML's scanner and parser, also as Snakemake or an IDE report them): the
    # config or data file the user wrote
    _sign(
        F.BACKEND_ERROR,
        EXCEPTION,
        r"mapping values are not allowed here|could not find expected ':'|while scanning a simple key|"
        r"found character .* that cannot start any token|\byaml\.(scanner|parser)\.\w+Error\b",
    ),
    # a chat template refusing the data's turns (jinja2 through tokenizer.apply_chat_template)
    _sign(F.BACKEND_ERROR, EXCEPTION, r"Conversation roles must alternate|jinja2\.exceptions\.\w+"),
    # CUDA device-side asserts are data (a label or token id outside the vocabulary)
    _sign(F.BACKEND_ERROR, EXCEPTION, r"device-side assert(ion)? triggered"),
    # -- software faults the log names but no rule can pin on the user or the machine: class unknown, with the
    # fault's own line as evidence (not a later echo). An illegal memory access or a launch failure without an
    # Xid or ECC line is a kernel's bug until proven otherwise; CUDA's "unknown error" (999) and NCCL's
    # "unhandled cuda error" likewise (reported from NCCL's threads as terminate ... what())
    _sign(
        F.UNKNOWN,
        EXCEPTION,
        r"an illegal memory access was encountered|unspecified launch failure|"
        r"misaligned address|an illegal instruction was encountered",
    ),
    _sign(F.UNKNOWN, EXCEPTION, r"CUDA error: unknown error|Cuda failure (999 )?'unknown error'|cudaErrorUnknown"),
    _sign(F.UNKNOWN, EXCEPTION, r"unhandled cuda error|\bncclUnhandledCudaError\b|NCCL WARN Cuda failure"),
    _sign(F.UNKNOWN, EXCEPTION, r"CUBLAS_STATUS_EXECUTION_FAILED|CUBLAS_STATUS_INTERNAL_ERROR"),
    # torch's DataLoader saying how a worker died (its signal handler in the worker, then the main process): a
    # segfault or an FPE says nothing certain about the node or the data, nor does a bus error in old torch's main
    # process wording, which names the signal alone (torch's words that name shared memory are shm_full's, above)
    _sign(
        F.UNKNOWN,
        EXCEPTION,
        r"Unexpected (segmentation fault|floating-point exception) encountered in "
        r"worker|DataLoader worker \(pids?\(?s?\)? [\d, ]+\) (is killed by signal: (?!Killed)|exited "
        r"unexpectedly)",
    ),
)

# Exception types a value in the config or the data raises; with a frame of the backend's argument parsing,
# config validation or data loading in its traceback (CONFIG_DATA_FRAME), such an exception is the backend
# refusing its config or data. An OSError there (a disk, a network) is not.
VALUE_ERRORS = re.compile(
    r"(^|\.)(ValueError|KeyError|TypeError|IndexError|AssertionError|AttributeError|FileNotFoundError|"
    r"IsADirectoryError|NotADirectoryError|JSONDecodeError|UnicodeDecodeError|ArrowInvalid|ArrowTypeError|"
    r"ValidationError|TemplateError|UndefinedError|ArgumentError|ArgumentTypeError)$"
)
CONFIG_DATA_FRAME = re.compile(
    r"(^|/)(transformers/(hf_argparser|training_args\w*)\.py|(llamafactory|llmtuner)/(hparams|data)/|"
    r"llmtuner/tuner/core/parser\.py|axolotl/utils/(config|data|schemas|dict)|axolotl/(cli/config|"
    r"prompt_strategies|prompters|datasets)|datasets/(load|builder|arrow_dataset|data_files|table|features|info|"
    r"iterable_dataset|dataset_dict|packaged_modules)|pyarrow/_(json|csv)|swift/llm/(dataset|argument)|"
    r"deepspeed/runtime/config|megatron/(training/)?arguments\.py|argparse\.py)"
)

# The user's own code or config failing before the first training step: an exception of these types (a value the
# config names, a key or file it lacks, a module it asks for, a script that does not compile), raised before any
# loss was logged and outside the training loop's frames, with no infrastructure sign in the attempt, is the
# user's (classify.py). Their messages must not name the machine's side (a shared library, the driver, CUDA/NCCL,
# the network, the rendezvous or what the launcher sets), which an ImportError or a ValueError can also carry.
PLAIN_ERRORS = re.compile(
    r"(^|\.)(ValueError|KeyError|TypeError|IndexError|AttributeError|NameError|UnboundLocalError|SyntaxError|"
    r"IndentationError|TabError|ModuleNotFoundError|ImportError|FileNotFoundError|NotADirectoryError|"
    r"IsADirectoryError|AssertionError|NotImplementedError|JSONDecodeError|UnicodeDecodeError|ZeroDivisionError|"
    r"\w*Config\w*(Error|Exception)|ScannerError|ParserError|ConstructorError|ComposerError|ValidationError|"
    r"ArgumentError|ArgumentTypeError|InstantiationException|HFValidationError)$"
)
MACHINE_WORDS = re.compile(
    r"\.so\b|\.so\.\d|shared object|undefined symbol|GLIBC|\bCUDA\b|\bNCCL\b|cuDNN|\bdriver\b|\bGPUs?\b|"
    r"rendezvous|MASTER_(ADDR|PORT)|WORLD_SIZE|LOCAL_RANK|SLURM_\w+|init_process_group|process group|"
    r"out of memory|\[Errno (?!2\])\d+\]|"
    r"connection|timed? ?out\b|timeout|network|socket",
    re.IGNORECASE,
)
# Functions of a training loop (HF Trainer, Lightning, DeepSpeed, scripts' own loops): an exception raised under
# one of them came after training started
TRAINING_LOOP_FUNCTION = re.compile(
    r"_?inner_training_loop|training_step|train_step|train_one_epoch|_?train_epoch|run_epoch|compute_loss|"
    r"_?backward|optimizer_step|step|fit_loop|run_training_epoch|run_training_batch|advance|validate|"
    r"validation_step|evaluate|evaluation_loop|prediction_step|_maybe_log_save_evaluate"
)
FRAME_FUNCTION = re.compile(r", in (?P<func>[\w.<>]+)\s*$")
# Progress lines that show training steps ran even where no loss is logged
TRAINING_STEP = re.compile(r"current_steps|\biteration\s+\d+/")

# A traceback frame: `File "<path>", line N` (Python), or IPython's `File <path>:N, in f`.
FRAME = re.compile(r"""^File (?:"(?P<path>[^"]+)", line \d+|(?P<ipath>\S+):\d+, in )""")

# An exception line: `Type: message` (also `Type` alone) once a launcher's prefix is off the line.
EXCEPTION_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*)?(?:Error|Exception))(?::\s*(?P<msg>.*))?$")

# C++'s std::terminate: the exception's type, then its message on a `what():` line (torch's c10 errors from NCCL's
# and the watchdog's threads, CUDA errors raised while a tensor is freed)
TERMINATE = re.compile(r"terminate called after throwing an instance of")
WHAT = re.compile(r"^what\(\):\s*(?P<msg>.*)$")

# Python's words between the exceptions of one chain (raise ... from ..., or an error while handling one).
CHAINED = re.compile(
    r"The above exception was the direct cause of the following exception|"
    r"During handling of the above exception, another exception occurred"
)

# Exceptions that only re-raise a child's failure: never the cause themselves.
WRAPPERS = re.compile(
    r"ChildFailedError|CalledProcessError|FailedJobError|UncompletedJobError|CellFailed|SignalException"
    r"|ProcessRaisedException|ProcessExitedException|RemoteTraceback|RayTaskError|terminated with the following"
    r"|torch\.distributed\.elastic|subprocess\.|\bSystemExit\b|KeyboardInterrupt"
)
# NCCL's name of a result code, printed under the error that carries it ("ncclUnhandledCudaError: Call to CUDA
# function failed."): part of that error's message, not an exception of its own
NCCL_RESULT = re.compile(
    r"^(nccl)?(UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote|InProgress)Error\b"
)

# A logged loss: HF Trainer's print (Python dict), trainer_log.jsonl (JSON), Megatron's "lm loss: 6.4E+00", a plain
# "loss: x" / "loss=x" / "loss = x" (TF-slim, DeepLab) and "loss x" / "Loss x" (nanoGPT's "iter 3010: loss nan",
# insightface's "Loss nan   LearningRate"). The key is exactly loss (not train_loss, eval_loss, avg_loss, train/loss,
# "val loss"); the number may end a sentence ("loss = NaN.").
_NOT_EVAL = r"(?<!val )(?<!eval )(?<!test )(?<!valid )(?<!validation )"
_NUMBER = r"(?:tensor\()?(?P<value>[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?))(?!\w|\.\d)"
LOSS_VALUE = re.compile(
    r"""(?:['"]loss['"]\s*:\s*['"]?|(?<![\w/.-])""" + _NOT_EVAL + r"""loss(?:\s*[:=]\s*|\s+))""" + _NUMBER,
    re.IGNORECASE,
)
# Another training loss's key, read only where a line has no plain loss: backends' and scripts' own names (PEFT's
# examples' "train_epoch_loss=tensor(nan, device='cuda:0')", "step_loss=nan", MXNet's "IDLoss=nan", DG-Net's
# "DLoss:nan"), never an evaluation's; a value may be printed as a tensor
_NOT_EVAL_KEY = r"(?!(?:eval|val|valid|validation|test)_)"
OTHER_LOSS_VALUE = re.compile(r"(?<![\w/.-])" + _NOT_EVAL_KEY + r"\w+loss\s*[:=]\s*" + _NUMBER, re.IGNORECASE)
# Perplexity, the exponential of the loss ("PPL 311.73", "train_perplexity=25.47", "'perplexity': inf"): read as
# its logarithm where a line logs no loss
PERPLEXITY_VALUE = re.compile(
    r"(?<![\w/.-])" + _NOT_EVAL + _NOT_EVAL_KEY + r"""(?:\w+_)?(?:ppl|perplexity)['"]?(?:\s*[:=]\s*|\s+)""" + _NUMBER,
    re.IGNORECASE,
)
# fp16 overflow as the HF Trainer logs it: a NaN gradient norm while the loss it logs is 0.0 ({'loss': 0.0,
# 'grad_norm': nan}), and ESPnet's "The grad norm is nan. Skipping updating the model": the step's loss is not
# finite, whatever number the line shows
GRAD_NORM_NAN = re.compile(r"""['"]?grad_norm['"]?\s*[:=]\s*['"]?(?:nan|inf)\b|\bgrad norm is (?:nan|inf)\b""", re.I)
# A loss scaler halving its scale after an overflow: DeepSpeed (0.3-0.5 "[deepscale] OVERFLOW! ... Attempted loss
# scale: 1, reducing to 1", later "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4, reducing
# to 2") and apex ("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.0")
SCALE_DOWN = re.compile(
    r"(overflow!?.*?Attempted loss scale: [\d.e+]+,? reducing to|Gradient overflow\.\s+"
    r"Skipping step, (?:loss scaler \d+ )?reducing loss scale to) (?P<to>[\d.]+(?:e[-+]?\d+)?)",
    re.IGNORECASE,
)
# The scale a scaler stops at by default (DeepSpeed's min_loss_scale is 1): one halving above it, every step
# overflows and the loss or its gradients are no longer finite
SCALE_FLOOR = 2.0

# Lines that show the process group running (so a lost connection is a failed collective, not a rendezvous): NCCL's
# init done, training progress, or a collective that the failing line itself names.
GROUP_RUNNING = re.compile(r"NCCL INFO .*Init COMPLETE|current_steps|\biteration\s+\d+/|WorkNCCL\(SeqNum=\d+, OpType=")

# submitit's own account of a signal's timing (1.2+, before "Caught signal ...: this job is preempted/timed-out"):
# how long the job ran of what it asked for. Slurm warns a job a set time before its limit (submitit asks
# --signal=USR2@90 by default; sites and users set a few minutes): a signal further from the limit than
# WARNING_MARGIN_MIN is no time limit's warning, so the scheduler preempted the job
SUBMITIT_TIMING = re.compile(
    r"Job has (?:not )?timed out\. Ran (?P<ran>\d+) minutes out of requested (?P<asked>\d+) minutes"
)
WARNING_MARGIN_MIN = 10

# Lines that start a new attempt of the cell (sft_grid's runner marker; submitit starting a job) and lines
# that end one (a requeue). A requeued cell's log holds every attempt, oldest first.
ATTEMPT_START = re.compile(r"^=== sft_grid: |submitit INFO \(.*\) - Starting with JobEnvironment")
ATTEMPT_END = re.compile(r"Requeued job \S+ \(\d+ remaining timeouts\)|DUE TO JOB REQUEUE")
# The scheduler ending a job at a time; a line logged well after it comes from the job's next run (Slurm kills
# what is left after KillWait, 30 s by default, and preemption's GraceTime, minutes at most)
SCHEDULER_END = re.compile(
    r"CANCELLED AT (?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d) DUE TO "
    r"(PREEMPTION|TIME LIMIT|NODE FAIL|JOB REQUEUE)"
)
TIMESTAMP = re.compile(r"(?<!\d)(?P<time>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?!\d)")
KILL_GRACE_S = 300

# With no sign and no exception, the most telling line left, by rank: a crash, a kill, an exit status, an error.
UNKNOWN_HINTS = (
    re.compile(
        r"Segmentation fault|\bSIGSEGV\b|Fatal Python error|Bus error|\bSIGBUS\b|\bSIGABRT\b|\bAborted\b|"
        r"core dumped|Illegal instruction|\bSIGILL\b|terminate called|signal: \w+|NCCL WARN|NCCL error in",
        re.IGNORECASE,
    ),
    re.compile(r"\bKilled\b|已杀死|\bSIGKILL\b|signal 9\b|exit code 137", re.IGNORECASE),
    re.compile(r"[Ee]xit(ed with exit)? code [1-9]|exit status [1-9]|exitcode\s*:\s*-?[1-9]", re.IGNORECASE),
    re.compile(r"\berror\b", re.IGNORECASE),
)

# Where a line names the node it is about.
NODE_FAILED = re.compile(r"Node failure on (?P<node>[\w.-]+)")
NODE_IN_LINE = (
    NODE_FAILED,
    re.compile(r"srun: error: (?P<node>[\w.-]+): tasks? [\d,-]+"),
    re.compile(r"(?P<node>[\w.-]+) kernel: (\[[\d. ]+\] )?NVRM: Xid"),
    re.compile(r"^\s*(?:\[rank\d+\]:\s*)?(?P<node>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\]"),  # NCCL's host:pid:tid [dev]
    re.compile(r"Prolog (?:error|failure) on node (?P<node>[\w.-]+)"),
    re.compile(r"Task launch for \S+ failed on node (?P<node>[\w.-]+)"),
    re.compile(r"Xid errors on instance: (?P<node>[\w.-]+)"),
)
# torchrun's failure summary names the host of the first failed rank
ROOT_CAUSE_HOST = re.compile(r"^\s*host\s*:\s*(?P<node>[\w.-]+)\s*$")
