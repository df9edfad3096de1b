"""Layer 1, planning: from conf/ and the command line to typed, validated cells (pure: reads, never writes).

- `compose`: every cell of a grid with Hydra's own semantics, at a fraction of Hydra's cost;
- `cells`: a composed config made a typed `Cell`, with its identity (what determines the trained model),
  its name and what is derived from it (gradient accumulation, world size);
- `inputs`: what a cell's backend loads (a local path, a hub id, or a prepared copy of the model);
- `venvs`: which virtual environment a cell trains in, and the pinned specs of the managed ones;
- `evals`, `eval_tasks`, `eval_rules`: what a grid evaluates (suites, score identities, base models, the eval
  axis merged into one cell), the project's tiny local tasks, and the suites' rules;
- `validate`, `schema_rules`, `messages`: every rule over every cell, all problems reported at once.

Imports only sft_grid.core.
"""
