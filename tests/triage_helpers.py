"""The failure triage corpus (tests/triage_corpus): its labelled cases, in two splits, and their logs.

The main split is what the classifier's signs were written from; the holdout split (triage_corpus/holdout) is
a stratified fifth of the real cases that they were not: its accuracy is the classifier's measured one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "triage_corpus"
HOLDOUT = CORPUS / "holdout"


def corpus_cases(split: str = "main") -> list[tuple[str, dict[str, Any]]]:
    """The cases of one split ("main" or "holdout"), by file stem."""
    folder = HOLDOUT if split == "holdout" else CORPUS
    return [(p.stem, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def case_log(case: dict[str, Any]) -> str | list[str]:
    """A case's log: "log" (one text, lines as a list) or "logs" (several texts)."""
    if "logs" in case:
        return ["\n".join(text) for text in case["logs"]]
    log = case.get("log", "")
    return "\n".join(log) if isinstance(log, list) else log


def is_real(name: str, case: dict[str, Any]) -> bool:
    """A case taken from a public issue tracker or logbook (the others were measured on a local cluster)."""
    return "source" in case or "family" in case or "_r0" in name
