"""Layer 8, analysis: a grid's results read back from its cells' files, fitted and drawn.

- `table`, `scores`: the cells x values table (swept values, state, steps, final loss, scores, GPU-hours,
  estimates) that `python -m sft_grid.results` prints and the report shows, read from ledgers, trainer logs
  and score files only;
- `report`: the report's data (report.json): the table, loss curves, fits, each cell's estimate against what it
  took (the calibration of grid/costs.py and planning/estimate.py);
- `scaling`, `solver`: the fit of L(N) = E + A N^-alpha per recipe, with its bootstrap band;
- `html`, `plots`, `curves`, `svg`: the self-contained HTML page drawn from the report's data.

numpy is imported inside the functions that fit and draw, so reading a table does not pay for it.
"""
