"""Notifications (sft_grid/stages/notify.py) against a real HTTP receiver on loopback and real commands.

The receiver is a small http.server in a thread, answering from a script of status codes; it is shut
down by the fixture. Every wait is bounded (client timeouts, subprocess timeouts, Event.wait deadlines).
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import sys
from pathlib import Path

import pytest

from sft_grid.stages import notify as n

TOKEN = "s3cretT0kenValue42"


def event(outcome: str = "failed", attempt: int = 1) -> n.Notice:
    return n.cell_event(
        "smoke",
        "tiny_llama_lr2e-5-ab12",
        outcome,
        attempt,
        failure_class="gpu_oom",
        summary="GPU out of memory, at step 12 of 300",
        step=12,
        total=300,
        job_id="55_3",
    )


def config(**kw) -> n.NotifyConfig:
    kw.setdefault("timeout_s", 5.0)
    kw.setdefault("backoff_s", 0.01)
    return n.NotifyConfig(**kw)


def test_webhook_posts_the_event_as_json(receiver):
    [d] = n.send(event(), config(webhook=receiver.url()))
    assert d.ok and d.channel == "webhook" and d.attempts == 1 and "HTTP 200" in d.detail
    [req] = receiver.requests
    assert req["path"] == "/hook" and req["headers"]["Content-Type"] == "application/json"
    body = json.loads(req["body"])
    assert body["kind"] == "cell" and body["grid"] == "smoke" and body["cell"] == "tiny_llama_lr2e-5-ab12"
    assert body["outcome"] == "failed" and body["class"] == "gpu_oom" and body["attempt"] == 1
    assert body["details"] == {"step": 12, "total": 300, "job_id": "55_3"}
    assert body["key"] == n.dedup_key("smoke/tiny_llama_lr2e-5-ab12", "failed", 1)


def test_webhook_retries_server_errors_then_succeeds(receiver):
    receiver.statuses = [503, 500]
    [d] = n.send(event(), config(webhook=receiver.url(), retries=2))
    assert d.ok and d.attempts == 3 and len(receiver.requests) == 3


def test_webhook_gives_up_after_its_retries_without_raising(receiver, caplog):
    receiver.statuses = [500] * 10
    url = receiver.url(f"/hook?token={TOKEN}")
    with caplog.at_level(logging.INFO, logger=n.__name__):
        [d] = n.send(event(), config(webhook=url, retries=2))
    assert not d.ok and d.attempts == 3 and "HTTP 500" in d.detail and len(receiver.requests) == 3
    assert TOKEN not in d.detail and TOKEN not in caplog.text and "token=" not in caplog.text
    assert "?***" in caplog.text


def test_webhook_does_not_retry_a_client_error(receiver):
    receiver.statuses = [400]
    [d] = n.send(event(), config(webhook=receiver.url(), retries=3))
    assert not d.ok and d.attempts == 1 and "HTTP 400" in d.detail


def test_webhook_timeout_is_short_and_bounded(receiver):
    receiver.hang = True
    [d] = n.send(event(), config(webhook=receiver.url(), timeout_s=0.3, retries=0))
    receiver.release.set()
    assert not d.ok and d.attempts == 1 and "timed out" in d.detail.lower()


def test_webhook_to_a_closed_port_fails_quietly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [d] = n.send(event(), config(webhook=f"http://127.0.0.1:{port}/x", retries=1))
    assert not d.ok and d.attempts == 2 and "refused" in d.detail.lower()


def test_userinfo_becomes_basic_auth_and_never_reaches_the_logs(receiver, caplog):
    url = receiver.url("/hook").replace("http://", f"http://bot:{TOKEN}@")
    with caplog.at_level(logging.INFO, logger=n.__name__):
        [d] = n.send(event(), config(webhook=url))
    assert d.ok
    auth = receiver.requests[0]["headers"]["Authorization"]
    assert base64.b64decode(auth.split()[1]).decode() == f"bot:{TOKEN}"
    assert TOKEN not in caplog.text and "bot:" not in caplog.text and "***@127.0.0.1" in caplog.text


@pytest.mark.parametrize(
    "url,shown",
    [
        ("https://user:pw@hooks.example.org/notify?token=abc#frag", "https://***@hooks.example.org/notify?***#***"),
        (
            "https://hooks.slack.com/services/T0AB12CD3/B0AB12CD3/AbCdEfGhIjKlMnOpQrStUvWx",
            "https://hooks.slack.com/services/***/***/***",
        ),
        ("http://127.0.0.1:8080/hook", "http://127.0.0.1:8080/hook"),
        ("http://[::1]:9/x?k=v", "http://[::1]:9/x?***"),
    ],
)
def test_redact_url(url, shown):
    assert n.redact_url(url) == shown


def test_bad_urls_are_a_failed_delivery_not_an_exception():
    for url in ("ftp://example.org/x", "not a url", "http://[::1"):
        [d] = n.send(event(), config(webhook=url))
        assert not d.ok


def append_command(target: Path) -> tuple[str, ...]:
    """A command that appends its stdin, then the event's class from the environment, to a file."""
    return ("sh", "-c", 'cat >> "$1" && printf "\\nclass=%s\\n" "$SFT_GRID_EVENT_CLASS" >> "$1"', "sh", str(target))


