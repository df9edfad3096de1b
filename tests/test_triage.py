"""Failure triage: the labelled corpus (tests/triage_corpus: real Slurm/PyTorch/NCCL/gloo/CUDA/kernel/Hub/backend
messages, in a main split and a holdout split its signs were not written from) is classified 100% right, the
corpus has the shape asked for, the rules hold on the cases they exist for (interleaved ranks, no
backend_error without positive evidence, hardware only on the hardware's word), families hold on real
lines in several wordings (the user's code or config failing before the first step, loss formats, torch 2.x store
and NCCL wordings wrapped or glued, submitit's words, launchers' words for a memory kill or a lost node), so do a
trainer's own guard on a loss that is not finite, torch's words for /dev/shm exhausted and Slurm's for a lost node
(and their look-alikes decide nothing), and each class's policy says and suggests the right thing. Pure and fast: no
process, no file but the corpus."""

from __future__ import annotations

import json
import shlex
from collections import Counter, defaultdict

import pytest

from sft_grid.core.failures import (
    DEFAULT_RULES,
    SACCT_FORMAT,
    CellContext,
    Failure,
    FailureClass,
    Policy,
    RemedyKind,
    Rule,
    classify,
    expand_hostlist,
    group_legs,
    parse_sacct,
    parse_time,
    remedy_for,
    sacct_argv,
    split_attempts,
    summarize,
    with_overrides,
)
from sft_grid.core.human import duration
from tests.triage_helpers import case_log, corpus_cases, is_real

CASES = corpus_cases("main")
HOLDOUT = corpus_cases("holdout")
F = FailureClass


def lines(*texts: str) -> str:
    return "\n".join(texts)


def run_case(case: dict) -> Failure:
    legs = parse_sacct("\n".join(case.get("sacct", [])))
    return classify(
        legs,
        case_log(case),
        case.get("watchdog"),
        case.get("requeues_used"),
        case.get("requeue_budget", 0),
        case.get("step"),
        case.get("total"),
    )


def test_corpus_shape():
    """>= 150 cases, >= 5 per class, each real case with its source URL and family, >= 3 distinct versions per
    family where its cases carry versions, and a holdout of about a fifth of the real cases."""
    everything = CASES + HOLDOUT
    assert len(everything) >= 150
    counts = Counter(case["expect"]["class"] for _, case in everything)
    # every class but `hang`, which the job's own watch decides (sft_grid/job/hang.py, tests/test_hang.py), not a log
    assert set(counts) == {c.value for c in FailureClass} - {FailureClass.HANG.value}
    assert all(n >= 5 for n in counts.values()), counts
    real = [(name, case) for name, case in everything if is_real(name, case)]
    versions: dict[str, list[str]] = defaultdict(list)
    for name, case in everything:
        assert case["expect"]["evidence"], name
        assert "sacct" in case or "log" in case or "logs" in case or "watchdog" in case, name
        assert name.startswith(case["expect"]["class"]) or "relabelled" in case or name in EXPECT_ANOTHER, name
    for name, case in real:
        assert str(case.get("source", "")).startswith("https://"), name
        assert case.get("family"), name
        versions[case["family"]].append(json.dumps(case.get("versions") or {}, sort_keys=True))
    # a family whose cases each say which versions wrote them shows the wordings of >= 3 distinct ones (families
    # whose posts name no version, such as slurmstepd's own lines, cannot say)
    thin = {family: len(set(seen)) for family, seen in versions.items() if "{}" not in seen and len(set(seen)) < 3}
    assert not thin, f"families with fewer than 3 distinct versions: {thin}"
    assert all(is_real(name, case) for name, case in HOLDOUT)
    assert 0.15 <= len(HOLDOUT) / len(real) <= 0.25, (len(HOLDOUT), len(real))


# older cases that exercise another class on purpose (an earlier attempt's sign that the last one overrides)
EXPECT_ANOTHER = {"gpu_hardware_07_history_xid_then_time_limit"}


@pytest.mark.parametrize("name,case", CASES + HOLDOUT, ids=[n for n, _ in CASES + HOLDOUT])
def test_corpus_case(name, case):
    failure = run_case(case)
    expect = case["expect"]
    assert failure.klass.value == expect["class"], (failure.evidence, failure.summary)
    assert expect["evidence"] in failure.evidence
    assert "\n" not in failure.evidence and "\n" not in failure.summary
    if "nodes" in expect:
        assert list(failure.nodes) == expect["nodes"]
    assert expect.get("summary", "") in failure.summary


def test_the_misleading_begintime_record_becomes_a_time_limit_with_progress():
    _, case = next(c for c in CASES if c[0] == "time_limit_02_requeues_spent_begintime")
    failure = run_case(case)
    assert failure.summary == "time limit reached after 3 requeues (budget 3), at step 297 of 300"
    assert (failure.step, failure.total, failure.requeues) == (297, 300, 3)
    assert "BeginTime" not in failure.evidence


def test_sacct_parsing_keeps_every_leg_and_step_in_order():
    text = (
        "JobID|State|ExitCode|Reason|NodeList|Elapsed|Start|End\n"
        "55_3|REQUEUED|0:0|BeginTime|n1|01:00:00|s|e\n"
        "55_3.batch|CANCELLED|0:15||n1|01:00:00|s|e\n"
        "55_3|TIMEOUT|0:0|None|n[2-3]|01:00:00|s|e\n"
        "55_4|CANCELLED by 1000|0:0|Dependency|None assigned|00:00:00|None|e\n"
        "\n"
        "garbage line\n"
    )
    legs = parse_sacct(text)
    assert [leg.job_id for leg in legs] == ["55_3", "55_3.batch", "55_3", "55_4"]
    assert legs[1].is_step and legs[1].allocation == "55_3" and legs[1].base_state == "CANCELLED"
    assert legs[2].node_names() == ["n2", "n3"] and legs[3].node_names() == []
    assert legs[3].cancelled_by == "1000" and legs[0].cancelled_by is None
    assert list(group_legs(legs)) == ["55_3", "55_4"] and len(group_legs(legs)["55_3"]) == 3


def test_sacct_argv_lists_duplicates_steps_and_the_parsed_format():
    argv = sacct_argv(["55", "56_2"])
    assert argv[0] == "sacct" and "--duplicates" in argv and "--parsable2" in argv and "-X" not in argv
    assert f"--format={SACCT_FORMAT}" in argv
    assert SACCT_FORMAT == "JobID,State,ExitCode,Reason,NodeList,Elapsed,Start,End"
    assert argv[-1] == "--jobs=55,56_2"


@pytest.mark.parametrize(
    "expr,names",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[007-009,12],login1", ["gpu007", "gpu008", "gpu009", "gpu12", "login1"]),
        ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
    ],
)
def test_hostlists_expand_as_slurm_writes_them(expr, names):
    assert expand_hostlist(expr) == names


