"""The failure triage corpus (tests/triage_corpus): its labelled cases and their logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "triage_corpus"


def corpus_cases() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(CORPUS.glob("*.json"))]


def case_log(case: dict[str, Any]) -> str | list[str]:
    """A case's log: "log" (one text, lines as a list) or "logs" (several texts)."""
    if "logs" in case:
        return ["\n".join(text) for text in case["logs"]]
    log = case.get("log", "")
    return "\n".join(log) if isinstance(log, list) else log
