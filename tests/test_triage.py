"""Failure triage: the labelled corpus (tests/triage_corpus/*.json, real Slurm/PyTorch/NCCL/CUDA/OS/Hub/
backend messages) is classified 100% right, and each class's policy decision says and suggests the right
thing. Pure and fast: no process, no file but the corpus."""

from __future__ import annotations

import shlex
from collections import Counter

import pytest

from sft_grid.core.failure_policy import (DEFAULT_RULES, ActionKind, CellContext, Policy, Rule, decide, format_time,
                                          parse_time, with_overrides)
from sft_grid.core.failures import Failure, FailureClass, classify, split_attempts, summarize
from sft_grid.core.sacct_legs import SACCT_FORMAT, expand_hostlist, group_legs, parse_sacct, sacct_argv
from tests.triage_helpers import case_log, corpus_cases

CASES = corpus_cases()
F = FailureClass


def run_case(case: dict) -> Failure:
    legs = parse_sacct("\n".join(case.get("sacct", [])))
    return classify(legs, case_log(case), case.get("watchdog"), case.get("requeues_used"),
                    case.get("requeue_budget", 0), case.get("step"), case.get("total"))


def test_corpus_is_large_and_covers_every_class_several_times():
    assert len(CASES) >= 60
    counts = Counter(case["expect"]["class"] for _, case in CASES)
    assert set(counts) == {c.value for c in FailureClass}
    assert all(n >= 4 for n in counts.values()), counts
    for name, case in CASES:
        assert case["expect"]["evidence"], name
        assert "sacct" in case or "log" in case or "logs" in case or "watchdog" in case, name


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
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
    text = ("JobID|State|ExitCode|Reason|NodeList|Elapsed|Start|End\n"
            "55_3|REQUEUED|0:0|BeginTime|n1|01:00:00|s|e\n"
            "55_3.batch|CANCELLED|0:15||n1|01:00:00|s|e\n"
            "55_3|TIMEOUT|0:0|None|n[2-3]|01:00:00|s|e\n"
            "55_4|CANCELLED by 1000|0:0|Dependency|None assigned|00:00:00|None|e\n"
            "\n"
            "garbage line\n")
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


@pytest.mark.parametrize("expr,names", [
    ("n1", ["n1"]), ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu[007-009,12],login1", ["gpu007", "gpu008", "gpu009", "gpu12", "login1"]),
    ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
])
def test_hostlists_expand_as_slurm_writes_them(expr, names):
    assert expand_hostlist(expr) == names


def test_logs_split_into_attempts_at_restart_and_requeue_markers():
    log = "\n".join(["a", "submitit INFO (x) - Requeued job 5 (2 remaining timeouts)", "b",
                     "=== sft_grid: 2026 bash launch.sh", "c"])
    assert split_attempts(log) == [["a", "submitit INFO (x) - Requeued job 5 (2 remaining timeouts)"], ["b"],
                                   ["=== sft_grid: 2026 bash launch.sh", "c"]]
    assert split_attempts("") == [[]]


def test_wrappers_and_pending_reasons_alone_decide_nothing():
    legs = parse_sacct("7|FAILED|1:0|Dependency|n1|00:01:00|s|e")
    log = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
           "subprocess.CalledProcessError: Command 'x'")
    failure = classify(legs, log)
    assert failure.klass is F.UNKNOWN and "Dependency" not in failure.summary


def test_several_logs_each_contribute_their_last_attempt():
    stepd = "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-30T01:00:00 DUE TO TIME LIMIT ***"
    failure = classify([], ["{'loss': 2.0}\n=== sft_grid: x\nValueError: bad key", stepd])
    assert failure.klass is F.TIME_LIMIT


def test_summary_wording():
    assert summarize(F.GPU_OOM, "torch.OutOfMemoryError: CUDA out of memory.", (), 0, 0, 12, 300) == \
        "GPU out of memory, at step 12 of 300: torch.OutOfMemoryError: CUDA out of memory."
    assert summarize(F.PREEMPTED, "x", (), 1, 5, None, None) == "preempted by the scheduler after 1 requeue (budget 5)"
    assert len(summarize(F.BACKEND_ERROR, "E" * 1000, (), 0, 0, None, None)) < 300