def test_logs_split_into_attempts_at_restart_and_requeue_markers():
    log = lines(
        "a", "submitit INFO (x) - Requeued job 5 (2 remaining timeouts)", "b", "=== sft_grid: 2026 bash launch.sh", "c"
    )
    assert split_attempts(log) == [
        ["a", "submitit INFO (x) - Requeued job 5 (2 remaining timeouts)"],
        ["b"],
        ["=== sft_grid: 2026 bash launch.sh", "c"],
    ]
    assert split_attempts("") == [[]]


def test_wrappers_and_pending_reasons_alone_decide_nothing():
    legs = parse_sacct("7|FAILED|1:0|Dependency|n1|00:01:00|s|e")
    log = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "subprocess.CalledProcessError: Command 'x'"
    )
    failure = classify(legs, log)
    assert failure.klass is F.UNKNOWN and "Dependency" not in failure.summary


def test_several_logs_each_contribute_their_last_attempt():
    stepd = "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-30T01:00:00 DUE TO TIME LIMIT ***"
    failure = classify([], ["{'loss': 2.0}\n=== sft_grid: x\nValueError: bad key", stepd])
    assert failure.klass is F.TIME_LIMIT


def test_summary_wording():
    assert (
        summarize(F.GPU_OOM, "torch.OutOfMemoryError: CUDA out of memory.", (), 0, 0, 12, 300)
        == "GPU out of memory, at step 12 of 300: torch.OutOfMemoryError: CUDA out of memory."
    )
    assert summarize(F.PREEMPTED, "x", (), 1, 5, None, None) == "preempted by the scheduler after 1 requeue (budget 5)"
    # no requeue budget: no count of requeues, only where it stopped
    no_budget = summarize(F.TIME_LIMIT, "DUE TO TIME LIMIT", (), 0, 0, 1234, 6000)
    assert no_budget == "time limit reached, at step 1234 of 6000"
    assert len(summarize(F.BACKEND_ERROR, "E" * 1000, (), 0, 0, None, None)) < 300


# ---------------------------------------------------------------- the rules

TRACEBACK = ["Traceback (most recent call last):", '  File "/envs/x/bin/train.py", line 8, in <module>', "    launch()"]


@pytest.mark.parametrize(
    "prefix",
    [
        "[rank3]: ",
        "[rank3]:",
        "[default0]:",
        "0: ",
        "[1,0]<stderr>:",
        "work-1: ",
        "2026-11-30 10:00:01,123 - trainer - ERROR - ",
        "E1130 10:00:01.123000 4242 torch/distributed/elastic/api.py:732] ",
    ],
)
def test_an_exception_behind_a_launchers_label_is_found(prefix):
    log = "\n".join(prefix + line for line in [*TRACEBACK, "RuntimeError: the reader lost its place"])
    failure = classify([], log)
    assert failure.klass is F.UNKNOWN and "RuntimeError: the reader lost its place" in failure.evidence
    assert "launch()" not in failure.evidence


def test_spliced_ranks_are_read_apart():
    # a progress bar with a rank's traceback glued on; two ranks' raise lines with the type cut from its message
    log = lines(
        " 16%|#5   | 7395/45743 [13:13:43<68:36:00,  6.44s/it][rank3]: Traceback (most recent call last):",
        '[rank3]:   File "/envs/lf/lib/python3.11/site-packages/llamafactory/data/parser.py", line 107, in get',
        '        run_sft(model_args)raise ValueError("Undefined dataset {} in {}.".format(name, DATA_CONFIG))',
        'raise ValueError("Undefined dataset {} in {}.".format(name, DATA_CONFIG))ValueError',
        ": Undefined dataset alpaca.json in dataset_info.json.ValueError",
        ": Undefined dataset alpaca.json in dataset_info.json.",
        "    launch()",
    )
    failure = classify([], log)
    assert failure.klass is F.BACKEND_ERROR
    assert failure.evidence.startswith("ValueError: Undefined dataset alpaca.json in dataset_info.json.")


def test_terminate_and_what_lines_are_an_exception():
    log = lines(
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  the allocator's bookkeeping went wrong",
        "Exception raised from free at ../c10/cuda/CUDACachingAllocator.cpp:1 (most recent call first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x42 (0x1 in libc10.so)",
    )
    failure = classify([], log)
    assert failure.klass is F.UNKNOWN and "what():  the allocator's bookkeeping went wrong" in failure.evidence
    timeout = classify(
        [],
        "terminate called after throwing an instance of 'c10::DistBackendError'\n  what():  [PG 0 "
        "Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600001 "
        "milliseconds before timing out.",
    )
    assert timeout.klass is F.COLLECTIVE_TIMEOUT


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: the reader lost its place",
        # a KeyError from the training loop (after the first step: no rule pins it on the config or the data)
        lines(
            "Traceback (most recent call last):",
            '  File "/envs/x/lib/python3.11/site-packages/transformers/trainer.py", line 2548, in _inner_training_loop',
            "    tr_loss_step = self.training_step(model, inputs)",
            "KeyError: 'a'",
        ),
        "OSError: [Errno 5] Input/output error: '/scratch/run/samples'",
        lines("{'loss': 2.31, 'grad_norm': 1.2, 'epoch': 0.1}", "ValueError: too many values to unpack (expected 2)"),
    ],
)
def test_no_backend_error_without_positive_evidence(log):
    failure = classify([], log)
    assert failure.klass is F.UNKNOWN and failure.evidence == log.splitlines()[-1]
    assert "read " in remedy_for(failure, Policy(), 0, CellContext(log="logs/train.log")).message


@pytest.mark.parametrize(
    "log",
    [
        "ValueError: Some keys are not used by the HfArgumentParser: ['lr']",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for AxolotlConfigWCapabilities",
        "train.py: error: unrecognized arguments: --learning-rate 1e-5",
        "datasets.exceptions.DatasetGenerationError: An error occurred while generating the dataset",
        lines(
            "Traceback (most recent call last):",
            '  File "/envs/lf/lib/python3.11/site-packages/llamafactory/data/converter.py", line 9, in __call__',
            '    prompt = example["instruction"]',
            "KeyError: 'instruction'",
        ),
        lines(
            "Traceback (most recent call last):",
            '  File "/envs/x/lib/python3.9/site-packages/transformers/training_args.py", line 1180, in __post_init__',
            "    raise ValueError(",
            "ValueError: --load_best_model_at_end requires the save and eval strategy to match",
        ),
    ],
)
def test_backend_error_on_positive_evidence(log):
    failure = classify([], log)
    assert failure.klass is F.BACKEND_ERROR and failure.evidence == log.splitlines()[-1]
    assert "fix what the evidence names" in remedy_for(failure, Policy(), 0).message


