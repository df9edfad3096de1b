"""Layer 7, sites: where a grid's jobs run and the code they run.

- `transport`: how a site is reached: a process here, or OpenSSH with one control connection per command;
- `snapshot`: the commit a grid is launched from, extracted once into the site's store, what every queued job runs;
- `placement`, `facts`: a grid across sites (`sites=[...]`): each cell on a feasible site, earliest expected start
  first (pure), from what each site's scheduler says (`sbatch --test-only`, asked by observe);
- `moves`: a site that fails: the crash-safe journal that moves its queued cells elsewhere, exactly once;
- `merged`: one view of a grid across remote sites: each site asked over its transport (status, the files results
  and report read), each cell's copy chosen, the replies merged for cli/across.py to print.

Imports core (and the schedulers' queue readers); the grid flow calls it at a few marked hooks.
"""