# ---------------------------------------------------------------- policy

RERUN = ("python", "-m", "sft_grid", "model=qwen3_8b", "micro_batch_size=4", "rerun_failed=true")


def failure(klass: FailureClass, nodes: tuple[str, ...] = (), **kw) -> Failure:
    kw.setdefault("summary", f"{klass.value} happened")
    return Failure(klass, kw.pop("evidence", "evidence line"), nodes, **kw)


def test_time_limit_with_budget_spent_says_where_it_stopped_what_to_change_and_the_rerun_command():
    f = failure(F.TIME_LIMIT, step=297, total=300, requeues=3, requeue_budget=3,
                summary="time limit reached after 3 requeues (budget 3), at step 297 of 300")
    action = decide(f, Policy(), attempts_so_far=3, cell=CellContext(rerun=RERUN, time="04:00:00", nodes=2))
    assert action.kind is ActionKind.STOP
    assert action.overrides == ("cluster.max_requeues=4",)
    assert "step 297 of 300" in action.message and "checkpoints are kept" in action.message
    assert "time=08:00:00" in action.message and "nodes=4" in action.message
    assert action.rerun == (*RERUN, "cluster.max_requeues=4")
    assert action.message.endswith("Rerun: " + shlex.join(action.rerun))


def test_time_limit_pace_estimate_asks_for_enough_legs():
    f = failure(F.TIME_LIMIT, step=100, total=1000, requeues=0, requeue_budget=0)
    action = decide(f, Policy(), 0)
    # 100 steps per leg, 900 to go: 9 more legs
    assert action.overrides == ("cluster.max_requeues=9",) and action.rerun == ()


def test_time_limit_within_its_budget_is_requeued():
    action = decide(failure(F.TIME_LIMIT, requeue_budget=3), Policy(), attempts_so_far=1)
    assert action.kind is ActionKind.REQUEUE and "requeue 2 of 3" in action.message


def test_gpu_oom_halves_the_micro_batch_and_keeps_the_global_batch():
    action = decide(failure(F.GPU_OOM), Policy(), 0, CellContext(rerun=RERUN, micro_batch_size=4, global_batch_size=64))
    assert action.kind is ActionKind.STOP and action.overrides == ("micro_batch_size=2",)
    assert "global batch (64) stays" in action.message and "accumulation doubles" in action.message
    # the rerun replaces the old micro_batch_size instead of repeating it
    assert action.rerun == ("python", "-m", "sft_grid", "model=qwen3_8b", "rerun_failed=true", "micro_batch_size=2")


def test_gpu_oom_at_micro_batch_one_suggests_other_fixes():
    action = decide(failure(F.GPU_OOM), Policy(), 0, CellContext(micro_batch_size=1))
    assert action.overrides == () and "cutoff_len" in action.message


@pytest.mark.parametrize("klass,budget", [(F.PREEMPTED, 5), (F.NODE_FAILURE, 2), (F.GPU_HARDWARE, 2),
                                          (F.COLLECTIVE_TIMEOUT, 2), (F.RENDEZVOUS, 2)])
def test_transient_classes_requeue_within_their_budget_then_stop(klass, budget):
    nodes = ("gpu042",) if klass in (F.NODE_FAILURE, F.GPU_HARDWARE) else ()
    first = decide(failure(klass, nodes), Policy(), 0)
    assert first.kind is ActionKind.REQUEUE and first.exclude_nodes == nodes
    assert "last checkpoint" in first.message
    assert ("excluding gpu042" in first.message) == bool(nodes)
    last = decide(failure(klass, nodes), Policy(), budget)
    assert last.kind is ActionKind.STOP and f"requeue budget {budget} spent" in last.message


