"""Run a backend's own preprocessing on a few rows and report, per token, what it trains (standalone:
runs in the backend's environment, never imports sft_grid).

    <backend env>/bin/python mask_probe.py BATCH.json OUT.json

BATCH.json is a list of jobs, one per unique (tokenizer, template, dataset fields) of a grid, so one
process (one ~10 s import of the backend) serves every loss-mask check of the grid:

    {"id": ..., "reader": "llamafactory" | "axolotl", "model": <tokenizer dir>, "rows": [<raw rows>],
     "column": "messages", "tags": {"role_tag": ..., ...}, "spec": {<the backend's own settings>}}

OUT.json holds, per job, either {"id", "error"} or {"id", "rows": [...]} where each row has the
conversation as the cell's tags read it (`messages`: [kind, content], kind user/assistant/system/tool/
function, or other for a role no tag matches; plus the raw role values), whether the backend dropped it
(and the warnings it logged), and `segments`:
[text, trained, markup] runs of consecutive tokens (markup: an added/special token of the tokenizer). The mask is
judged on the whole row; with the cell's `cutoff_len` in the job's spec, each row also has `n_trained_cut`: the
tokens it still trains once the backend truncates it there as the job will (LLaMA-Factory's processor at that
cutoff; axolotl's own handling of a longer sequence, dropped or truncated).
Deciding whether that mask is right is the orchestrator's job (sft_grid/checks/mask.py), so the logic stays
pure and testable; this file only asks the backend.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any

IGNORE = -100


class _Captured(logging.Handler):
    """The warnings a backend logs while it processes one row (why it dropped or skipped it)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage()[:300])


def conversation(row: dict[str, Any], column: str, tags: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """The row's turns as the cell's tags read them: [kind, content] and the raw role values."""
    kinds = {
        tags.get("observation_tag"): "tool",
        tags.get("function_tag"): "function",
        tags.get("assistant_tag"): "assistant",
        tags.get("user_tag"): "user",
        tags.get("system_tag"): "system",
    }
    kinds.pop(None, None)
    turns, raw = [], []
    for msg in row.get(column) or []:
        if not isinstance(msg, dict):
            continue
        role = msg.get(tags.get("role_tag", "role"))
        raw.append(str(role))
        content = msg.get(tags.get("content_tag", "content"))
        turns.append([kinds.get(role, "other"), content if isinstance(content, str) else json.dumps(content)])
    return turns, raw


def segments(tokenizer: Any, input_ids: list[int], labels: list[int]) -> list[list[Any]]:
    """Runs of tokens with the same (trained, markup) flags, each decoded as one piece of text."""
    markup = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(tokenizer.all_special_ids)
    runs: list[list[Any]] = []
    current: list[int] = []
    flags: tuple[bool, bool] | None = None
    for tok, lab in zip(input_ids, labels, strict=True):
        f = (lab != IGNORE, tok in markup)
        if f != flags and current:
            assert flags is not None  # set with the first token
            runs.append(
                [tokenizer.decode(current, skip_special_tokens=False, clean_up_tokenization_spaces=False), *flags]
            )
            current = []
        flags = f
        current.append(tok)
    if current and flags is not None:
        runs.append([tokenizer.decode(current, skip_special_tokens=False, clean_up_tokenization_spaces=False), *flags])
    return runs


def row_result(
    tokenizer: Any,
    raw: dict[str, Any],
    job: dict[str, Any],
    input_ids: list[int] | None,
    labels: list[int] | None,
    warnings: list[str],
    trained_cut: int | None = None,
) -> dict[str, Any]:
    turns, roles = conversation(raw, job["column"], job["tags"])
    out: dict[str, Any] = {"messages": turns, "roles": roles, "warnings": warnings[:5]}
    if trained_cut is not None:  # the tokens it trains as the job truncates it, at the cell's cutoff_len
        out["n_trained_cut"] = trained_cut
    if input_ids is None or labels is None:
        out.update(dropped=True, segments=[], n_tokens=0, n_trained=0)
    else:
        out.update(
            dropped=False,
            segments=segments(tokenizer, input_ids, labels),
            n_tokens=len(input_ids),
            n_trained=sum(1 for lab in labels if lab != IGNORE),
        )
    return out


# -- LLaMA-Factory ---------------------------------------------------------------------------------------


def _register_templates(templates: dict[str, str]) -> None:
    """sft_grid's own chat templates (name -> jinja file, e.g. delphi), registered inside LLaMA-Factory by
    the project's module beside this file, exactly as training registers them."""
    if not templates:
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sft_grid_lf

    sft_grid_lf.register_all(templates)


def llamafactory(job: dict[str, Any]) -> list[dict[str, Any]]:
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.data.processor import SupervisedDatasetProcessor
    from llamafactory.extras import logging as lf_logging
    from llamafactory.hparams import DataArguments, ModelArguments
    from llamafactory.model import load_tokenizer

    spec = job["spec"]
    _register_templates(spec.get("templates") or {})
    # the cell's own data arguments (template, train_on_prompt, mask_history, enable_thinking, ...); no
    # truncation, so that a long row is judged on its whole mask
    data_args = DataArguments(**{**spec.get("data_args", {}), "cutoff_len": 10**7})
    model_args = ModelArguments(model_name_or_path=job["model"])
    tok_module = load_tokenizer(model_args)
    tokenizer = tok_module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    attr = DatasetAttr("file", dataset_name=job["id"])
    attr.join(spec["dataset_info"])
    converter = get_dataset_converter(attr.formatting, attr, data_args)
    processor = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=tok_module.get("processor"), data_args=data_args
    )
    # and as the job truncates it: the same processor at the cell's cutoff_len
    cutoff = spec.get("cutoff_len")
    cut_args = DataArguments(**{**spec.get("data_args", {}), "cutoff_len": cutoff or 10**7})
    cut_processor = SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=tok_module.get("processor"), data_args=cut_args
    )
    captured = _Captured()
    lf_logging.add_handler(captured)
    results = []
    try:
        for raw in job["rows"]:
            captured.lines = []
            try:
                aligned = converter(raw)
                encoded = processor.preprocess_dataset({k: [v] for k, v in aligned.items()})
            except Exception as exc:  # the backend could not process this row at all: that is a finding
                captured.lines.append(f"{type(exc).__name__}: {exc}"[:300])
                encoded = {}
            ids = encoded.get("input_ids") or [None]
            labs = encoded.get("labels") or [None]
            cut = None
            if cutoff and ids[0] is not None:
                try:
                    cut_labels = (
                        cut_processor.preprocess_dataset({k: [v] for k, v in aligned.items()}).get("labels") or [[]]
                    )[0]
                    cut = sum(1 for lab in cut_labels if lab != IGNORE)
                except Exception as exc:  # the whole row encoded: its truncation is left unjudged, said why
                    captured.lines.append(f"at cutoff_len {cutoff}: {type(exc).__name__}: {exc}"[:300])
            results.append(row_result(tokenizer, raw, job, ids[0], labs[0], list(captured.lines), cut))
    finally:
        lf_logging.remove_handler(captured)
    return results


