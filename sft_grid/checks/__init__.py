"""Layer 3, checks: what needs a tokenizer or data, run once per unique input before anything is queued.

- `inputs`: where a local path or a hub id can be read here, and a sample of its rows;
- `preflight`: the checks of every cell (paths, template tokens, assistant turns, the loss mask), run once
  each, with the ones whose input cannot be read here deferred to the job's first step;
- `mask`: the loss-mask probe (the backend's own preprocessing in its virtual environment) and its cache;
- `judge`: whether the probe's token data trains the assistant turns and nothing else (pure);
- `examples`: the first example of each source as the backend trains it (what a dry run shows).

Imports sft_grid.core, sft_grid.planning and sft_grid.backends.
"""
