"""Layer 5, job: what a job runs on a compute node (or this machine, locally), from a cell's directory alone.

- `runner`: run one rendered cell: record it, run its deferred checks, resume or start training, record the
  outcome, then its post-training stages where they run in the training job;
- `hang`: the watch over a running training that ends it when it hangs (no step, no log line past a bound);
- `entries`: the functions a scheduler's job calls, one per role (prep, train, post);
- `after`: what a Slurm training job's batch script runs once its training step ended: the requeue its failure
  asks for, submitted from outside the step.

It never re-composes from conf/: what was rendered is what runs. Imports sft_grid.core, backends, checks and
stages; the schedulers reach it only by name (core/submission.py ENTRIES, AFTER_STEP).

    python -m sft_grid.job <cell_dir>       # run a rendered cell here, as its job would
"""
