"""Layer 9, adaptive: grids that steer themselves; the decisions, as pure functions of what the cells' files say.

- `spec`: the sweep's `prune:` and `adaptive:` blocks, typed and validated (every bad value: its key, the value, the
  fix; before anything is queued).
- `halving`: successive halving across Slurm: at each rung, the cells of a bracket compared at the same schedule
  position (on a short cooldown probe, or the loss at the rung), the dominated ones pruned; every decision written
  to an append-only record before it is acted on, so a killed and restarted orchestrator redoes nothing and
  changes nothing.
- `design`: the next cells from the fit: the existing scaling fit and its bootstrap by cell, and the candidate that
  most reduces the question's variance per GPU-hour, with the numbers that say why.

Above the analysis layer (it reads its fit), below the grid's flow, which asks it for its decision before it checks
the grid and applies what the decision writes (`effects`) once every rule has passed; nothing here submits or
writes by itself. The simulator these are measured against is the `synthetic` backend (benchmarks/bench_adaptive.py).
"""
