"""Layer 3, checks: what needs a tokenizer or data, run once per unique input before anything is queued.

- `preflight`: the checks of every cell (paths, template tokens, assistant turns, the loss mask), run once
  each, with the ones whose input cannot be read here deferred to the job's first step, and each check's verdict;
- `own_envs`: the environments a site names itself (`cluster.backend_venvs.<backend>`, a directory or a conda
  environment's name): there, a python that runs, the backend importable (asked of it: `venv_facts`);
- `mask`: the loss-mask probe (the backend's own preprocessing in its virtual environment), its cache, and the
  judgement of its token data (every assistant turn trained, nothing of the prompt: pure);
- `tokenizers`: tokenizers as content (a digest of what decides the tokens) and Delphi's prepared tokenizer;
- `examples`: the first example of each source as the backend trains it (what a dry run shows).

Imports sft_grid.core, sft_grid.planning and sft_grid.backends.
"""
