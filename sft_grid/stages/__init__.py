"""Layer 4, stages: what makes a cell's inputs and outputs exist, around its training.

- `staging`: the Hub models and datasets a grid needs, pinned and fetched into the site's cache before anything is
  queued (here, or in a staging job): a subpackage;
- `prep`: the Delphi tokenizer prep, once per model, shared by its cells; `tokenize`: tokenize once per grid;
  `once`: what both run on this machine, once, under a lock;
- `post_training`: the post-training chain of a cell (consolidate, preprocessor config, tokenizer repair, upload,
  register, cleanup), each stage with its own state in the ledger, and what each stage does;
- `evaluate`: the evaluation stage of a cell (or a base model) after its post stages: lm-eval in its own
  environment, one score file per task, each computed once; its state from the score files and the ledger;
- `notify`: who hears about a cell's end and the grid's, once each (a command, a webhook);
- `venv_build`, `tiny_assets`: the managed virtual environments and the tiny local models and datasets.

Imports sft_grid.core, planning, backends and checks.
"""
