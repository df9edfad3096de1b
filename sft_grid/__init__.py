"""sft_grid: declarative grids of supervised fine-tuning experiments, on Slurm or on this machine.

Layers, each importing only the layers above it in this list (tests/test_layers.py checks every import,
function-local ones included):

    core        sft_grid.core        types, file layout, the ledger's events, the submission plan, problems
    planning    sft_grid.planning    composition (Hydra's semantics, fast), cells and identity, validation
    backends    sft_grid.backends    one Backend interface; pure renderers of LLaMA-Factory's and axolotl's files
    checks      sft_grid.checks      preflight and the loss-mask probe, once per unique input
    stages      sft_grid.stages      Hub staging, model prep, post-training stages, evaluation, virtual environments,
                                     tiny assets
    job         sft_grid.job         what a job runs on its node, from the cell directory alone
    schedulers  sft_grid.schedulers  execute a plan's jobs (local, Slurm) and read the queue; imports core only
    sites       sft_grid.sites       how a site is reached (here, ssh), the code snapshot its jobs run, placement
                                     across sites and the move journal
    analysis    sft_grid.analysis    a grid read back: each cell's state (the view), the cells x values table,
                                     scaling fits, the report
    adaptive    sft_grid.adaptive    grids that steer themselves: successive halving, the next cells from the fit
    grid        sft_grid.grid        check -> steer -> observe -> plan (pure) -> execute
    cli         sft_grid.cli         the entry points: sft-grid COMMAND (python -m sft_grid COMMAND), the
                                     Hydra app (sft-grid run), and hydra_plugins/sft_grid_plugins

`sft_grid.in_venv` is beside them: scripts and plugins that run with a backend's python, importing nothing of
sft_grid.
"""

__version__ = "0.2.0"
