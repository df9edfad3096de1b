"""Layer 8, analysis: a grid read back from its cells' files: each cell's state, its results, fitted and drawn.

- `view`: each cell's ledger and the scheduler's view of their jobs (one sacct call for the grid), immutable: what
  the flow observes, and what `status`, `results` and the report read;
- `table`: the cells x values table (swept values, state, steps, final loss, scores, GPU-hours, estimates) that
  `sft-grid results` prints and the report shows, read from cell.yaml, ledgers, trainer logs and score
  files only;
- `report_data`: the report's data (report.json): the table, loss curves, fits, each cell's estimate against what
  it took (the calibration of planning/costs.py);
- `scaling`: the fit of L(N) = E + A N^-alpha per recipe (scipy's least_squares), with its bootstrap band (numpy);
- `figures`, `page`: the self-contained HTML page drawn from the report's data, its figures plotly's.

numpy and scipy are imported inside the functions that fit and draw, so reading a table does not pay for them.
"""
