"""Layer 7, grid: the flow compose -> plan -> validate -> check -> render -> submission plan -> schedule.

- `flow`: the whole flow for every cell at once; returns a `GridResult` and prints nothing (the command line
  presents it);
- `view`: each cell's ledger and the scheduler's view of their jobs (one sacct call for the grid);
- `decide`: what to do with each cell, from its state (run, skip, run its post-training stages only, rerun);
- `recover`: what to do about jobs an orchestrator killed mid-submit left behind;
- `render`: each cell's files, exactly as a job reads them;
- `submission`, `requests`, `eval_jobs`: the `SubmissionPlan` (arrays, names, requests, throttles, prep, post and
  evaluation jobs, dependencies), pure;
- `execute`: the only part with effects: runs the plan and nothing else; `lock`: one invocation at a time.

Imports everything below it: core, planning, backends, checks, stages, job (to archive), schedulers.
"""