# -- axolotl ---------------------------------------------------------------------------------------------


def axolotl(job: dict[str, Any]) -> list[dict[str, Any]]:
    """axolotl's own chat_template prompt strategy, configured from the cell's rendered config."""
    from axolotl.prompt_strategies.chat_template import load as load_strategy
    from axolotl.utils.dict import DictDefault
    from transformers import AutoTokenizer

    spec = job["spec"]
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    cfg = DictDefault({"sequence_len": 10**7, "train_on_inputs": False, **spec.get("cfg", {})})
    ds_cfg = DictDefault(spec["dataset"])
    strategy = load_strategy(tokenizer, cfg, ds_cfg)
    captured = _Captured()
    logging.getLogger("axolotl").addHandler(captured)
    results = []
    encoded_rows: list[tuple[list[int], list[int]] | None] = []
    try:
        for raw in job["rows"]:
            captured.lines = []
            try:
                encoded = strategy.tokenize_prompt(raw)
                ids, labs = encoded.get("input_ids"), encoded.get("labels")
                if not ids:
                    ids = labs = None
            except Exception as exc:
                captured.lines.append(f"{type(exc).__name__}: {exc}"[:300])
                ids = labs = None
            results.append(row_result(tokenizer, raw, job, ids, labs, list(captured.lines)))
            encoded_rows.append((ids, labs) if ids is not None and labs is not None else None)
    finally:
        logging.getLogger("axolotl").removeHandler(captured)
    cutoff = spec.get("cutoff_len")
    if cutoff:
        for row, trained in zip(results, _axolotl_cut(encoded_rows, cfg, cutoff), strict=True):
            row["n_trained_cut"] = trained
    return results


def _axolotl_cut(encoded: list[tuple[list[int], list[int]] | None], cfg: Any, cutoff: int) -> list[int]:
    """The trained tokens each row keeps after axolotl's own handling of sequences longer than sequence_len
    (excess_length_strategy: dropped by default, or truncated)."""
    from axolotl.utils.data.utils import handle_long_seq_in_dataset
    from datasets import Dataset

    kept = [(i, e) for i, e in enumerate(encoded) if e is not None]
    trained = [0] * len(encoded)
    if not kept:
        return trained
    data = Dataset.from_list(
        [{"row": i, "input_ids": ids, "labels": labs, "attention_mask": [1] * len(ids)} for i, (ids, labs) in kept]
    )
    handled = handle_long_seq_in_dataset(data, cutoff, cfg)
    for item in handled:
        trained[item["row"]] = sum(1 for lab in item["labels"] if lab != IGNORE)
    return trained


# the reader a backend names in its mask spec (sft_grid/backends/*.py mask_spec)
READERS = {"llamafactory": llamafactory, "axolotl": axolotl}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {os.path.basename(sys.argv[0])} BATCH.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        batch = json.load(f)
    # a list of jobs, or {"jobs": [...], "facts": {...}}: the environment's facts too (env_facts.py's answers)
    jobs, facts = (batch, None) if isinstance(batch, list) else (batch["jobs"], batch.get("facts"))
    out = []
    for job in jobs:
        try:
            out.append({"id": job["id"], "rows": READERS[job["reader"]](job)})
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            out.append({"id": job["id"], "error": detail[-800:]})
    with open(argv[1], "w") as fh:
        json.dump(out, fh)
    if facts:
        _env_facts(facts)
    return 0


def _env_facts(request: dict[str, Any]) -> None:
    """env_facts.py's answers, from this process (its transformers is imported already: seconds saved). A failure
    leaves no answer: the grid then asks env_facts.py itself."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import importlib

        env_facts = importlib.import_module("env_facts")  # beside this file (by its bare name, as the jobs do)
        flags = ["--transformers"] if request.get("transformers") else []
        env_facts.main([request["out"], *flags, *request["modules"]])
    except Exception:
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
