"""Layer 9, adaptive: grids that steer themselves; the decisions, as pure functions of what the cells' files say.

- `spec`: the sweep's `prune:` and `adaptive:` blocks, typed and validated (every bad value: its key, the value, the
  fix; before anything is queued).
- `halving`: successive halving across Slurm: at each rung, the cells of a bracket compared at the same schedule
  position (on a short cooldown probe, or the loss at the rung), the dominated ones pruned; every decision written
  to an append-only record before it is acted on, so a killed and restarted orchestrator redoes nothing and
  changes nothing.
- `candidates`: a candidate cell of the pool, the pool by (recipe, size), and a recipe's forecast with its band:
  what the designs read and say.
- `design`: the next cells from the fit: each recipe's forecast and band, the decision and its probability, the
  stops; for a `loss` question the completion that most reduces the forecast's variance per GPU-hour, for a `gap`
  question under `design: value` the plan worth most per GPU-hour, with the numbers that say why.
- `ladder`: a `gap` question's cells under `design: ladder` (the default): each recipe's foot and rung, the recipes
  far behind out, then a top for each recipe still in as large as the budget reaches; the forecast the power law
  through a recipe's two largest sizes.
- `race`: a `gap` question's cells under `design: race`: successive elimination, each recipe that can still be the
  lowest measured one size further per round, none that cannot.

Above the analysis layer (it reads its fit), below the grid's flow, which asks it for its decision before it checks
the grid and applies what the decision writes (`effects`) once every rule has passed; nothing here submits or
writes by itself. The simulator these are measured against is the `synthetic` backend (benchmarks/bench_adaptive.py).
"""
