"""The shipped config groups (cluster, backend, model, dataset, eval, harness, sweep) and the backends' locks.

Package data, found by Hydra as `pkg://sft_grid.conf`, so that a wheel and a checkout compose the same cells. A
team's own repository is searched first (sft_grid/core/project.py): its option of the same name wins.
"""