def test_submitits_preempted_label_alone_decides_nothing():
    label = "submitit WARNING (2026-11-30 14:00:00,118) - Caught signal SIGUSR2 on n7: this job is preempted."
    # USR2 is Slurm's warning before the time limit: with no scheduler record of a preemption, it is that
    assert classify([], label).klass is F.TIME_LIMIT
    # the scheduler's record decides: its preemption, or its time limit
    stepd = "slurmstepd: error: *** JOB 9 ON n7 CANCELLED AT 2026-11-30T14:00:01 DUE TO PREEMPTION ***"
    assert classify([], f"{label}\n{stepd}").klass is F.PREEMPTED
    assert classify(parse_sacct("9|TIMEOUT|0:0|None|n7|04:00:00|s|e"), label).klass is F.TIME_LIMIT
    # a preemption the scheduler requeued, then the next run's own failure: the later run decides
    later = (
        "submitit ERROR (2026-11-30 15:10:00,000) - Submitted job triggered an exception\n"
        "RuntimeError: Timed out initializing process group in store based barrier on rank: 0"
    )
    assert classify([], f"{label}\n{stepd}\n{later}").klass is F.RENDEZVOUS


@pytest.mark.parametrize(
    "log",
    [
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "gpu031:3456:3512 [1] NCCL WARN Cuda failure 'an illegal memory access was encountered'",
        "terminate called after throwing an instance of 'c10::CUDAError'\n  what():  CUDA error: unknown error",
    ],
)
def test_a_cuda_fault_without_a_hardware_sign_is_software_and_excludes_no_node(log):
    legs = parse_sacct("5|FAILED|1:0|None|gpu031|00:10:00|s|e")
    failure = classify(legs, log)
    assert failure.klass is F.UNKNOWN and failure.nodes == ()
    assert remedy_for(failure, Policy(), 0).exclude_nodes == ()
    xid = "Nov 30 03:12:45 gpu031 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    hardware = classify(legs, f"{xid}\n{log}")
    assert hardware.klass is F.GPU_HARDWARE and hardware.nodes == ("gpu031",)


def test_an_echo_on_other_ranks_does_not_outrank_the_named_failure():
    data = "[rank0]: ValueError: Undefined dataset tulu in dataset_info.json."
    echo = (
        "[rank1]: torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving "
        "ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Connection "
        "reset by peer"
    )
    assert classify([], f"{data}\n{echo}").klass is F.BACKEND_ERROR
    assert classify([], echo).klass is F.RENDEZVOUS


def test_nccl_connection_failures_are_a_rendezvous_at_set_up_and_a_collective_once_running():
    refused = (
        "n1:12:34 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<4321> failed : "
        "Connection refused"
    )
    assert classify([], refused).klass is F.RENDEZVOUS
    assert classify([], "{'loss': 2.1, 'epoch': 0.5}\n" + refused).klass is F.COLLECTIVE_TIMEOUT


# ---------------------------------------------------------------- the families (real lines, see corpus)

# the user's own code or config failing before the first step, in several wordings (each from a corpus case)
EARLY_USER_ERRORS = [
    # LLaMA-Factory's launcher without the package (hiyouga/LlamaFactory#5243), torchrun's echo after it
    lines(
        "Traceback (most recent call last):",
        '  File "/home/u/LLaMA-Factory/src/llamafactory/launcher.py", line 15, in <module>',
        "    from llamafactory.train.tuner import run_exp",
        "ModuleNotFoundError: No module named 'llamafactory'",
        "E0822 16:10:35.525161 139625595627328 torch/distributed/elastic/multiprocessing/api.py:833] failed "
        "(exitcode: 1) local_rank: 0 (pid: 1754335) of binary: /app/anaconda3/bin/python",
    ),
    # a script that does not compile, without a Traceback header (zphang/bert_on_stilts#5)
    lines(
        '  File "glue/train.py", line 224',
        '    args.output_dir, f"all_state___epoch{epoch:04d}___batch{step:06d}.p"',
        "                                                                       ^",
        "SyntaxError: invalid syntax",
    ),
    # a path the command names (tianzhi0549/FCOS#197)
    "FileNotFoundError: [Errno 2] No such file or directory: './configs/fcos_R_50_FPN_1x.yaml'",
    # Hydra/omegaconf refusing a key the config lacks (lipzh5/X2CNet#2)
    lines(
        "Error executing job with overrides: ['train.batch_size=128', 'train.lr=1e-3']",
        "Traceback (most recent call last):",
        '  File "/home/lfl/facial_robot/X2CNet/main.py", line 130, in main',
        "    pred_delta = int(cfg.train.pred_delta_from_neutral)",
        "omegaconf.errors.ConfigAttributeError: Key 'pred_delta_from_neutral' is not in struct",
    ),
    # a config enum or type the config system refuses (RikoLi/WACV23-workshop-TMGF#4, yacs)
    "ValueError: Type mismatch (<class 'yacs.config.CfgNode'> vs. <class 'str'>) for config key: LOG.CHECKPOINT",
    # a key the script reads from its YAML (univtac/UniVTAC#7)
    lines(
        '  File "/mlp/UniVTAC/policy/ACT/imitate_episodes.py", line 82, in main',
        "    \"num_steps\": args['num_steps'],",
        "KeyError: 'num_steps'",
    ),
]


@pytest.mark.parametrize("log", EARLY_USER_ERRORS)
def test_an_early_plain_exception_is_the_users_with_its_line_as_evidence(log):
    failure = classify([], log)
    exception = next(x.strip() for x in log.splitlines() if x.strip().split(":")[0].endswith("Error"))
    assert failure.klass is F.BACKEND_ERROR and failure.evidence == exception
    assert "fix what the evidence names" in remedy_for(failure, Policy(), 0).message


@pytest.mark.parametrize(
    "log, klass",
    [
        # an infrastructure sign in the same attempt decides: never the user's
        (
            EARLY_USER_ERRORS[2] + "\nslurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-30T01:00:00 DUE TO "
            "TIME LIMIT ***",
            F.TIME_LIMIT,
        ),
        (EARLY_USER_ERRORS[5] + "\nsrun: error: n3: task 0: Out Of Memory", F.HOST_OOM),
        (EARLY_USER_ERRORS[3] + "\nn1:7:9 [0] NCCL WARN Call to connect returned Connection refused", F.RENDEZVOUS),
        (EARLY_USER_ERRORS[0] + "\nSegmentation fault (core dumped)", F.UNKNOWN),
        # an exception about the machine's side is not plain (Dao-AILab/flash-attention#631)
        ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", F.UNKNOWN),
        (
            "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable "
            "MASTER_ADDR expected, but not set",
            F.UNKNOWN,
        ),
        ("KeyError: 'LOCAL_RANK'", F.UNKNOWN),  # what the launcher sets, not the user's config
        # raised inside the training loop (zhou13/lcnn#17), or after a loss was logged: training had started
        (
            lines(
                '  File "/home/u/lcnn/lcnn/trainer.py", line 202, in train_epoch',
                "    self.validate()",
                '  File "/home/u/lcnn/lcnn/trainer.py", line 70, in _loss',
                "KeyError: 'losses'",
            ),
            F.UNKNOWN,
        ),
        ("iter 2990: loss 3.8853, time 1096.65ms, mfu 15.34%\n" + EARLY_USER_ERRORS[5], F.UNKNOWN),
    ],
)
def test_the_early_exception_rule_never_blames_the_user_for_the_machine_or_a_running_training(log, klass):
    assert classify([], log).klass is klass


