"""Layer 6, schedulers: execute the jobs of a submission plan and read the queue back. Imports sft_grid.core only.

- `slurm`: sbatch a plan's job (an array through submitit, retried on the controller's transient errors), the
  sbatch script it sends (what a dry run prints), the queue's view of jobs (one sacct + one squeue call),
  scancel, and the submission files a crash-recovery looks for;
- `local`: submitit's local executor, at most N jobs at once, waiting for them when asked;
- `entry`: the picklable callable every job runs: a job-side function named in the plan, with its target.
"""
