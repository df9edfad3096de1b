"""Layer 0, core: the types and file layout every other layer shares. Imports nothing else of sft_grid.

- `schema`: the typed cell config and evaluation suite (Hydra structured configs), with each key's range or
  allowed values;
- `layout`: what a cell directory holds and what a trainer's output must hold to count as complete;
- `events`: the one ledger event type and its one writer;
- `state`: a cell's state, derived from its ledger, its output and the scheduler's view;
- `failures`: why a cell failed and what happens next (classes, signs, the classifier, sacct's records, the
  policy, a failed cell's triage from its directory);
- `cellfiles`: the typed files a job reads (post.json, preflight.json) and the preflight `Check`;
- `scores`: eval.json and the score files (the contract with the results table);
- `submission`: the typed submission plan a dry run prints and a real run executes;
- `problems`: the one error type of bad input (every problem of every cell, raised once);
- `hubcache`: a Hub repository's pin and its files in a Hugging Face cache (what training needs, what is staged);
- `lock`: the one file lock (one holder per path across processes and hosts, on cluster filesystems too);
- `gate`: a queued job's gate, claimed once by the job or by a move to another site;
- `templates`: chat templates, which tokenizers they fit, and train == serve (the template a saved model carries);
- `tokenized`, `provenance`, `overrides`, `secrets`, `timefmt`, `paths`: a shared tokenized dataset, what makes a
  result traceable, a cell's overrides, secrets in URLs, wall times, and where caches live.
"""
