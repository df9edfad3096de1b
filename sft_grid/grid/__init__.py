"""Layer 10, grid: the flow compose -> steer -> validate -> check -> observe -> plan -> render -> submission plan ->
schedule.

- `flow`: the whole flow for every cell at once: the checks (`check`), what the world says now (`observe`: the
  ledgers and the queue; in a real run it records triage and sends notifications), a frozen plan that is a pure
  function of the two (`plan`), and its execution (`execute`); prints nothing (the command line presents what it
  returns);
- `decide`: what to do with each cell, from its state (run, skip, run its post-training stages only, rerun), and
  about jobs an orchestrator killed mid-submit left behind;
- `render`: each cell's files, exactly as a job reads them;
- `jobs`: the `SubmissionPlan` of an invocation (arrays, names, sbatch requests, throttles, the jobs before training,
  post and evaluation jobs, dependencies), pure;
- `triage`: failures the scheduler ended, triaged where the grid is observed (and by `status`); the requeue a job
  asks for;
- `execute`: runs the plan and nothing else: with `observe`, the only part with effects.

Imports everything below it: core, planning, backends, checks, stages, job (to archive), schedulers, sites, analysis
(the view of the cells), adaptive (a steered grid's decision).
"""