@pytest.mark.parametrize(
    "log, evidence",
    [
        # the HF Trainer's fp16 overflow: loss 0.0 with a NaN grad_norm, LLaMA-Factory's callback echoing the loss
        # (hiyouga/LlamaFactory#2810)
        (
            lines(
                "{'loss': 1.2, 'grad_norm': 0.8, 'learning_rate': 0.05, 'epoch': 0.01}",
                "{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 0.04999485182928687, 'epoch': 0.02}",
                "03/12/2024 11:24:50 - INFO - llmtuner.extras.callbacks - {'loss': 0.0000, 'epoch': 0.03}",
            ),
            "'grad_norm': nan, 'learning_rate': 0.04999485182928687",
        ),
        # nanoGPT's "loss <value>" (karpathy/nanoGPT#215) and insightface's "Loss nan" (deepinsight/insightface#2262)
        (
            "iter 3000: loss 4.2490, time 35392.33ms\niter 3010: loss nan, time 1019.95ms\niter 3020: loss nan, mfu 1%",
            "iter 3010: loss nan",
        ),
        ("Training: 2023-03-14 09:08:43,293-Speed 2178.40 samples/sec   Loss nan   LearningRate 0.001000", "Loss nan"),
        # a backend's own key (bytedance/byteps#411) and accelerate scripts' epoch loss
        ("Epoch[1] Batch[6] Speed: 136.34 samples/sec,  IDLoss=70.405,\nEpoch[1] Batch[7]  IDLoss=nan,", "IDLoss=nan"),
        # PEFT's examples print f"{epoch=}: {train_ppl=} {train_epoch_loss=} {eval_ppl=} {eval_epoch_loss=}"
        (
            "epoch=0: train_ppl=tensor(5.1023, device='cuda:0') train_epoch_loss=tensor(1.6297, device='cuda:0') "
            "eval_ppl=tensor(4.9, device='cuda:0') eval_epoch_loss=tensor(1.59, device='cuda:0')\n"
            "epoch=1: train_ppl=tensor(nan, device='cuda:0') train_epoch_loss=tensor(nan, device='cuda:0') "
            "eval_ppl=tensor(nan, device='cuda:0') eval_epoch_loss=tensor(nan, device='cuda:0')",
            "epoch=1: train_ppl=tensor(nan",
        ),
        # perplexity as the loss's exponential (harvardnlp/data2text#9's format)
        ("Epoch 1 ; Iter 50/213 ; PPL 8226.52 ;\nEpoch 1 ; Iter 100/213 ; PPL nan ;", "PPL nan"),
        # "diverged with loss = NaN" raised inside a traceback (melonwan/denseReg#21): the message, not the source
        (
            lines(
                '  File "/home/denseReg/model/train_single_gpu.py", line 149, in train',
                "    assert not np.isnan(loss_value), 'Model diverged with loss = NaN'",
                "AssertionError: Model diverged with loss = NaN",
            ),
            "AssertionError: Model diverged with loss = NaN",
        ),
        ("RuntimeError: Training diverged and returned NaN.", "Training diverged and returned NaN"),
        ("WARNING: The grad norm is nan. Skipping updating the model.", "The grad norm is nan"),
    ],
)
def test_a_nan_loss_in_the_formats_trainers_print(log, evidence):
    failure = classify([], log)
    assert failure.klass is F.NAN_LOSS and evidence in failure.evidence


def test_a_loss_that_recovers_or_a_spike_in_another_format_is_read_as_the_trainer_logged_it():
    # mmocr logs a NaN gradient norm with a finite loss (AMP skipped the step) and training goes on
    # (JiaquanYe/TableMASTER-mmocr#32): no failure
    skipped = (
        "Epoch [1][100/62598]\tlr: 1.000e-03, loss_ce: 1.2757, loss: 1.9091, grad_norm: nan\n"
        "Epoch [1][200/62598]\tlr: 1.000e-03, loss_ce: 0.5921, loss: 0.9186, grad_norm: 3.9772"
    )
    assert classify([], skipped).klass is F.UNKNOWN
    # a loss = x series (DeepLab's "step N \t loss = X") that jumps and stays up is a divergence; an evaluation's
    # loss on the same lines ("val loss") is not the training loss
    climb = "\n".join(
        f"step {i} \t loss = {v}, (1.0 sec/step) val loss 0.1" for i, v in enumerate([0.9, 0.7, 0.6, 4.1, 5.3, 6.2])
    )
    failure = classify([], climb)
    assert failure.klass is F.DIVERGED and "loss = 4.1" in failure.evidence
    # perplexity climbing the same way (its logarithm is the loss)
    ppl = "\n".join(f"Epoch 2 ; Iter {i} ; PPL {v} ;" for i, v in enumerate([311.73, 197.73, 149.43, 9000.0, 20000.0]))
    assert classify([], ppl).klass is F.DIVERGED


# the store's and NCCL's torch 2.x wordings, whole, hard-wrapped by a terminal, or glued to a progress bar
HEARTBEAT = (
    "[rank1]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 1] [PG 0 Rank 1] ProcessGroupNCCL's watchdog got stuck for 600 "
    "seconds without making progress in monitoring enqueued collectives."
)  # Intellindust-AI-Lab/DEIM#105
STORE_CONNECT = (
    "[W426 16:56:01.831041000 TCPStore.cpp:347] [c10d] TCP client failed to connect/validate to host "
    "100.64.0.1:59782 - retrying (try=6, timeout=1800000ms, delay=5241ms): Connection reset by peer"
)  # TheTom/vllm-swift#9
STORE_GONE = (
    "[rank6]:[W729 10:15:17.529361055 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=76, "
    "addr=[localhost]:60950, remote=[localhost]:29500): Connection reset by peer"
)  # tdrussell/diffusion-pipe#333
STORE_WORKERS = "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for workers. 1/2 workers joined."