def test_command_gets_the_event_on_stdin_and_in_its_environment(tmp_path):
    out = tmp_path / "events.log"
    [d] = n.send(event(), config(command=append_command(out)))
    assert d.ok and d.channel == "command"
    body, env_line = out.read_text().strip().split("\n")
    assert json.loads(body)["summary"] == "GPU out of memory, at step 12 of 300"
    assert env_line == "class=gpu_oom"
    env = event().environ()
    assert env["SFT_GRID_EVENT_OUTCOME"] == "failed" and env["SFT_GRID_EVENT_STEP"] == "12"
    assert env["SFT_GRID_EVENT_KEY"] == event().key


def test_command_failures_are_reported_not_raised(tmp_path):
    boom = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    [d] = n.send(event(), config(command=(sys.executable, "-c", boom)))
    assert not d.ok and "exit 3: boom" in d.detail
    [d] = n.send(event(), config(command=(str(tmp_path / "missing-notifier"),)))
    assert not d.ok
    [d] = n.send(event(), config(command=(sys.executable, "-c", "import time; time.sleep(60)"), timeout_s=0.5))
    assert not d.ok and "killed" in d.detail


def test_both_channels_are_used(receiver, tmp_path):
    out = tmp_path / "events.log"
    deliveries = n.send(
        n.grid_event("smoke", {"completed": 3, "failed": 1}),
        config(command=append_command(out), webhook=receiver.url()),
    )
    assert [d.channel for d in deliveries] == ["command", "webhook"] and all(d.ok for d in deliveries)
    body = json.loads(receiver.requests[0]["body"])
    assert body["kind"] == "grid" and body["summary"] == "grid smoke done: 3 completed, 1 failed"


def test_dedup_across_requeues_and_reruns(receiver):
    cfg, sent = config(webhook=receiver.url()), set()
    for _ in range(3):  # the same attempt seen again (a requeued job, a runner on every node)
        if n.send_once(event(), cfg, sent):
            sent.add(event().key)
    assert len(receiver.requests) == 1
    assert n.send_once(event(attempt=2), cfg, sent)  # a rerun is a new attempt
    assert n.send_once(event(outcome="completed", attempt=2), cfg, sent)
    assert len(receiver.requests) == 3
    assert n.send_once(event(), n.NotifyConfig(), set()) == []  # nothing configured: nothing sent


def test_dedup_key_is_pure():
    k = n.dedup_key("smoke/cell", "failed", 1)
    assert k == n.dedup_key("smoke/cell", "failed", 1)
    assert (
        len(
            {
                k,
                n.dedup_key("smoke/cell", "failed", 2),
                n.dedup_key("smoke/cell", "completed", 1),
                n.dedup_key("smoke/other", "failed", 1),
            }
        )
        == 4
    )
    assert n.should_send(k, set()) and not n.should_send(k, {k})


def test_config_from_a_grid_mapping():
    cfg = n.NotifyConfig.from_mapping({"command": ["notify-send", "sft"], "webhook": "https://x/y", "retries": 1})
    assert cfg.command == ("notify-send", "sft") and cfg.webhook == "https://x/y" and cfg.retries == 1 and cfg.enabled
    assert not n.NotifyConfig.from_mapping(None).enabled
    with pytest.raises(ValueError):
        n.NotifyConfig.from_mapping({"command": "notify-send sft"})
