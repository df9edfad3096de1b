"""Layer 11, cli: the entry points. `sft-grid COMMAND` (main.py: a subcommand per command, each in cmd_<name>.py,
with the options they share in options.py), the Hydra app that runs grids (app.py: `python -m sft_grid` and
`sft-grid run`), and the text a person reads (present.py). Only this layer prints.

`python -m sft_grid <command>` is the same as `sft-grid <command>` (sft_grid/__main__.py hands its arguments to
main.py's `module_main`); `python -m sft_grid <overrides>` is `sft-grid run <overrides>`.
"""