@pytest.mark.parametrize("klass,fix", [
    (F.NAN_LOSS, "lower the learning rate"), (F.DIVERGED, "lower the learning rate"),
    (F.BACKEND_ERROR, "fix what the evidence names"), (F.DISK_FULL, "free space or raise the quota"),
    (F.OFFLINE_HUB, "no internet"), (F.CANCELLED, "nothing to fix"), (F.HOST_OOM, "host memory"),
    (F.UNKNOWN, "read the cell's log"),
])
def test_stopping_classes_keep_checkpoints_and_say_how_to_fix(klass, fix):
    action = decide(failure(klass), Policy(), 0, CellContext(rerun=RERUN))
    assert action.kind is ActionKind.STOP and action.exclude_nodes == ()
    assert fix in action.message and f"policy: {klass.value} stops" in action.message
    assert action.rerun == RERUN and action.overrides == ()


def test_loss_failures_suggest_a_lower_learning_rate_when_it_is_known():
    action = decide(failure(F.NAN_LOSS), Policy(), 0, CellContext(rerun=RERUN, lr=2e-5))
    assert action.overrides == ("lr=2e-06",) and action.rerun[-1] == "lr=2e-06"
    assert decide(failure(F.HOST_OOM), Policy(), 0, CellContext(mem_gb=64)).overrides == ("cluster.mem_gb=128",)


def test_a_grid_changes_the_policy_with_a_plain_mapping():
    policy = Policy.from_mapping({"preempted": {"action": "requeue", "budget": 8}, "gpu_oom": "stop",
                                  "node_failure": "requeue:1", "collective_timeout": "stop"})
    assert policy.rule(F.PREEMPTED) == Rule(ActionKind.REQUEUE, 8)
    assert policy.rule(F.NODE_FAILURE) == Rule(ActionKind.REQUEUE, 1)
    assert decide(failure(F.COLLECTIVE_TIMEOUT), policy, 0).kind is ActionKind.STOP
    assert decide(failure(F.NODE_FAILURE, ("n1",)), policy, 1).kind is ActionKind.STOP
    assert policy.rule(F.RENDEZVOUS) == DEFAULT_RULES[F.RENDEZVOUS]
    # a class that normally stops can be made transient by a grid
    assert decide(failure(F.DISK_FULL), Policy.from_mapping({"disk_full": "requeue:1"}), 0).kind is ActionKind.REQUEUE


@pytest.mark.parametrize("changes", [{"nosuch": "stop"}, {"gpu_oom": "retry"}, {"preempted": {"budget": -1}},
                                     {"preempted": "requeue:two"}])
def test_bad_policy_changes_are_refused(changes):
    with pytest.raises(ValueError):
        Policy.from_mapping(changes)


def test_overrides_and_times():
    assert with_overrides(["a=1", "+b=2", "c"], ["b=3", "d=4"]) == ("a=1", "c", "b=3", "d=4")
    assert parse_time("04:00:00") == 14400 and parse_time("1-02:00:00") == 93600 and parse_time("90") == 5400
    assert format_time(2 * 93600) == "2-04:00:00" and format_time(28800) == "08:00:00"


def test_classify_then_decide_end_to_end_on_a_node_failure():
    _, case = next(c for c in CASES if c[0] == "node_failure_02_multinode_srun_names_node")
    action = decide(run_case(case), Policy(), 0)
    assert action.kind is ActionKind.REQUEUE and action.exclude_nodes == ("gpu042",)


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


@pytest.mark.parametrize("starts, saved, stuck", [
    (("", "checkpoint-20"), ["checkpoint-20", "checkpoint-40"], False),  # the second leg saved one: progress
    (("checkpoint-20", "checkpoint-20"), ["checkpoint-20"], True),  # two legs from the same, nothing newer
    (("", ""), [], True),  # two legs that never reached the first checkpoint
    (("checkpoint-20",), ["checkpoint-20"], False),  # one leg alone: a preemption can end a leg early
    (("checkpoint-20", "checkpoint-20"), ["checkpoint-20", "checkpoint-40"], False),  # the last leg saved one
])
def test_a_requeue_is_refused_when_two_legs_in_a_row_saved_nothing(tmp_path, starts, saved, stuck):
    from sft_grid.core.triage import stalled

    (tmp_path / "cell.yaml").write_text("# Rerun this cell: python -m sft_grid model=m save_steps=20 time=00:10:00\n"
                                        "save_steps: 20\ntime: '00:10:00'\ncluster: {max_requeues: 9}\n")
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
    from sft_grid.core.triage import in_data_step, open_data_step

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