def _wrapped(line: str, inside: str) -> str:
    """The line as a terminal hard-wraps it, cut in the middle of `inside` (at least WRAP_MIN characters in)."""
    cut = max(line.index(inside) + len(inside) // 2, 100)
    assert line[cut - 1].isalnum() and line[cut].isalnum() and cut < line.index(inside) + len(inside)
    return line[:cut] + "\n" + line[cut:]


@pytest.mark.parametrize(
    "log, klass",
    [
        (HEARTBEAT, F.COLLECTIVE_TIMEOUT),
        (_wrapped(HEARTBEAT, "watchdog got stuck for"), F.COLLECTIVE_TIMEOUT),
        (" 45%|####5     | 90/200 [10:01<12:15,  6.68s/it]\r" + HEARTBEAT, F.COLLECTIVE_TIMEOUT),
        (" 45%|####5     | 90/200 [10:01<12:15,  6.68s/it]" + HEARTBEAT, F.COLLECTIVE_TIMEOUT),
        (STORE_CONNECT, F.RENDEZVOUS),
        (STORE_GONE, F.RENDEZVOUS),
        ("{'loss': 1.93, 'epoch': 0.5}\n" + STORE_GONE, F.COLLECTIVE_TIMEOUT),  # the store lost mid-run
        (STORE_WORKERS, F.RENDEZVOUS),
    ],
)
def test_torch2_store_and_nccl_wordings_whole_wrapped_or_glued(log, klass):
    assert classify([], log).klass is klass


def test_submitits_timing_tells_a_preemption_from_a_time_limit():
    # facebookincubator/submitit#1618: the signal 61 minutes into a 120-minute job is no time limit's warning
    preempted = lines(
        "submitit INFO (2021-04-01 02:26:27,643) - Job has not timed out. Ran 61 minutes out of requested 120 minutes.",
        "submitit WARNING (2021-04-01 02:26:27,643) - Caught signal SIGUSR1 on learnfair4096: this job is preempted.",
        "submitit INFO (2021-04-01 02:26:28,004) - Requeued job 39025082 (3 remaining timeouts)",
    )
    failure = classify([], preempted)
    assert failure.klass is F.PREEMPTED and "Ran 61 minutes out of requested 120" in failure.evidence
    # facebookincubator/submitit#1656: 0 of 2 minutes is the warning 90 s before a 2-minute limit
    short = lines(
        "[2021-10-21 11:50:15,215][submitit][INFO] - Job has timed out. Ran 0 minutes out of requested 2 minutes.",
        "[2021-10-21 11:50:15,216][submitit][WARNING] - Caught signal SIGUSR1 on rmc-gpu05: this job is timed-out.",
    )
    assert classify([], short).klass is F.TIME_LIMIT
    # the scheduler's own record outranks submitit's reading of the signal
    stepd = "slurmstepd: error: *** JOB 9 ON n7 CANCELLED AT 2021-04-01T02:27:00 DUE TO TIME LIMIT ***"
    assert classify([], f"{preempted}\n{stepd}").klass is F.TIME_LIMIT
    # submitit giving up (facebookincubator/submitit#1775)
    gave_up = "submitit.core.utils.UncompletedJobError: Job not requeued because: timed-out and not checkpointable."
    assert classify([], gave_up).klass is F.TIME_LIMIT


@pytest.mark.parametrize(
    "line",
    [
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3 (pid: 812917) of "
        "binary: /data/envs/bin/python",  # hpcaitech/ColossalAI#3514
        "[ERROR] [launch.py:321:sigkill_handler [xxx] exits with return code = -9",  # deepspeedai/DeepSpeed#4890
        "2020-11-24 20:22:28.106 /bin/bash: line 27: 318 Killed sh start.sh",  # divamgupta/deep-clustering-kingdra#2
        " 31%|########      | 331/1063 [01:06<03:59,  3.06it/s]Killed",  # InternLandMark/LandMark#65
        "Process finished with exit code 137 (interrupted by signal 9: SIGKILL)",  # NWPUZhoufei/LDP-Net#4
        "Exception: process 1 terminated with signal SIGKILL",  # HRNet/HigherHRNet-Human-Pose-Estimation#47
        "=   EXIT CODE: 9",  # openai/jukebox#155
    ],
)
def test_launchers_words_for_a_memory_kill(line):
    failure = classify([], line)
    assert failure.klass is F.HOST_OOM and failure.nodes == ()
    # a SIGKILL says nothing of memory where a scheduler's end explains it: the scheduler's record decides
    limit = "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-30T01:00:00 DUE TO TIME LIMIT ***"
    assert classify([], f"{limit}\n{line}").klass is F.TIME_LIMIT
    # nor where the peers' collective failed: one rank killed from outside is a transient fault to requeue
    # (test_triage_faults kills a rank of a two-node job)
    watchdog = "[rank0]:[E ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout"
    assert classify([], f"{line}\n{watchdog}").klass is F.COLLECTIVE_TIMEOUT
    # the kubelet naming memory is the memory's own word, like the kernel's OOM killer (kubeflow/kubeflow#1261)
    assert classify([], f"{limit}\nThe node was low on resource: memory.").klass is F.HOST_OOM


def test_other_signals_and_a_killed_word_in_prose_are_no_memory_kill():
    assert classify([], "exits with return code = -11").klass is F.UNKNOWN  # SIGSEGV (deepspeedai/DeepSpeed#3989)
    assert classify([], "the worker was killed").klass is F.UNKNOWN
    assert classify([], "DataLoader worker (pid 7) is killed by signal: Bus error.").klass is F.UNKNOWN


@pytest.mark.parametrize(
    "line",
    [
        "The node with client ID 1eadc9db2f074bfec34caf25dd5bf1f99fad0d59 has been marked dead because the monitor "
        "has missed too many heartbeats from it.",  # ray-project/ray#3446 (Ray 0.6)
        "WARNING worker.py:1462 -- The node with node id: 8f205b12 and ip: 10.128.0.103 has been marked dead because "
        "the detector has missed too many heartbeats from it.",  # ray-project/ray#22349 (Ray 1.10)
        "Task failed because the node it was running on is dead or unavailable. Node IP: 127.0.0.1",  # ray#58638
        " ORTE has lost communication with its daemon located on node:",  # aws/aws-parallelcluster#301
    ],
)
def test_other_launchers_words_for_a_lost_node(line):
    assert classify([], line).klass is F.NODE_FAILURE


def test_cuda_that_cannot_initialise_is_the_nodes_and_a_fault_mid_run_is_not():
    legs = parse_sacct("5|FAILED|1:0|None|gpu031|00:10:00|s|e")
    start = (
        "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
        "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero."
    )  # microsoft/Bringing-Old-Photos-Back-to-Life#52
    failure = classify(legs, start)
    assert failure.klass is F.GPU_HARDWARE and failure.nodes == ("gpu031",)
    samples = "cudaGetDeviceCount returned 999\n-> unknown error"  # NVIDIA/cuda-samples#13
    assert classify(legs, samples).klass is F.GPU_HARDWARE
    for mid_run in ("RuntimeError: CUDA error: unspecified launch failure", "RuntimeError: CUDA error: unknown error"):
        failure = classify(legs, f"{{'loss': 1.2, 'epoch': 3.0}}\n{mid_run}")
        assert failure.klass is F.UNKNOWN and failure.nodes == ()


# ---------------------------------------------------------------- a trainer's own guard, /dev/shm, a lost node (real)


@pytest.mark.parametrize(
    "log, evidence",
    [
        # detectron2's guard, its traceback quoting the f-string that words it (gist-ailab/uoais): the message decides
        (
            lines(
                '  File "/envs/uoais/lib/python3.7/site-packages/detectron2/engine/train_loop.py", line 339, in '
                "write_metrics",
                '    f"Loss became infinite or NaN at iteration={storage.iter}!\\n"',
                "FloatingPointError: Loss became infinite or NaN at iteration=0!",
            ),
            "FloatingPointError: Loss became infinite or NaN at iteration=0!",
        ),
        # a guard that skips steps, then stops (AIGeeksGroup/3D-R1): the stop decides
        (
            lines(
                "Epoch [0/5]; Iter [0/9450]; Loss 10.08; LR 1.00e-06; Iter time 3.72; ETA 9:46:15; Mem 29072.79MB",
                "Loss in not finite. Skip this training step.",
                "Loss in not finite. Terminate training.",
            ),
            "Loss in not finite. Terminate training.",
        ),
        # Keras' TerminateOnNaN glued to the progress bar, after a finite loss (keras-team/keras-tuner)
        (
            "   1/1500 [......] - ETA: 0s - loss: 2.2759 - accuracy: 0.2188Batch 1: Invalid loss, terminating training",
            "Batch 1: Invalid loss, terminating training",
        ),
        ("WARNING: non-finite loss, ending training  tensor([nan, nan, 0., nan], device='cuda:0')", "non-finite loss"),
        # Megatron-Core's checks, as an AssertionError (<= 0.7) and through its rerun state machine (0.8+)
        (
            "AssertionError: Rank 11: found NaN in local grad norm in backward pass before data-parallel "
            "communication collective. Device: 3",
            "found NaN in local grad norm",
        ),
        (
            "i.pretrain/0 [default2]:[rank2]: RuntimeError: Rank 2, node dcfai-xe9680-01, device 2, iteration -1: "
            "Unexpected result nan (message='found NaN in local grad norm for bucket #0 in backward pass before "
            "data-parallel communication collective')",
            "Unexpected result nan",
        ),
        ("ValueError: nan loss encountered", "nan loss encountered"),  # AllenNLP's and OLMo's trainers
    ],
)
def test_a_trainers_own_guard_on_a_loss_that_is_not_finite(log, evidence):
    failure = classify([], log)
    assert failure.klass is F.NAN_LOSS and evidence in failure.evidence
    assert remedy_for(failure, Policy(), 0, CellContext(lr=2e-5)).overrides == ("lr=2e-06",)


@pytest.mark.parametrize(
    "log",
    [
        "Loss in not finite. Skip this training step.",  # the guard skipped a step and training went on
        "NaN loss detected, skipping batch",
        # "inf" and "infinite" inside other words and keys, a finite loss
        "{'loss': 1.23, 'grad_norm': 0.4, 'info': 'inference', 'epoch': 0.5}\nRuntimeError: the reader lost its place",
        "2026-11-30 10:00:01 INFO loss_info: loss 2.31, infinite_loop=off\nRuntimeError: the reader lost its place",
        "ValueError: Invalid loss function: foo",  # a config naming a loss, not a loss value
    ],
)
def test_loss_words_that_are_no_guard_stopping_the_run(log):
    assert classify([], log).klass is not F.NAN_LOSS


# torch's words for the data loader's workers out of /dev/shm, across versions (each from a corpus case)
SHM_WORDINGS = [
    "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
    "RuntimeError: DataLoader worker (pid 3216) is killed by signal: Bus error. It is possible that dataloader's "
    "workers are out of shared memory. Please try to raise your shared memory limit.",
    "RuntimeError: unable to write to file </torch_76_3625483894> at /pytorch/aten/src/TH/THAllocator.c:383",
    "RuntimeError: unable to write to file </torch_15769_1517813162>",
    "RuntimeError: unable to write to file </torch_8289_606636967_0>: No space left on device (28)",
]


@pytest.mark.parametrize("line", SHM_WORDINGS)
def test_the_data_loaders_workers_out_of_shared_memory(line):
    failure = classify(parse_sacct("5|FAILED|1:0|None|gpu031|00:10:00|s|e"), line)
    assert failure.klass is F.SHM_FULL and failure.nodes == ()
    remedy = remedy_for(failure, Policy(), 0)
    assert remedy.kind is RemedyKind.STOP and remedy.exclude_nodes == ()
    assert "/dev/shm" in remedy.message and "dataloader_num_workers" in remedy.message
    # the root cause, not its echo: the other ranks' collective timing out after it, or a later exception
    watchdog = "[rank0]:[E ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout"
    exited = "RuntimeError: DataLoader worker (pid(s) 3216) exited unexpectedly"
    assert classify([], f"{line}\n{watchdog}\n{exited}").klass is F.SHM_FULL


@pytest.mark.parametrize(
    "log, klass",
    [
        # NCCL's transport over shared memory is no data loader's (espnet/espnet's log)
        (
            "a70dc447153aw:55891:63349 [3] NCCL INFO Ring 00 : 3[3] -> 4[4] via direct shared memory\n"
            "RuntimeError: the reader lost its place",
            F.UNKNOWN,
        ),
        ("DataLoader worker (pid 7) is killed by signal: Bus error.", F.UNKNOWN),  # old wording: the signal alone
        # a /torch_ file that cannot be opened or unlinked: the process's file descriptors as often as /dev/shm
        ("RuntimeError: unable to open shared memory object </torch_16550_876314950> in read-write mode", F.UNKNOWN),
        (
            "terminate called after throwing an instance of 'c10::Error'\n  what():  could not unlink the shared "
            "memory file /torch_30417_1951398734 (close at /opt/conda/aten/src/TH/THAllocator.cpp:475)",
            F.UNKNOWN,
        ),
        ("OSError: [Errno 28] No space left on device: '/scratch/run/checkpoint-500'", F.DISK_FULL),
    ],
)
def test_shared_memory_in_other_words_is_not_the_data_loaders(log, klass):
    assert classify([], log).klass is klass


@pytest.mark.parametrize(
    "log, nodes",
    [
        # srun on nodes that never booted (GoogleCloudPlatform/cluster-toolkit, aws/aws-parallelcluster), with and
        # without its node-failure line
        (
            "srun: error: Node failure on od-r7i-4xl-dy-od-128-gb-8-cores-4\n"
            "srun: error: Nodes od-r7i-4xl-dy-od-128-gb-8-cores-4 are still not ready\n"
            "srun: error: Something is wrong with the boot of the nodes.",
            ("od-r7i-4xl-dy-od-128-gb-8-cores-4",),
        ),
        (
            "srun: error: Nodes hpcsmall-debug-ghpc-[0-2] are still not ready\n"
            "srun: error: Something is wrong with the boot of the nodes.",
            (),
        ),
        # an old Slurm's step id ("5.0", before StepId=) in srun's launch failure
        (
            "srun: error: Task launch for 5.0 failed on node ip-172-31-81-213: Communication connection failure",
            ("ip-172-31-81-213",),
        ),
        # slurmstepd's line with and without the node and the pointer to slurmctld's log (Slurm <= 17 and later)
        ("slurmstepd: error: *** JOB 123 CANCELLED AT 2016-03-02T10:11:12 DUE TO NODE FAILURE ***", ()),
        (
            "slurmstepd: error: *** STEP 1943824.0 ON jean-zay-iam17 CANCELLED AT 2023-03-06T03:17:51 DUE TO NODE "
            "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
            (),
        ),
    ],
)
def test_slurms_words_for_a_lost_node_in_the_jobs_log(log, nodes):
    failure = classify([], log)
    assert failure.klass is F.NODE_FAILURE and failure.nodes == nodes
    assert remedy_for(failure, Policy(), 0).kind is RemedyKind.REQUEUE
    # sacct's own record says it too (every leg: --duplicates), and names the node
    assert classify(parse_sacct("7|NODE_FAIL|0:0|None|gpu042|02:13:44|s|e"), "").nodes == ("gpu042",)


# ---------------------------------------------------------------- policy

RERUN = ("python", "-m", "sft_grid", "model=qwen3_8b", "micro_batch_size=4", "rerun_failed=true")


def failure(klass: FailureClass, nodes: tuple[str, ...] = (), **kw) -> Failure:
    kw.setdefault("summary", f"{klass.value} happened")
    return Failure(klass=klass, evidence=kw.pop("evidence", "evidence line"), nodes=nodes, **kw)


def test_time_limit_with_budget_spent_says_where_it_stopped_what_to_change_and_the_rerun_command():
    f = failure(
        F.TIME_LIMIT,
        step=297,
        total=300,
        requeues=3,
        requeue_budget=3,
        summary="time limit reached after 3 requeues (budget 3), at step 297 of 300",
    )
    remedy = remedy_for(f, Policy(), attempts_so_far=3, cell=CellContext(rerun=RERUN, time="04:00:00", nodes=2))
    assert remedy.kind is RemedyKind.STOP
    assert remedy.overrides == ("cluster.max_requeues=4",)
    assert "step 297 of 300" in remedy.message and "checkpoints are kept" in remedy.message
    assert "time=08:00:00" in remedy.message and "nodes=4" in remedy.message
    assert remedy.rerun == (*RERUN, "cluster.max_requeues=4")
    assert remedy.message.endswith("Rerun: " + shlex.join(remedy.rerun))


def test_time_limit_pace_estimate_asks_for_enough_legs():
    f = failure(F.TIME_LIMIT, step=100, total=1000, requeues=0, requeue_budget=0)
    remedy = remedy_for(f, Policy(), 0)
    # 100 steps per leg, 900 to go: 9 more legs
    assert remedy.overrides == ("cluster.max_requeues=9",) and remedy.rerun == ()


def test_time_limit_within_its_budget_is_requeued():
    remedy = remedy_for(failure(F.TIME_LIMIT, requeue_budget=3), Policy(), attempts_so_far=1)
    assert remedy.kind is RemedyKind.REQUEUE and "requeue 2 of 3" in remedy.message


def test_gpu_oom_halves_the_micro_batch_and_keeps_the_global_batch():
    remedy = remedy_for(
        failure(F.GPU_OOM), Policy(), 0, CellContext(rerun=RERUN, micro_batch_size=4, global_batch_size=64)
    )
    assert remedy.kind is RemedyKind.STOP and remedy.overrides == ("micro_batch_size=2",)
    assert "global batch (64) stays" in remedy.message and "accumulation doubles" in remedy.message
    # the rerun replaces the old micro_batch_size instead of repeating it
    assert remedy.rerun == ("python", "-m", "sft_grid", "model=qwen3_8b", "rerun_failed=true", "micro_batch_size=2")


def test_gpu_oom_at_micro_batch_one_suggests_other_fixes():
    remedy = remedy_for(failure(F.GPU_OOM), Policy(), 0, CellContext(micro_batch_size=1))
    assert remedy.overrides == () and "cutoff_len" in remedy.message


@pytest.mark.parametrize(
    "klass,budget",
    [(F.PREEMPTED, 5), (F.NODE_FAILURE, 2), (F.GPU_HARDWARE, 2), (F.COLLECTIVE_TIMEOUT, 2), (F.RENDEZVOUS, 2)],
)
def test_transient_classes_requeue_within_their_budget_then_stop(klass, budget):
    nodes = ("gpu042",) if klass in (F.NODE_FAILURE, F.GPU_HARDWARE) else ()
    first = remedy_for(failure(klass, nodes), Policy(), 0)
    assert first.kind is RemedyKind.REQUEUE and first.exclude_nodes == nodes
    assert "last checkpoint" in first.message
    assert ("excluding gpu042" in first.message) == bool(nodes)
    last = remedy_for(failure(klass, nodes), Policy(), budget)
    assert last.kind is RemedyKind.STOP and f"requeue budget {budget} spent" in last.message


@pytest.mark.parametrize(
    "klass,fix",
    [
        (F.NAN_LOSS, "lower the learning rate"),
        (F.DIVERGED, "lower the learning rate"),
        (F.BACKEND_ERROR, "fix what the evidence names"),
        (F.DISK_FULL, "free space or raise the quota"),
        (F.OFFLINE_HUB, "no internet"),
        (F.CANCELLED, "nothing to fix"),
        (F.HOST_OOM, "host memory"),
        (F.SHM_FULL, "shared memory (/dev/shm"),
        (F.UNKNOWN, "read the cell's log (logs/train.log)"),
    ],
)
def test_stopping_classes_keep_checkpoints_and_say_how_to_fix(klass, fix):
    remedy = remedy_for(failure(klass), Policy(), 0, CellContext(rerun=RERUN))
    assert remedy.kind is RemedyKind.STOP and remedy.exclude_nodes == ()
    assert fix in remedy.message and f"policy: {klass.value} stops" in remedy.message
    assert remedy.rerun == RERUN and remedy.overrides == ()


def test_loss_failures_suggest_a_lower_learning_rate_when_it_is_known():
    remedy = remedy_for(failure(F.NAN_LOSS), Policy(), 0, CellContext(rerun=RERUN, lr=2e-5))
    assert remedy.overrides == ("lr=2e-06",) and remedy.rerun[-1] == "lr=2e-06"
    assert remedy_for(failure(F.HOST_OOM), Policy(), 0, CellContext(mem_gb=64)).overrides == ("cluster.mem_gb=128",)


def test_a_grid_changes_the_policy_with_a_plain_mapping():
    policy = Policy.from_mapping(
        {
            "preempted": {"action": "requeue", "budget": 8},
            "gpu_oom": "stop",
            "node_failure": "requeue:1",
            "collective_timeout": "stop",
        }
    )
    assert policy.rule(F.PREEMPTED) == Rule(RemedyKind.REQUEUE, 8)
    assert policy.rule(F.NODE_FAILURE) == Rule(RemedyKind.REQUEUE, 1)
    assert remedy_for(failure(F.COLLECTIVE_TIMEOUT), policy, 0).kind is RemedyKind.STOP
    assert remedy_for(failure(F.NODE_FAILURE, ("n1",)), policy, 1).kind is RemedyKind.STOP
    assert policy.rule(F.RENDEZVOUS) == DEFAULT_RULES[F.RENDEZVOUS]
    # a class that normally stops can be made transient by a grid
    assert (
        remedy_for(failure(F.DISK_FULL), Policy.from_mapping({"disk_full": "requeue:1"}), 0).kind is RemedyKind.REQUEUE
    )


@pytest.mark.parametrize(
    "changes", [{"nosuch": "stop"}, {"gpu_oom": "retry"}, {"preempted": {"budget": -1}}, {"preempted": "requeue:two"}]
)
def test_bad_policy_changes_are_refused(changes):
    with pytest.raises(ValueError):
        Policy.from_mapping(changes)


def test_overrides_and_times():
    assert with_overrides(["a=1", "+b=2", "c"], ["b=3", "d=4"]) == ("a=1", "c", "b=3", "d=4")
    assert parse_time("04:00:00") == 14400 and parse_time("1-02:00:00") == 93600 and parse_time("90") == 5400
    assert duration(2 * 93600) == "2-04:00:00" and duration(28800) == "08:00:00"


def test_classify_then_decide_end_to_end_on_a_node_failure():
    _, case = next(c for c in CASES if c[0] == "node_failure_02_multinode_srun_names_node")
    remedy = remedy_for(run_case(case), Policy(), 0)
    assert remedy.kind is RemedyKind.REQUEUE and remedy.exclude_nodes == ("gpu042",)


def _leg_history(*starts: str) -> list:
    """A submitted cell's ledger with one leg per start ("" starts from scratch, else resumes that checkpoint)."""
    from sft_grid.core.events import Event, Kind

    out = [Event(Kind.SUBMITTED, executor="slurm", array="sft_grid-x", index=0)]
    for start in starts:
        out.append(Event(Kind.RUNNING, job_id="7"))
        if start:
            out.append(Event(Kind.RESUMED, checkpoint=start))
        out.append(Event(Kind.REQUEUED, job_id="7"))
    return out


@pytest.mark.parametrize(
    "starts, saved, stuck",
    [
        (("", "checkpoint-20"), ["checkpoint-20", "checkpoint-40"], False),  # the second leg saved one: progress
        (("checkpoint-20", "checkpoint-20"), ["checkpoint-20"], True),  # two legs from the same, nothing newer
        (("", ""), [], True),  # two legs that never reached the first checkpoint
        (("checkpoint-20",), ["checkpoint-20"], False),  # one leg alone: a preemption can end a leg early
        (("checkpoint-20", "checkpoint-20"), ["checkpoint-20", "checkpoint-40"], False),  # the last leg saved one
    ],
)
def test_a_requeue_is_refused_when_two_legs_in_a_row_saved_nothing(tmp_path, starts, saved, stuck):
    from sft_grid.core.failures.cell import stalled

    (tmp_path / "cell.yaml").write_text(
        "# Rerun this cell: python -m sft_grid model=m save_steps=20 time=00:10:00\n"
        "save_steps: 20\ntime: '00:10:00'\ncluster: {max_requeues: 9}\n"
    )
    for name in saved:
        (tmp_path / "output" / name).mkdir(parents=True)
    event = stalled(tmp_path, _leg_history(*starts), "7")
    assert (event is not None) is stuck
    if stuck:
        assert event.failure_class == "time_limit" and event.action == "stop" and event.job_id == "7"
        assert "no progress" in event.reason and "each started" in event.evidence
        assert "save_steps=5" in event.note and "time=00:20:00" in event.note
        assert "Rerun: python -m sft_grid model=m rerun_failed=true save_steps=5 time=00:20:00" in event.note


def test_a_job_killed_in_its_data_step_says_so(tmp_path):
    """The data step's record (in_venv/data_step.py) of the latest leg has a start and no end: the summary says the
    job ended there (a tokenization that hung reads as one, not as a slow training); an earlier leg's open start,
    and a step that ended, say nothing."""
    import json
    import time

    from sft_grid.core.events import Event, Kind
    from sft_grid.core.failures.cell import in_data_step, open_data_step

    leg = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(leg))
    history = [Event(Kind.SUBMITTED), Event(Kind.RUNNING, time=stamp)]
    records = [
        {"event": "start", "what": "get_dataset", "rank": 0, "pid": 1, "time": leg - 600},  # an earlier leg's
        {"event": "start", "what": "get_dataset", "rank": 0, "pid": 2, "time": leg + 5},
        {"event": "end", "what": "get_dataset", "rank": 0, "pid": 2, "time": leg + 9, "ok": True},
        {"event": "start", "what": "get_dataset", "rank": 1, "pid": 3, "time": leg + 6},
    ]
    (tmp_path / "data_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{torn")
    assert open_data_step(tmp_path, history)["pid"] == 3
    before = failure(FailureClass.TIME_LIMIT)
    after = in_data_step(before, tmp_path, history)
    assert after.summary.startswith(before.summary) and after.klass is FailureClass.TIME_LIMIT
    assert "in its data step (get_dataset on rank 1, started " in after.summary and "never finished" in after.summary

    (tmp_path / "data_step.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    assert open_data_step(tmp_path, history) is None and in_data_step(before, tmp_path, history) == before
    (tmp_path / "data_step.jsonl").unlink()
    assert in_data_step(before, tmp_path, history) == before
